//! A process's perf map (`/tmp/perf-PID.map`, written by node's
//! `--perf-basic-prof`): the names of its JIT code, read by uvspan itself,
//! within fixed bounds. The traced process writes the file, so it is
//! untrusted input of any size and content (a container on the node can
//! write millions of lines, or garbage).
//!
//! Format: one `START SIZE name` per line, START and SIZE hexadecimal
//! without `0x` (tolerated), the name from its first non-blank character to
//! the end of the line (fields separated by spaces or tabs). A line that
//! does not parse (or covers nothing, or wraps past the end of the address
//! space, or has no name) is skipped and counted; nothing panics.
//!
//! Bounds ([`Limits::DEFAULT`]): at most 16 MiB of the file are parsed in
//! all (from its start, so at most that much per read; later reads take
//! only the bytes appended since), at most 250,000 entries are kept, a name
//! is cut at 512 bytes (at a character boundary), and the names' arena
//! never exceeds the bytes parsed. Held per process: 24 bytes per entry
//! and one string for every name (at most 6 MB + 16 MiB; a real node app's
//! map has tens of thousands of lines). Past a bound, nothing more is
//! read: what was kept still names frames, what was not is counted
//! ([`Stats`]) and said once ([`PerfMapFile::take_notice`]). The file is
//! looked at again only when an address is not found, at most every
//! [`MIN_INTERVAL`], and read only if it changed (size, mtime): from where
//! the last read stopped (V8 only appends), or from its start when it was
//! replaced or cut shorter — at most 4 × 16 MiB parsed over a process's life.
//!
//! Overlaps (V8 reuses the addresses of collected code, and the file only
//! grows): an address is named by the entry covering it that was written
//! last, among the [`OVERLAP_SCAN`] entries starting nearest at or below it.
//!
//! Where: `/proc/PID/root/tmp/perf-NSPID.map` ([`perf_map_path`]), PID as
//! uvspan sees the process and NSPID as it sees itself (its own PID
//! namespace: the last `NSpid:` value, [`crate::discover::pidns::nspid`]).
//! It is opened under the process's root (symbolic links resolved inside
//! it, the last component not followed), only when it is a regular file owned by one of the process's
//! user ids, and never blocks (a FIFO is refused).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The bounds on what is taken from one perf map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the file parsed in all (from its start).
    pub max_bytes: u64,
    /// Entries kept.
    pub max_entries: usize,
    /// Longest name kept, in bytes (longer ones are cut).
    pub max_name: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits { max_bytes: 16 << 20, max_entries: 250_000, max_name: 512 };
}

/// Entries looked at below an address for the one covering it.
pub const OVERLAP_SCAN: usize = 16;

/// The file is looked at again (on an address not found) at most this often.
pub const MIN_INTERVAL: Duration = Duration::from_millis(500);

/// Bytes read from the file at a time.
const CHUNK: usize = 64 << 10;

/// A perf map replaced or cut shorter is read again from its start, but
/// not past this many times `max_bytes` over the process's life (a process
/// rewriting its map cannot keep uvspan parsing it).
const LIFETIME_READS: u64 = 4;

/// What the parser saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Complete lines parsed.
    pub lines: u64,
    /// Bytes of complete lines parsed.
    pub bytes: u64,
    /// Lines that do not parse.
    pub garbage: u64,
    /// Well-formed lines not kept: a bound was reached.
    pub not_kept: u64,
    /// Names cut at `max_name`.
    pub names_cut: u64,
}

/// One entry: [start, end) and its name in the arena. Names are appended
/// in line order, so a later line has a larger `name` offset.
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    end: u64,
    name: u32,
    len: u32,
}

/// The parsed entries of one perf map: sorted by start, names in one arena.
#[derive(Debug)]
pub struct PerfMap {
    limits: Limits,
    entries: Vec<Entry>,
    names: String,
    stats: Stats,
    /// `max_bytes` were read: nothing more will be.
    exhausted: bool,
}

