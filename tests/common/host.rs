//! Facts about this host and about live processes: host name, cgroup path,
//! memory and open file descriptors.

/// This machine's host name, as uname(2) reports it.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(r, 0, "gethostname failed");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The cgroup path a /proc/PID/cgroup text names: the cgroup v2 entry
/// ("0::/path"), else the first (v1) line's path.
pub fn cgroup_of(proc_cgroup: &str) -> String {
    // The v2 path ("0::/path"), unless it is the root while a v1 hierarchy
    // names a real group (hybrid hosts such as this CI machine).
    let paths: Vec<&str> = proc_cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2)).collect();
    let v2 = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"));
    match v2 {
        Some(p) if p != "/" => p,
        _ => paths
            .iter()
            .copied()
            .find(|p| *p != "/")
            .or(v2)
            .or(paths.first().copied())
            .unwrap_or_else(|| panic!("cannot read a cgroup path from {proc_cgroup:?}")),
    }
    .to_string()
}

/// VmRSS of a live process, KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// A `kB` field of a live process's /proc/PID/status (`VmRSS`, `VmHWM`, …).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Copies the executable `bin` into the root directory `root` at `at`
/// (absolute, as seen inside), with the shared libraries it links (`ldd`)
/// at their paths: a container's root filesystem of that program.
pub fn copy_with_libs(bin: &std::path::Path, root: &std::path::Path, at: &str) {
    let put = |from: &std::path::Path, to: &str| {
        let to = root.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a folder")).expect("mkdir");
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {} into {}: {e}", from.display(), root.display()));
    };
    put(bin, at);
    let ldd = std::process::Command::new("ldd").arg(bin).output().expect("ldd (libc-bin)");
    for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
        put(std::path::Path::new(lib), lib);
    }
}

/// Open file descriptors of a live process.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
}

/// Whether this kernel has session uprobes (Linux >= 6.13): uvspan then
/// ends sync fs calls at their return and leaves uv_fs_req_cleanup out
/// where nothing else ends there.
pub fn session_uprobes() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("/proc/sys/kernel/osrelease");
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 13)
}

/// Every open file's /proc/PID/fdinfo, as `key: value` pairs (BPF objects
/// say what they are there: map_id, prog_id, link_type, tp_name, path, ...).
pub fn fdinfos(pid: u32) -> Vec<std::collections::BTreeMap<String, String>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|info| info.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect())
        .collect()
}

/// The BPF links a process holds (the fdinfos with a link_type).
pub fn bpf_links(pid: u32) -> Vec<std::collections::BTreeMap<String, String>> {
    fdinfos(pid).into_iter().filter(|i| i.contains_key("link_type")).collect()
}
