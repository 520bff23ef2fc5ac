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
    /// The cookie of the probe where `uv__work_done` has taken its batch
    /// of finished jobs ([`catalog::work_batch_cookie`]), whose file offset
    /// is `offsets[catalog::WORK_BATCH]`; None where that point is not
    /// found (each job's completion is probed instead).
    pub work_batch: Option<u64>,
    /// Another JavaScript runtime that exports libuv's API for native
    /// addons without running on libuv ("Bun 1.4.5"): not Node.js, nothing
    /// to trace there.
    pub not_node: Option<String>,
}

impl Image {
    pub fn has_libuv(&self) -> bool {
        self.offsets.contains_key("uv_fs_open") || self.offsets.contains_key("uv_run")
    }

    /// Whether V8's garbage collection points are here (any of them).
    pub fn has_v8(&self) -> bool {
        crate::probes::catalog::all_probes()
            .iter()
            .any(|p| p.image == crate::probes::catalog::ImageKind::V8 && self.offsets.contains_key(p.symbol))
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
    // The addresses the batch point needs (name -> (address, size)).
    let mut batch_syms: HashMap<&'static str, (u64, u64)> = HashMap::new();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        match name {
            "uv_version" => {
                let code = file_offset(elf, sym.address()).and_then(|o| code_at(data, o, 16));
                uv_version = uv_version.or(code.and_then(returned_constant));
            }
            NODE_IO_URING_PATCH => node_io_uring_patch = true,
            _ => {}
        }
        if let Some(&b) = catalog::WORK_BATCH_SYMBOLS.iter().find(|b| **b == name) {
            batch_syms.entry(b).or_insert((sym.address(), sym.size()));
        }
        let Some(&w) = wanted.get(name) else { continue };
        if offsets.contains_key(w) || w == catalog::WORK_BATCH {
            continue;
        }
        // An offset outside the file is no place for a probe.
        if let Some((off, code)) = file_offset(elf, sym.address()).and_then(|o| Some((o, code_at(data, o, 32)?))) {
            // The whole function (bounded): its branches say whether the point may move.
            let size = usize::try_from(sym.size()).unwrap_or(0).min(MAX_FUNCTION);
            let body = code_at(data, off, size).unwrap_or_default();
            let point = point::choose(code, body, catalog::args_may_change(w));
            if !point.emulated {
                single_stepped.push(w);
            }
            offsets.insert(w, off + point.delta);
        }
    }
    let work_batch = work_batch_point(elf, data, &batch_syms).map(|(off, cookie)| {
        offsets.insert(catalog::WORK_BATCH, off);
        cookie
    });
    // Node's version lives in read-only data: search only there.
    let rodata = elf
        .section_by_name(".rodata")
        .and_then(|s| s.file_range())
        .and_then(|(o, n)| data.get(usize::try_from(o).ok()?..usize::try_from(o.checked_add(n)?).ok()?))
        .unwrap_or(data);
    let dynstr = elf.section_by_name(".dynstr").and_then(|s| s.data().ok()).unwrap_or_default();
    let not_node = other_runtime(dynstr, rodata);
    Image {
        build_id,
        offsets,
        single_stepped,
        has_symtab,
        node_version: if not_node.is_some() { None } else { node_version(rodata) },
        not_node,
        libuv_version: uv_version.map(|v| format!("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff)),
        uv_version,
        node_io_uring_patch,
        work_batch,
    }
}

/// The file offset and cookie of `uv__work_done`'s batch point, when the
/// function is of the known shape and the job completions it tells apart
/// are near it.
fn work_batch_point(elf: &object::File<'_>, data: &[u8], syms: &HashMap<&'static str, (u64, u64)>) -> Option<(u64, u64)> {
    let &(start, size) = syms.get(catalog::WORK_BATCH)?;
    let &(unlock, _) = syms.get("uv_mutex_unlock")?;
    let &(fs_done, _) = syms.get("uv__fs_done")?;
    let dns_done = syms.get("uv__getaddrinfo_done").map(|s| s.0);
    let off = file_offset(elf, start)?;
    let body = code_at(data, off, usize::try_from(size).ok()?.min(MAX_FUNCTION))?;
    let b = point::work_batch(body, start, unlock)?;
    let at = start + b.delta;
    let cookie = catalog::work_batch_cookie(fs_done as i64 - at as i64, dns_done.map(|d| d as i64 - at as i64), b)?;
    Some((off + b.delta, cookie))
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

/// Virtual address to file offset, through the PT_LOAD segment holding it
/// (checked: the file's addresses and offsets may be anything).
fn file_offset(elf: &object::File<'_>, addr: u64) -> Option<u64> {
    elf.segments().find_map(|seg| {
        let (off, size) = seg.file_range();
        let start = seg.address();
        (addr >= start && addr < start.checked_add(size)?).then(|| (addr - start).checked_add(off)).flatten()
    })
}

/// The most of a function read to check its branches (its symbol's size,
/// which the file may state as anything).
const MAX_FUNCTION: usize = 64 * 1024;

/// Up to `len` bytes of the file from `off`; None when `off` is outside it.
fn code_at(data: &[u8], off: u64, len: usize) -> Option<&[u8]> {
    let off = usize::try_from(off).ok().filter(|&o| o < data.len())?;
    data.get(off..off.saturating_add(len).min(data.len()))
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

/// Bun: its exports are versioned `BUN_1.2` (in `.dynstr`), its version is
/// in its banner "Bun v1.4.5 (Linux x64)". It exports libuv's API (and
/// says it is a Node.js version) for native addons, but its I/O runs on its
/// own event loop.
fn other_runtime(dynstr: &[u8], rodata: &[u8]) -> Option<String> {
    memchr::memmem::find(dynstr, b"\0BUN_")?;
    let version = memchr::memmem::find_iter(rodata, b"Bun v").find_map(|at| {
        let rest = rodata.get(at + 5..)?;
        let end = rest.iter().take(20).position(|&b| !(b.is_ascii_digit() || b == b'.'))?;
        (end > 0 && rest.get(end) == Some(&b' ')).then(|| String::from_utf8_lossy(&rest[..end]).into_owned())
    });
    Some(version.map_or_else(|| "Bun".to_string(), |v| format!("Bun {v}")))
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
    fn bun_is_told_by_its_versioned_exports() {
        let dynstr = b"\0uv_run\0napi_create_array\0BUN_1.2\0";
        let rodata = b"x\0Bun v1.4.5 (Linux x64)\0";
        assert_eq!(other_runtime(dynstr, rodata).as_deref(), Some("Bun 1.4.5"));
        assert_eq!(other_runtime(dynstr, b"Bun v").as_deref(), Some("Bun"), "no version: still Bun");
        assert_eq!(other_runtime(dynstr, b"Bun v1.2.3").as_deref(), Some("Bun"), "cut short");
        assert_eq!(other_runtime(b"\0uv_run\0GLIBC_2.2.5\0", rodata), None, "Node's exports are not versioned so");
        assert_eq!(other_runtime(b"", b""), None);
    }

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
        assert_eq!(libuv_version(b"\0x\x001.44.2\0abc").as_deref(), Some("1.44.2"));
        assert_eq!(libuv_version(b"\x011.44.2\n"), Some("1.44.2".into()));
        assert_eq!(libuv_version(b"\x001.2\0v1.44.2\0nghttp2/1.61.0x\0"), None);
    }

    #[test]
    fn node_version_from_release_url() {
        let blob = b"xx\0https://nodejs.org/download/release/v20.20.2/node-v20.20.2-headers.tar.gz\0yy";
        assert_eq!(node_version(blob).as_deref(), Some("v20.20.2"));
        assert_eq!(node_version(b"nothing here"), None);
        assert_eq!(node_version(b"/node-vX.1-headers.tar.gz"), None);
    }

    /// A small ELF file as a linker would write it for node: a loadable
    /// segment, `.text` with `uv_version` (`mov $0x012e00, %eax; ret`),
    /// `uv_run` and `uv_fs_open`, `.rodata` with Node's release URL, `.data`
    /// with two `v8dbg_*` constants, and their symbols.
    pub(crate) fn tiny_elf() -> Vec<u8> {
        const BASE: u64 = 0x40_0000;
        let text: Vec<u8> = [
            &[0xb8, 0x00, 0x2e, 0x01, 0x00, 0xc3, 0x90, 0x90][..],
            &[0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3, 0x90, 0x90],
            &[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5],
        ]
        .concat();
        let rodata = b"\0https://nodejs.org/download/release/v20.20.2/node-v20.20.2-headers.tar.gz\0".to_vec();
        let data: Vec<u8> = [31i32.to_le_bytes(), 1i32.to_le_bytes()].concat();
        let names = ["", "uv_version", "uv_run", "uv_fs_open", "v8dbg_SmiShiftSize", "v8dbg_HeapObjectTag"];
        let (strtab, name_at) = string_table(&names);
        let shnames = ["", ".text", ".rodata", ".data", ".symtab", ".strtab", ".shstrtab"];
        let (shstrtab, sh_name) = string_table(&shnames);
        // Layout: header, one program header, then the sections' bytes, then the section headers.
        let text_off = 64 + 56;
        let rodata_off = text_off + text.len();
        let data_off = rodata_off + rodata.len();
        let symtab_off = (data_off + data.len()).next_multiple_of(8);
        let symtab_len = 24 * names.len();
        let strtab_off = symtab_off + symtab_len;
        let shstrtab_off = strtab_off + strtab.len();
        let sh_off = (shstrtab_off + shstrtab.len()).next_multiple_of(8);
        let total = sh_off + 64 * shnames.len();
        let addr = |off: usize| BASE + off as u64;
        let mut f = Vec::with_capacity(total);
        elf_header(&mut f, BASE, addr(text_off), sh_off, shnames.len(), total);
        f.extend_from_slice(&text);
        f.extend_from_slice(&rodata);
        f.extend_from_slice(&data);
        f.resize(symtab_off, 0);
        f.extend_from_slice(&[0; 24]);
        // (name, st_info: global FUNC 0x12 / OBJECT 0x11, section, value, size)
        let syms = [
            (name_at[1], 0x12u8, 1u16, addr(text_off), 6u64),
            (name_at[2], 0x12, 1, addr(text_off + 8), 6),
            (name_at[3], 0x12, 1, addr(text_off + 16), 8),
            (name_at[4], 0x11, 3, addr(data_off), 4),
            (name_at[5], 0x11, 3, addr(data_off + 4), 4),
        ];
        for (name, info, shndx, value, size) in syms {
            f.extend_from_slice(&name.to_le_bytes());
            f.extend_from_slice(&[info, 0]);
            f.extend_from_slice(&shndx.to_le_bytes());
            f.extend_from_slice(&value.to_le_bytes());
            f.extend_from_slice(&size.to_le_bytes());
        }
        f.extend_from_slice(&strtab);
        f.extend_from_slice(&shstrtab);
        f.resize(sh_off, 0);
        f.extend_from_slice(&[0; 64]);
        // (type, flags, offset, size, link, info, align, entsize)
        let sections = [
            (1u32, 6u64, text_off, text.len(), 0u32, 0u32, 16u64, 0u64),
            (1, 2, rodata_off, rodata.len(), 0, 0, 1, 0),
            (1, 3, data_off, data.len(), 0, 0, 4, 0),
            (2, 0, symtab_off, symtab_len, 5, 1, 8, 24),
            (3, 0, strtab_off, strtab.len(), 0, 0, 1, 0),
            (3, 0, shstrtab_off, shstrtab.len(), 0, 0, 1, 0),
        ];
        for (i, (ty, flags, off, size, link, info, align, entsize)) in sections.into_iter().enumerate() {
            f.extend_from_slice(&sh_name[i + 1].to_le_bytes());
            f.extend_from_slice(&ty.to_le_bytes());
            f.extend_from_slice(&flags.to_le_bytes());
            f.extend_from_slice(&(if flags & 2 != 0 { addr(off) } else { 0 }).to_le_bytes());
            f.extend_from_slice(&(off as u64).to_le_bytes());
            f.extend_from_slice(&(size as u64).to_le_bytes());
            f.extend_from_slice(&link.to_le_bytes());
            f.extend_from_slice(&info.to_le_bytes());
            f.extend_from_slice(&align.to_le_bytes());
            f.extend_from_slice(&entsize.to_le_bytes());
        }
        assert_eq!(f.len(), total);
        f
    }

    /// A string table of `names` (the first one empty: index 0 names
    /// nothing), and where each name starts in it.
    fn string_table(names: &[&str]) -> (Vec<u8>, Vec<u32>) {
        let mut table = Vec::new();
        let mut at = Vec::new();
        for n in names {
            at.push(table.len() as u32);
            table.extend_from_slice(n.as_bytes());
            table.push(0);
        }
        (table, at)
    }

    /// The ELF header (64-bit, little-endian, ET_DYN, x86-64) and one program
    /// header: a PT_LOAD at `base` of the whole file (`total` bytes), read +
    /// execute. `shnum` section headers at `sh_off`, the last one the section
    /// names.
    fn elf_header(f: &mut Vec<u8>, base: u64, entry: u64, sh_off: usize, shnum: usize, total: usize) {
        f.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&3u16.to_le_bytes());
        f.extend_from_slice(&62u16.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&entry.to_le_bytes());
        f.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        f.extend_from_slice(&(sh_off as u64).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        for v in [64u16, 56, 1, 64, shnum as u16, (shnum - 1) as u16] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&5u32.to_le_bytes());
        for v in [0, base, base, total as u64, total as u64, 0x1000] {
            f.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// What uvspan reads from one file, as `inspect` does it (without its caches).
    fn read_image(data: &[u8]) -> Option<(Image, HashMap<String, i64>)> {
        let elf = object::File::parse(data).ok()?;
        let build_id = elf.build_id().ok().flatten().map(hex);
        let mut img = parse(&elf, data, build_id);
        if img.libuv_version.is_none() {
            img.libuv_version = libuv_version(data);
        }
        Some((img, crate::symbols::v8meta::constants_of(&elf)))
    }

    #[test]
    fn the_tiny_elf_reads_like_a_node_binary() {
        let (img, constants) = read_image(&tiny_elf()).expect("an ELF file");
        assert_eq!(img.uv_version, Some(0x012e00));
        assert_eq!(img.node_version.as_deref(), Some("v20.20.2"));
        assert!(img.has_symtab && img.has_libuv(), "{img:?}");
        assert_eq!(img.offsets.get("uv_fs_open"), Some(&(64 + 56 + 16 + 4)), "after endbr64");
        assert_eq!((constants.get("SmiShiftSize"), constants.get("HeapObjectTag")), (Some(&31), Some(&1)));
    }

    /// What the property tests below found: a segment or section ending
    /// past the top of the address space, or a symbol there, overflowed the
    /// offset arithmetic (a panic in debug builds).
    #[test]
    fn addresses_at_the_top_of_the_address_space() {
        let put = |f: &mut Vec<u8>, at: usize, v: u64| f[at..at + 8].copy_from_slice(&v.to_le_bytes());
        let word_at = |f: &[u8], at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap());
        let mut f = tiny_elf();
        let (sh, symtab) = (word_at(&f, 0x28) as usize, word_at(&f, word_at(&f, 0x28) as usize + 4 * 64 + 24) as usize);
        put(&mut f, 64 + 16, u64::MAX - 16); // the segment's address
        for i in 1..=5 {
            put(&mut f, symtab + 24 * i + 8, u64::MAX - 1); // every symbol's
        }
        put(&mut f, sh + 2 * 64 + 24, u64::MAX - 8); // .rodata's offset
        put(&mut f, sh + 3 * 64 + 16, 0); // .data's address
        let (img, constants) = read_image(&f).expect("still an ELF file");
        assert!(img.offsets.is_empty() && img.uv_version.is_none());
        assert_eq!(img.node_version.as_deref(), Some("v20.20.2"), "searched in the whole file");
        assert!(constants.is_empty());
    }

    /// The binaries are the traced containers': a truncated or corrupted
    /// ELF file gives an error or some image, never a panic.
    mod props {
        use proptest::prelude::*;

        use super::*;

        fn bin_true() -> &'static [u8] {
            static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            BYTES.get_or_init(|| std::fs::read("/bin/true").unwrap_or_else(|_| tiny_elf()))
        }

        fn mutate(
            mut f: Vec<u8>,
            muts: &[(prop::sample::Index, u8)],
            words: &[(prop::sample::Index, u64)],
            cut: Option<prop::sample::Index>,
        ) -> Vec<u8> {
            for (at, b) in muts {
                let i = at.index(f.len());
                f[i] = *b;
            }
            // Whole words too: offsets, sizes and addresses out of range.
            for (at, w) in words {
                let i = at.index(f.len() / 8) * 8;
                f[i..i + 8].copy_from_slice(&w.to_le_bytes());
            }
            if let Some(cut) = cut {
                f.truncate(cut.index(f.len()));
            }
            f
        }

        fn word() -> impl Strategy<Value = u64> {
            prop_oneof![
                any::<u64>(),
                (0u64..8).prop_map(|d| u64::MAX - d),
                0u64..8,
                0u64..0x1000,
                (0u64..0x1000).prop_map(|o| 0x40_0000 + o)
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn a_corrupted_elf_is_an_error_or_an_image(
                muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..24),
                words in prop::collection::vec((any::<prop::sample::Index>(), word()), 0..6),
                cut in prop::option::weighted(0.2, any::<prop::sample::Index>()),
                system in any::<bool>(),
            ) {
                let base = if system { bin_true().to_vec() } else { tiny_elf() };
                let f = mutate(base, &muts, &words, cut);
                if let Some((img, _)) = read_image(&f) {
                    prop_assert!(img.offsets.len() <= catalog::symbols().len());
                }
            }

            /// The loadable segment's and the symbols' addresses, offsets
            /// and sizes replaced (where a symbol is looked up in the file).
            #[test]
            fn out_of_range_addresses_are_an_error_or_an_image(
                segment in (word(), word(), word()),
                values in prop::collection::vec(word(), 5),
                sections in prop::collection::vec(prop::option::of(word()), 3),
            ) {
                let mut f = tiny_elf();
                let (offset, vaddr, filesz) = segment;
                for (at, v) in [(64 + 8, offset), (64 + 16, vaddr), (64 + 32, filesz)] {
                    f[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                let word_at = |f: &[u8], at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap());
                let symtab = word_at(&f, word_at(&f, 0x28) as usize + 4 * 64 + 24) as usize;
                for (i, v) in values.into_iter().enumerate() {
                    let at = symtab + 24 * (i + 1) + 8;
                    f[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                // .text, .rodata and .data's addresses.
                let sh = word_at(&f, 0x28) as usize;
                for (i, v) in sections.into_iter().enumerate() {
                    if let Some(v) = v {
                        let at = sh + (i + 1) * 64 + 16;
                        f[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    }
                }
                let _ = read_image(&f);
            }

            #[test]
            fn arbitrary_bytes_are_an_error_or_an_image(head in prop::bool::ANY, bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
                let mut f = if head { tiny_elf()[..64].to_vec() } else { Vec::new() };
                f.extend_from_slice(&bytes);
                let _ = read_image(&f);
            }
        }
    }
}