impl PerfMap {
    pub fn new(limits: Limits) -> PerfMap {
        PerfMap { limits, entries: Vec::new(), names: String::new(), stats: Stats::default(), exhausted: false }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of names kept (the arena).
    pub fn names_len(&self) -> usize {
        self.names.len()
    }

    /// Whether a bound was reached: nothing more is taken.
    pub fn full(&self) -> bool {
        self.entries.len() >= self.limits.max_entries || self.exhausted || self.stats.bytes >= self.limits.max_bytes
    }

    /// Parses the lines of `r` (the file from where the last call stopped)
    /// within the bounds: at most what remains of `max_bytes` is read.
    /// Returns the bytes consumed: complete lines only (a last line without
    /// its newline, which the writer may be finishing, is left for the next
    /// call to read again).
    pub fn feed(&mut self, r: impl Read) -> io::Result<u64> {
        if self.full() {
            return Ok(0);
        }
        let budget = self.limits.max_bytes.saturating_sub(self.stats.bytes);
        let mut r = r.take(budget);
        let mut read: u64 = 0;
        // A line is kept up to this many bytes (two hex fields, separators, the name).
        let line_max = self.limits.max_name.saturating_add(64);
        let mut line: Vec<u8> = Vec::with_capacity(line_max.min(4096));
        let mut line_len: u64 = 0; // bytes of the current line, including those not kept
        let mut consumed: u64 = 0;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    read += n as u64;
                    n
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.finish_feed();
                    return Err(e);
                }
            };
            let mut chunk = &buf[..n];
            while !chunk.is_empty() {
                let (part, ended) = match memchr::memchr(b'\n', chunk) {
                    Some(i) => (&chunk[..i], true),
                    None => (chunk, false),
                };
                let room = line_max.saturating_sub(line.len());
                line.extend_from_slice(&part[..part.len().min(room)]);
                line_len += part.len() as u64;
                chunk = &chunk[(part.len() + usize::from(ended)).min(chunk.len())..];
                if ended {
                    consumed += line_len + 1;
                    self.stats.lines += 1;
                    self.stats.bytes += line_len + 1;
                    self.line(&line, line_len > line.len() as u64);
                    line.clear();
                    line_len = 0;
                }
            }
        }
        // The budget spent (the last line perhaps cut by it): done.
        self.exhausted = read >= budget;
        self.finish_feed();
        Ok(consumed)
    }

    /// Entries sorted by start (and line order) for lookups.
    fn finish_feed(&mut self) {
        self.entries.sort_unstable_by_key(|e| (e.start, e.name));
    }

    /// One line, without its newline (`cut`: bytes beyond `line` were not kept).
    fn line(&mut self, line: &[u8], cut: bool) {
        let Some((start, size, name)) = parse_line(line) else {
            self.stats.garbage += 1;
            return;
        };
        let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
            self.stats.garbage += 1;
            return;
        };
        let full = String::from_utf8_lossy(name);
        let mut keep = full.len().min(self.limits.max_name);
        while !full.is_char_boundary(keep) {
            keep -= 1;
        }
        let name = &full[..keep];
        if name.trim().is_empty() {
            self.stats.garbage += 1;
            return;
        }
        let arena_room = self.names.len() as u64 + name.len() as u64 <= self.limits.max_bytes.min(u64::from(u32::MAX));
        if self.entries.len() >= self.limits.max_entries || !arena_room {
            self.stats.not_kept += 1;
            return;
        }
        if cut || keep < full.len() {
            self.stats.names_cut += 1;
        }
        let at = self.names.len() as u32; // arena_room: fits
        self.names.push_str(name);
        self.entries.push(Entry { start, end, name: at, len: name.len() as u32 });
    }

    /// The name of the entry covering `addr` (see the module comment for overlaps).
    pub fn name(&self, addr: u64) -> Option<&str> {
        let below = self.entries.partition_point(|e| e.start <= addr);
        let e = self.entries[..below].iter().rev().take(OVERLAP_SCAN).filter(|e| addr < e.end).max_by_key(|e| e.name)?;
        self.names.get(e.name as usize..e.name as usize + e.len as usize)
    }
}

