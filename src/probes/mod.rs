//! What uvspan attaches to. See [`catalog`].
pub mod catalog;
pub mod list;
pub mod point;
