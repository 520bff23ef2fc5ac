//! Module loading: which fs operations are node loading code (`require`,
//! the ES module loader: resolving, statting and reading module files),
//! so that they are counted on the span they ran under instead of being a
//! span each. Pure: paths and the results of earlier operations only.

use std::hash::BuildHasher;
use std::sync::Arc;

use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

use crate::events::decode::FsRecord;

/// Module files a process has open at once before the table starts over.
const FDS_MAX: usize = 1024;
/// Folders of module files remembered per process before the set starts over.
const DIRS_MAX: usize = 8192;

/// A module file or folder by its path alone: anything under a
/// `node_modules` folder (or node's global folders), a `package.json`, a
/// `.js`, `.mjs`, `.cjs` or `.node` file. Other `.json` files are a user's
/// data as often as a required module: not by their path alone.
pub fn module_path(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    if name == "package.json" {
        return true;
    }
    if let Some((stem, ext)) = name.rsplit_once('.') {
        if !stem.is_empty() && matches!(ext, "js" | "mjs" | "cjs" | "node") {
            return true;
        }
    }
    let mut parts = path.split('/').peekable();
    while let Some(p) = parts.next() {
        if matches!(p, "node_modules" | ".node_modules" | ".node_libraries") {
            return true;
        }
        // `<prefix>/lib/node`: node's global module folder.
        if p == "lib" && parts.peek() == Some(&"node") {
            return true;
        }
    }
    false
}

/// Operations module loading does: those on a path, and those on an fd.
/// Node's loaders never call `access`: an `fs.access` of a `.js` file is the
/// app's own.
fn on_path(op: &str) -> bool {
    matches!(op, "fs.open" | "fs.stat" | "fs.lstat" | "fs.realpath" | "fs.readlink")
}

fn on_fd(op: &str) -> bool {
    matches!(op, "fs.read" | "fs.fstat" | "fs.close")
}

/// An operation of module loading: the module file of its fd, if it is on one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ModuleOp {
    pub(super) file: Option<Arc<str>>,
}

/// What the classifier learnt of one process.
#[derive(Debug, Default)]
pub(super) struct Files {
    /// When its loop first ran (kernel ns), once known (with a trace per
    /// task: whether its module loading outside tasks is `main`'s).
    pub(super) loop_since: Option<u64>,
    /// fd -> the module file it is open on (fed by opens, cleared by closes).
    fds: FxHashMap<i32, Arc<str>>,
    /// The folders module files are in, and their parents (hashes of their
    /// paths): the resolution walk (`realpath`'s lstat of each) stats them.
    dirs: FxHashSet<u64>,
}

fn hash(s: &str) -> u64 {
    FxBuildHasher.hash_one(s)
}

impl Files {
    /// Whether `f` is module loading, learning from it: an open of a module
    /// file (its fd), a close, a module file's folders. `op`: its span name.
    pub(super) fn module_load(&mut self, op: &str, f: &FsRecord) -> Option<ModuleOp> {
        if on_fd(op) {
            let fd = f.fd?;
            let file = if op == "fs.close" { self.fds.remove(&fd) } else { self.fds.get(&fd).cloned() };
            return file.map(|p| ModuleOp { file: Some(p) });
        }
        let path = f.path.as_deref().filter(|_| on_path(op))?;
        let module = module_path(path);
        if op == "fs.open" && f.result >= 0 {
            let fd = i32::try_from(f.result).unwrap_or(-1);
            if module {
                if self.fds.len() >= FDS_MAX {
                    self.fds.clear();
                }
                self.fds.insert(fd, path.into());
            } else {
                // A reused fd: no longer a module's.
                self.fds.remove(&fd);
            }
        }
        if module {
            self.learn_dirs(path);
            return Some(ModuleOp { file: None });
        }
        let walk = op != "fs.open" && path.len() > 1 && self.dirs.contains(&hash(path.trim_end_matches('/')));
        walk.then_some(ModuleOp { file: None })
    }