/// `START SIZE name` (hex, hex, the rest), separated by spaces or tabs;
/// None if it does not parse. A trailing `\r` is not part of the name.
pub fn parse_line(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let is_sep = |b: &u8| *b == b' ' || *b == b'\t';
    let (start, rest) = hex_field(line)?;
    let rest = trim_start(rest, is_sep)?;
    let (size, rest) = hex_field(rest)?;
    let name = trim_start(rest, is_sep)?;
    Some((start, size, name))
}

/// At least one separator, then what follows it.
fn trim_start(b: &[u8], is_sep: impl Fn(&u8) -> bool) -> Option<&[u8]> {
    let n = b.iter().take_while(|c| is_sep(c)).count();
    (n > 0).then(|| &b[n..])
}

/// A hexadecimal number (optionally `0x`-prefixed, at most 16 digits) and what follows.
fn hex_field(b: &[u8]) -> Option<(u64, &[u8])> {
    let b = b.strip_prefix(b"0x").or_else(|| b.strip_prefix(b"0X")).unwrap_or(b);
    let n = b.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if n == 0 || n > 16 {
        return None;
    }
    let digits = std::str::from_utf8(&b[..n]).ok()?;
    Some((u64::from_str_radix(digits, 16).ok()?, &b[n..]))
}

/// The process's user ids (real, effective, saved, filesystem) from its status.
pub fn uids_from_status(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|v| v.split_whitespace().filter_map(|u| u.parse().ok()).collect())
        .unwrap_or_default()
}

/// Where the perf map of process `pid` (as uvspan sees it) is, when it sees
/// itself as `ns_pid`: its `/tmp`, through its root.
pub fn perf_map_path(pid: u32, ns_pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root/{}", in_root(ns_pid)))
}

/// The perf map's path inside the process's root.
fn in_root(ns_pid: u32) -> String {
    format!("tmp/perf-{ns_pid}.map")
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `rel` under the directory `root` as if it were `/` (RESOLVE_IN_ROOT:
/// symbolic links, absolute ones too, stay inside it), not following a last
/// symbolic link, without blocking; only a regular file.
pub fn open_in_root(root: &std::path::Path, rel: &str) -> io::Result<File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let dir = File::open(root)?;
    let rel = std::ffi::CString::new(rel).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))?;
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 reads a NUL-terminated path (`rel` outlives the call)
    // and `size_of::<OpenHow>()` bytes of `how`, laid out as the kernel's
    // struct open_how (three u64, repr(C)); `dir` is an open descriptor.
    let fd =
        unsafe { libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), rel.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("openat2 returned an impossible descriptor"))?;
    // SAFETY: `fd` was just returned by openat2 and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// What identifies the file's content at a read: a change means new lines
/// (or a new file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

/// One process's perf map, read as it grows, within [`Limits`].
#[derive(Debug)]
pub struct PerfMapFile {
    pid: u32,
    ns_pid: u32,
    /// The file must be owned by one of these (the process's user ids).
    uids: Vec<u32>,
    root: PathBuf,
    map: PerfMap,
    seen: Option<Seen>,
    /// Where the next read starts (the end of the last complete line read).
    offset: u64,
    /// Bytes parsed of earlier files (or earlier contents) of this process.
    parsed_before: u64,
    checked: Option<Instant>,
    /// The file's size when a bound was reached (the notice is due).
    over: Option<u64>,
    told: bool,
}

impl PerfMapFile {
    /// The perf map of process `pid` (as uvspan sees it), which sees itself
    /// as `ns_pid` and runs as `uids`; nothing is read yet.
    pub fn new(pid: u32, ns_pid: u32, uids: Vec<u32>, limits: Limits) -> PerfMapFile {
        PerfMapFile::under(PathBuf::from(format!("/proc/{pid}/root")), pid, ns_pid, uids, limits)
    }

