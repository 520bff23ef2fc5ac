//! Where libuv lives in a process, and the file offsets of the catalog's
//! symbols there. ELF files are parsed once per build-id and size (or inode
//! when there is no build-id) and the result cached, so attaching to the 50th process of a
//! build costs no re-parse of its ~100 MB binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use crate::probes::catalog;

pub mod point;

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
}

impl Image {
    pub fn has_libuv(&self) -> bool {
        self.offsets.contains_key("uv_fs_open") || self.offsets.contains_key("uv_run")
    }
}

/// The files a process's probes go into: where libuv is, and libc (for the
/// getaddrinfo fallback of builds that only export libuv's API).
#[derive(Clone, Debug)]
pub struct Images {
    pub libuv: Located,
    pub libc: Option<Located>,
    /// Node's version: from the libuv image, or from the libnode.so next to
    /// a shared libuv.
    pub node_version: Option<String>,
}

impl Images {
    pub fn new(libuv: Located, libc: Option<Located>) -> Images {
        let node_version = libuv.image.node_version.clone().or_else(|| {
            // A shared libuv: Node's version is in the libnode.so beside it.
            let dir = Path::new(&libuv.path).parent()?.to_path_buf();
            let root = libuv.attach_path.to_string_lossy().split("/map_files/").next().map(|p| PathBuf::from(p).join("root"));
            let dir = match root.filter(|r| r.exists()) {
                Some(r) => r.join(dir.strip_prefix("/").unwrap_or(&dir)),
                None => dir,
            };
            std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("libnode.so") { inspect(&e.path()).ok()?.node_version.clone() } else { None }
            })
        });
        Images { libuv, libc, node_version }
    }
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

/// Where parsed images are kept between runs, one small JSON file per
/// build-id and size, so a second uvspan start reads no symbol table.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/uvspan";

static CACHE_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Sets the persistent cache directory (None: keep parsed images in memory
/// only). The first call wins; without one, [`DEFAULT_CACHE_DIR`] is used.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    let _ = CACHE_DIR.set(dir);
}

/// The persistent cache directory, if any.
pub fn cache_dir() -> Option<&'static Path> {
    CACHE_DIR.get_or_init(|| Some(PathBuf::from(DEFAULT_CACHE_DIR))).as_deref()
}

/// An [`Image`] as stored on disk, with what it was computed for: the
/// uvspan version and the symbols it looked for (a newer catalog reads the
/// file again).
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    uvspan: String,
    wanted: Vec<String>,
    build_id: Option<String>,
    offsets: std::collections::BTreeMap<String, u64>,
    single_stepped: Vec<String>,
    has_symtab: bool,
    node_version: Option<String>,
    libuv_version: Option<String>,
}

/// Every symbol an image is searched for, sorted.
fn wanted() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = catalog::all_probes().iter().map(|p| p.symbol).chain(["uv_run"]).collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl Stored {
    fn of(img: &Image) -> Stored {
        Stored {
            uvspan: env!("CARGO_PKG_VERSION").into(),
            wanted: wanted().iter().map(|s| s.to_string()).collect(),
            build_id: img.build_id.clone(),
            offsets: img.offsets.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            single_stepped: img.single_stepped.iter().map(|s| s.to_string()).collect(),
            has_symtab: img.has_symtab,
            node_version: img.node_version.clone(),
            libuv_version: img.libuv_version.clone(),
        }
    }

    /// The image, if the file was written by this uvspan for this catalog.
    fn image(self) -> Option<Image> {
        let want = wanted();
        if self.uvspan != env!("CARGO_PKG_VERSION") || self.wanted.iter().map(String::as_str).ne(want.iter().copied()) {
            return None;
        }
        let name = |s: &str| want.iter().copied().find(|w| *w == s);
        Some(Image {
            build_id: self.build_id,
            offsets: self.offsets.iter().map(|(k, v)| Some((name(k)?, *v))).collect::<Option<_>>()?,
            single_stepped: self.single_stepped.iter().map(|s| name(s)).collect::<Option<_>>()?,
            has_symtab: self.has_symtab,
            node_version: self.node_version,
            libuv_version: self.libuv_version,
        })
    }
}

fn stored_path(dir: &Path, key: &str) -> PathBuf {
    dir.join("symbols").join(format!("{key}.json"))
}

/// The image stored for `key`, if any (a missing, unreadable or outdated
/// file is simply read again from the ELF).
fn load_stored(key: &str) -> Option<Image> {
    let text = std::fs::read(stored_path(cache_dir()?, key)).ok()?;
    serde_json::from_slice::<Stored>(&text).ok()?.image()
}

