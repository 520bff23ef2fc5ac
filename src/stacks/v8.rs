//! Naming a JS frame from V8's heap, read from outside the process: the
//! JSFunction a frame holds → its SharedFunctionInfo → the name (a String,
//! or inside the ScopeInfo) and the Script (file name, line of the
//! function's start). Every offset and type comes from the node binary's
//! postmortem metadata ([`V8Layout`]); nothing here trusts what it reads:
//! each object's type is checked through its map, lengths are bounded, and
//! an unreadable or implausible object gives `None`, never a panic.
//!
//! Two facts are not in the metadata (the OpenTelemetry eBPF profiler reads
//! ScopeInfo the same way): where the function name sits among the
//! ScopeInfo's variable-length slots (after the context locals: the first
//! String from there), and where the function's source positions are — two
//! fixed slots (3 and 4) since V8 12.8 (Node ≥ 23), before that the first
//! pair of increasing Smis after the name.

use crate::symbols::v8meta::V8Layout;

/// Reads another process's memory (tests use byte buffers).
pub trait Memory {
    /// Fills `buf` from `addr`; false if any byte is unreadable.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// A named JS function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsFunction {
    /// "" for an anonymous function.
    pub name: String,
    pub script: Option<String>,
    /// 1-based line and column of the function's start in its script.
    pub line: Option<u32>,
    pub column: Option<u32>,
}

/// Longest string read (a function or file name: 4 KiB; a script's source
/// when its line ends are not computed yet: 8 MiB).
const NAME_MAX: usize = 4096;
const SOURCE_MAX: usize = 8 << 20;
/// Deepest cons/sliced/thin chain followed.
const STRING_DEPTH: u32 = 24;

pub struct Heap<'a, M: Memory> {
    l: &'a V8Layout,
    m: &'a M,
    /// V8 ≥ 12.8 (Node ≥ 23): the function's positions are ScopeInfo slots 3 and 4.
    fixed_positions: bool,
}

impl<'a, M: Memory> Heap<'a, M> {
    pub fn new(l: &'a V8Layout, m: &'a M, node_major: Option<u32>) -> Self {
        Heap { l, m, fixed_positions: node_major.is_some_and(|v| v >= 23) }
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.m.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }

    fn u16_at(&self, addr: u64) -> Option<u16> {
        let mut b = [0u8; 2];
        self.m.read(addr, &mut b).then(|| u16::from_le_bytes(b))
    }

    fn i32_at(&self, addr: u64) -> Option<i32> {
        let mut b = [0u8; 4];
        self.m.read(addr, &mut b).then(|| i32::from_le_bytes(b))
    }

    pub fn is_heap_object(&self, v: u64) -> bool {
        v & self.l.heap_object_tag_mask == self.l.heap_object_tag && v > 0x1000
    }

    fn untag(&self, v: u64) -> u64 {
        v - self.l.heap_object_tag
    }

    pub fn smi(&self, v: u64) -> Option<i64> {
        (v & self.l.smi_tag_mask == self.l.smi_tag).then(|| (v as i64) >> self.l.smi_value_shift)
    }

    /// The field at `off` of the heap object `obj` (tagged).
    fn field(&self, obj: u64, off: u64) -> Option<u64> {
        self.u64_at(self.untag(obj).checked_add(off)?)
    }

    /// The instance type of a tagged heap object, read through its map.
    pub fn instance_type(&self, obj: u64) -> Option<u16> {
        if !self.is_heap_object(obj) {
            return None;
        }
        let map = self.field(obj, self.l.heap_object_map)?;
        if !self.is_heap_object(map) {
            return None;
        }
        self.u16_at(self.untag(map) + self.l.map_instance_type)
    }

    fn is_string_type(&self, t: u16) -> bool {
        t < self.l.first_nonstring_type
    }

    /// Whether `v` is a JSFunction: its type is JS_FUNCTION_TYPE or one of
    /// the subtypes V8 numbers right after it (class constructors and the
    /// like, up to 15 since V8 9.6), and its `shared` field is a
    /// SharedFunctionInfo — the second check is what makes the range safe.
    pub fn shared_info_of(&self, v: u64) -> Option<u64> {
        let t = self.instance_type(v)?;
        if t < self.l.js_function_type || t > self.l.js_function_type + 15 {
            return None;
        }
        let sfi = self.field(v, self.l.js_function_shared)?;
        (self.instance_type(sfi)? == self.l.shared_function_info_type).then_some(sfi)
    }