    /// The same with another root (tests).
    fn under(root: PathBuf, pid: u32, ns_pid: u32, uids: Vec<u32>, limits: Limits) -> PerfMapFile {
        PerfMapFile {
            pid,
            ns_pid,
            uids,
            root,
            map: PerfMap::new(limits),
            seen: None,
            offset: 0,
            parsed_before: 0,
            checked: None,
            over: None,
            told: false,
        }
    }

    pub fn path(&self) -> PathBuf {
        perf_map_path(self.pid, self.ns_pid)
    }

    /// `perf-NSPID.map`: where a name came from.
    pub fn file_name(&self) -> String {
        format!("perf-{}.map", self.ns_pid)
    }

    pub fn map(&self) -> &PerfMap {
        &self.map
    }

    /// The name of the JIT code at `addr`; when it is not known, the file is
    /// read again if it changed and [`MIN_INTERVAL`] has passed since the
    /// last look (`now`), unless a bound was reached.
    pub fn name(&mut self, addr: u64, now: Instant) -> Option<&str> {
        if self.map.name(addr).is_none() {
            self.refresh(now);
        }
        self.map.name(addr)
    }

    fn refresh(&mut self, now: Instant) {
        if self.map.full() || self.checked.is_some_and(|t| now.saturating_duration_since(t) < MIN_INTERVAL) {
            return;
        }
        self.checked = Some(now);
        let Ok(mut file) = open_in_root(&self.root, &in_root(self.ns_pid)) else { return };
        let Ok(meta) = file.metadata() else { return };
        if !self.uids.contains(&meta.uid()) {
            return;
        }
        let seen = Seen { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime: (meta.mtime(), meta.mtime_nsec()) };
        if self.seen == Some(seen) {
            return;
        }
        // Another file, or one cut shorter than what was read: from the
        // start, within the lifetime budget (else what was read stays).
        if self.seen.is_some_and(|s| (s.dev, s.ino) != (seen.dev, seen.ino)) || seen.size < self.offset {
            let parsed = self.parsed_before + self.map.stats().bytes;
            if parsed >= LIFETIME_READS.saturating_mul(self.map.limits.max_bytes) {
                return;
            }
            self.parsed_before = parsed;
            self.map = PerfMap::new(self.map.limits);
            self.offset = 0;
        }
        self.seen = Some(seen);
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        if let Ok(n) = self.map.feed(&mut file) {
            self.offset += n;
        }
        if self.map.full() && self.over.is_none() {
            self.over = Some(seen.size);
        }
    }

