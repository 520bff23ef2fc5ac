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
        notice.starts_with("uvspan: pid 4242's perf map is larger than uvspan reads (1 MiB, 10 entries): /proc/4242/root/tmp/perf-1.map"),
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
