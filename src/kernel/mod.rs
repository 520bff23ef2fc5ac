//! The kernel side from Rust.
pub mod diagnose;
pub mod features;
pub mod wake;
