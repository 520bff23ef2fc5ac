//! V8's postmortem metadata: the `v8dbg_*` data symbols every Node build
//! carries (also in `.dynsym`, so stripped builds keep them). Each is an
//! `int` holding one fact about V8's frame and object layout: a field offset
//! (`v8dbg_class_<Class>__<field>__<type>`), an instance type
//! (`v8dbg_type_<Class>__<TYPE>`), a tag or mask. V8 writes them from its own
//! headers at build time (tools/gen-postmortem-metadata.py); llnode and the
//! OpenTelemetry eBPF profiler read the same symbols.
//!
//! Only what naming a JS frame needs is resolved here ([`V8Layout`]); the
//! field names that changed between V8 versions are tried in turn.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

/// Every `v8dbg_*` symbol of one ELF file and its value (symbol name
/// without the prefix).
pub fn read_constants(path: &Path) -> Result<HashMap<String, i64>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: read-only private mapping; a file changed under us yields
    // wrong values or a parse error, never UB on our side.
    let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
    let elf = object::File::parse(&*map).with_context(|| format!("{} is not an ELF file", path.display()))?;
    Ok(constants_of(&elf))
}

/// The `v8dbg_*` constants of a parsed ELF file: each symbol's 4-byte value
/// read from the section it lives in (0 for `.bss`: V8 leaves zeros there).
pub fn constants_of(elf: &object::File<'_>) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        let Ok(name) = sym.name() else { continue };
        let Some(key) = name.strip_prefix("v8dbg_") else { continue };
        if out.contains_key(key) {
            continue;
        }
        let Some(idx) = sym.section_index() else { continue };
        let Ok(section) = elf.section_by_index(idx) else { continue };
        let value = if section.kind() == SectionKind::UninitializedData {
            Some(0)
        } else {
            section.data().ok().and_then(|d| {
                let at = usize::try_from(sym.address().checked_sub(section.address())?).ok()?;
                let b: [u8; 4] = d.get(at..at.checked_add(4)?)?.try_into().ok()?;
                Some(i64::from(i32::from_le_bytes(b)))
            })
        };
        if let Some(v) = value {
            out.insert(key.to_string(), v);
        }
    }
    out
}

/// The facts uvspan uses to name JS frames (64-bit V8 without pointer
/// compression, as in Node's official builds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V8Layout {
    pub heap_object_tag: u64,
    pub heap_object_tag_mask: u64,
    pub smi_tag: u64,
    pub smi_tag_mask: u64,
    pub smi_value_shift: u32,
    /// Frame pointer offset of a JS frame's JSFunction (-16).
    pub off_fp_function: i64,
    /// Frame pointer offset of a JS frame's context, which typed (non-JS)
    /// frames use for their frame-type marker (-8).
    pub off_fp_context_or_frame_type: i64,
    pub heap_object_map: u64,
    pub map_instance_type: u64,
    pub first_nonstring_type: u16,
    pub string_representation_mask: u16,
    pub string_encoding_mask: u16,
    pub one_byte_string_tag: u16,
    pub seq_string_tag: u16,
    pub cons_string_tag: u16,
    pub thin_string_tag: u16,
    pub sliced_string_tag: u16,
    pub external_string_tag: u16,
    pub string_length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub thin_actual: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub external_resource: u64,
    pub js_function_type: u16,
    pub js_function_shared: u64,
    pub shared_function_info_type: u16,
    pub scope_info_type: u16,
    pub script_type: u16,
    pub sfi_name_or_scope_info: u64,
    pub sfi_script: u64,
    pub scope_info_first_vars: u64,
    pub scope_info_ncontextlocals: u64,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,
    pub fixed_array_length: u64,
    pub fixed_array_data: u64,
    /// FIXED_ARRAY_TYPE: tells a computed `Script.line_ends` from `undefined`.
    pub fixed_array_type: Option<u16>,
    /// External string types without a cached data pointer (V8 ≥ 10).
    pub uncached_external_types: Vec<u16>,
}

