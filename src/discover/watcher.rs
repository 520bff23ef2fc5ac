//! `--all`: which of the processes the kernel reports at exec are Node.js
//! processes to trace. Reading a new binary's symbols (tens to hundreds of ms
//! for a 100 MB node without the symbol cache) happens on a worker thread,
//! so processes of known binaries are found at once meanwhile; executables
//! seen not to be Node are remembered and skipped; one of another
//! JavaScript runtime (Bun) is said once per process (it is what a user
//! may expect traced).
//!
//! The watcher only decides; the agent attaches what it [`Found`].

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{Candidate, Filter};
use crate::kernel::wake::Waker;
use crate::symbols::{self, Images};

/// (device, inode) of an executable.
type ExeId = (u64, u64);

/// A process to trace, with where its libuv is.
pub struct Found {
    pub pid: u32,
    pub images: Images,
    /// When it was found (for "probes live N ms after it was found").
    pub since: Instant,
}

/// A process the watcher could not look at, said once by the agent.
pub struct Trouble {
    pub pid: u32,
    pub error: anyhow::Error,
}

/// What the worker sends back: (pid, tries, found at, executable looked at, its images).
type WorkerResult = (u32, u32, Instant, Option<ExeId>, Result<Images>);

pub struct Watcher {
    filter: Filter,
    /// Executables seen to be Node (fast path) or not (skipped).
    node_exes: HashSet<ExeId>,
    other_exes: HashSet<ExeId>,
    /// Executables of another JavaScript runtime, with what to say of them.
    other_runtimes: HashMap<ExeId, String>,
    /// (pid, when, tries): a dynamically linked node maps its libuv.so after exec.
    retry: Vec<(u32, Instant, u32)>,
    in_worker: HashSet<u32>,
    /// Processes that exec'd again while the worker looked at them.
    exec_again: HashSet<u32>,
    to_worker: Sender<(u32, u32)>,
    from_worker: Receiver<WorkerResult>,
    /// uvspan's own executable: its other processes are not looked at.
    own_exe: Option<ExeId>,
}

fn exe_id(pid: u32) -> Option<ExeId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| (m.dev(), m.ino()))
}

/// Bytes every uvspan executable holds (this very constant): another
/// uvspan, of whatever build, is not a process to trace.
const UVSPAN_MARK: &[u8] = b"uvspan: an eBPF agent, not a Node.js process";

/// Whether an executable links a shared libuv or libnode (the loader maps it
/// just after exec, so a first look can miss it); never a uvspan (its
/// strings name them too).
fn links_shared_libuv(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/exe"))
        .map(|b| {
            let has = |s: &[u8]| memchr::memmem::find(&b, s).is_some();
            (has(b"libuv.so") || has(b"libnode.so")) && !has(UVSPAN_MARK)
        })
        .unwrap_or(false)
}

impl Watcher {
    /// Starts the symbol worker; `waker` is rung whenever it has a result.
    pub fn new(filter: Filter, waker: Waker) -> Result<Watcher> {
        let (to_worker, jobs) = channel::<(u32, u32)>();
        let (done, from_worker) = channel();
        std::thread::Builder::new()
            .name("uvspan-symbols".into())
            .spawn(move || {
                for (pid, tries) in jobs {
                    let t = Instant::now();
                    // The executable is noted first: the process may exec again meanwhile.
                    let exe = exe_id(pid);
                    if done.send((pid, tries, t, exe, symbols::images(pid))).is_err() {
                        return;
                    }
                    waker.wake();
                }
            })
            .context("cannot start the thread that reads new binaries' symbols")?;
        Ok(Watcher {
            filter,
            node_exes: HashSet::new(),
            other_exes: HashSet::new(),
            other_runtimes: HashMap::new(),
            retry: Vec::new(),
            in_worker: HashSet::new(),
            exec_again: HashSet::new(),
            to_worker,
            from_worker,
            own_exe: exe_id(std::process::id()),
        })
    }

    /// Whether the worker has something coming (the agent then polls sooner).
    pub fn busy(&self) -> bool {
        !self.in_worker.is_empty() || !self.retry.is_empty()
    }

    /// A process not traced yet (found at start or reported at exec): found
    /// at once if its executable is a known Node, else handed to the worker,
    /// or skipped (not Node, or not in scope).
    pub fn consider(&mut self, pid: u32, tries: u32) -> Result<Option<Found>, Trouble> {
        if self.in_worker.contains(&pid) {
            self.exec_again.insert(pid); // look again once the worker is done with it
            return Ok(None);
        }
        if pid == std::process::id() {
            return Ok(None);
        }
        let Some(exe) = exe_id(pid) else { return Ok(None) };
        if self.other_exes.contains(&exe) || Some(exe) == self.own_exe {
            return Ok(None);
        }
        let Some(cand) = Candidate::read(pid) else { return Ok(None) };
        if !self.filter.admits(&cand) {
            return Ok(None);
        }
        if let Some(what) = self.other_runtimes.get(&exe) {
            return Err(Trouble { pid, error: anyhow::anyhow!("{what}") });
        }
        if self.node_exes.contains(&exe) {
            let since = Instant::now();
            return match symbols::images(pid) {
                Ok(images) => Ok(Some(Found { pid, images, since })),
                // Gone meanwhile: nothing to say.
                Err(_) if exe_id(pid).is_none() => Ok(None),
                Err(error) => Err(Trouble { pid, error }),
            };
        }
        if self.to_worker.send((pid, tries)).is_ok() {
            self.in_worker.insert(pid);
        }
        Ok(None)
    }

    /// What the worker has read, and retries that are due: processes to
    /// trace (and troubles to say).
    pub fn poll(&mut self) -> (Vec<Found>, Vec<Trouble>) {
        let (mut found, mut trouble) = (Vec::new(), Vec::new());
        let mut keep = |r: Result<Option<Found>, Trouble>| match r {
            Ok(Some(f)) => found.push(f),
            Ok(None) => {}
            Err(t) => trouble.push(t),
        };
        while let Ok((pid, tries, since, exe, result)) = self.from_worker.try_recv() {
            self.in_worker.remove(&pid);
            let again = self.exec_again.remove(&pid);
            let Some(exe) = exe else { continue };
            if again || exe_id(pid) != Some(exe) {
                // It exec'd something else while the worker looked (a shell
                // starting node): what was read may be either; look again.
                keep(self.consider(pid, tries));
                continue;
            }
            match result {
                Ok(images) => {
                    self.node_exes.insert(exe);
                    keep(Ok(Some(Found { pid, images, since })));
                }
                // Another JavaScript runtime: said for this process and
                // every later one of the file.
                Err(error) if symbols::is_other_runtime(&error) => {
                    self.other_runtimes.insert(exe, format!("{error:#}"));
                    keep(Err(Trouble { pid, error }));
                }
                // Not Node (most execs on a host), or a shared libuv not
                // mapped yet: look again shortly (5 times, 20 ms apart).
                Err(_) if !links_shared_libuv(pid) => {
                    self.other_exes.insert(exe);
                }
                Err(_) if tries < 5 => self.retry.push((pid, Instant::now() + Duration::from_millis(20), tries + 1)),
                Err(error) if exe_id(pid).is_some() => keep(Err(Trouble { pid, error })),
                Err(_) => {}
            }
        }
        let now = Instant::now();
        let due: Vec<(u32, Instant, u32)> = self.retry.iter().filter(|r| r.1 <= now).copied().collect();
        self.retry.retain(|r| r.1 > now);
        for (pid, _, tries) in due {
            keep(self.consider(pid, tries));
        }
        (found, trouble)
    }
}
