//! The kernel side from Rust: load bpf/uvspan.bpf.c, attach the catalog's
//! probes to a libuv image, manage the set of traced processes, read the
//! ring buffer and the counters.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, UprobeOpts};

use crate::bpf::types::stat_idx;
use crate::bpf::{UvspanSkel, UvspanSkelBuilder};
use crate::probes::catalog::{self, Probe, Program};
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
    /// Uprobe links per (image path, pid filter); dropped = detached.
    uprobes: HashMap<(PathBuf, i32), Vec<Link>>,
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
        // The skeleton borrows its object for its whole life; uvspan keeps one
        // tracer for the whole run, so the object is leaked on purpose.
        let object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = UvspanSkelBuilder::default().open(object).map_err(load_error)?;
        let ro = open.maps.rodata_data.as_deref_mut().ok_or_else(|| anyhow!("BPF object has no .rodata"))?;
        ro.loop_threshold_ns = settings.loop_threshold.as_nanos().min(u128::from(u64::MAX)) as u64;
        ro.follow_forks = u32::from(settings.follow_forks);
        let skel = open.load().map_err(load_error)?;
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
        Ok(Tracer { skel, uprobes: HashMap::new(), _global: global })
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
        let key = (loc.attach_path.clone(), pid_filter);
        let mut links = Vec::new();
        let mut report = Vec::new();
        for probe in catalog::all_probes() {
            let offset = loc.image.offsets.get(probe.symbol).copied();
            let problem = match offset {
                None => Some("symbol not found".to_string()),
                Some(off) => match self.attach_one(&probe, loc, off, pid_filter) {
                    Ok(link) => {
                        links.push(link);
                        None
                    }
                    Err(e) => Some(format!("attach failed: {e}")),
                },
            };
            report.push(ProbeStatus {
                symbol: probe.symbol,
                program: probe.program,
                offset,
                problem,
                if_missing: probe.if_missing,
            });
        }
        if links.is_empty() {
            let why = report.iter().find_map(|r| r.problem.clone()).unwrap_or_default();
            return Err(anyhow!("no probe could be attached to {} ({why})", loc.path));
        }
        self.uprobes.insert(key, links);
        Ok(report)
    }

    fn attach_one(&self, probe: &Probe, loc: &Located, offset: u64, pid: i32) -> Result<Link> {
        let p = &self.skel.progs;
        let prog = match probe.program {
            Program::FsSubmit => &p.fs_submit,
            Program::FsWork => &p.fs_work,
            Program::FsDone => &p.fs_done,
            Program::FsCleanup => &p.fs_cleanup,
            Program::WorkEnd => &p.work_end,
            Program::DnsSubmit => &p.dns_submit,
            Program::DnsWork => &p.dns_work,
            Program::DnsDone => &p.dns_done,
            Program::LoopPhase => &p.loop_phase,
        };
        let opts = UprobeOpts { cookie: probe.cookie, retprobe: false, ..Default::default() };
        Ok(prog.attach_uprobe_with_opts(pid, &loc.attach_path, offset as usize, opts)?)
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
