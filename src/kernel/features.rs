//! Which kernel features uvspan's BPF side uses on this machine: multi-uprobe
//! links (Linux >= 6.6; else one link per probe) and fentry/fexit trampolines
//! for the epoll system calls (refused by kernels in lockdown; else the
//! sys_enter/sys_exit BTF raw tracepoints). Tried best first; what worked is
//! remembered for the current boot next to the symbol cache, so later starts
//! do not pay for the failed attempts.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub multi_uprobe: bool,
    pub fentry: bool,
}

/// Every combination, best first.
pub const ORDER: [Features; 4] = [
    Features { multi_uprobe: true, fentry: true },
    Features { multi_uprobe: true, fentry: false },
    Features { multi_uprobe: false, fentry: true },
    Features { multi_uprobe: false, fentry: false },
];

/// What a boot's kernel was seen to accept.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    pub boot_id: String,
    pub features: Features,
    /// The errno fentry programs were refused with, if they were.
    pub fentry_refused: Option<i32>,
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

fn path() -> Option<std::path::PathBuf> {
    Some(crate::symbols::cache_dir()?.join("kernel.json"))
}

/// What worked before on this boot, if known.
pub fn remembered() -> Option<Remembered> {
    let r: Remembered = serde_json::from_slice(&std::fs::read(path()?).ok()?).ok()?;
    (Some(&r.boot_id) == boot_id().as_ref()).then_some(r)
}

/// Notes what worked (best effort: an unwritable cache costs the next start
/// the failed attempts again).
pub fn remember(features: Features, fentry_refused: Option<i32>) {
    let (Some(path), Some(boot_id)) = (path(), boot_id()) else { return };
    let r = Remembered { boot_id, features, fentry_refused };
    let Ok(text) = serde_json::to_vec(&r) else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(&path))
        .and_then(|()| std::fs::write(&tmp, text))
        .and_then(|()| std::fs::rename(&tmp, &path));
}

/// The one line said when the epoll waits go through the raw tracepoints.
pub fn fallback_notice(errno: Option<i32>) -> String {
    let why = errno.map_or_else(String::new, |e| format!(" ({})", crate::events::errno::error_type(-i64::from(e))));
    format!(
        "this kernel refuses fentry programs{why}, as kernels in lockdown do: the loop thread's epoll waits are read \
         from the sys_enter/sys_exit tracepoints instead, which every system call on the host passes while uvspan \
         runs (~0.2 µs each on the benchmark VM)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_first_and_all_combinations() {
        assert_eq!(ORDER[0], Features { multi_uprobe: true, fentry: true });
        let mut all: Vec<(bool, bool)> = ORDER.iter().map(|f| (f.multi_uprobe, f.fentry)).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn remembered_round_trips() {
        let r = Remembered { boot_id: "b".into(), features: ORDER[1], fentry_refused: Some(1) };
        let back: Remembered = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(fallback_notice(Some(1)).contains("fentry programs (EPERM)"));
    }
}
