//! Work no request caused, as traces a person can read: each background
//! task (a batch of JS timers, of immediates, a socket's I/O callback that
//! no request caused) with the work it started under its root span, and
//! with `--trace-per process` each process's life as one trace (its
//! start-up, its tasks, its slow loop iterations under its root span).
//!
//! The kernel tags each operation with its cause ([`cause`]); records the
//! request tracker gave back come here ([`Tasks::work`]), and the HTTP/1
//! calls tasks make ([`Tasks::http`]: CLIENT spans under them). A task's work is
//! held until the task is quiet, then its spans are built in one batch; a
//! process's spans are held until it exits (within bounds), so a CLI run
//! leaves as one tree. Pure: no kernel, no clock of its own.

pub mod cause;
mod modules;
mod spans;
mod tracker;

pub use cause::TaskKind;
pub use spans::task_keys;
pub use tracker::{StartupOps, TaskStats, Tasks, TracePer};