impl V8Layout {
    /// The layout from a file's constants; the error names the first
    /// constant missing (under every name it has had).
    pub fn from_constants(c: &HashMap<String, i64>) -> Result<V8Layout> {
        let get = |names: &[&str]| -> Result<i64> {
            names.iter().find_map(|n| c.get(*n).copied()).ok_or_else(|| anyhow!("V8 postmortem constant v8dbg_{} is missing", names[0]))
        };
        let off = |names: &[&str]| -> Result<u64> {
            let v = get(names)?;
            u64::try_from(v).map_err(|_| anyhow!("V8 postmortem constant v8dbg_{} is negative ({v})", names[0]))
        };
        let ty = |names: &[&str]| -> Result<u16> {
            let v = get(names)?;
            u16::try_from(v).map_err(|_| anyhow!("V8 postmortem constant v8dbg_{} is out of range ({v})", names[0]))
        };
        // A Smi's value sits above the tag (SmiValueShift: the tag's size,
        // 1) and the shift (SmiShiftSize: 31 without pointer compression).
        let smi_value_shift = get(&["SmiShiftSize"])? + c.get("SmiValueShift").copied().unwrap_or(1);
        let l = V8Layout {
            heap_object_tag: off(&["HeapObjectTag"])?,
            heap_object_tag_mask: off(&["HeapObjectTagMask"])?,
            smi_tag: off(&["SmiTag"])?,
            smi_tag_mask: off(&["SmiTagMask"])?,
            // Shifting a 64-bit word by 64 or more means nothing (and panics).
            smi_value_shift: u32::try_from(smi_value_shift)
                .ok()
                .filter(|&s| s < 64)
                .ok_or_else(|| anyhow!("V8 SmiValueShift {smi_value_shift} is out of range"))?,
            off_fp_function: get(&["off_fp_function"])?,
            off_fp_context_or_frame_type: get(&["off_fp_context_or_frame_type", "off_fp_context"])?,
            heap_object_map: off(&["class_HeapObject__map__Map"])?,
            map_instance_type: off(&["class_Map__instance_type__uint16_t"])?,
            first_nonstring_type: ty(&["FirstNonstringType"])?,
            string_representation_mask: ty(&["StringRepresentationMask"])?,
            string_encoding_mask: ty(&["StringEncodingMask"])?,
            one_byte_string_tag: ty(&["OneByteStringTag"])?,
            seq_string_tag: ty(&["SeqStringTag"])?,
            cons_string_tag: ty(&["ConsStringTag"])?,
            thin_string_tag: ty(&["ThinStringTag"])?,
            sliced_string_tag: ty(&["SlicedStringTag"])?,
            external_string_tag: ty(&["ExternalStringTag"])?,
            string_length: off(&["class_String__length__int32_t"])?,
            seq_one_byte_chars: off(&["class_SeqOneByteString__chars__char"])?,
            seq_two_byte_chars: off(&["class_SeqTwoByteString__chars__char"])?,
            cons_first: off(&["class_ConsString__first__String"])?,
            cons_second: off(&["class_ConsString__second__String"])?,
            thin_actual: off(&["class_ThinString__actual__String"])?,
            sliced_parent: off(&["class_SlicedString__parent__String"])?,
            sliced_offset: off(&["class_SlicedString__offset__SMI"])?,
            external_resource: off(&["class_ExternalString__resource__Object"])?,
            js_function_type: ty(&["type_JSFunction__JS_FUNCTION_TYPE"])?,
            js_function_shared: off(&["class_JSFunction__shared__SharedFunctionInfo"])?,
            shared_function_info_type: ty(&["type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"])?,
            scope_info_type: ty(&["type_ScopeInfo__SCOPE_INFO_TYPE"])?,
            script_type: ty(&["type_Script__SCRIPT_TYPE"])?,
            sfi_name_or_scope_info: off(&[
                "class_SharedFunctionInfo__name_or_scope_info__Object",
                "class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_",
                "class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
            ])?,
            sfi_script: off(&[
                "class_SharedFunctionInfo__script_or_debug_info__HeapObject",
                "class_SharedFunctionInfo__script_or_debug_info__Object",
                "class_SharedFunctionInfo__script__Tagged_HeapObject_",
            ])?,
            scope_info_first_vars: off(&["scopeinfo_idx_first_vars"])?,
            scope_info_ncontextlocals: off(&["scopeinfo_idx_ncontextlocals"])?,
            script_name: off(&["class_Script__name__Object"])?,
            script_source: off(&["class_Script__source__Object"])?,
            script_line_ends: off(&["class_Script__line_ends__Object"])?,
            fixed_array_length: off(&["class_FixedArrayBase__length__SMI"])?,
            fixed_array_data: off(&["class_FixedArray__data__uintptr_t"])?,
            fixed_array_type: ty(&["type_FixedArray__FIXED_ARRAY_TYPE"]).ok(),
            uncached_external_types: c
                .iter()
                .filter(|(k, _)| k.starts_with("type_UncachedExternalString__"))
                .filter_map(|(_, &v)| u16::try_from(v).ok())
                .collect(),
        };
        Ok(l)
    }

