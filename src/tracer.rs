//! The kernel side from Rust: load bpf/uvspan.bpf.c, attach the catalog's
//! probes to a libuv image, manage the set of traced processes, read the
//! ring buffer and the counters.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, UprobeMultiOpts, UprobeOpts};

use crate::bpf::types::stat_idx;
use crate::bpf::{UvspanSkel, UvspanSkelBuilder};
use crate::probes::catalog::{self, Program};
use crate::symbols::Located;

/// Settings fixed at load time.
#[derive(Clone, Debug)]
pub struct Settings {
    pub loop_threshold: Duration,
    /// Trace children forked by traced processes (the `--` command mode).
    pub follow_forks: bool,
}

/// How one catalog probe fared on one image.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeStatus {
    pub symbol: &'static str,
    pub program: Program,
    /// File offset of the symbol, when found.
    pub offset: Option<u64>,
    /// None when attached (or attachable), else why not.
    pub problem: Option<String>,
    #[serde(skip)]
    pub if_missing: &'static str,
    #[serde(skip)]
    cookie: u64,
}

/// Kernel-side counters (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub ringbuf_lost: u64,
    pub loop_iterations: u64,
    pub loop_emitted: u64,
    pub inflight_replaced: u64,
}

pub struct Tracer {
    skel: UvspanSkel<'static>,
    /// Multi-uprobe links available (one link per image: fast attach and detach).
    multi: bool,
    /// Uprobe links per (image path, pid filter); dropped = detached.
    uprobes: HashMap<(PathBuf, i32), Vec<Link>>,
    /// Tracepoint links (syscalls, process lifecycle).
    _global: Vec<Link>,
}

/// One line for the user when BPF cannot be loaded.
fn load_error(e: libbpf_rs::Error) -> anyhow::Error {
    let msg = e.to_string();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let eperm = msg.contains("os error 1)") || msg.contains("Operation not permitted");
    let eacces = msg.contains("os error 13") || msg.contains("Permission denied");
    if eperm || (eacces && !root) {
        anyhow!(
            "cannot load the eBPF program: permission denied. uvspan needs root, or the capabilities \
             CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_SYS_RESOURCE; run it with sudo"
        )
    } else if eacces {
        // EACCES for root is the verifier refusing a program, not a privilege problem.
        anyhow!(
            "the kernel's BPF verifier rejected uvspan's program ({msg}); this is a uvspan bug or an \
             unsupported kernel: rerun with UVSPAN_DEBUG=1 for the verifier log and report it"
        )
    } else {
        anyhow!("cannot load the eBPF program: {msg}. uvspan needs Linux >= 5.15 with BTF (/sys/kernel/btf/vmlinux)")
    }
}

/// libbpf's own messages go to stderr only with UVSPAN_DEBUG=1.
fn quiet_libbpf() {
    let debug = std::env::var_os("UVSPAN_DEBUG").is_some_and(|v| v != "0");
    let cb: libbpf_rs::PrintCallback = if debug { |_, m| eprint!("{m}") } else { |_, _| {} };
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, cb)));
}

impl Tracer {
    pub fn load(settings: &Settings) -> Result<Tracer> {
        quiet_libbpf();
        // Multi-uprobe links need Linux >= 6.6; without them, load the
        // single-uprobe program only.
        let (skel, multi) = match Self::open_and_load(settings, true) {
            Ok(skel) => (skel, true),
            Err(_) => (Self::open_and_load(settings, false).map_err(load_error)?, false),
        };
        let p = &skel.progs;
        let mut global = Vec::new();
        for prog in [
            &p.epoll_wait_enter,
            &p.epoll_wait_exit,
            &p.epoll_pwait_enter,
            &p.epoll_pwait_exit,
            &p.epoll_pwait2_enter,
            &p.epoll_pwait2_exit,
            &p.proc_fork,
            &p.proc_exec,
            &p.proc_exit,
        ] {
            global.push(prog.attach().map_err(load_error).with_context(|| format!("attaching {}", prog.name().to_string_lossy()))?);
        }
        Ok(Tracer { skel, multi, uprobes: HashMap::new(), _global: global })
    }

