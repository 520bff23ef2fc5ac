//! Whether a process's libuv may complete fs requests through io_uring.
//! Such completions skip `uv__fs_done` (libuv runs the request's callback
//! straight from its io_uring poll), so only `uv_fs_req_cleanup` sees those
//! requests end, and it must stay probed.
//!
//! - libuv < 1.45: no io_uring.
//! - libuv 1.45-1.47: fs requests go to io_uring by default;
//!   `UV_USE_IO_URING=0` turns it off. Node's own copies, patched for
//!   CVE-2024-22017 (they export `uv__node_patch_is_using_io_uring`), keep
//!   it off unless `UV_USE_IO_URING` is a non-zero number.
//! - libuv 1.48: off unless `UV_USE_IO_URING` is a non-zero number.
//! - libuv >= 1.49: only on loops configured with
//!   `UV_LOOP_USE_IO_URING_SQPOLL`, which Node never sets.
//!
//! libuv reads the variable once, when the first loop starts, with `atoi`.

/// What is known of a process's `UV_USE_IO_URING`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Env {
    /// Its environment cannot be read.
    Unknown,
    Unset,
    Set(String),
}

impl Env {
    /// A process's `UV_USE_IO_URING`, from the environment it started with.
    pub fn of(pid: u32) -> Env {
        match std::fs::read(format!("/proc/{pid}/environ")) {
            Ok(raw) => env_value(&raw, "UV_USE_IO_URING").map_or(Env::Unset, Env::Set),
            Err(_) => Env::Unknown,
        }
    }

    /// Set to turn io_uring on (a non-zero number), whatever the version.
    pub fn turns_on(&self) -> bool {
        matches!(self, Env::Set(v) if atoi(v) != 0)
    }
}

/// `major.minor` of a `uv_version()` value (0x012e00: 1.46).
fn minor(uv_version: u32) -> Option<u32> {
    (uv_version >> 16 == 1).then_some((uv_version >> 8) & 0xff)
}

/// C's `atoi`: leading blanks, a sign, digits; anything else ends it.
fn atoi(s: &str) -> i64 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n = digits.bytes().take_while(u8::is_ascii_digit).take(18).fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    if neg {
        -n
    } else {
        n
    }
}

/// Whether fs requests of a process may complete through io_uring, given
/// its libuv version (None: unknown), Node's patch and its environment.
/// Unknown versions and unknown environments count as "may".
pub fn fs_may_use_io_uring(uv_version: Option<u32>, node_patched: bool, env: &Env) -> bool {
    let Some(minor) = uv_version.and_then(minor) else { return true };
    if !(45..=48).contains(&minor) {
        return false;
    }
    let default_on = minor <= 47 && !node_patched;
    match env {
        Env::Unknown => true,
        Env::Unset => default_on,
        Env::Set(_) => env.turns_on(),
    }
}

/// The value of `key` in a NUL-separated environment block.
fn env_value(raw: &[u8], key: &str) -> Option<String> {
    raw.split(|&b| b == 0).find_map(|kv| {
        let v = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(v).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_44: u32 = 0x012c02;
    const V1_46: u32 = 0x012e00;
    const V1_48: u32 = 0x013000;
    const V1_51: u32 = 0x013300;

    #[test]
    fn by_version_patch_and_environment() {
        use Env::*;
        let set = |v: &str| Set(v.to_string());
        let may = |v, patched, env: Env| fs_may_use_io_uring(v, patched, &env);
        // Before io_uring, and since it needs a loop flag Node never sets.
        for env in [Unknown, Unset, set("1")] {
            assert!(!may(Some(V1_44), false, env.clone()));
            assert!(!may(Some(V1_51), false, env));
        }
        // libuv 1.45-1.47 as released: on unless turned off.
        assert!(may(Some(V1_46), false, Unset));
        assert!(!may(Some(V1_46), false, set("0")));
        // Node's patched copies and 1.48: off unless turned on.
        assert!(!may(Some(V1_46), true, Unset));
        assert!(may(Some(V1_46), true, set("1")));
        assert!(!may(Some(V1_48), false, Unset));
        assert!(may(Some(V1_48), false, set(" 2")));
        assert!(!may(Some(V1_48), false, set("yes")), "atoi(\"yes\") is 0");
        // Not known: assume it may.
        assert!(may(None, false, Unset));
        assert!(may(Some(V1_46), true, Unknown));
        assert!(may(Some(0x020000), false, Unset), "not a libuv 1.x version");
    }

    #[test]
    fn turns_on() {
        assert!(Env::Set("1".into()).turns_on());
        assert!(!Env::Set("0".into()).turns_on());
        assert!(!Env::Unset.turns_on() && !Env::Unknown.turns_on());
        assert_eq!(Env::of(u32::MAX), Env::Unknown, "no such process");
    }

    #[test]
    fn atoi_like_c() {
        for (s, n) in [("1", 1), ("0", 0), ("", 0), ("  -3x", -3), ("+7", 7), ("abc", 0), ("12abc", 12)] {
            assert_eq!(atoi(s), n, "{s:?}");
        }
    }

    #[test]
    fn environment_block() {
        let raw = b"PATH=/bin\0UV_USE_IO_URING_X=9\0UV_USE_IO_URING=1\0HOME=/root\0";
        assert_eq!(env_value(raw, "UV_USE_IO_URING").as_deref(), Some("1"));
        assert_eq!(env_value(b"PATH=/bin\0", "UV_USE_IO_URING"), None);
        assert_eq!(env_value(b"UV_USE_IO_URING=\0", "UV_USE_IO_URING").as_deref(), Some(""));
    }
}
