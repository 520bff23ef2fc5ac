//! Where libuv lives in a process (the executable, or a libuv.so/libnode.so
//! it maps) and libc beside it. What each file holds is read by [`elf`]
//! (the catalog's symbol offsets, at [`point`]s the kernel can emulate),
//! once per build and cached in memory and on disk ([`cache`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::probes::catalog::ImageKind;

pub mod cache;
pub mod elf;
pub mod point;
pub mod v8meta;

pub use cache::{cache_dir, set_cache_dir, DEFAULT_CACHE_DIR};
pub use elf::{inspect, Image};

/// The files a process's probes go into: where libuv is, and libc (the
/// loop's epoll waits where the kernel refuses fentry; the getaddrinfo
/// fallback of builds that only export libuv's API).
#[derive(Clone, Debug)]
pub struct Images {
    pub libuv: Located,
    pub libc: Option<Located>,
    /// V8's image when it is not libuv's: the libnode.so beside a shared
    /// libuv.so (Debian's node). None: V8 is in libuv's image (or absent).
    pub v8: Option<Located>,
    /// Node's version: from the libuv image, or from the libnode.so next to
    /// a shared libuv.
    pub node_version: Option<String>,
}

impl Images {
    pub fn new(libuv: Located, libc: Option<Located>) -> Images {
        // A shared libuv: V8 and Node's version are in the libnode.so beside it.
        let libnode = if libuv.image.has_v8() { None } else { libnode_beside(&libuv) };
        let node_version = libuv.image.node_version.clone().or_else(|| libnode.as_ref()?.image.node_version.clone());
        let v8 = libnode.filter(|l| l.image.has_v8());
        Images { libuv, libc, v8, node_version }
    }

    /// The file a probe of `kind` goes to.
    pub fn of(&self, kind: ImageKind) -> Option<&Located> {
        match kind {
            ImageKind::Libuv => Some(&self.libuv),
            ImageKind::Libc => self.libc.as_ref(),
            ImageKind::V8 => Some(self.v8.as_ref().unwrap_or(&self.libuv)),
        }
    }
}

/// The libnode.so in the directory of a shared libuv (as the process sees
/// it: through /proc/PID/root when libuv was found in a process).
fn libnode_beside(libuv: &Located) -> Option<Located> {
    let dir = Path::new(&libuv.path).parent()?.to_path_buf();
    let root = libuv.attach_path.to_string_lossy().split("/map_files/").next().map(|p| PathBuf::from(p).join("root"));
    let (seen, real) = match root.filter(|r| r.exists()) {
        Some(r) => (dir.clone(), r.join(dir.strip_prefix("/").unwrap_or(&dir))),
        None => (dir.clone(), dir),
    };
    let mut names: Vec<String> = std::fs::read_dir(&real)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("libnode.so"))
        .collect();
    names.sort();
    names.into_iter().find_map(|name| {
        let attach = real.join(&name);
        let image = inspect(&attach).ok()?;
        Some(Located { attach_path: attach, path: seen.join(&name).display().to_string(), image })
    })
}

/// One ELF file of a process.
#[derive(Clone, Debug)]
pub struct Located {
    /// Path uprobes attach to: opens the very file the process maps, even if
    /// it was deleted or replaced, or lives in another mount namespace.
    pub attach_path: PathBuf,
    /// The path as the process sees it (for display).
    pub path: String,
    pub image: Arc<Image>,
}

/// The path to attach to for a file a process maps: /proc/PID/map_files
/// opens the very file (deleted, replaced or in another mount namespace).
fn mapped_file(pid: u32, range: &str, path: &str) -> PathBuf {
    let attach = PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
    if attach.exists() {
        attach
    } else {
        PathBuf::from(format!("/proc/{pid}/root/{}", path.trim_start_matches('/')))
    }
}

/// (address range as map_files names it, path) of each file a process
/// maps, first mapping only.
fn mapped_files(pid: u32) -> Result<Vec<(String, String)>> {
    let maps = procfs::process::Process::new(pid as i32).and_then(|p| p.maps()).with_context(|| format!("cannot read /proc/{pid}/maps"))?;
    let mut out: Vec<(String, String)> = Vec::new();
    for m in maps {
        let procfs::process::MMapPath::Path(path) = &m.pathname else { continue };
        let path = path.to_string_lossy().into_owned();
        if !out.iter().any(|(_, p)| *p == path) {
            out.push((format!("{:x}-{:x}", m.address.0, m.address.1), path));
        }
    }
    Ok(out)
}

