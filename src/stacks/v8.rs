//! Naming a JS frame from V8's heap, read from outside the process: the
//! JSFunction a frame holds → its SharedFunctionInfo → the name (a String,
//! or inside the ScopeInfo) and the Script (file name, line of the
//! function's start). Every offset and type comes from the node binary's
//! postmortem metadata ([`V8Layout`]); nothing here trusts what it reads:
//! each object's type is checked through its map, lengths are bounded, and
//! an unreadable or implausible object gives `None`, never a panic. What one
//! name costs is bounded as well: at most `STRING_NODES` string objects per
//! string, reads of at most `READ_CHUNK` bytes, a script's source scanned
//! in pieces and its line ends binary-searched where they are (property
//! tests in `v8/tests.rs` feed it arbitrary memory).
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

/// Longest string read, in code units (a function or file name: 4 Ki; a
/// script's source, scanned for line breaks when its line ends are not
/// computed yet: 8 Mi, streamed in [`READ_CHUNK`]s, never held).
const NAME_MAX: usize = 4096;
const SOURCE_MAX: usize = 8 << 20;
/// Deepest cons/sliced/thin chain followed.
const STRING_DEPTH: u32 = 24;
/// String objects visited for one string at most: a crafted graph of cons
/// strings (a node's two halves the same string, say) cannot make one read
/// take more.
const STRING_NODES: u32 = 1024;
/// Largest read of a string's characters at once (bytes).
const READ_CHUNK: usize = 32 << 10;
/// Longest `Script.line_ends` array searched (its entries are read by a
/// binary search, a few words, not copied).
const LINE_ENDS_MAX: i64 = 1 << 22;
/// JSFunction subtypes V8 numbers right after JS_FUNCTION_TYPE.
const JS_FUNCTION_SUBTYPES: u16 = 15;

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

    /// The address of a tagged pointer (wrapping: a word that is not one
    /// gives an address that fails to read).
    fn untag(&self, v: u64) -> u64 {
        v.wrapping_sub(self.l.heap_object_tag)
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
        self.u16_at(self.untag(map).checked_add(self.l.map_instance_type)?)
    }

    fn is_js_function_type(&self, t: u16) -> bool {
        (self.l.js_function_type..=self.l.js_function_type.saturating_add(JS_FUNCTION_SUBTYPES)).contains(&t)
    }

    fn is_string_type(&self, t: u16) -> bool {
        t < self.l.first_nonstring_type
    }

    /// Whether `v` is a JSFunction: its type is JS_FUNCTION_TYPE or one of
    /// the subtypes V8 numbers right after it (class constructors and the
    /// like, up to 15 since V8 9.6), and its `shared` field is a
    /// SharedFunctionInfo — the second check is what makes the range safe.
    pub fn shared_info_of(&self, v: u64) -> Option<u64> {
        if !self.is_js_function_type(self.instance_type(v)?) {
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
        if !self.is_js_function_type(self.u16_at(self.untag(map).checked_add(self.l.map_instance_type)?)?) {
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
        let Some(data) = self.untag(si).checked_add(self.l.heap_object_map).and_then(|d| d.checked_add(8)) else {
            return (String::new(), None);
        };
        let slot = |i: u64| self.u64_at(data.checked_add(i.checked_mul(8)?)?);
        let Some(ncl) = slot(self.l.scope_info_ncontextlocals).and_then(|v| self.smi(v)) else {
            return (String::new(), None);
        };
        if !(0..=4096).contains(&ncl) {
            return (String::new(), None);
        }
        let first = self.l.scope_info_first_vars.saturating_add(2 * ncl as u64);
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
        for i in first..first.saturating_add(12) {
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
    /// breaks of its source (streamed: at most [`SOURCE_MAX`] code units).
    fn line_of(&self, script: u64, pos: u64) -> Option<(u32, u32)> {
        if let Some(lc) = self.field(script, self.l.script_line_ends).and_then(|le| self.line_from_ends(le, pos)) {
            return Some(lc);
        }
        let src = self.field(script, self.l.script_source)?;
        let (mut seen, mut breaks, mut last) = (0u64, 0u64, None::<u64>);
        let mut count = |units: &[u16]| {
            for (i, &u) in units.iter().enumerate() {
                if u == u16::from(b'\n') {
                    breaks += 1;
                    last = Some(seen + i as u64);
                }
            }
            seen += units.len() as u64;
        };
        let limit = usize::try_from(pos).unwrap_or(usize::MAX).min(SOURCE_MAX);
        let mut nodes = STRING_NODES;
        self.units(src, 0, limit, &mut count, 0, &mut nodes)?;
        Some(line_col_after(breaks, last, pos))
    }

    /// Line and column of `pos` from `Script.line_ends` when it is a
    /// FixedArray of Smis (the positions of the line breaks, ascending): a
    /// binary search over the array in the process's memory.
    fn line_from_ends(&self, v: u64, pos: u64) -> Option<(u32, u32)> {
        let t = self.instance_type(v)?;
        if self.l.fixed_array_type.is_some_and(|f| f != t) {
            return None;
        }
        let n = self.smi(self.field(v, self.l.fixed_array_length)?)?;
        if !(1..=LINE_ENDS_MAX).contains(&n) {
            return None;
        }
        let data = self.untag(v).checked_add(self.l.fixed_array_data)?;
        let end = |i: u64| -> Option<u64> { u64::try_from(self.smi(self.u64_at(data.checked_add(i * 8)?)?)?).ok() };
        // Line breaks before `pos`: the first index whose break is at or after it.
        let (mut lo, mut hi) = (0u64, n as u64);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if end(mid)? < pos {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let last = if lo == 0 { None } else { Some(end(lo - 1)?) };
        Some(line_col_after(lo, last, pos))
    }

    /// A V8 String as Rust text (Latin-1 or UTF-16 decoded), at most `max` code units.
    pub fn string(&self, v: u64, max: usize) -> Option<String> {
        let mut units = Vec::new();
        let mut nodes = STRING_NODES;
        self.units(v, 0, max, &mut |u: &[u16]| units.extend_from_slice(u), 0, &mut nodes)?;
        Some(String::from_utf16_lossy(&units))
    }

    /// Hands code units [start, start + limit) of string `v` to `out`, in
    /// pieces; `nodes`: string objects that may still be visited.
    fn units(&self, v: u64, start: usize, limit: usize, out: &mut dyn FnMut(&[u16]), depth: u32, nodes: &mut u32) -> Option<()> {
        if depth > STRING_DEPTH || limit == 0 {
            return (depth <= STRING_DEPTH).then_some(());
        }
        *nodes = nodes.checked_sub(1)?;
        let t = self.instance_type(v)?;
        if !self.is_string_type(t) {
            return None;
        }
        let len = usize::try_from(self.i32_at(self.untag(v).checked_add(self.l.string_length)?)?).ok()?;
        if len > 1 << 30 {
            return None;
        }
        if start >= len {
            return Some(());
        }
        let take = (len - start).min(limit);
        let one_byte = t & self.l.string_encoding_mask == self.l.one_byte_string_tag;
        let repr = t & self.l.string_representation_mask;
        // The characters from `addr`, [`READ_CHUNK`] bytes at a time.
        let raw = |addr: u64, out: &mut dyn FnMut(&[u16])| -> Option<()> {
            let width = if one_byte { 1 } else { 2 };
            let per_read = READ_CHUNK / width;
            let mut buf = vec![0u8; take.min(per_read) * width];
            let mut units = Vec::with_capacity(take.min(per_read));
            let mut done = 0;
            while done < take {
                let n = (take - done).min(per_read);
                let at = addr.checked_add(u64::try_from((start + done) * width).ok()?)?;
                let bytes = &mut buf[..n * width];
                if !self.m.read(at, bytes) {
                    return None;
                }
                units.clear();
                if one_byte {
                    units.extend(bytes.iter().map(|&b| u16::from(b)));
                } else {
                    units.extend(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])));
                }
                out(&units);
                done += n;
            }
            Some(())
        };
        if repr == self.l.seq_string_tag {
            let off = if one_byte { self.l.seq_one_byte_chars } else { self.l.seq_two_byte_chars };
            raw(self.untag(v).checked_add(off)?, out)
        } else if repr == self.l.cons_string_tag {
            let first = self.field(v, self.l.cons_first)?;
            let second = self.field(v, self.l.cons_second)?;
            if !self.is_heap_object(first) {
                return None;
            }
            let flen = usize::try_from(self.i32_at(self.untag(first).checked_add(self.l.string_length)?)?).ok()?;
            if start < flen {
                self.units(first, start, take.min(flen - start), out, depth + 1, nodes)?;
            }
            let done = flen.saturating_sub(start).min(take);
            if done < take {
                self.units(second, start.saturating_sub(flen), take - done, out, depth + 1, nodes)?;
            }
            Some(())
        } else if repr == self.l.thin_string_tag {
            self.units(self.field(v, self.l.thin_actual)?, start, take, out, depth + 1, nodes)
        } else if repr == self.l.sliced_string_tag {
            let parent = self.field(v, self.l.sliced_parent)?;
            let off = usize::try_from(self.smi(self.field(v, self.l.sliced_offset)?)?).ok()?;
            self.units(parent, start.checked_add(off)?, take, out, depth + 1, nodes)
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
    line_col_after(i as u64, i.checked_sub(1).and_then(|j| ends.get(j)).copied(), pos)
}

/// 1-based (line, column) of position `pos` after `breaks` line breaks,
/// the last at `last` (saturating: the positions come from the process).
fn line_col_after(breaks: u64, last: Option<u64>, pos: u64) -> (u32, u32) {
    let line_start = last.map_or(0, |e| e.saturating_add(1));
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    (clamp(breaks.saturating_add(1)), clamp(pos.saturating_sub(line_start).saturating_add(1)))
}

#[cfg(test)]
pub(crate) mod tests;
