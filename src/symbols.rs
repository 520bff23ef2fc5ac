//! Where libuv lives in a process, and the file offsets of the catalog's
//! symbols there. ELF files are parsed once per build-id (or path when there
//! is none) and the result cached, so attaching to the 50th process of a
//! build costs no re-parse of its ~100 MB binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::probes::catalog;

/// What uvspan knows about one ELF file holding libuv.
#[derive(Debug)]
pub struct Image {
    pub build_id: Option<String>,
    /// symbol -> file offset, for the catalog symbols present.
    pub offsets: HashMap<&'static str, u64>,
    /// Whether a .symtab was present (else only .dynsym exports).
    pub has_symtab: bool,
    /// Node version found in the file ("v20.20.2"), when it can be told.
    pub node_version: Option<String>,
}

impl Image {
    pub fn has_libuv(&self) -> bool {
        self.offsets.contains_key("uv_fs_open") || self.offsets.contains_key("uv_run")
    }
}

/// libuv inside one process.
#[derive(Clone, Debug)]
pub struct Located {
    /// Path uprobes attach to: opens the very file the process maps, even if
    /// it was deleted or replaced, or lives in another mount namespace.
    pub attach_path: PathBuf,
    /// The path as the process sees it (for display).
    pub path: String,
    pub image: Arc<Image>,
}

fn cache() -> &'static Mutex<HashMap<String, Arc<Image>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Image>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Reads (or fetches from the cache) the image at `path`.
pub fn inspect(path: &Path) -> Result<Arc<Image>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the mapping is read-only and private; the file may change under
    // us (a binary being replaced), in which case we parse garbage and fail
    // with an error, not UB on our side beyond reading stale bytes.
    let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
    let elf = object::File::parse(&*map).with_context(|| format!("{} is not an ELF file", path.display()))?;
    let build_id = elf.build_id().ok().flatten().map(hex);
    let meta = file.metadata()?;
    let key = build_id.clone().unwrap_or_else(|| {
        use std::os::unix::fs::MetadataExt;
        format!("{}:{}:{}", meta.dev(), meta.ino(), meta.mtime())
    });
    if let Some(img) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(img.clone());
    }
    let img = Arc::new(parse(&elf, &map, build_id));
    cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, img.clone());
    Ok(img)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn parse(elf: &object::File<'_>, data: &[u8], build_id: Option<String>) -> Image {
    let wanted: Vec<&'static str> = catalog::all_probes().iter().map(|p| p.symbol).chain(["uv_run"]).collect();
    let mut offsets = HashMap::new();
    let has_symtab = elf.section_by_name(".symtab").is_some();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if let Some(w) = wanted.iter().find(|w| **w == name) {
            if let Some(off) = file_offset(elf, sym.address()) {
                offsets.entry(*w).or_insert(off);
            }
        }
    }
    Image { build_id, offsets, has_symtab, node_version: node_version(data) }
}

/// Virtual address to file offset, through the PT_LOAD segment holding it.
fn file_offset(elf: &object::File<'_>, addr: u64) -> Option<u64> {
    elf.segments().find_map(|seg| {
        let (off, size) = seg.file_range();
        (addr >= seg.address() && addr < seg.address() + size).then(|| addr - seg.address() + off)
    })
}

/// Node embeds its release URLs: ".../release/v20.20.2/node-v20.20.2-headers.tar.gz".
fn node_version(data: &[u8]) -> Option<String> {
    let needle = b"-headers.tar.gz";
    let at = memchr::memmem::find(data, needle)?;
    let head = &data[at.saturating_sub(40)..at];
    let start = memchr::memmem::rfind(head, b"/node-v")? + "/node-".len();
    let v = std::str::from_utf8(&head[start..]).ok()?;
    v[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).then(|| v.to_string())
}

/// Finds libuv in a running process: the executable itself, or a shared
/// library it maps (libuv.so, libnode.so).
pub fn locate(pid: u32) -> Result<Located> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let exe_link = proc.join("exe");
    let exe = std::fs::read_link(&exe_link)
        .with_context(|| format!("cannot read {} (process gone, or no permission)", exe_link.display()))?;
    let exe_str = exe.to_string_lossy().trim_end_matches(" (deleted)").to_string();
    let img = inspect(&exe_link)?;
    if img.has_libuv() {
        return Ok(Located { attach_path: exe_link, path: exe_str, image: img });
    }
    // Shared libraries, in the order the process mapped them.
    let maps = std::fs::read_to_string(proc.join("maps")).with_context(|| format!("cannot read /proc/{pid}/maps"))?;
    let mut seen = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(_off), Some(_dev), Some(_ino), Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        if !(name.starts_with("libuv") || name.starts_with("libnode")) || seen.contains(&path) {
            continue;
        }
        seen.push(path);
        // map_files opens the mapped file itself (deleted or in another mount namespace).
        let attach = proc.join("map_files").join(range);
        let attach = if attach.exists() { attach } else { proc.join("root").join(path.trim_start_matches('/')) };
        if let Ok(img) = inspect(&attach) {
            if img.has_libuv() {
                return Ok(Located { attach_path: attach, path: path.to_string(), image: img });
            }
        }
    }
    bail!("no libuv found in process {pid} ({exe_str}): it is not a Node.js process, or its libuv is not visible")
}

/// libuv in an executable not yet started (the `--` command): the file
/// itself, or the libuv.so / libnode.so it links against.
pub fn locate_file(path: &Path) -> Result<Located> {
    let img = inspect(path)?;
    if img.has_libuv() {
        return Ok(Located { attach_path: path.to_path_buf(), path: path.display().to_string(), image: img });
    }
    bail!("{} contains no libuv symbols: it is not a Node.js binary", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_version_from_release_url() {
        let blob = b"xx\0https://nodejs.org/download/release/v20.20.2/node-v20.20.2-headers.tar.gz\0yy";
        assert_eq!(node_version(blob).as_deref(), Some("v20.20.2"));
        assert_eq!(node_version(b"nothing here"), None);
        assert_eq!(node_version(b"/node-vX.1-headers.tar.gz"), None);
    }
}
