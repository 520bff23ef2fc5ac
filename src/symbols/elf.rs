//! What one ELF file holds for uvspan: the file offsets of the catalog's
//! symbols (at probe points the kernel can emulate), whether it has a symbol
//! table, and the Node and libuv versions. Parsed once per build-id and size
//! (or inode when there is no build-id) and kept in memory; build-id files
//! also on disk ([`super::cache`]), so a later start reads no symbol table.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use super::{cache, point};
use crate::probes::catalog;

/// What uvspan knows about one ELF file holding libuv.
#[derive(Debug, PartialEq, Eq)]
pub struct Image {
    pub build_id: Option<String>,
    /// symbol -> file offset of its probe point, for the catalog symbols
    /// present (see probes::point: possibly a few bytes into the function).
    pub offsets: HashMap<&'static str, u64>,
    /// Symbols whose probe point the kernel must single-step (slow).
    pub single_stepped: Vec<&'static str>,
    /// Whether a .symtab was present (else only .dynsym exports).
    pub has_symtab: bool,
    /// Node version found in the file ("v20.20.2"), when it can be told.
    pub node_version: Option<String>,
    /// libuv version found in a libuv.so ("1.44.2"), when it can be told.
    pub libuv_version: Option<String>,
    /// What `uv_version()` returns (0x012e00: 1.46.0), read from its code.
    pub uv_version: Option<u32>,
    /// Node's copy of libuv patched to keep io_uring off unless asked
    /// (it exports `uv__node_patch_is_using_io_uring`).
    pub node_io_uring_patch: bool,
}

impl Image {
    pub fn has_libuv(&self) -> bool {
        self.offsets.contains_key("uv_fs_open") || self.offsets.contains_key("uv_run")
    }
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
    // `strip` keeps the build-id but moves code: the size tells them apart.
    let key = match &build_id {
        Some(id) => format!("{id}-{}", meta.len()),
        None => {
            use std::os::unix::fs::MetadataExt;
            format!("{}:{}:{}", meta.dev(), meta.ino(), meta.mtime())
        }
    };
    if let Some(img) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(img.clone());
    }
    // Only build-ids name a file across reboots (an inode number does not).
    let persistent = build_id.is_some();
    if let Some(img) = persistent.then(|| cache::load(&key)).flatten() {
        let img = Arc::new(img);
        cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, img.clone());
        return Ok(img);
    }
    let is_libuv_so = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libuv"))
        || std::fs::read_link(path).is_ok_and(|t| t.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libuv")));
    let mut img = parse(&elf, &map, build_id);
    if is_libuv_so && img.libuv_version.is_none() {
        img.libuv_version = libuv_version(&map);
    }
    if persistent {
        cache::store(&key, &img);
    }
    let img = Arc::new(img);
    cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, img.clone());
    Ok(img)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn parse(elf: &object::File<'_>, data: &[u8], build_id: Option<String>) -> Image {
    let wanted: std::collections::HashSet<&'static str> = catalog::symbols().into_iter().collect();
    let mut offsets = HashMap::new();
    let mut single_stepped = Vec::new();
    let has_symtab = elf.section_by_name(".symtab").is_some();
    let (mut uv_version, mut node_io_uring_patch) = (None, false);
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        match name {
            "uv_version" => {
                let code = file_offset(elf, sym.address()).and_then(|o| data.get(o as usize..(o as usize + 16).min(data.len())));
                uv_version = uv_version.or(code.and_then(returned_constant));
            }
            NODE_IO_URING_PATCH => node_io_uring_patch = true,
            _ => {}
        }
        let Some(&w) = wanted.get(name) else { continue };
        if offsets.contains_key(w) {
            continue;
        }
        if let Some(off) = file_offset(elf, sym.address()) {
            let code = data.get(off as usize..(off as usize + 32).min(data.len())).unwrap_or(&[]);
            let point = point::choose(code, catalog::args_may_change(w));
            if !point.emulated {
                single_stepped.push(w);
            }
            offsets.insert(w, off + point.delta);
        }
    }
    // Node's version lives in read-only data: search only there.
    let rodata = elf
        .section_by_name(".rodata")
        .and_then(|s| s.file_range())
        .and_then(|(o, n)| data.get(o as usize..(o + n) as usize))
        .unwrap_or(data);
    Image {
        build_id,
        offsets,
        single_stepped,
        has_symtab,
        node_version: node_version(rodata),
        libuv_version: uv_version.map(|v| format!("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff)),
        uv_version,
        node_io_uring_patch,
    }
}

/// Exported only by Node's patched copies of libuv 1.45-1.47.
const NODE_IO_URING_PATCH: &str = "uv__node_patch_is_using_io_uring";

/// The constant a function returns when its code is `mov $imm32, %eax; ret`
/// (libuv's `uv_version()`), possibly with `endbr64` before and a frame
/// pointer around it (`push %rbp; mov %rsp,%rbp` ... `pop %rbp`: Node 26).
fn returned_constant(code: &[u8]) -> Option<u32> {
    let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
    let (code, framed) = match code.strip_prefix(&[0x55, 0x48, 0x89, 0xe5]) {
        Some(rest) => (rest, true),
        None => (code, false),
    };
    let [0xb8, a, b, c, d, rest @ ..] = code else { return None };
    let rest = if framed { rest.strip_prefix(&[0x5d])? } else { rest };
    (rest.first() == Some(&0xc3)).then(|| u32::from_le_bytes([*a, *b, *c, *d]))
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

/// A libuv version string in a libuv.so: a standalone "1.NN.N".
fn libuv_version(data: &[u8]) -> Option<String> {
    data.split(|b| !b.is_ascii_graphic()).find_map(|s| {
        let t = std::str::from_utf8(s).ok()?;
        let parts: Vec<&str> = t.split('.').collect();
        (parts.len() == 3
            && parts[0] == "1"
            && parts.iter().all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit())))
        .then(|| t.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_version_from_its_code() {
        assert_eq!(returned_constant(&[0xb8, 0x00, 0x2e, 0x01, 0x00, 0xc3]), Some(0x012e00));
        assert_eq!(returned_constant(&[0xb8, 0x00, 0x2e, 0x01, 0x00, 0x90]), None);
        assert_eq!(returned_constant(&[0xb8, 0x00]), None);
        // Node 26: with a frame pointer; and with endbr64 first.
        let framed = [0x55, 0x48, 0x89, 0xe5, 0xb8, 0x01, 0x34, 0x01, 0x00, 0x5d, 0xc3];
        assert_eq!(returned_constant(&framed), Some(0x013401));
        assert_eq!(returned_constant(&[0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x01, 0x34, 0x01, 0x00, 0xc3]), Some(0x013401));
        assert_eq!(returned_constant(&framed[..10]), None, "no ret");
    }

    #[test]
    fn libuv_version_string() {
        assert_eq!(libuv_version(b"\0x\01.44.2\0abc").as_deref(), Some("1.44.2"));
        assert_eq!(libuv_version(b"\x011.44.2\n"), Some("1.44.2".into()));
        assert_eq!(libuv_version(b"\01.2\0v1.44.2\0nghttp2/1.61.0x\0"), None);
    }

    #[test]
    fn node_version_from_release_url() {
        let blob = b"xx\0https://nodejs.org/download/release/v20.20.2/node-v20.20.2-headers.tar.gz\0yy";
        assert_eq!(node_version(blob).as_deref(), Some("v20.20.2"));
        assert_eq!(node_version(b"nothing here"), None);
        assert_eq!(node_version(b"/node-vX.1-headers.tar.gz"), None);
    }
}