/// Stores the image for `key`; failing to (a read-only file system, no
/// permission) only costs the next start a parse.
fn store(key: &str, img: &Image) {
    let Some(dir) = cache_dir() else { return };
    let path = stored_path(dir, key);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(&Stored::of(img)).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        if std::env::var_os("UVSPAN_DEBUG").is_some_and(|v| v != "0") {
            eprintln!("uvspan: debug: cannot store symbols in {}: {e}", path.display());
        }
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
    if let Some(img) = persistent.then(|| load_stored(&key)).flatten() {
        let img = Arc::new(img);
        cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, img.clone());
        return Ok(img);
    }
    let is_libuv_so = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("libuv"))
        || std::fs::read_link(path).is_ok_and(|t| t.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libuv")));
    let mut img = parse(&elf, &map, build_id);
    if is_libuv_so {
        img.libuv_version = libuv_version(&map);
    }
    if persistent {
        store(&key, &img);
    }
    let img = Arc::new(img);
    cache().lock().unwrap_or_else(|e| e.into_inner()).insert(key, img.clone());
    Ok(img)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn parse(elf: &object::File<'_>, data: &[u8], build_id: Option<String>) -> Image {
    let wanted: std::collections::HashSet<&'static str> = wanted().into_iter().collect();
    let mut offsets = HashMap::new();
    let mut single_stepped = Vec::new();
    let has_symtab = elf.section_by_name(".symtab").is_some();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let Some(&w) = wanted.get(name) else { continue };
        if offsets.contains_key(w) {
            continue;
        }
        if let Some(off) = file_offset(elf, sym.address()) {
            let code = data.get(off as usize..(off as usize + 32).min(data.len())).unwrap_or(&[]);
            let point = point::choose(code);
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
    Image { build_id, offsets, single_stepped, has_symtab, node_version: node_version(rodata), libuv_version: None }
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
        (parts.len() == 3 && parts[0] == "1" && parts.iter().all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit())))
            .then(|| t.to_string())
    })
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

/// (address range, path) of each file a process maps, first mapping only.
fn mapped_files(pid: u32) -> Result<Vec<(String, String)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("cannot read /proc/{pid}/maps"))?;
    let mut out: Vec<(String, String)> = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 6 && f[5].starts_with('/') && !out.iter().any(|(_, p)| p == f[5]) {
            out.push((f[0].to_string(), f[5..].join(" ")));
        }
    }
    Ok(out)
}

fn is_libc(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

/// libc as mapped by a process.
pub fn locate_libc(pid: u32) -> Option<Located> {
    let (range, path) = mapped_files(pid).ok()?.into_iter().find(|(_, p)| is_libc(p))?;
    let attach = mapped_file(pid, &range, &path);
    let image = inspect(&attach).ok()?;
    Some(Located { attach_path: attach, path, image })
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
    let exe = std::fs::read_link(&exe_link)
        .with_context(|| format!("cannot read {} (process gone, or no permission)", exe_link.display()))?;
    let exe_str = exe.to_string_lossy().trim_end_matches(" (deleted)").to_string();
    let img = inspect(&exe_link)?;
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

/// libuv in an executable not yet started (the `--` command): the file
/// itself, or the libuv.so / libnode.so it links against, looked up like the
/// dynamic loader would (LD_LIBRARY_PATH, then the system directories).
pub fn locate_file(path: &Path) -> Result<Located> {
    let img = inspect(path)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_image_round_trips_and_outdated_files_are_refused() {
        let img = Image {
            build_id: Some("ab12".into()),
            offsets: [("uv_fs_open", 0x10u64), ("uv__fs_done", 0x20)].into_iter().collect(),
            single_stepped: vec!["uv__fs_done"],
            has_symtab: true,
            node_version: Some("v20.20.2".into()),
            libuv_version: None,
        };
        let json = serde_json::to_string(&Stored::of(&img)).unwrap();
        let back = serde_json::from_str::<Stored>(&json).unwrap().image().unwrap();
        assert_eq!(back, img);
        let mut old = Stored::of(&img);
        old.uvspan = "0.0.0".into();
        assert!(old.image().is_none(), "another uvspan version's file is parsed again");
        let mut other = Stored::of(&img);
        other.wanted.pop();
        assert!(other.image().is_none(), "another catalog's file is parsed again");
        let mut bad = Stored::of(&img);
        bad.offsets.insert("not_a_probe".into(), 1);
        assert!(bad.image().is_none());
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