    /// The layout of the V8 inside one ELF file (node, or libnode.so).
    pub fn read(path: &Path) -> Result<V8Layout> {
        let c = read_constants(path)?;
        if c.is_empty() {
            return Err(anyhow!("{} has no V8 postmortem metadata (no v8dbg_* symbols)", path.display()));
        }
        V8Layout::from_constants(&c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's node (Node 20 here); the matrix builds are checked end to
    /// end by tests/stacks.rs.
    fn system_node() -> Option<std::path::PathBuf> {
        let p = std::path::PathBuf::from("/usr/bin/node");
        p.exists().then_some(p)
    }

    #[test]
    fn reads_the_constants_of_a_node_binary() {
        let Some(node) = system_node() else {
            panic!("this test needs /usr/bin/node (scripts/setup.sh installs it)");
        };
        let c = read_constants(&node).unwrap();
        assert!(c.len() > 400, "{} v8dbg constants", c.len());
        let l = V8Layout::from_constants(&c).unwrap();
        // Facts that hold for every 64-bit V8 Node ships.
        assert_eq!((l.off_fp_function, l.off_fp_context_or_frame_type), (-16, -8));
        assert_eq!((l.heap_object_tag, l.heap_object_tag_mask), (1, 3));
        assert_eq!((l.smi_tag, l.smi_tag_mask, l.smi_value_shift), (0, 1, 32), "no pointer compression");
        assert_eq!(l.heap_object_map, 0, "the map is the first word (a .bss zero)");
        assert!(l.first_nonstring_type > 0 && l.js_function_type > l.first_nonstring_type);
        assert_ne!(l.sfi_name_or_scope_info, l.sfi_script);
    }

    #[test]
    fn a_missing_constant_is_named() {
        let mut c = HashMap::new();
        c.insert("SmiShiftSize".to_string(), 31);
        c.insert("HeapObjectTag".to_string(), 1);
        let e = V8Layout::from_constants(&c).unwrap_err().to_string();
        assert!(e.contains("v8dbg_HeapObjectTagMask is missing"), "{e}");
    }

    #[test]
    fn older_names_are_tried_in_turn() {
        let node = system_node().expect("this test needs /usr/bin/node");
        let mut c = read_constants(&node).unwrap();
        let v = c.remove("class_SharedFunctionInfo__name_or_scope_info__Object");
        let sfi = c.remove("class_SharedFunctionInfo__script_or_debug_info__HeapObject");
        c.insert("class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_".into(), v.unwrap_or(8));
        c.insert("class_SharedFunctionInfo__script__Tagged_HeapObject_".into(), sfi.unwrap_or(16));
        let l = V8Layout::from_constants(&c).unwrap();
        assert_eq!(l.sfi_name_or_scope_info, v.unwrap_or(8) as u64);
    }
}
