//! The on-disk cache of parsed images: one small JSON file per build-id and
//! size under `--symbol-cache` (default /var/cache/uvspan), written by the
//! uvspan version and catalog that computed it; anything else is read again
//! from the ELF file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::Image;
use crate::probes::catalog;

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
    /// How probe points are chosen ([`FORMAT`]).
    #[serde(default)]
    format: u32,
    uvspan: String,
    wanted: Vec<String>,
    /// The symbols whose probe point may skip argument writes (a policy of
    /// the catalog: a change chooses other points).
    #[serde(default)]
    args_may_change: Vec<String>,
    build_id: Option<String>,
    offsets: std::collections::BTreeMap<String, u64>,
    single_stepped: Vec<String>,
    has_symtab: bool,
    node_version: Option<String>,
    libuv_version: Option<String>,
    #[serde(default)]
    uv_version: Option<u32>,
    #[serde(default)]
    node_io_uring_patch: bool,
    #[serde(default)]
    work_batch: Option<u64>,
    #[serde(default)]
    not_node: Option<String>,
}

impl Stored {
    fn of(img: &Image) -> Stored {
        Stored {
            format: FORMAT,
            uvspan: env!("CARGO_PKG_VERSION").into(),
            wanted: catalog::symbols().iter().map(|s| s.to_string()).collect(),
            args_may_change: moved_args(),
            build_id: img.build_id.clone(),
            offsets: img.offsets.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            single_stepped: img.single_stepped.iter().map(|s| s.to_string()).collect(),
            has_symtab: img.has_symtab,
            node_version: img.node_version.clone(),
            libuv_version: img.libuv_version.clone(),
            uv_version: img.uv_version,
            node_io_uring_patch: img.node_io_uring_patch,
            work_batch: img.work_batch,
            not_node: img.not_node.clone(),
        }
    }

    /// The image, if the file was written by this uvspan for this catalog.
    fn image(self) -> Option<Image> {
        let want = catalog::symbols();
        if self.format != FORMAT
            || self.args_may_change != moved_args()
            || self.uvspan != env!("CARGO_PKG_VERSION")
            || self.wanted.iter().map(String::as_str).ne(want.iter().copied())
        {
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
            uv_version: self.uv_version,
            node_io_uring_patch: self.node_io_uring_patch,
            work_batch: self.work_batch,
            not_node: self.not_node,
        })
    }
}

/// Bumped when what an image holds is computed differently (probe points
/// chosen another way; 3: the libuv version and io_uring patch read from
/// every image; 4: uv_version() read with a frame pointer too; 5: a probe
/// point is not moved where a branch lands on it or on what it skips; 6:
/// uv__work_done's batch point; 7: another runtime exporting libuv's API
/// told apart): older files are read again from the ELF.
const FORMAT: u32 = 7;

/// The catalog's symbols whose probe points may skip argument writes, sorted.
fn moved_args() -> Vec<String> {
    catalog::symbols().into_iter().filter(|s| catalog::args_may_change(s)).map(str::to_string).collect()
}

fn stored_path(dir: &Path, key: &str) -> PathBuf {
    dir.join("symbols").join(format!("{key}.json"))
}

/// The image stored for `key`, if any (a missing, unreadable or outdated
/// file is simply read again from the ELF).
pub(super) fn load(key: &str) -> Option<Image> {
    let text = std::fs::read(stored_path(cache_dir()?, key)).ok()?;
    serde_json::from_slice::<Stored>(&text).ok()?.image()
}

/// Stores the image for `key`; failing to (a read-only file system, no
/// permission) only costs the next start a parse.
pub(super) fn store(key: &str, img: &Image) {
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
            uv_version: Some(0x012e00),
            node_io_uring_patch: true,
            work_batch: Some(0x1234),
            not_node: Some("Bun 1.4.5".into()),
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
        let mut policy = Stored::of(&img);
        policy.args_may_change.pop();
        assert!(policy.image().is_none(), "a file made under another probe-point policy is parsed again");
        let mut older = Stored::of(&img);
        older.format = 1;
        assert!(older.image().is_none(), "a file of another format is parsed again");
        let mut bad = Stored::of(&img);
        bad.offsets.insert("not_a_probe".into(), 1);
        assert!(bad.image().is_none());
    }
}
