//! Cgroups of a test's own (v1 where this host has a pids hierarchy, else
//! v2), fake container ids, and unique names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::runner::wait_until;

/// A cgroup of the test's own, in a v1 hierarchy (pids) where this hybrid
/// host has one, else cgroup v2; removed on drop (its processes killed first:
/// only this test's processes are ever put in it).
pub struct Cgroup {
    /// The hierarchy's mount point.
    pub root: PathBuf,
    /// The path inside the hierarchy, "/a/b" (what /proc/PID/cgroup shows).
    pub path: String,
    /// Directories created, outermost first.
    created: Vec<PathBuf>,
}

pub fn cgroup_mount() -> PathBuf {
    match hierarchy("pids") {
        Some((root, _)) => root,
        None => panic!("no cgroup v1 pids hierarchy and no cgroup v2 mounted: cannot make a test cgroup"),
    }
}

/// Where `controller` is: its cgroup v1 hierarchy (true), else the cgroup
/// v2 mount (false); None without either.
pub fn hierarchy(controller: &str) -> Option<(PathBuf, bool)> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("read /proc/self/mounts");
    let mut v2 = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        if f[2] == "cgroup" && f[3].split(',').any(|o| o == controller) {
            return Some((PathBuf::from(f[1]), true));
        }
        if f[2] == "cgroup2" && v2.is_none() {
            v2 = Some((PathBuf::from(f[1]), false));
        }
    }
    v2
}

pub fn unique(tag: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{tag}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

impl Cgroup {
    /// `rel` is a path like "a/b/c" created under the hierarchy root.
    pub fn create(rel: &str) -> Cgroup {
        let root = cgroup_mount();
        let mut created = Vec::new();
        let mut cur = root.clone();
        for seg in rel.split('/').filter(|s| !s.is_empty()) {
            cur = cur.join(seg);
            if !cur.exists() {
                std::fs::create_dir(&cur).unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", cur.display()));
                created.push(cur.clone());
            }
        }
        assert!(!created.is_empty(), "cgroup {rel} already existed");
        Cgroup { root, path: format!("/{}", rel.trim_matches('/')), created }
    }

    pub fn procs_file(&self) -> String {
        self.root.join(self.path.trim_start_matches('/')).join("cgroup.procs").to_string_lossy().into_owned()
    }

    /// Makes `cmd`'s process move itself into this cgroup before it execs.
    pub fn enter_before_exec(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(self.procs_file()).expect("cgroup path");
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls (open, write, close) on memory
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself (cgroup v1 and v2).
                let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                if r < 0 {
                    return Err(e);
                }
                Ok(())
            });
        }
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.procs_file(), pid.to_string()).unwrap_or_else(|e| panic!("cannot move {pid} into {}: {e}", self.path));
    }

    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for d in &self.created {
            if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
                out.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        out
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill(2); only this test's processes are in its cgroup.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for d in self.created.iter().rev() {
            let has_children = || std::fs::read_dir(d).is_ok_and(|rd| rd.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())));
            if has_children() {
                break; // a parent shared with another Cgroup of the test: its owner removes it
            }
            // Killed processes may take a moment to leave.
            let _ = wait_until(Duration::from_secs(5), || std::fs::remove_dir(d).is_ok() || !d.exists());
        }
    }
}

/// A fake 64-hex container id, different per call.
pub fn container_hex(seed: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut out = String::new();
    let mut i = 0u64;
    while out.len() < 64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (seed, unique("c"), i).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
        i += 1;
    }
    out
}

/// Removes the test's top cgroup directories left after the leaves went.
pub struct TopCgroup(pub PathBuf);

impl Drop for TopCgroup {
    fn drop(&mut self) {
        // Leaves are removed by their Cgroup; remove whatever empty dirs remain, deepest first.
        fn rm(p: &Path) {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        rm(&e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(p);
        }
        rm(&self.0);
    }
}
