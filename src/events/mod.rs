//! From kernel records to spans: [`decode`] the ring buffer's bytes, build
//! [`spans`] with wall-clock times from the [`clock`] and error names from
//! [`errno`]. The next stage, [`crate::requests`], holds the records of an
//! HTTP request's work and builds them under it. Pure: no kernel needed, so
//! recorded runs replay in tests.
pub mod clock;
pub mod decode;
pub mod errno;
pub mod gc;
pub mod loop_time;
pub mod sampler;
pub mod spans;
