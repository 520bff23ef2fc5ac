use std::collections::{BTreeMap, HashMap};

use super::*;

/// Sparse fake memory: (address → bytes) regions.
#[derive(Default)]
pub struct Fake(pub BTreeMap<u64, Vec<u8>>);

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some((&base, bytes)) = self.0.range(..=addr).next_back() else { return false };
        let at = (addr - base) as usize;
        match bytes.get(at..at + buf.len()) {
            Some(b) => {
                buf.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

/// A layout with Node 20's values for what the tests touch.
pub fn layout() -> V8Layout {
    V8Layout::from_constants(&constants()).unwrap()
}

/// The postmortem constants of [`layout`].
pub fn constants() -> HashMap<String, i64> {
    [
        ("HeapObjectTag", 1),
        ("HeapObjectTagMask", 3),
        ("SmiTag", 0),
        ("SmiTagMask", 1),
        ("SmiShiftSize", 31),
        ("SmiValueShift", 1),
        ("off_fp_function", -16),
        ("off_fp_context_or_frame_type", -8),
        ("class_HeapObject__map__Map", 0),
        ("class_Map__instance_type__uint16_t", 12),
        ("FirstNonstringType", 128),
        ("StringRepresentationMask", 7),
        ("StringEncodingMask", 8),
        ("OneByteStringTag", 8),
        ("SeqStringTag", 0),
        ("ConsStringTag", 1),
        ("ExternalStringTag", 2),
        ("SlicedStringTag", 3),
        ("ThinStringTag", 5),
        ("class_String__length__int32_t", 12),
        ("class_SeqOneByteString__chars__char", 16),
        ("class_SeqTwoByteString__chars__char", 16),
        ("class_ConsString__first__String", 16),
        ("class_ConsString__second__String", 24),
        ("class_ThinString__actual__String", 16),
        ("class_SlicedString__parent__String", 16),
        ("class_SlicedString__offset__SMI", 24),
        ("class_ExternalString__resource__Object", 16),
        ("type_JSFunction__JS_FUNCTION_TYPE", 2000),
        ("class_JSFunction__shared__SharedFunctionInfo", 24),
        ("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE", 300),
        ("type_ScopeInfo__SCOPE_INFO_TYPE", 301),
        ("type_Script__SCRIPT_TYPE", 302),
        ("type_FixedArray__FIXED_ARRAY_TYPE", 303),
        ("class_SharedFunctionInfo__name_or_scope_info__Object", 16),
        ("class_SharedFunctionInfo__script_or_debug_info__HeapObject", 32),
        ("scopeinfo_idx_first_vars", 4),
        ("scopeinfo_idx_ncontextlocals", 2),
        ("class_Script__name__Object", 16),
        ("class_Script__source__Object", 8),
        ("class_Script__line_ends__Object", 24),
        ("class_FixedArrayBase__length__SMI", 8),
        ("class_FixedArray__data__uintptr_t", 16),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub fn smi(v: i64) -> u64 {
    (v << 32) as u64
}

/// Builds objects in fake memory; addresses are untagged, return values tagged.
pub struct Builder {
    pub mem: Fake,
    next: u64,
    maps: HashMap<u16, u64>,
}

impl Builder {
    pub fn new() -> Self {
        Builder { mem: Fake::default(), next: 0x10_0000, maps: HashMap::new() }
    }

    fn alloc(&mut self, bytes: Vec<u8>) -> u64 {
        let at = self.next;
        self.next += (bytes.len() as u64 + 0x100) & !0xF;
        self.mem.0.insert(at, bytes);
        at
    }

    fn map(&mut self, t: u16) -> u64 {
        if let Some(&m) = self.maps.get(&t) {
            return m;
        }
        let mut b = vec![0u8; 16];
        b[12..14].copy_from_slice(&t.to_le_bytes());
        let m = self.alloc(b) + 1;
        self.maps.insert(t, m);
        m
    }

    /// An object of type `t` whose words after the map are `words`.
    pub fn object(&mut self, t: u16, words: &[u64]) -> u64 {
        let map = self.map(t);
        let mut b = map.to_le_bytes().to_vec();
        for w in words {
            b.extend(w.to_le_bytes());
        }
        self.alloc(b) + 1
    }

    pub fn seq_one_byte(&mut self, s: &str) -> u64 {
        let map = self.map(8); // SeqOneByte, not internalized
        let mut b = map.to_le_bytes().to_vec();
        b.extend(0u32.to_le_bytes()); // hash
        b.extend((s.len() as i32).to_le_bytes());
        b.extend(s.bytes());
        self.alloc(b) + 1
    }

    pub fn seq_two_byte(&mut self, s: &str) -> u64 {
        let map = self.map(0);
        let units: Vec<u16> = s.encode_utf16().collect();
        let mut b = map.to_le_bytes().to_vec();
        b.extend(0u32.to_le_bytes());
        b.extend((units.len() as i32).to_le_bytes());
        for u in units {
            b.extend(u.to_le_bytes());
        }
        self.alloc(b) + 1
    }

    /// A string header of type `t` followed by `words`.
    pub fn string_of(&mut self, t: u16, len: usize, words: &[u64]) -> u64 {
        let map = self.map(t);
        let mut b = map.to_le_bytes().to_vec();
        b.extend(0u32.to_le_bytes());
        b.extend((len as i32).to_le_bytes());
        for w in words {
            b.extend(w.to_le_bytes());
        }
        self.alloc(b) + 1
    }

    pub fn raw(&mut self, bytes: Vec<u8>) -> u64 {
        self.alloc(bytes)
    }
}

fn read_string(b: &Builder, v: u64) -> Option<String> {
    let l = layout();
    Heap::new(&l, &b.mem, Some(20)).string(v, 1000)
}

#[test]
fn strings_of_every_layout_decode() {
    let mut b = Builder::new();
    let one = b.seq_one_byte("parseBig");
    let two = b.seq_two_byte("Payload€");
    assert_eq!(read_string(&b, one).as_deref(), Some("parseBig"));
    assert_eq!(read_string(&b, two).as_deref(), Some("Payload€"));
    let cons = b.string_of(1, 16, &[one, two]); // ConsString, two-byte
    assert_eq!(read_string(&b, cons).as_deref(), Some("parseBigPayload€"));
    let thin = b.string_of(5 | 8, 8, &[one]);
    assert_eq!(read_string(&b, thin).as_deref(), Some("parseBig"));
    let sliced = b.string_of(3 | 8, 3, &[one, smi(5)]);
    assert_eq!(read_string(&b, sliced).as_deref(), Some("Big"));
    let data = b.raw(b"external!".to_vec());
    let ext = b.string_of(2 | 8, 8, &[0xdead_0000, data]);
    assert_eq!(read_string(&b, ext).as_deref(), Some("external"));
}

#[test]
fn bad_strings_give_none_not_a_panic() {
    let mut b = Builder::new();
    assert_eq!(read_string(&b, 0x42), None, "a Smi");
    assert_eq!(read_string(&b, 0x9999_0001), None, "unmapped");
    let not_string = b.object(300, &[]);
    assert_eq!(read_string(&b, not_string), None);
    let huge = b.string_of(8, i32::MAX as usize, &[]);
    assert_eq!(read_string(&b, huge), None, "length beyond the readable bytes");
    // A cons string that contains itself ends at the depth limit.
    let map_addr = b.string_of(1 | 8, 4, &[0, 0]);
    let self_ref = map_addr;
    let mut bytes = b.mem.0.get(&(self_ref - 1)).unwrap().clone();
    bytes[16..24].copy_from_slice(&self_ref.to_le_bytes());
    bytes[24..32].copy_from_slice(&self_ref.to_le_bytes());
    b.mem.0.insert(self_ref - 1, bytes);
    assert_eq!(read_string(&b, self_ref), None);
}

/// What the property tests below found: a cons string whose half is
/// not a pointer, a map pointer at the top of the address space (both
/// overflowed the address arithmetic: a panic in debug builds), and a
/// script whose line ends or source claim millions of entries (read in
/// one piece: up to 32 MB allocated per function named).
#[test]
fn corrupt_objects_that_panicked_or_read_megabytes() {
    let mut b = Builder::new();
    let l = layout();
    let cons = b.string_of(1 | 8, 4, &[0, 0]);
    assert_eq!(read_string(&b, cons), None, "a cons string whose halves are Smi zeros");
    let top = b.raw((u64::MAX - 2).to_le_bytes().to_vec()) + 1;
    assert_eq!(Heap::new(&l, &b.mem, Some(20)).instance_type(top), None, "a map at the top of the address space");
    let source = b.string_of(8, 8 << 20, &[0x0a0a_0a0a_0a0a_0a0a; 4]);
    let file = b.seq_one_byte("f.js");
    let ends = b.object(303, &[smi(1 << 22), smi(3), smi(10)]);
    let script = b.object(302, &[source, file, ends]);
    let m = props::Counted::new(&b.mem);
    let h = Heap::new(&l, &m, Some(20));
    assert_eq!(h.line_of(script, 5 << 20), None, "neither the line ends nor the source are readable that far");
    assert!(m.largest.get() <= READ_CHUNK, "a read of {} bytes", m.largest.get());
    let mut c = constants();
    c.insert("SmiShiftSize".into(), 63);
    assert!(V8Layout::from_constants(&c).is_err(), "a Smi shift of 64");
}

/// Cons strings whose two halves are the same string, 22 levels deep:
/// a graph of 23 objects that is a tree of 4 million leaves. Reading it
/// stops after [`STRING_NODES`] objects.
#[test]
fn a_cons_string_graph_is_read_in_bounded_time() {
    let mut b = Builder::new();
    let l = layout();
    let empty = b.string_of(8, 0, &[]);
    let mut s = b.string_of(1 | 8, 1, &[empty, empty]);
    for d in 1..=22 {
        s = b.string_of(1 | 8, 1 << d, &[s, s]);
    }
    let file = b.seq_one_byte("f.js");
    let undefined = b.object(400, &[]);
    let script = b.object(302, &[s, file, undefined]);
    let m = props::Counted::new(&b.mem);
    let h = Heap::new(&l, &m, Some(20));
    assert_eq!(h.line_of(script, 4 << 20), None);
    assert_eq!(h.string(s, NAME_MAX), None);
    // Two reads, each of at most STRING_NODES objects of a few words.
    assert!(m.reads.get() <= 2 * 8 * u64::from(STRING_NODES), "{} reads", m.reads.get());
}

#[test]
fn line_and_column_from_line_ends() {
    assert_eq!(line_col(&[9, 20], 0), (1, 1));
    assert_eq!(line_col(&[9, 20], 5), (1, 6));
    assert_eq!(line_col(&[9, 20], 10), (2, 1));
    assert_eq!(line_col(&[9, 20], 25), (3, 5));
}

/// JSFunction → SFI (name in a ScopeInfo) → Script (name, source
/// without line ends): the whole chain from bytes.
#[test]
fn a_function_is_named_from_its_scope_info_and_script() {
    let mut b = Builder::new();
    let l = layout();
    let name = b.seq_one_byte("handleRequest");
    let file = b.seq_one_byte("/srv/app/blocker.js");
    let source = b.seq_one_byte("// app\n\nfunction handleRequest(req) {\n}\n");
    let undefined = b.object(400, &[]);
    // Script: source @8, name @16, line_ends @24 (undefined: not computed).
    let script = b.object(302, &[source, file, undefined]);
    // ScopeInfo slots: flags, nparams, ncontextlocals = 1, 2 reserved, the
    // local's name and info, then the function name and positions.
    let local = b.seq_one_byte("x");
    let pos = 17; // "handleRequest" starts on line 3, column 10
    let si = b.object(301, &[smi(0), smi(1), smi(1), smi(0), local, smi(0), name, smi(pos), smi(pos + 20)]);
    let sfi = b.object(300, &[0, si, 0, script]);
    let func = b.object(2000 + 3, &[0, 0, sfi]);
    let heap = Heap::new(&l, &b.mem, Some(20));
    let f = heap.function(func).expect("named");
    assert_eq!(f.name, "handleRequest");
    assert_eq!(f.script.as_deref(), Some("/srv/app/blocker.js"));
    assert_eq!((f.line, f.column), (Some(3), Some(10)));
    // The same from the words copied at the sample, after the function moved.
    let words: Vec<u64> = (0..6).map(|i| heap.u64_at(func - 1 + i * 8).unwrap_or(0)).collect();
    assert_eq!(heap.shared_info_from(&words), Some(sfi));
    assert_eq!(heap.shared_info_from(&[0; 6]), None);
    assert_eq!(heap.shared_info_from(&words[..2]), None, "shared beyond the copied words");
    // Not a function: a frame slot holding something else.
    assert_eq!(heap.function(sfi), None);
    assert_eq!(heap.function(smi(7)), None);
}

#[test]
fn a_string_name_and_computed_line_ends() {
    let mut b = Builder::new();
    let l = layout();
    let name = b.seq_one_byte("parseBigPayload");
    let file = b.seq_one_byte("blocker.js");
    let ends = b.object(303, &[smi(3), smi(10), smi(20), smi(30)]);
    let script = b.object(302, &[0, file, ends]);
    let sfi = b.object(300, &[0, name, 0, script]);
    let func = b.object(2000, &[0, 0, sfi]);
    let f = Heap::new(&l, &b.mem, Some(20)).function(func).unwrap();
    assert_eq!(f.name, "parseBigPayload");
    assert_eq!(f.script.as_deref(), Some("blocker.js"));
    assert_eq!(f.line, None, "a String name carries no position");
}

#[test]
fn newer_v8_keeps_positions_in_fixed_slots() {
    let mut b = Builder::new();
    let l = layout();
    let name = b.seq_one_byte("hot");
    let file = b.seq_one_byte("f.js");
    let ends = b.object(303, &[smi(3), smi(3), smi(9), smi(30)]);
    let script = b.object(302, &[0, file, ends]);
    let si = b.object(301, &[smi(0), smi(0), smi(0), smi(12), smi(40), name]);
    let sfi = b.object(300, &[0, si, 0, script]);
    let func = b.object(2001, &[0, 0, sfi]);
    let f = Heap::new(&l, &b.mem, Some(24)).function(func).unwrap();
    assert_eq!((f.name.as_str(), f.line, f.column), ("hot", Some(3), Some(3)));
}

/// What a traced process controls: its heap. Arbitrary memory (words
/// that look like tagged pointers into it, small integers, type
/// numbers, anything) must give None or some bounded name, never a
/// panic, in a bounded number and size of reads.
pub mod props {
    use std::cell::Cell;

    use proptest::prelude::*;

    use super::*;

    const BASE: u64 = 0x10_0000;
    /// Reads one name may take (a string's nodes, a ScopeInfo's slots, a
    /// binary search of line ends...), and the largest read.
    const READS_MAX: u64 = 50_000;
    const READ_MAX: usize = 64 << 10;

    /// Memory that is one region of words at BASE, counting what is read.
    struct Fuzzed {
        bytes: Vec<u8>,
        reads: Cell<u64>,
        largest: Cell<usize>,
    }

    impl Fuzzed {
        fn new(words: &[u64]) -> Fuzzed {
            Fuzzed { bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(), reads: Cell::new(0), largest: Cell::new(0) }
        }
    }

    impl Memory for Fuzzed {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.reads.set(self.reads.get() + 1);
            self.largest.set(self.largest.get().max(buf.len()));
            let Some(at) = addr.checked_sub(BASE).and_then(|a| usize::try_from(a).ok()) else { return false };
            match at.checked_add(buf.len()).and_then(|end| self.bytes.get(at..end)) {
                Some(b) => {
                    buf.copy_from_slice(b);
                    true
                }
                None => false,
            }
        }
    }

    /// Another memory, counting what is read.
    pub struct Counted<'a, M: Memory> {
        m: &'a M,
        pub reads: Cell<u64>,
        pub largest: Cell<usize>,
    }

    impl<'a, M: Memory> Counted<'a, M> {
        pub fn new(m: &'a M) -> Self {
            Counted { m, reads: Cell::new(0), largest: Cell::new(0) }
        }
    }

    impl<M: Memory> Memory for Counted<'_, M> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.reads.set(self.reads.get() + 1);
            self.largest.set(self.largest.get().max(buf.len()));
            self.m.read(addr, buf)
        }
    }

    /// A word of a fuzzed heap: a tagged pointer into it (often), a Smi
    /// (also a type number or a string length where those are read),
    /// anything.
    fn word(words: usize) -> impl Strategy<Value = u64> {
        let words = words as u64;
        prop_oneof![
            4 => (0..words).prop_map(|i| BASE + i * 8 + 1),
            3 => (-5i64..5000).prop_map(|v| (v << 32) as u64),
            1 => (2000i64..2016).prop_map(|v| (v << 32) as u64),
            1 => any::<i32>().prop_map(|v| (i64::from(v) << 32) as u64),
            1 => any::<u64>(),
            1 => (0u64..64).prop_map(|d| u64::MAX - d),
            1 => Just(0u64),
        ]
    }

    /// A word to write over a field of a real object: a huge or
    /// negative Smi (a length, an offset, a position), a pointer to
    /// itself or nowhere.
    fn field_value() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<i32>().prop_map(|v| (i64::from(v) << 32) as u64),
            (0i64..(1 << 23)).prop_map(|v| (v << 32) as u64),
            any::<u64>(),
            (0u64..64).prop_map(|d| u64::MAX - d),
            (0u64..0x2000).prop_map(|o| 0x10_0000 + o * 8 + 1),
        ]
    }

    fn heap() -> impl Strategy<Value = Vec<u64>> {
        (16usize..160).prop_flat_map(|n| prop::collection::vec(word(n), n))
    }

    /// Every entry point a sample uses, on `v`; what comes out is bounded.
    fn read_all<M: Memory>(h: &Heap<'_, M>, v: u64, words: &[u64]) {
        for f in [h.function(v), h.shared_info_of(v).and_then(|s| h.describe(s)), h.describe(v)].into_iter().flatten() {
            assert!(f.name.len() <= 3 * NAME_MAX, "name of {} bytes", f.name.len());
            assert!(f.script.as_ref().is_none_or(|s| s.len() <= 3 * NAME_MAX));
        }
        if let Some(s) = h.string(v, NAME_MAX) {
            assert!(s.len() <= 3 * NAME_MAX);
        }
        let _ = h.shared_info_from(words);
        let _ = h.instance_type(v);
    }

    /// The values a corrupted function chain is built with.
    #[derive(Debug)]
    struct Fields {
        ends_len: u64,
        source_len: i32,
        name_len: i32,
        start: u64,
        end: u64,
        context_locals: u64,
        sliced_offset: u64,
    }

    fn fields() -> impl Strategy<Value = Fields> {
        (field_value(), any::<i32>(), any::<i32>(), field_value(), field_value(), field_value(), field_value()).prop_map(
            |(ends_len, source_len, name_len, start, end, context_locals, sliced_offset)| Fields {
                ends_len,
                source_len,
                name_len,
                start,
                end,
                context_locals,
                sliced_offset,
            },
        )
    }

    /// JSFunctions named through a ScopeInfo (a cons name) with line
    /// ends, through a ScopeInfo with only the source (a sliced name),
    /// and through a String name; `f` replaces their lengths and
    /// positions.
    fn chain(f: &Fields) -> (Builder, [u64; 3]) {
        let mut b = Builder::new();
        let name = b.seq_one_byte("handleRequest");
        let file = b.seq_one_byte("/srv/app/blocker.js");
        let source = b.string_of(8, f.source_len.max(0) as usize, &[u64::from_le_bytes(*b"// ap\n\nf"); 8]);
        let undefined = b.object(400, &[]);
        let ends = b.object(303, &[f.ends_len, smi(3), smi(10), smi(20), smi(30)]);
        let with_ends = b.object(302, &[source, file, ends]);
        let without = b.object(302, &[source, file, undefined]);
        let long = b.string_of(8, f.name_len.max(0) as usize, &[0x4141_4141_4141_4141; 4]);
        let cons = b.string_of(1 | 8, 26, &[name, long]);
        let sliced = b.string_of(3 | 8, 5, &[name, f.sliced_offset]);
        let local = b.seq_one_byte("x");
        let si = b.object(301, &[smi(0), smi(1), f.context_locals, f.start, f.end, local, smi(0), cons, f.start, f.end]);
        let si2 = b.object(301, &[smi(0), smi(1), smi(0), f.start, f.end, sliced, f.start, f.end]);
        let sfis = [b.object(300, &[0, si, 0, with_ends]), b.object(300, &[0, si2, 0, without]), b.object(300, &[0, long, 0, with_ends])];
        let funcs = [b.object(2000 + 3, &[0, 0, sfis[0]]), b.object(2000, &[0, 0, sfis[1]]), b.object(2001, &[0, 0, sfis[2]])];
        (b, funcs)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn a_fuzzed_heap_gives_bounded_names_in_bounded_reads(words in heap(), at in any::<prop::sample::Index>(), major in prop::sample::select(vec![18u32, 20, 22, 24])) {
            let l = layout();
            let m = Fuzzed::new(&words);
            let h = Heap::new(&l, &m, Some(major));
            let v = words[at.index(words.len())];
            let first = &words[at.index(words.len())..];
            read_all(&h, v, &first[..first.len().min(6)]);
            read_all(&h, BASE + at.index(words.len()) as u64 * 8 + 1, &[]);
            prop_assert!(m.reads.get() <= READS_MAX, "{} reads", m.reads.get());
            prop_assert!(m.largest.get() <= READ_MAX, "a read of {} bytes", m.largest.get());
        }

        /// A real chain (JSFunction → SharedFunctionInfo → ScopeInfo →
        /// Script) with its lengths, positions and pointers replaced and
        /// bytes overwritten.
        #[test]
        fn a_corrupted_function_gives_none_or_a_bounded_name(
            f in fields(),
            muts in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 0..8),
            words in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), field_value()), 0..4),
        ) {
            let l = layout();
            let (mut b, funcs) = chain(&f);
            let keys: Vec<u64> = b.mem.0.keys().copied().collect();
            for (region, at, byte) in muts {
                let bytes = b.mem.0.get_mut(&keys[region.index(keys.len())]).unwrap();
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            for (region, at, value) in words {
                let bytes = b.mem.0.get_mut(&keys[region.index(keys.len())]).unwrap();
                let i = at.index(bytes.len() / 8) * 8;
                if let Some(w) = bytes.get_mut(i..i + 8) {
                    w.copy_from_slice(&value.to_le_bytes());
                }
            }
            let m = Counted::new(&b.mem);
            for major in [20, 24] {
                let h = Heap::new(&l, &m, Some(major));
                for func in funcs {
                    read_all(&h, func, &[]);
                }
            }
            prop_assert!(m.reads.get() <= READS_MAX, "{} reads", m.reads.get());
            prop_assert!(m.largest.get() <= READ_MAX, "a read of {} bytes", m.largest.get());
        }

        /// The layout comes from the target's binary too: any constants
        /// that make a layout must not make reading panic.
        #[test]
        fn a_fuzzed_layout_does_not_panic(
            overrides in prop::collection::vec((any::<prop::sample::Index>(), prop_oneof![0i64..80, 0i64..70_000, any::<i32>().prop_map(i64::from)]), 0..8),
            shift in prop_oneof![Just(31i64), 0i64..80],
            js_function in prop_oneof![Just(2000i64), 65_500i64..65_536],
            words in heap(),
            at in any::<prop::sample::Index>(),
            f in fields(),
        ) {
            let mut c = constants();
            c.insert("SmiShiftSize".into(), shift);
            c.insert("type_JSFunction__JS_FUNCTION_TYPE".into(), js_function);
            let mut keys: Vec<String> = c.keys().cloned().collect();
            keys.sort();
            for (k, v) in overrides {
                c.insert(keys[k.index(keys.len())].clone(), v);
            }
            let Ok(l) = V8Layout::from_constants(&c) else { return Ok(()) };
            let m = Fuzzed::new(&words);
            let h = Heap::new(&l, &m, Some(20));
            let i = at.index(words.len());
            read_all(&h, words[i], &words[i..(i + 6).min(words.len())]);
            prop_assert!(m.largest.get() <= READ_MAX, "a read of {} bytes", m.largest.get());
            let (b, funcs) = chain(&f);
            let m = Counted::new(&b.mem);
            for major in [20, 24] {
                let h = Heap::new(&l, &m, Some(major));
                for func in funcs {
                    read_all(&h, func, &[]);
                }
            }
            prop_assert!(m.largest.get() <= READ_MAX, "a read of {} bytes", m.largest.get());
        }
    }
}
