//! What uvspan attaches to, decided without the kernel: the [`catalog`] of
//! probes, the [`plan`] for one Node build (what is attached, what is
//! missing and what that loses), and the `uvspan probes` [`report`].
pub mod catalog;
pub mod io_uring;
pub mod plan;
pub mod report;
