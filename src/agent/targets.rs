//! The processes traced: --pid targets and the Node.js processes below
//! them, the processes --all finds, and `-- COMMAND` (started, attached, its
//! execs, its exit, signals passed on).
//!
//! A --pid target's descendants are followed as `-- COMMAND`'s are: the
//! kernel adds each process a followed one forks to the traced set and
//! reports its exec (bpf/procs.h); the watcher decides whether what it
//! exec'd is Node.js, as it does for --all. Unlike the command's, each one
//! found is attached for itself (`--pid` attaches to no other process of
//! the binary).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::procs::Origin;
use super::{report, Agent};
use crate::cli::Cli;
use crate::discover::target;
use crate::discover::watcher::{Found, Trouble, Watcher};
use crate::discover::{self, Filter};
use crate::symbols::Images;

/// The targets named on the command line, resolved.
pub(super) struct Targets {
    pub(super) found: Instant,
    pub(super) pids: Vec<(u32, Images)>,
    pub(super) command_node: Option<target::CommandNode>,
}

/// Resolves --pid targets and the command's node while BPF loads (reading
/// a 100 MB node's symbols takes tens of ms without the symbol cache).
pub(super) fn resolve_targets(cli: &Cli) -> std::thread::JoinHandle<Result<Targets>> {
    let (pids, argv0) = (cli.pids.clone(), cli.command.first().cloned());
    std::thread::spawn(move || {
        let found = Instant::now();
        let pids = pids.into_iter().map(|pid| Ok((pid, target::check_pid(pid)?))).collect::<Result<_>>()?;
        let command_node = argv0.map(|a| target::node_binary_for(&a)).transpose()?;
        Ok(Targets { found, pids, command_node })
    })
}

impl Agent {
    /// One --pid target: its own probes (pid filter), traced, announced.
    pub(super) fn attach_target(&mut self, pid: u32, images: &Images, found: Instant) -> Result<()> {
        let report = self.tracer.attach(images, pid, false)?.report;
        self.tracer.add_pid(pid, &report)?;
        report::announce(&format!("process {pid}"), images, &report, found.elapsed(), true, self.cli.verbose);
        self.noticed.insert(images.libuv.path.clone());
        self.procs.add(pid, Origin::Target, images.node_version.clone(), &self.exporter, true);
        self.traced.add(pid, None);
        self.start_sampling(pid, images);
        Ok(())
    }

    /// --stacks: the process's loop thread sampled during slow iterations.
    /// A refusal is said and tracing goes on without stacks.
    fn start_sampling(&mut self, pid: u32, images: &Images) {
        let Some(stacks) = self.stacks.as_mut() else { return };
        match self.tracer.sample_loop(pid, stacks.period_ns()) {
            Ok(()) => stacks.add_process(pid, images.node_version.as_deref()),
            Err(e) => eprintln!("uvspan: {e:#}"),
        }
    }