    fn open_and_load(settings: &Settings, multi: bool) -> std::result::Result<UvspanSkel<'static>, libbpf_rs::Error> {
        // The skeleton borrows its object for its whole life; uvspan keeps one
        // tracer for the whole run, so the object is leaked on purpose.
        let object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = UvspanSkelBuilder::default().open(object)?;
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.loop_threshold_ns = settings.loop_threshold.as_nanos().min(u128::from(u64::MAX)) as u64;
            ro.follow_forks = u32::from(settings.follow_forks);
        }
        if !multi {
            open.progs.uv_multi.set_autoload(false);
        }
        open.load()
    }

    /// Marks a process as traced: its events pass the kernel-side filter.
    pub fn add_pid(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .traced
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .with_context(|| format!("cannot add process {pid} to the traced set"))
    }

    pub fn remove_pid(&mut self, pid: u32) {
        let _ = self.skel.maps.traced.delete(&pid.to_ne_bytes());
        self.uprobes.retain(|(_, p), _| *p != pid as i32);
    }

    /// Attaches every catalog probe found in `loc`, for process `pid_filter`
    /// (-1: every process mapping the file; the kernel-side filter then
    /// decides). Missing symbols are reported, not fatal; an image with no
    /// probe attached at all is an error.
    pub fn attach(&mut self, loc: &Located, pid_filter: i32) -> Result<Vec<ProbeStatus>> {
        let mut report: Vec<ProbeStatus> = catalog::all_probes()
            .into_iter()
            .map(|p| {
                let offset = loc.image.offsets.get(p.symbol).copied();
                ProbeStatus {
                    symbol: p.symbol,
                    program: p.program,
                    offset,
                    problem: offset.is_none().then(|| "symbol not found".to_string()),
                    if_missing: p.if_missing,
                    cookie: p.attach_cookie(),
                }
            })
            .collect();
        let found: Vec<&ProbeStatus> = report.iter().filter(|r| r.offset.is_some()).collect();
        if found.is_empty() {
            return Err(anyhow!("no libuv probe symbol found in {}", loc.path));
        }
        let mut links = Vec::new();
        if self.multi {
            // One link for the whole image: all or nothing.
            let opts = UprobeMultiOpts {
                offsets: found.iter().map(|r| r.offset.unwrap_or(0) as usize).collect(),
                cookies: found.iter().map(|r| r.cookie).collect(),
                ..Default::default()
            };
            if let Ok(link) = self.skel.progs.uv_multi.attach_uprobe_multi_with_opts(pid_filter, &loc.attach_path, "", opts) {
                links.push(link);
            }
        }
        if links.is_empty() {
            // One link per probe, so a failure is reported per probe.
            for r in report.iter_mut().filter(|r| r.offset.is_some()) {
                let opts = UprobeOpts { cookie: r.cookie, retprobe: false, ..Default::default() };
                match self.skel.progs.uv_single.attach_uprobe_with_opts(
                    pid_filter,
                    &loc.attach_path,
                    r.offset.unwrap_or(0) as usize,
                    opts,
                ) {
                    Ok(link) => links.push(link),
                    Err(e) => r.problem = Some(format!("attach failed: {e}")),
                }
            }
        }
        if links.is_empty() {
            let why = report.iter().find_map(|r| r.problem.clone()).unwrap_or_default();
            return Err(anyhow!("no probe could be attached to {} ({why})", loc.path));
        }
        self.uprobes.insert((loc.attach_path.clone(), pid_filter), links);
        Ok(report)
    }

    /// A ring-buffer reader that hands each raw record to `on_record`.
    pub fn ring_buffer(&self, mut on_record: impl FnMut(&[u8]) + 'static) -> Result<RingBuffer<'static>> {
        let mut b = RingBufferBuilder::new();
        b.add(&self.skel.maps.events, move |data: &[u8]| {
            on_record(data);
            0
        })?;
        Ok(b.build()?)
    }

    pub fn stats(&self) -> Stats {
        let read = |idx: stat_idx| -> u64 {
            self.skel
                .maps
                .stats
                .lookup_percpu(&idx.0.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|cpus| {
                    cpus.iter()
                        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                        .sum()
                })
                .unwrap_or(0)
        };
        Stats {
            ringbuf_lost: read(stat_idx::STAT_RINGBUF_LOST),
            loop_iterations: read(stat_idx::STAT_LOOP_ITERATIONS),
            loop_emitted: read(stat_idx::STAT_LOOP_EMITTED),
            inflight_replaced: read(stat_idx::STAT_INFLIGHT_REPLACED),
        }
    }
}

impl Drop for Tracer {
    /// Detaching waits for RCU grace periods in the kernel (tens of ms per
    /// tracepoint link); detaching the links side by side roughly halves
    /// uvspan's exit time (measured 620 ms → 320 ms).
    fn drop(&mut self) {
        self.uprobes.clear();
        let threads: Vec<_> = self._global.drain(..).map(|l| std::thread::spawn(move || drop(l))).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}
