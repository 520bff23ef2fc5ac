//! The local OTLP agent (`--otlp-listen`): the traced app exports its own
//! traces, metrics and logs to uvspan, which forwards them unchanged (the
//! same protobuf bytes) to its own endpoint, and reads the app's SERVER spans
//! on the way to give its own request spans their exact parent ([`join`]).
//!
//! ```text
//! app ──OTLP (gRPC or HTTP/protobuf, any address given)──► serve ──► queue ──► forward ──► endpoint
//!                                                            └── SERVER spans ──► agent: join
//! ```

pub mod forward;
pub mod join;
pub mod serve;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::export::client::Settings;
use join::AppSpans;

/// The three OTLP signals.
pub use crate::export::client::Signal;

/// Counters of the listener, per signal in items (spans, data points, log
/// records), shared with the health metrics and the summary line.
#[derive(Debug, Default)]
pub struct ListenCounters {
    pub received: [AtomicU64; 3],
    pub forwarded: [AtomicU64; 3],
    /// Accepted, then lost: the endpoint refused them for good, or they were
    /// still queued when the flush deadline passed.
    pub dropped: [AtomicU64; 3],
    /// Refused with RESOURCE_EXHAUSTED / 503 because the queue was full (the
    /// app's exporter retries them).
    pub refused: [AtomicU64; 3],
    /// Rejected by the endpoint in a partial success.
    pub rejected: [AtomicU64; 3],
    /// Malformed requests (answered INVALID_ARGUMENT / 400).
    pub malformed: AtomicU64,
    /// uvspan's spans put under the app's SERVER span / sent as they were.
    pub joined: AtomicU64,
    pub unjoined: AtomicU64,
    /// uvspan's spans of an operation not sent: the app's span of it stood for it.
    pub twins: AtomicU64,
    /// The listener runs (the health metrics are exported).
    pub on: std::sync::atomic::AtomicBool,
    /// It takes a collector's copy and forwards nothing (`--otlp-listen-forward none`).
    pub tee: std::sync::atomic::AtomicBool,
}

impl ListenCounters {
    pub fn add(field: &[AtomicU64; 3], s: Signal, n: u64) {
        field[s as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(field: &[AtomicU64; 3], s: Signal) -> u64 {
        field[s as usize].load(Ordering::Relaxed)
    }

    /// For the summary line.
    pub fn summary(&self) -> String {
        let per = |f: &[AtomicU64; 3]| Signal::ALL.map(|s| Self::get(f, s).to_string()).join("/");
        if self.tee.load(Ordering::Relaxed) {
            return format!(
                "OTLP copy of the app's telemetry from the collector (traces/metrics/logs): received {}, not forwarded, \
                 malformed requests {}; uvspan spans under the app's SERVER span {}, not joined {}, \
                 not sent because the app's span of the same operation stood for them {}",
                per(&self.received),
                self.malformed.load(Ordering::Relaxed),
                self.joined.load(Ordering::Relaxed),
                self.unjoined.load(Ordering::Relaxed),
                self.twins.load(Ordering::Relaxed),
            );
        }
        format!(
            "OTLP forwarded for the app (traces/metrics/logs): received {}, forwarded {}, dropped {}, refused while the queue was full {}, \
             rejected by the endpoint {}, malformed requests {}; uvspan spans under the app's SERVER span {}, not joined {}, \
             not sent because the app's span of the same operation stood for them {}",
            per(&self.received),
            per(&self.forwarded),
            per(&self.dropped),
            per(&self.refused),
            per(&self.rejected),
            self.malformed.load(Ordering::Relaxed),
            self.joined.load(Ordering::Relaxed),
            self.unjoined.load(Ordering::Relaxed),
            self.twins.load(Ordering::Relaxed),
        )
    }
}

/// `--otlp-listen` settings.
#[derive(Clone, Debug)]
pub struct ListenConfig {
    pub addrs: Vec<SocketAddr>,
    /// Where each signal is forwarded (None: no endpoint for it).
    pub upstream: [Option<Settings>; 3],
    /// Bytes of requests queued for the endpoint at most.
    pub queue_bytes: u64,
    /// false (`--otlp-listen-forward none`): a collector's copy, read for
    /// the join and forwarded nowhere.
    pub forward: bool,
}

/// The running listener: servers and the forwarding task.
pub struct Listener {
    pub counters: Arc<ListenCounters>,
    /// The app's SERVER spans, for the joiner (the agent's thread).
    pub servers: std::sync::mpsc::Receiver<AppSpans>,
    /// None: a collector tee (nothing forwarded).
    forwarder: Option<forward::Handle>,
    rt: tokio::runtime::Handle,
}

/// Binding failed: the address is in use or not ours (exit code 2).
#[derive(Debug)]
pub struct BindError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.source.kind() {
            std::io::ErrorKind::AddrInUse => {
                "the address is in use; stop what listens there or give another --otlp-listen address".to_string()
            }
            std::io::ErrorKind::AddrNotAvailable => {
                "no interface here has that address; give a local address such as 127.0.0.1:4317".to_string()
            }
            std::io::ErrorKind::PermissionDenied => "permission denied; use a port above 1023 or run as root".to_string(),
            _ => format!("{}", self.source),
        };
        write!(f, "cannot listen for OTLP on {}: {what}", self.addr)
    }
}

impl std::error::Error for BindError {}

impl Listener {
    /// Binds every address (before anything is traced: a bad address stops
    /// uvspan at once) and starts serving on `rt`.
    pub fn start(cfg: &ListenConfig, rt: &tokio::runtime::Runtime, counters: Arc<ListenCounters>) -> Result<Listener> {
        let mut sockets = Vec::new();
        for addr in &cfg.addrs {
            let l = std::net::TcpListener::bind(addr).map_err(|source| BindError { addr: *addr, source })?;
            l.set_nonblocking(true).context("cannot make the OTLP listener non-blocking")?;
            sockets.push(l);
        }
        counters.on.store(true, Ordering::Relaxed);
        counters.tee.store(!cfg.forward, Ordering::Relaxed);
        let forwarder = if cfg.forward {
            let _guard = rt.enter();
            Some(forward::start(&cfg.upstream, cfg.queue_bytes, counters.clone())?)
        } else {
            None
        };
        let (tx, rx) = std::sync::mpsc::channel();
        for l in sockets {
            let _guard = rt.enter();
            let l = tokio::net::TcpListener::from_std(l).context("cannot hand the OTLP listener to the runtime")?;
            rt.spawn(serve::serve(
                l,
                serve::State { queue: forwarder.as_ref().map(forward::Handle::queue), counters: counters.clone(), servers: tx.clone() },
            ));
        }
        Ok(Listener { counters, servers: rx, forwarder, rt: rt.handle().clone() })
    }

    /// Forwards what is queued, waiting at most `deadline`; what is left is
    /// counted as dropped.
    pub fn finish(self, deadline: Duration) {
        if let Some(f) = &self.forwarder {
            self.rt.block_on(f.flush(deadline));
        }
    }
}
