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
mod tests;
