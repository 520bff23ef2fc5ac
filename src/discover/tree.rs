//! `-- COMMAND`'s process tree: uvspan is its subreaper (what a shell leaves
//! running, `node a.js &`, stays uvspan's descendant), signals reach every
//! process of it, and what is still running when the command has exited is
//! stopped, so that no process uvspan started outlives it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Makes uvspan the subreaper of what it starts: orphaned descendants are
/// reparented to it (not to init), so they can be found and stopped.
pub fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only sets a flag on this
    // process; its other arguments are unused.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The parent of every process in /proc (pid -> ppid).
fn parents() -> HashMap<u32, u32> {
    let Ok(all) = procfs::process::all_processes() else { return HashMap::new() };
    all.flatten()
        .filter_map(|p| {
            let s = p.stat().ok()?;
            // Zombies have exited already: nothing to signal.
            (s.state != 'Z').then_some((u32::try_from(s.pid).ok()?, u32::try_from(s.ppid).ok()?))
        })
        .collect()
}

/// Every live process below `root` (not `root` itself), parents first.
pub fn descendants(root: u32) -> Vec<u32> {
    descendants_in(&parents(), root)
}

fn descendants_in(parents: &HashMap<u32, u32>, root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, &ppid) in parents {
        children.entry(ppid).or_default().push(pid);
    }
    let (mut out, mut seen) = (Vec::new(), HashSet::from([root]));
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if seen.insert(c) {
                out.push(c);
                next.push(c);
            }
        }
    }
    out
}

/// Sends `sig` to each of `pids`.
pub fn signal(pids: &[u32], sig: i32) {
    for &pid in pids {
        if let Ok(p) = i32::try_from(pid) {
            // SAFETY: kill(2) with a pid of uvspan's own process tree and a
            // valid signal number.
            unsafe { libc::kill(p, sig) };
        }
    }
}

/// Reaps uvspan's exited children but `keep` (the command, whose status its
/// own thread waits for): orphans reparented to uvspan leave no zombie.
pub fn reap_orphans(keep: Option<u32>) {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with WNOWAIT only looks at a child that exited;
        // `info` is ours to write.
        let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        // SAFETY: si_pid is set by waitid (0 when no child has exited).
        let pid = unsafe { info.si_pid() };
        if r != 0 || pid <= 0 || keep.is_some_and(|k| k as i32 == pid) {
            return;
        }
        // SAFETY: reaps exactly that child, which has exited.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// Stops what is left below uvspan once the command has exited: SIGTERM,
/// then SIGKILL for what is still there after `grace`. The pids stopped.
pub fn stop_leftovers(grace: Duration) -> Vec<u32> {
    let me = std::process::id();
    let left = descendants(me);
    if left.is_empty() {
        return left;
    }
    signal(&left, libc::SIGTERM);
    let until = Instant::now() + grace;
    loop {
        reap_orphans(None);
        let still = descendants(me);
        if still.is_empty() {
            break;
        }
        if Instant::now() >= until {
            signal(&still, libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(20));
            reap_orphans(None);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_of_a_tree_and_nothing_else() {
        // 10 -> 11 -> 13, 10 -> 12; 20 -> 21 is another tree; a loop
        // (bad input: pids reused while read) ends.
        let parents: HashMap<u32, u32> = [(11, 10), (12, 10), (13, 11), (21, 20), (30, 31), (31, 30)].into_iter().collect();
        let mut d = descendants_in(&parents, 10);
        d.sort_unstable();
        assert_eq!(d, vec![11, 12, 13]);
        assert!(descendants_in(&parents, 13).is_empty());
        let mut l = descendants_in(&parents, 30);
        l.sort_unstable();
        assert_eq!(l, vec![31], "the root itself is never its own descendant");
    }
}