fn is_libc(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

/// Where the dynamic loader finds libc on x86_64 distributions (Debian's
/// multiarch directories first, then Fedora's and Alpine's).
const LIBC_DIRS: [&str; 6] = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// libc as mapped by a process; for a process found at exec, before its
/// dynamic loader mapped libc, the one in the process's own root (its
/// container's files, not uvspan's).
pub fn locate_libc(pid: u32) -> Option<Located> {
    let Some((range, path)) = mapped_files(pid).ok()?.into_iter().find(|(_, p)| is_libc(p)) else {
        return root_libc(pid);
    };
    let attach = mapped_file(pid, &range, &path);
    let image = inspect(&attach).ok()?;
    Some(Located { attach_path: attach, path, image })
}

/// libc.so.6 in a process's root, where its dynamic loader will find it.
fn root_libc(pid: u32) -> Option<Located> {
    LIBC_DIRS.iter().find_map(|dir| {
        let path = format!("{dir}/libc.so.6");
        let attach = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let image = inspect(&attach).ok()?;
        Some(Located { attach_path: attach, path, image })
    })
}

/// Everything to attach to in a running process.
pub fn images(pid: u32) -> Result<Images> {
    Ok(Images::new(locate(pid)?, locate_libc(pid)))
}

/// Finds libuv in a running process: the executable itself, or a shared
/// library it maps (libuv.so, libnode.so).
pub fn locate(pid: u32) -> Result<Located> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let exe_link = proc.join("exe");
    let exe =
        std::fs::read_link(&exe_link).with_context(|| format!("cannot read {} (process gone, or no permission)", exe_link.display()))?;
    let exe_str = exe.to_string_lossy().trim_end_matches(" (deleted)").to_string();
    let img = inspect(&exe_link)?;
    refuse_other_runtime(&exe_str, &img)?;
    if img.has_libuv() {
        return Ok(Located { attach_path: exe_link, path: exe_str, image: img });
    }
    // Shared libraries, in the order the process mapped them.
    for (range, path) in mapped_files(pid)? {
        let name = path.rsplit('/').next().unwrap_or(&path);
        if !(name.starts_with("libuv") || name.starts_with("libnode")) {
            continue;
        }
        let attach = mapped_file(pid, &range, &path);
        if let Ok(img) = inspect(&attach) {
            if img.has_libuv() {
                return Ok(Located { attach_path: attach, path, image: img });
            }
        }
    }
    bail!("no libuv found in process {pid} ({exe_str}): it is not a Node.js process, or its libuv is not visible")
}

/// The error of an executable of another JavaScript runtime (Bun) that
/// exports libuv's API but does not run on it.
#[derive(Debug)]
pub struct OtherRuntime(String);

impl std::fmt::Display for OtherRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for OtherRuntime {}

/// Whether `e` says a program is another JavaScript runtime, not Node.js.
pub fn is_other_runtime(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<OtherRuntime>().is_some())
}

/// An executable of another JavaScript runtime (Bun) that exports libuv's
/// API but does not run on it: said as what it is, in one line.
fn refuse_other_runtime(path: &str, img: &Image) -> Result<()> {
    match &img.not_node {
        Some(what) => Err(OtherRuntime(format!(
            "{path} is {what}, not Node.js (its I/O does not go through libuv: it only exports libuv's API for native addons)"
        ))
        .into()),
        None => Ok(()),
    }
}

/// libuv in an executable not yet started (the `--` command): the file
/// itself, or the libuv.so / libnode.so it links against, looked up like the
/// dynamic loader would (LD_LIBRARY_PATH, then the system directories).
pub fn locate_file(path: &Path) -> Result<Located> {
    let img = inspect(path)?;
    refuse_other_runtime(&path.display().to_string(), &img)?;
    if img.has_libuv() {
        return Ok(Located { attach_path: path.to_path_buf(), path: path.display().to_string(), image: img });
    }
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let needs = |lib: &str| memchr::memmem::find(&data, lib.as_bytes()).is_some();
    if needs("libuv.so") || needs("libnode.so") {
        let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let dirs = ld
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .chain(["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", "/usr/lib", "/lib"].map(PathBuf::from));
        for dir in dirs {
            for name in ["libuv.so.1", "libuv.so"] {
                let cand = dir.join(name);
                if let Ok(img) = inspect(&cand) {
                    if img.has_libuv() {
                        return Ok(Located { attach_path: cand.clone(), path: cand.display().to_string(), image: img });
                    }
                }
            }
        }
    }
    bail!("{} contains no libuv symbols, and no libuv.so it links against was found: it is not a Node.js binary", path.display())
}

/// libc of this system (for a command not started yet: it will load the same).
pub fn system_libc() -> Option<Located> {
    locate_libc(std::process::id()).map(|mut l| {
        // Our own map_files entry dies with us: attach by path instead.
        l.attach_path = PathBuf::from(&l.path);
        l
    })
}
