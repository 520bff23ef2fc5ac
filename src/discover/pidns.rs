//! PID namespaces: who a process is, to uvspan and to itself.
//!
//! The kernel side gives every id in uvspan's own PID namespace (the ids its
//! /proc, `perf_event_open` and the uprobe pid filters use): the kernel's own
//! ids where uvspan runs in the initial namespace, else translated in BPF
//! (`current_ids` in bpf/common.h) from the namespace found here. A
//! traced process may live in a namespace nested below uvspan's (an app
//! container seen from a DaemonSet): its spans carry the ids it sees itself
//! (`NSpid`, the last one), as its own OpenTelemetry SDK reports them.

use std::os::unix::fs::MetadataExt;

use anyhow::{bail, Result};

/// The inode of the initial PID namespace (the kernel's `PROC_PID_INIT_INO`).
const INIT_INO: u64 = 0xEFFF_FFFC;

/// A PID namespace as the BPF helper `bpf_get_ns_current_pid_tgid` names it:
/// the nsfs device (the kernel's encoding) and the namespace's inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidNs {
    pub dev: u64,
    pub ino: u64,
}

/// The kernel's `dev_t` (major << 20 | minor) of a `stat` device number.
fn kernel_dev(st_dev: u64) -> u64 {
    (u64::from(libc::major(st_dev)) << 20) | u64::from(libc::minor(st_dev))
}

/// uvspan's own PID namespace; `None` for the initial one (the kernel's ids
/// are uvspan's). Fails, in one line saying what to do, where uvspan cannot
/// map the kernel's ids to its own: a `/proc` that belongs to another PID
/// namespace than uvspan's (e.g. `unshare --pid --fork` without
/// `--mount-proc`), whose pids no probe filter or record would match.
pub fn own() -> Result<Option<PidNs>> {
    let ns = match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) => PidNs { dev: kernel_dev(m.dev()), ino: m.ino() },
        Err(e) => bail!("cannot read /proc/self/ns/pid ({e}): uvspan needs /proc mounted (mount -t proc proc /proc)"),
    };
    let proc_self = std::fs::read_link("/proc/self").ok().and_then(|p| p.to_str()?.parse::<u32>().ok());
    let me = std::process::id();
    if proc_self != Some(me) {
        bail!(
            "/proc belongs to another PID namespace than uvspan's (it names uvspan {}, uvspan is {me} in its own): \
             the kernel's process ids cannot be matched to /proc's; mount a /proc of uvspan's namespace \
             (unshare --pid --fork --mount-proc, a container's own /proc) or run uvspan in the host's PID namespace",
            proc_self.map_or_else(|| "nothing".to_string(), |p| p.to_string())
        );
    }
    Ok((ns.ino != INIT_INO).then_some(ns))
}

/// A task's ids in `NSpid:` of a `/proc/.../status` text, from the /proc
/// reader's PID namespace down to the task's own (the last one: what it
/// sees itself as). Empty when there is no such line (a kernel before 4.1)
/// or it does not parse.
pub fn nspid(status: &str) -> Vec<u32> {
    let Some(line) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) else { return Vec::new() };
    line.split_whitespace().map(str::parse).collect::<Result<_, _>>().unwrap_or_default()
}

/// [`nspid`] of a process (`/proc/PID`) or one of its threads
/// (`/proc/PID/task/TID`); empty when it cannot be read (gone).
fn chain(pid: u32, tid: Option<u32>) -> Vec<u32> {
    let path = match tid {
        Some(t) => format!("/proc/{pid}/task/{t}/status"),
        None => format!("/proc/{pid}/status"),
    };
    // A status file is a few KiB; read at most 16 KiB of it.
    read_bounded(&path, 16 * 1024).map(|text| nspid(&text)).unwrap_or_default()
}

/// The id a process or thread sees itself as; None when it cannot be read
/// or is the one uvspan sees.
pub fn view_of(pid: u32, tid: Option<u32>) -> Option<u32> {
    chain(pid, tid).last().copied().filter(|&v| v != tid.unwrap_or(pid))
}

fn read_bounded(path: &str, max: u64) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path).ok()?.take(max).read_to_string(&mut s).ok()?;
    Some(s)
}

/// A process as it sees itself (None: as uvspan sees it) and its parent
/// `ppid` as the process sees it: the parent only where both live in the
/// same PID namespace (a container's first process sees none).
pub fn own_ids(pid: u32, ppid: Option<u32>) -> (Option<u32>, Option<u32>) {
    let mine = chain(pid, None);
    let own = mine.last().copied().filter(|&v| v != pid);
    let parent = match own {
        None => ppid,
        Some(_) => ppid.and_then(|pp| {
            let theirs = chain(pp, None);
            (theirs.len() == mine.len()).then(|| theirs.last().copied()).flatten()
        }),
    };
    (own, parent)
}

/// A traced process's ids as it sees them, for a process in a PID namespace
/// nested below uvspan's (threads looked up once each, bounded).
#[derive(Clone, Debug, Default)]
pub struct Views {
    /// The process's own pid (its `process.pid`).
    pub pid: u32,
    tids: rustc_hash::FxHashMap<u32, u32>,
}

/// Threads whose own ids are remembered per process (a thread pool is a few;
/// past this the table starts again).
const TIDS_MAX: usize = 4096;

impl Views {
    /// A process that sees itself as `own`.
    pub fn new(own: u32) -> Views {
        Views { pid: own, tids: Default::default() }
    }

    /// A thread's id as the process sees it (uvspan's id when it cannot be
    /// read: a thread already gone).
    pub fn tid(&mut self, pid: u32, tid: u32) -> u32 {
        if tid == pid {
            return self.pid;
        }
        if let Some(&t) = self.tids.get(&tid) {
            return t;
        }
        if self.tids.len() >= TIDS_MAX {
            self.tids.clear();
        }
        let own = view_of(pid, Some(tid)).unwrap_or(tid);
        self.tids.insert(tid, own);
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_runs_from_the_readers_namespace_to_the_process_own() {
        let status = "Name:\tnode\nTgid:\t29845\nPid:\t29845\nNSpid:\t29845\t12\t1\nPPid:\t1\n";
        assert_eq!(nspid(status), vec![29845, 12, 1]);
        assert_eq!(nspid("Name:\tnode\nNSpid:\t7\n"), vec![7]);
    }

    #[test]
    fn no_or_bad_nspid_is_empty() {
        assert!(nspid("Name:\tnode\nPid:\t7\n").is_empty());
        assert!(nspid("NSpid:\n").is_empty());
        assert!(nspid("NSpid:\t7 x\n").is_empty());
        assert!(nspid("").is_empty());
    }

    #[test]
    fn stat_devices_in_the_kernel_encoding() {
        // nsfs is an anonymous device: major 0, a small minor.
        assert_eq!(kernel_dev(libc::makedev(0, 4)), 4);
        assert_eq!(kernel_dev(libc::makedev(8, 1)), (8 << 20) | 1);
        assert_eq!(kernel_dev(libc::makedev(0, 300)), 300);
    }

    #[test]
    fn uvspan_sees_itself_in_its_own_namespace() {
        // The test runs wherever cargo does: /proc is its own.
        let ns = own().expect("the test's /proc is its namespace's");
        let meta = std::fs::metadata("/proc/self/ns/pid").expect("ns link");
        assert_eq!(ns.is_none(), meta.ino() == INIT_INO);
        let me = std::process::id();
        assert_eq!(view_of(me, None), None, "the test sees itself as it is");
        assert_eq!(own_ids(me, Some(1)), (None, Some(1)), "its parent as /proc says");
    }
}