    /// Like [`Self::shared_info_of`], from the first words of the object as
    /// they were at the sample (`words[0]` its map): the object itself may
    /// have moved since, its map and SharedFunctionInfo (old space) not.
    pub fn shared_info_from(&self, words: &[u64]) -> Option<u64> {
        let map = *words.first()?;
        if !self.is_heap_object(map) {
            return None;
        }
        let t = self.u16_at(self.untag(map) + self.l.map_instance_type)?;
        if t < self.l.js_function_type || t > self.l.js_function_type + 15 {
            return None;
        }
        let at = usize::try_from(self.l.js_function_shared / 8).ok()?;
        let sfi = match words.get(at) {
            Some(&w) if self.l.js_function_shared % 8 == 0 => w,
            _ => return None,
        };
        (self.instance_type(sfi)? == self.l.shared_function_info_type).then_some(sfi)
    }

    /// The function held by a frame's function slot, named; None if `v` is
    /// not a JSFunction.
    pub fn function(&self, v: u64) -> Option<JsFunction> {
        self.describe(self.shared_info_of(v)?)
    }

    /// Name and place of a SharedFunctionInfo (tagged, type already checked).
    pub fn describe(&self, sfi: u64) -> Option<JsFunction> {
        let nos = self.field(sfi, self.l.sfi_name_or_scope_info)?;
        let (name, pos) = match self.instance_type(nos) {
            Some(t) if self.is_string_type(t) => (self.string(nos, NAME_MAX).unwrap_or_default(), None),
            Some(t) if t == self.l.scope_info_type => self.scope_info(nos),
            _ => (String::new(), None),
        };
        let mut f = JsFunction { name, script: None, line: None, column: None };
        let script = self.field(sfi, self.l.sfi_script)?;
        if self.instance_type(script) == Some(self.l.script_type) {
            let sname = self.field(script, self.l.script_name);
            f.script = sname.and_then(|s| self.string(s, NAME_MAX)).filter(|s| !s.is_empty());
            if let Some(pos) = pos {
                if let Some((line, col)) = self.line_of(script, pos) {
                    f.line = Some(line);
                    f.column = Some(col);
                }
            }
        }
        Some(f)
    }

    /// Function name and start position from a ScopeInfo (see the module
    /// comment for what is heuristic).
    fn scope_info(&self, si: u64) -> (String, Option<u64>) {
        // ScopeInfo is a HeapObject since V8 9.1 (Node ≥ 16.4): slots follow the map.
        let data = self.untag(si) + self.l.heap_object_map + 8;
        let slot = |i: u64| self.u64_at(data + i * 8);
        let Some(ncl) = slot(self.l.scope_info_ncontextlocals).and_then(|v| self.smi(v)) else {
            return (String::new(), None);
        };
        if !(0..=4096).contains(&ncl) {
            return (String::new(), None);
        }
        let first = self.l.scope_info_first_vars + 2 * ncl as u64;
        let mut name = None;
        let mut pos = None;
        if self.fixed_positions {
            if let (Some(s), Some(e)) = (slot(3).and_then(|v| self.smi(v)), slot(4).and_then(|v| self.smi(v))) {
                if 0 <= s && s <= e {
                    pos = Some(s as u64);
                }
            }
        }
        let mut prev: Option<i64> = None;
        for i in first..first + 12 {
            let Some(cur) = slot(i) else { break };
            if name.is_none() && self.is_heap_object(cur) {
                if let Some(t) = self.instance_type(cur).filter(|&t| self.is_string_type(t)) {
                    let _ = t;
                    name = self.string(cur, NAME_MAX);
                }
            }
            if self.fixed_positions {
                if name.is_some() {
                    break;
                }
                continue;
            }
            let c = self.smi(cur);
            if let (Some(p), Some(c)) = (prev, c) {
                if 0 <= p && p < c {
                    pos = Some(p as u64);
                    break;
                }
            }
            prev = c;
        }
        (name.unwrap_or_default(), pos)
    }

    /// 1-based line and column of source position `pos` in `script`: from
    /// its line ends when V8 has computed them, else by counting the line
    /// breaks of its source.
    fn line_of(&self, script: u64, pos: u64) -> Option<(u32, u32)> {
        let ends = self.field(script, self.l.script_line_ends).and_then(|le| self.line_ends(le));
        let ends = match ends {
            Some(e) => e,
            None => {
                let src = self.field(script, self.l.script_source)?;
                let mut units = Vec::new();
                self.units(src, 0, (pos as usize).min(SOURCE_MAX), &mut units, 0)?;
                units.iter().enumerate().filter(|(_, &u)| u == u16::from(b'\n')).map(|(i, _)| i as u64).collect()
            }
        };
        Some(line_col(&ends, pos))
    }