    /// Once, when a bound was reached: one line saying what is used and
    /// what is not.
    pub fn take_notice(&mut self) -> Option<String> {
        let size = self.over.filter(|_| !self.told)?;
        self.told = true;
        let l = self.map.limits;
        let s = self.map.stats();
        Some(format!(
            "uvspan: pid {}'s perf map is larger than uvspan reads ({} MiB, {} entries): {} ({} bytes); \
             JIT frames are named from its first {} entries ({} lines not kept, {} bytes not read)",
            self.pid,
            l.max_bytes >> 20,
            l.max_entries,
            self.path().display(),
            size,
            self.map.len(),
            s.not_kept,
            size.saturating_sub(self.offset),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str, limits: Limits) -> PerfMap {
        let mut m = PerfMap::new(limits);
        m.feed(text.as_bytes()).unwrap();
        m
    }

    #[test]
    fn lines_are_parsed_and_garbage_skipped() {
        let text = "1000 10 LazyCompile:*foo /app/x.js:3\n\
                    2000\t20\tJS:~bar with spaces \n\
                    0x3000 0x8 Stub:CEntry\r\n\
                    zzzz 10 bad start\n\
                    4000 10\n\
                    4000 0 empty\n\
                    ffffffffffffffff 2 wraps\n\
                    12345678901234567 1 too long\n\
                    \n\
                    5000 10 no newline at the end";
        let m = parsed(text, Limits::DEFAULT);
        assert_eq!(m.len(), 3);
        assert_eq!(m.name(0x1000), Some("LazyCompile:*foo /app/x.js:3"));
        assert_eq!(m.name(0x100f), Some("LazyCompile:*foo /app/x.js:3"));
        assert_eq!(m.name(0x1010), None, "the end is not covered");
        assert_eq!(m.name(0x2005), Some("JS:~bar with spaces "));
        assert_eq!(m.name(0x3007), Some("Stub:CEntry"), "0x tolerated, \\r dropped");
        assert_eq!(m.name(0xfff), None);
        assert_eq!(m.name(0x5000), None, "a line without its newline waits for the next read");
        let s = m.stats();
        assert_eq!((s.lines, s.garbage, s.not_kept), (9, 6, 0));
    }

    #[test]
    fn the_last_line_written_wins_on_overlap() {
        let m = parsed("1000 100 old\n1000 80 reused\n1040 10 inner\n900 800 newest_big\n", Limits::DEFAULT);
        assert_eq!(m.name(0x1000), Some("newest_big"));
        let m = parsed("900 800 old_big\n1000 80 reused\n1040 10 inner\n", Limits::DEFAULT);
        assert_eq!(m.name(0x1045), Some("inner"));
        assert_eq!(m.name(0x1050), Some("reused"));
        assert_eq!(m.name(0x1090), Some("old_big"), "covered by nothing newer");
        assert_eq!(m.name(0x900), Some("old_big"));
    }

    #[test]
    fn bounds_hold_and_what_is_not_kept_is_counted() {
        let limits = Limits { max_bytes: 1 << 20, max_entries: 100, max_name: 8 };
        let text: String = (0..1000).map(|i| format!("{:x} 10 function_number_{i}\n", 0x1000 + i * 0x10)).collect();
        let m = parsed(&text, limits);
        assert_eq!(m.len(), 100);
        assert_eq!(m.stats().not_kept, 900);
        assert_eq!(m.stats().names_cut, 100);
        assert_eq!(m.name(0x1000), Some("function"), "cut at 8 bytes");
        assert_eq!(m.name(0x1000 + 100 * 0x10), None, "beyond the entries kept");
        assert!(m.full());
        // The byte bound: parsing stops there, a partial line is not taken.
        let limits = Limits { max_bytes: 100, max_entries: 1000, max_name: 64 };
        let m = parsed(&text, limits);
        assert!(m.stats().bytes <= 100);
        assert_eq!(m.len(), 100 / "1000 10 function_number_0\n".len());
        // A name cut inside a multi-byte character keeps whole characters.
        let m = parsed("10 10 \u{e9}\u{e9}\u{e9}\n", Limits { max_name: 3, ..Limits::DEFAULT });
        assert_eq!(m.name(0x10), Some("\u{e9}"));
        // A line longer than any name: kept up to the bound, counted as cut.
        let long = format!("10 10 {}\n20 10 next\n", "x".repeat(100_000));
        let m = parsed(&long, Limits::DEFAULT);
        assert_eq!(m.name(0x10).map(str::len), Some(512));
        assert_eq!(m.name(0x20), Some("next"));
    }

    /// A node's 3M-line perf map (~170 MB written by the process): what is
    /// held stays within the bounds (scaled down: 300k lines over bounds of
    /// 1 MiB and 10k entries, then the defaults over 3M lines from a reader
    /// that generates them, so no 170 MB file is written).
    #[test]
    fn a_huge_perf_map_keeps_memory_bounded() {
        struct Lines {
            i: u64,
            n: u64,
            pending: Vec<u8>,
        }
        impl Read for Lines {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                while self.pending.len() < buf.len() && self.i < self.n {
                    let line =
                        format!("{:x} 40 LazyCompile:*fn{} /srv/app/lib/module.js:{}\n", 0x7f00_0000_0000 + self.i * 0x40, self.i, self.i);
                    self.pending.extend_from_slice(line.as_bytes());
                    self.i += 1;
                }
                let n = buf.len().min(self.pending.len());
                buf[..n].copy_from_slice(&self.pending[..n]);
                self.pending.drain(..n);
                Ok(n)
            }
        }
        let small = Limits { max_bytes: 1 << 20, max_entries: 10_000, max_name: 512 };
        let mut m = PerfMap::new(small);
        m.feed(Lines { i: 0, n: 300_000, pending: Vec::new() }).unwrap();
        assert_eq!(m.len(), 10_000);
        assert!(m.names_len() as u64 <= small.max_bytes);
        assert!(m.stats().bytes <= small.max_bytes);

        let mut m = PerfMap::new(Limits::DEFAULT);
        let n = 3_000_000;
        let consumed = m.feed(Lines { i: 0, n, pending: Vec::new() }).unwrap();
        assert!(consumed <= Limits::DEFAULT.max_bytes, "{consumed} bytes read");
        assert!(m.len() <= Limits::DEFAULT.max_entries);
        assert!(m.names_len() as u64 <= Limits::DEFAULT.max_bytes);
        assert!(m.entries.capacity() <= 2 * Limits::DEFAULT.max_entries);
        assert!(m.stats().lines < n / 10, "most of the 3M lines never read: {}", m.stats().lines);
        assert!(m.full());
        assert_eq!(m.name(0x7f00_0000_0000 + 5 * 0x40 + 1), Some("LazyCompile:*fn5 /srv/app/lib/module.js:5"));
        // Fed again: nothing more is read.
        assert_eq!(m.feed(Lines { i: 0, n: 10, pending: Vec::new() }).unwrap(), 0);
    }

    #[test]
    fn ns_pid_and_uids_from_status() {
        let status = "Name:\tnode\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t1\nUid:\t1000\t1001\t1002\t1003\nNSpid:\t4242\t17\t1\n";
        assert_eq!(crate::discover::pidns::nspid(status).last(), Some(&1));
        assert_eq!(uids_from_status(status), vec![1000, 1001, 1002, 1003]);
        assert_eq!(perf_map_path(4242, 1), PathBuf::from("/proc/4242/root/tmp/perf-1.map"));
    }

    /// The test's user, as the owner of the files it writes.
    fn me(root: &std::path::Path) -> Vec<u32> {
        vec![std::fs::metadata(root).unwrap().uid()]
    }

    fn temp_root(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("uvspan-perfmap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn read_as_it_grows_and_again_when_replaced() {
        let root = temp_root("grows");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let path = root.join("tmp/perf-7.map");
        std::fs::write(&path, "1000 10 first\n2000 10 sec").unwrap();
        let mut f = PerfMapFile::under(root.clone(), 4242, 7, me(&root), Limits::DEFAULT);
        let t0 = Instant::now();
        assert_eq!(f.name(0x1000, t0), Some("first"));
        assert_eq!(f.name(0x2000, t0), None, "line not finished");
        // Finished: read at the next look after the interval.
        std::fs::write(&path, "1000 10 first\n2000 10 second\n3000 10 third\n").unwrap();
        assert_eq!(f.name(0x2000, t0 + MIN_INTERVAL / 2), None, "too soon");
        assert_eq!(f.name(0x2000, t0 + MIN_INTERVAL), Some("second"));
        assert_eq!(f.map().stats().lines, 3, "only the new lines were read");
        // Replaced by a shorter file: read from the start.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "4000 10 fourth\n").unwrap();
        assert_eq!(f.name(0x4000, t0 + 2 * MIN_INTERVAL), Some("fourth"));
        assert_eq!(f.name(0x1000, t0 + 2 * MIN_INTERVAL), None);
        assert!(f.take_notice().is_none());
        // Rewritten again and again: read again until the lifetime budget is spent.
        let limits = Limits { max_bytes: 30, ..Limits::DEFAULT };
        let mut g = PerfMapFile::under(root.clone(), 4242, 7, me(&root), limits);
        let mut named = 0;
        for i in 0..10u32 {
            // A new file each time (written aside, then renamed over the map).
            let line = format!("{:x} 10 function_{i:0>9}\n", 0x1000 * (i + 1));
            assert_eq!(line.len(), 27);
            std::fs::write(root.join("tmp/next"), line).unwrap();
            std::fs::rename(root.join("tmp/next"), &path).unwrap();
            named += usize::from(g.name(0x1000 * u64::from(i + 1), t0 + MIN_INTERVAL * (i + 3)).is_some());
        }
        assert_eq!(named, (30 * LIFETIME_READS as usize).div_ceil(27), "read while the budget lasts");
        // Owned by another user (or the process's users unknown): not read.
        let mut other = PerfMapFile::under(root.clone(), 4242, 7, vec![u32::MAX - 1], Limits::DEFAULT);
        assert_eq!(other.name(0x4000, t0), None);
        let mut unknown = PerfMapFile::under(root.clone(), 4242, 7, Vec::new(), Limits::DEFAULT);
        assert_eq!(unknown.name(0x4000, t0), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn over_the_bounds_it_is_said_once() {
        let root = temp_root("over");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let text: String = (0..100).map(|i| format!("{:x} 10 f{i}\n", 0x1000 + i * 0x10)).collect();
        std::fs::write(root.join("tmp/perf-1.map"), &text).unwrap();
        let limits = Limits { max_bytes: 1 << 20, max_entries: 10, max_name: 64 };
        let mut f = PerfMapFile::under(root.clone(), 4242, 1, me(&root), limits);
        assert_eq!(f.name(0x1000, Instant::now()), Some("f0"));
        let notice = f.take_notice().expect("said");
        assert!(
            notice
                .starts_with("uvspan: pid 4242's perf map is larger than uvspan reads (1 MiB, 10 entries): /proc/4242/root/tmp/perf-1.map"),
            "{notice}"
        );
        assert!(notice.contains("first 10 entries (90 lines not kept, 0 bytes not read)"), "{notice}");
        assert_eq!(f.take_notice(), None, "once");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The process controls its root: links stay inside it, and nothing it
    /// puts there can make uvspan block or read another file.
    #[test]
    fn opened_only_inside_the_root_and_only_a_regular_file() {
        let root = temp_root("escape");
        let outside = temp_root("outside");
        std::fs::write(outside.join("perf-1.map"), "1000 10 secret\n").unwrap();
        // /tmp a link to an absolute path: resolved inside the root.
        std::fs::create_dir_all(root.join("x")).unwrap();
        std::fs::write(root.join("x/perf-1.map"), "1000 10 inside\n").unwrap();
        std::os::unix::fs::symlink("/x", root.join("tmp")).unwrap();
        let mut f = PerfMapFile::under(root.clone(), 4242, 1, me(&root), Limits::DEFAULT);
        assert_eq!(f.name(0x1000, Instant::now()), Some("inside"));
        // Links to the file outside, absolute or through "..": not reached.
        std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
        std::os::unix::fs::symlink(format!("../../../../../../../..{}", outside.display()), root.join("up")).unwrap();
        for rel in ["abs/perf-1.map", "up/perf-1.map"] {
            let e = open_in_root(&root, rel).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{rel}: {e}");
        }
        // The map itself a link: not followed.
        std::os::unix::fs::symlink(outside.join("perf-1.map"), root.join("x/perf-2.map")).unwrap();
        assert!(open_in_root(&root, "tmp/perf-2.map").is_err());
        // A FIFO: refused without blocking.
        let fifo = std::ffi::CString::new(root.join("x/perf-3.map").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(open_in_root(&root, "tmp/perf-3.map").is_err());
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    /// The file is the traced process's: any bytes, read in any pieces,
    /// keep every bound and never panic; well-formed lines among garbage
    /// are all found.
    mod props {
        use proptest::prelude::*;

        use super::*;

        /// A reader giving `data` in pieces of the sizes in `cuts`.
        struct Pieces<'a> {
            data: &'a [u8],
            cuts: Vec<usize>,
            i: usize,
        }

        impl Read for Pieces<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let want = self.cuts.get(self.i).copied().unwrap_or(usize::MAX).max(1);
                self.i += 1;
                let n = want.min(buf.len()).min(self.data.len());
                buf[..n].copy_from_slice(&self.data[..n]);
                self.data = &self.data[n..];
                Ok(n)
            }
        }

        fn limits() -> impl Strategy<Value = Limits> {
            (0u64..4096, 0usize..64, 0usize..96).prop_map(|(max_bytes, max_entries, max_name)| Limits { max_bytes, max_entries, max_name })
        }

        /// Bytes that look like perf map lines often enough.
        fn text() -> impl Strategy<Value = Vec<u8>> {
            let piece = prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                "[0-9a-fA-Fx]{0,18}".prop_map(String::into_bytes),
                prop::sample::select(vec![" ", "\t", "\n", "\r\n", "0x", "ffffffffffffffff", "\u{e9}", "\u{fffd}"])
                    .prop_map(|s| s.as_bytes().to_vec()),
            ];
            prop::collection::vec(piece, 0..80).prop_map(|p| p.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn any_bytes_keep_the_bounds(data in text(), l in limits(), cuts in prop::collection::vec(1usize..300, 0..20), addrs in prop::collection::vec(any::<u64>(), 0..8)) {
                let mut m = PerfMap::new(l);
                let consumed = m.feed(Pieces { data: &data, cuts, i: 0 }).unwrap();
                prop_assert!(consumed <= l.max_bytes && consumed <= data.len() as u64);
                prop_assert_eq!(consumed, m.stats().bytes);
                prop_assert!(m.len() <= l.max_entries);
                prop_assert!(m.names_len() as u64 <= l.max_bytes);
                let s = m.stats();
                prop_assert_eq!(s.lines, s.garbage + s.not_kept + m.len() as u64);
                for e in &m.entries {
                    prop_assert!(e.start < e.end && e.len as usize <= l.max_name);
                    prop_assert!(m.name(e.start).is_some_and(|n| n.len() <= l.max_name));
                }
                for a in addrs {
                    prop_assert!(m.name(a).is_none_or(|n| n.len() <= l.max_name));
                }
                prop_assert!(m.entries.windows(2).all(|w| w[0].start <= w[1].start), "sorted");
            }

            #[test]
            fn lines_among_garbage_are_all_found(
                lines in prop::collection::vec(("[a-zA-Z_$:*~./0-9][a-zA-Z_$:*~ ./0-9]{0,39}", 1u64..0x100, any::<bool>(), prop::option::of("[^\n0-9a-fA-F \t][^\n]{0,30}")), 1..30),
                cuts in prop::collection::vec(1usize..200, 0..20),
            ) {
                let mut text = String::new();
                let mut want = Vec::new();
                for (i, (name, size, prefixed, garbage)) in lines.iter().enumerate() {
                    if let Some(g) = garbage {
                        text.push_str(g);
                        text.push('\n');
                    }
                    let start = 0x7f00_0000_0000 + i as u64 * 0x100;
                    text.push_str(&if *prefixed { format!("0x{start:x} 0x{size:x} {name}\n") } else { format!("{start:x} {size:x} {name}\n") });
                    want.push((start, start + size - 1, name.clone()));
                }
                let mut m = PerfMap::new(Limits::DEFAULT);
                m.feed(Pieces { data: text.as_bytes(), cuts, i: 0 }).unwrap();
                prop_assert_eq!(m.len(), want.len());
                for (start, last, name) in want {
                    prop_assert_eq!(m.name(start), Some(name.as_str()));
                    prop_assert_eq!(m.name(last), Some(name.as_str()));
                    prop_assert_eq!(m.name(last + 1), None);
                }
            }
        }
    }
}
