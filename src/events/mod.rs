//! From kernel records to spans: [`decode`] the ring buffer's bytes, build
//! [`spans`] with wall-clock times from the [`clock`] and error names from
//! [`errno`], joined to the HTTP [`requests`] that caused them. Pure: no kernel needed, so recorded runs replay in tests.
pub mod clock;
pub mod decode;
pub mod errno;
pub mod requests;
pub mod spans;
