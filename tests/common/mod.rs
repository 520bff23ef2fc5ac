//! Shared pieces of the end-to-end tests, by purpose:
//! - [`otlp`]: an in-test OTLP receiver (gRPC and HTTP/protobuf) and the
//!   spans it received, flattened;
//! - [`runner`]: preconditions, fixtures, running uvspan and node under a
//!   timeout, the fixtures' JSON markers, temp dirs and wait helpers;
//! - [`report`]: what uvspan reports on stderr: its final summary and status lines;
//! - [`host`]: facts about this host and about live processes;
//! - [`cgroups`]: cgroups of a test's own, fake container ids;
//! - [`checks`]: checks shared by several test files;
//! - [`node_builds`]: the Node builds of the matrix, downloaded once into a cache;
//! - [`faults`]: collector faults (a receiver that stops, restarts and is slow);
//! - [`collector`]: a collector speaking OTLP over TLS (certificates made by the test) and gzip;
//! - [`servers`]: private PostgreSQL, MariaDB and redis-server instances.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cgroups;
pub mod checks;
pub mod collector;
pub mod faults;
pub mod host;
pub mod node_builds;
pub mod otlp;
pub mod report;
pub mod runner;
pub mod servers;

// Flat, so that a test file's `use common::*;` sees every helper.
#[allow(unused_imports)] // each test binary uses a different subset
pub use self::{cgroups::*, checks::*, faults::*, host::*, node_builds::*, otlp::*, report::*, runner::*, servers::*};