    /// `Script.line_ends` when it is a FixedArray of Smis.
    fn line_ends(&self, v: u64) -> Option<Vec<u64>> {
        let t = self.instance_type(v)?;
        if self.l.fixed_array_type.is_some_and(|f| f != t) {
            return None;
        }
        let n = self.smi(self.field(v, self.l.fixed_array_length)?)?;
        if !(1..=(1 << 22)).contains(&n) {
            return None;
        }
        let mut buf = vec![0u8; n as usize * 8];
        if !self.m.read(self.untag(v) + self.l.fixed_array_data, &mut buf) {
            return None;
        }
        buf.chunks_exact(8)
            .map(|c| self.smi(u64::from_le_bytes(c.try_into().unwrap_or([1; 8]))).and_then(|x| u64::try_from(x).ok()))
            .collect()
    }

    /// A V8 String as Rust text (Latin-1 or UTF-16 decoded), at most `max` code units.
    pub fn string(&self, v: u64, max: usize) -> Option<String> {
        let mut units = Vec::new();
        self.units(v, 0, max, &mut units, 0)?;
        Some(String::from_utf16_lossy(&units))
    }

    /// Appends code units [start, start + limit) of string `v` to `out`.
    fn units(&self, v: u64, start: usize, limit: usize, out: &mut Vec<u16>, depth: u32) -> Option<()> {
        if depth > STRING_DEPTH || limit == 0 {
            return (depth <= STRING_DEPTH).then_some(());
        }
        let t = self.instance_type(v)?;
        if !self.is_string_type(t) {
            return None;
        }
        let len = usize::try_from(self.i32_at(self.untag(v) + self.l.string_length)?).ok()?;
        if len > 1 << 30 {
            return None;
        }
        if start >= len {
            return Some(());
        }
        let take = (len - start).min(limit);
        let one_byte = t & self.l.string_encoding_mask == self.l.one_byte_string_tag;
        let repr = t & self.l.string_representation_mask;
        let raw = |addr: u64, out: &mut Vec<u16>| -> Option<()> {
            let width = if one_byte { 1 } else { 2 };
            let mut buf = vec![0u8; take * width];
            if !self.m.read(addr + (start * width) as u64, &mut buf) {
                return None;
            }
            if one_byte {
                out.extend(buf.iter().map(|&b| u16::from(b)));
            } else {
                out.extend(buf.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])));
            }
            Some(())
        };
        if repr == self.l.seq_string_tag {
            let off = if one_byte { self.l.seq_one_byte_chars } else { self.l.seq_two_byte_chars };
            raw(self.untag(v) + off, out)
        } else if repr == self.l.cons_string_tag {
            let first = self.field(v, self.l.cons_first)?;
            let second = self.field(v, self.l.cons_second)?;
            let flen = usize::try_from(self.i32_at(self.untag(first) + self.l.string_length)?).ok()?;
            if start < flen {
                self.units(first, start, take.min(flen - start), out, depth + 1)?;
            }
            let done = flen.saturating_sub(start).min(take);
            if done < take {
                self.units(second, start.saturating_sub(flen), take - done, out, depth + 1)?;
            }
            Some(())
        } else if repr == self.l.thin_string_tag {
            self.units(self.field(v, self.l.thin_actual)?, start, take, out, depth + 1)
        } else if repr == self.l.sliced_string_tag {
            let parent = self.field(v, self.l.sliced_parent)?;
            let off = usize::try_from(self.smi(self.field(v, self.l.sliced_offset)?)?).ok()?;
            self.units(parent, start + off, take, out, depth + 1)
        } else if repr == self.l.external_string_tag {
            // The resource's data pointer is cached right after the
            // resource pointer, except in "uncached" external strings.
            if self.l.uncached_external_types.contains(&t) {
                return None;
            }
            let data = self.field(v, self.l.external_resource + 8)?;
            if data == 0 {
                return None;
            }
            raw(data, out)
        } else {
            None
        }
    }
}

/// 1-based (line, column) of position `pos` given the positions of the
/// line breaks, ascending.
pub fn line_col(ends: &[u64], pos: u64) -> (u32, u32) {
    let i = ends.partition_point(|&e| e < pos);
    let line_start = if i == 0 { 0 } else { ends[i - 1] + 1 };
    ((i + 1) as u32, (pos - line_start + 1).min(u64::from(u32::MAX)) as u32)
}

#[cfg(test)]
pub(crate) mod tests {
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
        let c: HashMap<String, i64> = [
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
        .collect();
        V8Layout::from_constants(&c).unwrap()
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
}
