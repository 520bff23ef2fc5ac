//! `--publish-trace-context`: the pinned map a profiler reads to put a trace
//! id and span id on each CPU sample of a loop thread (the OpenTelemetry eBPF
//! profiler with `-obi-process-ctx`): `/sys/fs/bpf/otel/traces_ctx_v1`, an
//! LRU hash of 16,384 entries, key `u64` (tgid << 32 | tid in the kernel's
//! initial PID namespace), value `{ u8 trace_id[16]; u8 span_id[8]; }`.
//!
//! uvspan makes and pins it (mounting the BPF filesystem first where it is
//! not, and saying so), or reuses one pinned there with that layout (another
//! tool made it first); another layout is refused. At exit it leaves it as it
//! found it: the entries of its threads removed, the map unpinned (and the
//! directory and mount it made removed) only if uvspan made it.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

pub const BPFFS: &str = "/sys/fs/bpf";
pub const DIR: &str = "/sys/fs/bpf/otel";
pub const PATH: &str = "/sys/fs/bpf/otel/traces_ctx_v1";
pub const NAME: &str = "traces_ctx_v1";
pub const KEY_SIZE: u32 = 8;
pub const VALUE_SIZE: u32 = 24;
pub const MAX_ENTRIES: u32 = 16384;

/// The BPF filesystem's magic (linux/magic.h: BPF_FS_MAGIC).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The map, and what uvspan made to have it (undone at [`Published::close`]).
pub struct Published {
    /// None only while being opened.
    map: Option<MapHandle>,
    made_map: bool,
    made_dir: bool,
    mounted: bool,
    /// The kernel side's ctx_threads (the threads that had an entry).
    threads: Option<MapHandle>,
    /// The run's random key of the ids (bpf/ops.h: ctx_ids).
    pub key: [u64; 2],
    closed: bool,
}

fn is_bpffs(path: &str) -> bool {
    let Ok(c) = CString::new(path) else { return false };
    // SAFETY: statfs writes into the zeroed struct we own; `c` is a valid
    // NUL-terminated path.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == BPF_FS_MAGIC
    }
}

fn random_key() -> [u64; 2] {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most b.len() bytes into the buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // Not expected on Linux >= 3.17; the time and pid still differ per run.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        b = (t ^ (u128::from(std::process::id()) << 64)).to_ne_bytes();
    }
    [u64::from_ne_bytes(b[..8].try_into().unwrap_or_default()), u64::from_ne_bytes(b[8..].try_into().unwrap_or_default())]
}

/// Whether a map of this type and sizes is the one a profiler reads.
pub fn layout_fits(ty: MapType, key_size: u32, value_size: u32) -> bool {
    ty == MapType::LruHash && key_size == KEY_SIZE && value_size == VALUE_SIZE
}

impl Published {
    /// Makes or reuses the pinned map.
    pub fn open() -> Result<Published> {
        Self::open_at(Path::new(PATH))
    }

    fn open_at(path: &Path) -> Result<Published> {
        let mut mounted = false;
        if !is_bpffs(BPFFS) {
            let (src, target, fs) = (c"bpf", CString::new(BPFFS)?, c"bpf");
            // SAFETY: every argument is a valid NUL-terminated string; no data.
            let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                bail!(
                    "--publish-trace-context: the BPF filesystem is not mounted at {BPFFS} and uvspan cannot mount it ({e}): \
                     mount it (mount -t bpf bpf {BPFFS}) or run uvspan with CAP_SYS_ADMIN"
                );
            }
            mounted = true;
            eprintln!("uvspan: mounted the BPF filesystem at {BPFFS} for the trace context map (unmounted at exit)");
        }
        let mut p = Published { map: None, made_map: false, made_dir: false, mounted, threads: None, key: random_key(), closed: false };
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(DIR));
        if !dir.exists() {
            if let Err(e) = std::fs::create_dir(&dir) {
                bail!("--publish-trace-context: cannot make {} ({e}): make it, or run uvspan as root", dir.display());
            }
            p.made_dir = true;
        }
        if path.exists() {
            let map = match MapHandle::from_pinned_path(path) {
                Ok(m) => m,
                Err(e) => bail!(
                    "--publish-trace-context: {} is there but is no BPF map uvspan can open ({e}): remove it or stop what pinned it",
                    path.display()
                ),
            };
            if !layout_fits(map.map_type(), map.key_size(), map.value_size()) {
                bail!(
                    "--publish-trace-context: {} has another layout ({}, key {} bytes, value {} bytes; a profiler reads an LRU hash \
                     with 8-byte keys and 24-byte values): remove it or stop what pinned it",
                    path.display(),
                    map_type_name(map.map_type()),
                    map.key_size(),
                    map.value_size()
                );
            }
            p.map = Some(map);
            return Ok(p);
        }
        let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
            ..Default::default()
        };
        let mut map = match MapHandle::create(MapType::LruHash, Some(NAME), KEY_SIZE, VALUE_SIZE, MAX_ENTRIES, &opts) {
            Ok(m) => m,
            Err(e) => bail!("--publish-trace-context: cannot make the trace context map ({e}): run uvspan as root"),
        };
        if let Err(e) = map.pin(path) {
            bail!("--publish-trace-context: cannot pin the trace context map at {} ({e}): run uvspan as root", path.display());
        }
        p.map = Some(map);
        p.made_map = true;
        Ok(p)
    }

    /// The map's fd, for the kernel side's traces_ctx_v1.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.map.as_ref().map(AsFd::as_fd)
    }

    /// The kernel side's record of the threads it published for.
    pub fn set_threads(&mut self, threads: MapHandle) {
        self.threads = Some(threads);
    }

    /// Leaves the map as found: the entries of the threads uvspan published
    /// for removed; unpinned, and the directory and mount removed, if uvspan
    /// made them. Call once the kernel side publishes no more.
    pub fn close(mut self) {
        self.undo();
    }

    fn undo(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if let (Some(t), Some(m)) = (&self.threads, &self.map) {
            let keys: Vec<Vec<u8>> = t.keys().collect();
            for k in keys {
                let _ = m.delete(&k);
            }
        }
        if self.made_map {
            let _ = std::fs::remove_file(PATH);
        }
        if self.made_dir {
            let _ = std::fs::remove_dir(DIR);
        }
        if self.mounted {
            if let Ok(t) = CString::new(BPFFS) {
                // SAFETY: a valid NUL-terminated path; a busy mount stays.
                unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }

    /// The entry of a thread (tests and diagnostics).
    pub fn lookup(&self, key: u64) -> Option<Vec<u8>> {
        self.map.as_ref()?.lookup(&key.to_ne_bytes(), MapFlags::ANY).ok().flatten()
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        self.undo();
    }
}

fn map_type_name(t: MapType) -> String {
    match t {
        MapType::Hash => "a hash".into(),
        MapType::LruHash => "an LRU hash".into(),
        MapType::Array => "an array".into(),
        MapType::PercpuHash => "a per-CPU hash".into(),
        MapType::LruPercpuHash => "a per-CPU LRU hash".into(),
        other => format!("map type {}", other as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_profilers_layout_fits() {
        assert!(layout_fits(MapType::LruHash, 8, 24));
        assert!(!layout_fits(MapType::Hash, 8, 24));
        assert!(!layout_fits(MapType::LruHash, 4, 24));
        assert!(!layout_fits(MapType::LruHash, 8, 32));
    }
}