    fn learn_dirs(&mut self, path: &str) {
        if self.dirs.len() >= DIRS_MAX {
            self.dirs.clear();
        }
        let mut dir = path.trim_end_matches('/');
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if parent.is_empty() || !self.dirs.insert(hash(parent)) {
                // The root is no module's folder; a known folder's parents are known.
                break;
            }
            dir = parent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode::OpRecord;

    fn rec(path: Option<&str>, fd: Option<i32>, result: i64) -> FsRecord {
        FsRecord {
            op: OpRecord { sync: true, ..OpRecord::test(7, 7, 10, 20) },
            op_id: 0,
            result,
            fd,
            path: path.map(Into::into),
            path2: None,
        }
    }

    #[test]
    fn module_paths() {
        for yes in [
            "/srv/app/node_modules/@opentelemetry/core",
            "/srv/app/node_modules/@opentelemetry/core.js",
            "/srv/app/node_modules/lodash.merge",
            "/srv/app/node_modules",
            "/srv/app/node_modules/x/data/table.txt",
            "/srv/app/package.json",
            "/srv/app/lib/index.js",
            "/srv/app/main.mjs",
            "/srv/app/conf.cjs",
            "/srv/app/build/Release/addon.node",
            "/root/.node_libraries",
            "/root/.node_modules/x",
            "/usr/lib/node",
            "/usr/local/lib/node/x",
        ] {
            assert!(module_path(yes), "{yes}");
        }
        for no in ["/srv/app/data/config.json", "/tmp/d/s-3", "/srv/app/lib", "/srv/app/.js", "/etc/localtime", "/usr/lib/nodejs-data", "/"]
        {
            assert!(!module_path(no), "{no}");
        }
    }

    /// `module_load` as a yes or no.
    fn load(f: &mut Files, op: &str, r: &FsRecord) -> bool {
        f.module_load(op, r).is_some()
    }

    #[test]
    fn a_module_files_reads_are_module_loading_and_a_data_files_are_not() {
        let mut f = Files::default();
        let m = "/srv/app/node_modules/x/index.js";
        assert!(load(&mut f, "fs.open", &rec(Some(m), None, 21)));
        assert_eq!(f.module_load("fs.fstat", &rec(None, Some(21), 0)), Some(ModuleOp { file: Some(m.into()) }), "named by its open");
        assert!(load(&mut f, "fs.read", &rec(None, Some(21), 4096)));
        assert!(load(&mut f, "fs.close", &rec(None, Some(21), 0)));
        assert!(!load(&mut f, "fs.read", &rec(None, Some(21), 10)), "closed: fd 21 is no module's now");
        // A user's data file, on the same fd number.
        assert!(!load(&mut f, "fs.open", &rec(Some("/srv/app/data/config.json"), None, 21)));
        assert!(!load(&mut f, "fs.read", &rec(None, Some(21), 10)));
        assert!(!load(&mut f, "fs.close", &rec(None, Some(21), 0)));
        // An fd opened on a module file, reused by a data file's open whose close was not seen.
        assert!(load(&mut f, "fs.open", &rec(Some(m), None, 22)));
        assert!(!load(&mut f, "fs.open", &rec(Some("/srv/data"), None, 22)));
        assert!(!load(&mut f, "fs.read", &rec(None, Some(22), 10)));
        // A failed open gives no fd; writes are never module loading.
        assert!(load(&mut f, "fs.open", &rec(Some("/srv/app/node_modules/y.js"), None, -2)));
        assert!(!load(&mut f, "fs.write", &rec(Some(m), Some(1), 3)));
        assert!(!load(&mut f, "fs.read", &rec(None, None, 3)));
        // Node's loaders never call access: the app's own check of a .js file.
        assert!(!load(&mut f, "fs.access", &rec(Some(m), None, 0)));
    }

    #[test]
    fn the_resolution_walk_over_a_module_files_folders_is_module_loading() {
        let mut f = Files::default();
        assert!(!load(&mut f, "fs.lstat", &rec(Some("/srv/app"), None, 0)), "no module seen there yet");
        assert!(load(&mut f, "fs.stat", &rec(Some("/srv/app/node_modules/x/index.js"), None, 0)));
        for dir in ["/srv", "/srv/app", "/srv/app/"] {
            assert!(load(&mut f, "fs.lstat", &rec(Some(dir), None, 0)), "{dir}");
        }
        assert!(load(&mut f, "fs.realpath", &rec(Some("/srv/app"), None, 0)));
        assert!(!load(&mut f, "fs.lstat", &rec(Some("/"), None, 0)), "the root is every file's folder");
        assert!(!load(&mut f, "fs.stat", &rec(Some("/srv/other"), None, 0)));
        assert!(!load(&mut f, "fs.open", &rec(Some("/srv/app"), None, 23)), "opening a folder is not the walk");
        assert!(!load(&mut f, "fs.stat", &rec(Some("/srv/app/data.json"), None, 0)), "a data file beside the app");
    }
}
