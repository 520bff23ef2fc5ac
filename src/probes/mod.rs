//! What uvspan attaches to. See [`catalog`].
pub mod catalog;