    /// --all: the processes running now, then every exec the kernel reports.
    pub(super) fn start_watching(&mut self) -> Result<()> {
        let filter = Filter {
            cgroup: self.cli.cgroup.clone(),
            container: self.cli.container.clone(),
            exclude_instrumented: self.cli.exclude_already_instrumented,
        };
        self.watcher = Some(Watcher::new(filter, self.waker.clone())?);
        for pid in discover::all_pids() {
            self.consider(pid);
        }
        // The processes already running: wait (bounded) for their symbols.
        let until = Instant::now() + Duration::from_secs(5);
        while self.watcher.as_ref().is_some_and(Watcher::busy) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
            self.discover();
        }
        eprintln!("uvspan: watching for Node.js processes ({} traced now)", self.procs.live());
        Ok(())
    }

    /// --pid: the processes below the targets running now are followed (the
    /// kernel adds what they fork from now on), and those that are Node.js
    /// traced; later ones are found at their exec ([`Agent::followed_exec`]).
    pub(super) fn start_following(&mut self) -> Result<()> {
        self.watcher = Some(Watcher::new(Filter::default(), self.waker.clone())?);
        // Twice: a process forked while the first walk was adding its
        // parent is found by the second.
        let mut below = Vec::new();
        for _ in 0..2 {
            for &t in &self.cli.pids {
                for pid in crate::discover::tree::descendants(t) {
                    if !below.contains(&pid) {
                        self.tracer.follow_pid(pid);
                        below.push(pid);
                    }
                }
            }
        }
        for pid in below {
            self.consider(pid);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while self.watcher.as_ref().is_some_and(Watcher::busy) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
            self.discover();
        }
        Ok(())
    }

    /// --pid: a process below a target exec'd (a cluster worker, a node a
    /// shell started): traced if it is Node.js.
    pub(super) fn followed_exec(&mut self, pid: u32) {
        if !self.traced.is_live(pid) {
            self.consider(pid);
        }
    }

    /// `-- COMMAND`: started held before exec, attached (every process of the
    /// binary, the kernel keeps this one and its children), then released.
    pub(super) fn start_command(&mut self, node: &target::CommandNode, found: Instant) -> Result<()> {
        let images = &node.images;
        let w = self.waker.clone();
        crate::discover::tree::become_subreaper();
        let child = target::spawn_held(&self.cli.command, move || w.wake())?;
        let report = self.tracer.attach(images, child.pid, true)?.report;
        self.tracer.add_pid(child.pid, &report)?;
        self.start_sampling(child.pid, images);
        match &node.not_node {
            None => {
                self.node_ran = true;
                report::announce("command", images, &report, found.elapsed(), true, self.cli.verbose);
            }
            Some(why) => {
                eprintln!("uvspan: {why}: uvspan cannot trace it");
                report::announce("the Node.js processes it starts", images, &report, found.elapsed(), true, self.cli.verbose);
            }
        }
        self.node_exe = exe_id(&node.node_exe);
        // Its resource is read once it has exec'd (the exec record).
        self.procs.add(child.pid, Origin::Other, images.node_version.clone(), &self.exporter, false);
        if let Some(r) = self.report.as_mut() {
            r.started();
        }
        child.release()?;
        self.command = Some(child);
        self.command_images = Some(images.clone());
        Ok(())
    }

    /// `-- COMMAND`: one of its processes exec'd (node started by a shell or
    /// a script): its stacks are named too. The binary's probes cover it already; one whose
    /// environment turns io_uring on may also need uv_fs_req_cleanup for
    /// itself (see Tracer::attach). Other programs, and processes that
    /// leave io_uring alone (nearly all: only their environment is read),
    /// are left alone.
    pub(super) fn command_exec(&mut self, pid: u32) {
        let Some(cmd) = &self.command_images else { return };
        if !self.node_ran {
            match exe_id(Path::new(&format!("/proc/{pid}/exe"))) {
                Some(exe) => self.node_ran = Some(exe) == self.node_exe,
                None => self.exec_unknown = true,
            }
        }
        // --stacks: its loop thread's samples (the sampler covers every CPU;
        // only the processes added are named). A new image: its caches go.
        if let Some(st) = self.stacks.as_mut() {
            st.add_process(pid, cmd.node_version.as_deref());
            self.tracer.watch_loop(pid);
        }
        if !crate::probes::io_uring::Env::of(pid).turns_on() {
            return;
        }
        let Ok(images) = target::check_pid(pid) else { return };
        if images.libuv.path != cmd.libuv.path {
            return;
        }
        if let Err(e) = self.tracer.attach(&images, pid, true) {
            eprintln!("uvspan: process {pid}: {e:#}");
        }
    }

    /// Whether `pid` is traced already: --all's processes are those of the
    /// table; with --pid's descendants followed, the table also holds the
    /// processes followed that are not (or not yet) known to be Node.js.
    fn tracing(&self, pid: u32) -> bool {
        if self.follow {
            self.traced.is_live(pid)
        } else {
            self.procs.contains(pid)
        }
    }

    /// A process for the watcher to look at (--all, --pid's descendants).
    pub(super) fn consider(&mut self, pid: u32) {
        if self.tracing(pid) {
            return;
        }
        let Some(w) = self.watcher.as_mut() else { return };
        match w.consider(pid, 0) {
            Ok(Some(found)) => self.start_tracing(found),
            Ok(None) => {}
            Err(t) => say_trouble(t),
        }
    }

    /// What the watcher found meanwhile.
    pub(super) fn discover(&mut self) {
        let Some(w) = self.watcher.as_mut() else { return };
        let (found, troubles) = w.poll();
        troubles.into_iter().for_each(say_trouble);
        for f in found {
            if !self.tracing(f.pid) {
                self.start_tracing(f);
            }
        }
    }

    /// A process found by --all: attached (one link per binary for all its
    /// processes; then a pid is one map update), traced, announced. One
    /// below a --pid target: attached for itself alone.
    fn start_tracing(&mut self, f: Found) {
        let Found { pid, images, since } = f;
        let attach = match self.tracer.attach(&images, pid, !self.follow) {
            Ok(a) => a,
            Err(e) => return eprintln!("uvspan: cannot trace process {pid}: {e:#}"),
        };
        if let Err(e) = self.tracer.add_pid(pid, &attach.report) {
            return eprintln!("uvspan: cannot trace process {pid}: {e:#}");
        }
        let under = self.follow.then(|| target_above(pid, &self.cli.pids)).flatten();
        let who = match under {
            Some(t) => format!("process {pid} under {t}"),
            None => format!("process {pid}"),
        };
        // A --pid target's descendants: the notices once per file.
        let notices = if self.follow { self.noticed.insert(images.libuv.path.clone()) } else { attach.new };
        report::announce(&who, &images, &attach.report, since.elapsed(), notices, self.cli.verbose);
        self.procs.add(pid, Origin::Other, images.node_version.clone(), &self.exporter, true);
        self.traced.add(pid, under);
        self.start_sampling(pid, &images);
    }

    /// The command's exit code, once it has exited (128+N if killed by N).
    pub(super) fn command_exited(&mut self) -> Option<i32> {
        let status = self.command.as_ref()?.status.try_recv().ok()?;
        Some(match status {
            Ok(s) => s.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)),
            Err(e) => {
                eprintln!("uvspan: cannot run {}: {e}", self.cli.command[0]);
                127
            }
        })
    }

    /// SIGINT/SIGTERM: passed on to the command and every process below it
    /// (what a shell started in the background too), whose exit (within
    /// 10 s) ends the run; without a command, the run ends now.
    pub(super) fn stop_for_signal(&mut self) -> bool {
        let sig = self.signal.load(Ordering::SeqCst);
        if sig == 0 {
            return false;
        }
        match (&self.command, self.forwarded_at) {
            (Some(_), None) => {
                // uvspan's only children are the command's tree (uvspan is
                // its subreaper: orphans stay below it).
                let tree = crate::discover::tree::descendants(std::process::id());
                crate::discover::tree::signal(&tree, sig);
                self.forwarded_at = Some(Instant::now());
                false
            }
            (Some(_), Some(at)) => at.elapsed() >= Duration::from_secs(10),
            (None, _) => true,
        }
    }
}

/// (device, inode) of an executable file.
pub(super) fn exe_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The --pid target `pid` descends from, by its parents in /proc (none
/// once the target has exited: its children went to another parent).
fn target_above(pid: u32, targets: &[u32]) -> Option<u32> {
    let mut p = pid;
    // Bounded: a chain of parents read while pids are reused could loop.
    for _ in 0..64 {
        p = u32::try_from(procfs::process::Process::new(p as i32).and_then(|x| x.stat()).ok()?.ppid).ok()?;
        if targets.contains(&p) {
            return Some(p);
        }
        if p <= 1 {
            return None;
        }
    }
    None
}

fn say_trouble(t: Trouble) {
    eprintln!("uvspan: cannot trace process {}: {:#}", t.pid, t.error);
}
