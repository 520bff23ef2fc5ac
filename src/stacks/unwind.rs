//! Stacks that are true: a sample's frames as the kernel's frame-pointer
//! walk found them are kept only while each lies in executable code of the
//! process, and a sample whose leaf is in a shared library (libc's
//! `open64`, the loader) is unwound through that library by its
//! `.eh_frame` over the copy of the stack taken with the sample.
//!
//! Why: V8's JIT code and node keep frame pointers, libc does not. A leaf
//! such as `open64` keeps whatever it likes in rbp (the path it opens), so
//! the kernel's walk from rbp reads the path's bytes as a caller. The
//! kernel also copies [`crate::kernel::skel::types::uvspan_sizes`]'s
//! `UVSPAN_STACK_COPY` bytes from the stack pointer up; here framehop
//! unwinds the library's frames over those bytes by their CFI and then
//! goes on by frame pointers (its rule for code without unwind info: the
//! JIT's and node's) until a frame is one the kernel's walk also found,
//! whose walk goes on from there (with the function objects it read). A walk
//! that leaves the process's code, or the copy, stops there: the stack ends
//! with a `[truncated]` marker (see [`Walked::truncated`]).
//!
//! Pure apart from [`Modules`], which reads the libraries' sections.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use crate::events::decode::{RawFrame, StackRecord};

/// Frames at most in one sample (the kernel's walk keeps as many).
pub const MAX_FRAMES: usize = 64;
/// A library larger than this is not read for its unwind sections.
const MODULE_FILE_MAX: u64 = 1 << 30;
/// A section larger than this is not copied (node's .eh_frame is 2.7 MB,
/// its .eh_frame_hdr 0.6 MB).
const SECTION_MAX: u64 = 8 << 20;
/// A library's .text is copied (for the prologues and epilogues of a
/// leaf) up to this size (libc's is 1.4 MB); node's never (27 MB: the
/// leaf of a sample in node's code is not unwound here).
const TEXT_MAX: u64 = 4 << 20;
/// A process's unwind info is kept up to this many bytes and modules;
/// a library past them unwinds by frame pointer.
const MODULES_BYTES_MAX: usize = 16 << 20;
const MODULES_MAX: usize = 16;

/// What an address is in the sampled process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Code that keeps frame pointers and has no CFI: V8's JIT code
    /// (anonymous executable memory), the vDSO.
    FramePointers,
    /// node's own code (its executable, libnode): frame pointers in most of
    /// it (V8, node's C++; its builtins have no CFI), not all (libuv's
    /// `uv__fs_work`): unwound by its CFI where it has some.
    Node,
    /// A shared library's code, unwound by its CFI (libc, the loader).
    Library,
    /// The kernel's uretprobe trampoline (`[uprobes]`): the return address
    /// a uretprobe put in place of a caller's. Not a frame; the walk goes
    /// on by the frame pointer (the caller's frame is unnamed).
    Trampoline,
    /// Not in an executable mapping of the process: not a frame.
    Outside,
}

/// A sample's frames, innermost first, and whether the walk stopped before
/// the stack's end (at an address outside the process's code, or at the
/// copy's end).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walked {
    pub frames: Vec<RawFrame>,
    pub truncated: bool,
}

/// The word at `addr` of the copy of the stack taken from `sp` up.
fn word(stack: &[u8], sp: u64, addr: u64) -> Option<u64> {
    let off = usize::try_from(addr.checked_sub(sp)?).ok()?;
    let b = stack.get(off..off.checked_add(8)?)?;
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

/// What return address `ra` is: the trampoline (at its own address), else
/// the code of the call before it.
fn code_of_return(ra: u64, code: &dyn Fn(u64) -> Code) -> Code {
    if code(ra) == Code::Trampoline {
        return Code::Trampoline;
    }
    match code(ra.wrapping_sub(1)) {
        Code::Trampoline => Code::Outside,
        c => c,
    }
}

/// The kernel's frames from `from` on, kept while each is code (a return
/// address is looked up at the call: one byte before it); a uretprobe's
/// trampoline is skipped.
fn keep_valid(out: &mut Walked, frames: &[RawFrame], from: usize, code: &dyn Fn(u64) -> Code) {
    for (i, f) in frames.iter().enumerate().skip(from) {
        if out.frames.len() >= MAX_FRAMES {
            return;
        }
        let kind = if i == 0 { code(f.pc) } else { code_of_return(f.pc, code) };
        if i > 0 && kind == Code::Trampoline {
            continue;
        }
        if f.pc == 0 || matches!(kind, Code::Outside | Code::Trampoline) {
            out.truncated = true;
            return;
        }
        out.frames.push(*f);
    }
}

/// The true frames of sample `r`: see the module's notes. `code` says what
/// an address is in the process; `unwinder` knows the process's libraries
/// (their CFI), every other address unwinds by frame pointer.
pub fn walk(r: &StackRecord, code: &dyn Fn(u64) -> Code, unwinder: &UnwinderX86_64<Arc<[u8]>>) -> Walked {
    let mut out = Walked::default();
    let Some(leaf) = r.frames.first() else { return out };
    if code(leaf.pc) != Code::Library || r.stack.is_empty() {
        keep_valid(&mut out, &r.frames, 0, code);
        return out;
    }
    out.frames.push(*leaf);
    let mut read = |addr: u64| word(&r.stack, r.sp, addr).ok_or(());
    let mut regs = UnwindRegsX86_64::new(leaf.pc, r.sp, r.fp);
    let mut cache = CacheX86_64::new();
    let mut address = FrameAddress::from_instruction_pointer(leaf.pc);
    // The kernel's frames after the leaf, by return address (its walk is
    // right from the first of them that this walk reaches).
    let known: HashMap<u64, usize> = r.frames.iter().enumerate().skip(1).map(|(i, f)| (f.pc, i)).collect();
    while out.frames.len() < MAX_FRAMES {
        let ra = match unwinder.unwind_frame(address, &mut regs, &mut cache, &mut read) {
            Ok(Some(ra)) => ra,
            // The stack's end by the CFI (the outermost frame).
            Ok(None) => return out,
            // A read past the copy, or unwind info that does not fit.
            Err(_) => {
                out.truncated = true;
                return out;
            }
        };
        let kind = code_of_return(ra, code);
        if ra == 0 || kind == Code::Outside {
            out.truncated = true;
            return out;
        }
        let bp = regs.bp();
        let (m16, m8) = match kind {
            Code::Library => (None, None),
            _ => (word(&r.stack, r.sp, bp.wrapping_sub(16)), word(&r.stack, r.sp, bp.wrapping_sub(8))),
        };
        if kind != Code::Library {
            if let Some(&i) = known.get(&ra) {
                let f = &r.frames[i];
                // The same frame: the same words below its frame pointer
                // (when the copy has them).
                if m16.is_none_or(|w| w == f.fp_m16) && m8.is_none_or(|w| w == f.fp_m8) {
                    keep_valid(&mut out, &r.frames, i, code);
                    return out;
                }
            }
        }
        if kind != Code::Trampoline {
            out.frames.push(RawFrame { pc: ra, fp_m16: m16.unwrap_or(0), fp_m8: m8.unwrap_or(0), obj: [0; 6] });
        }
        let Some(next) = FrameAddress::from_return_address(ra) else { break };
        address = next;
    }
    out
}

/// A library's unwind info as framehop keeps it.
type LibModule = Module<Arc<[u8]>>;

/// One library mapping of a process, for [`Modules`].
#[derive(Clone, Debug)]
pub struct LibMapping {
    pub range: Range<u64>,
    pub offset: u64,
    pub name: String,
    /// A shared library (its .text is read for a leaf's prologue), not
    /// node's own code.
    pub library: bool,
}

/// A process's libraries as framehop modules, read when a sample's walk
/// first needs each (a library that cannot be read unwinds by frame
/// pointer, and its frames end in `[truncated]` when that fails), within
/// [`MODULES_BYTES_MAX`] and [`MODULES_MAX`]; dropped with the process.
#[derive(Default)]
pub struct Modules {
    pub unwinder: UnwinderX86_64<Arc<[u8]>>,
    added: std::collections::HashSet<u64>,
    /// Bytes of the sections kept.
    pub bytes: usize,
}

impl Modules {
    /// Adds the file mapped at `m` (open as `file`) unless tried before or
    /// past the bounds; whether it was tried now.
    pub fn ensure(&mut self, m: &LibMapping, file: &std::fs::File) -> bool {
        if self.added.len() >= MODULES_MAX || self.bytes >= MODULES_BYTES_MAX || !self.added.insert(m.range.start) {
            return false;
        }
        if let Ok((module, bytes)) = module_of(m, file, MODULES_BYTES_MAX - self.bytes) {
            self.bytes += bytes;
            self.unwinder.add_module(module);
        }
        true
    }

    /// Whether the mapping at `start` was tried.
    pub fn has(&self, start: u64) -> bool {
        self.added.contains(&start) || self.added.len() >= MODULES_MAX || self.bytes >= MODULES_BYTES_MAX
    }
}

/// The unwind sections of the library mapped at `m`, within bounds (at
/// most `budget` bytes kept), and their size.
fn module_of(m: &LibMapping, f: &std::fs::File, budget: usize) -> Result<(LibModule, usize), &'static str> {
    use object::{Object, ObjectSection, ObjectSegment};
    if f.metadata().map_err(|_| "no metadata")?.len() > MODULE_FILE_MAX {
        return Err("too large");
    }
    // SAFETY: a read-only private mapping of a file that is not written
    // through it; a library replaced on disk under it could change what is
    // read (a wrong unwind, not memory unsafety: the bytes are only parsed,
    // within their bounds), and only the sections copied below are kept.
    let data = unsafe { memmap2::Mmap::map(f) }.map_err(|_| "cannot map")?;
    let file = object::File::parse(&*data).map_err(|_| "not an object file")?;
    // Where the file's addresses (SVMAs) are in the process: the segment
    // that holds the mapping's file offset.
    let seg = file
        .segments()
        .find(|s| {
            let (off, size) = s.file_range();
            off <= m.offset && m.offset < off.saturating_add(size)
        })
        .ok_or("no segment at the mapping's offset")?;
    let (seg_off, _) = seg.file_range();
    let seg_svma_at_offset = seg.address().checked_add(m.offset - seg_off).ok_or("bad segment")?;
    let base_avma = m.range.start.checked_sub(seg_svma_at_offset).ok_or("bad segment")?;
    let section = |name: &str, max: u64| {
        let s = file.section_by_name(name)?;
        if s.size() > max {
            return None;
        }
        let data: Arc<[u8]> = Arc::from(s.data().ok()?);
        Some((s.address()..s.address().saturating_add(s.size()), data))
    };
    let eh_frame = section(".eh_frame", SECTION_MAX).ok_or("no .eh_frame")?;
    let eh_frame_hdr = section(".eh_frame_hdr", SECTION_MAX);
    let mut bytes = eh_frame.1.len() + eh_frame_hdr.as_ref().map_or(0, |s| s.1.len());
    let text = if m.library { section(".text", TEXT_MAX) } else { None };
    let text = text.filter(|t| bytes + t.1.len() <= budget);
    bytes += text.as_ref().map_or(0, |t| t.1.len());
    if bytes > budget {
        return Err("over the unwind info's budget");
    }
    let eh_frame = Some(eh_frame);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text.as_ref().map(|t| t.0.clone()),
        text: text.map(|t| t.1),
        got_svma: file.section_by_name(".got").map(|s| s.address()..s.address().saturating_add(s.size())),
        eh_frame_svma: eh_frame.as_ref().map(|t| t.0.clone()),
        eh_frame: eh_frame.map(|t| t.1),
        eh_frame_hdr_svma: eh_frame_hdr.as_ref().map(|t| t.0.clone()),
        eh_frame_hdr: eh_frame_hdr.map(|t| t.1),
        ..Default::default()
    };
    Ok((Module::new(m.name.clone(), m.range.clone(), base_avma, info), bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: Range<u64> = 0x40_0000..0x50_0000;
    const LIB: Range<u64> = 0x7f00_0000..0x7f10_0000;
    const SP: u64 = 0x7ffd_0000;

    fn code(a: u64) -> Code {
        if CODE.contains(&a) {
            Code::FramePointers
        } else if LIB.contains(&a) {
            Code::Library
        } else {
            Code::Outside
        }
    }

    fn frame(pc: u64) -> RawFrame {
        RawFrame { pc, ..RawFrame::default() }
    }

    fn record(frames: Vec<RawFrame>, fp: u64, stack: Vec<u64>) -> StackRecord {
        StackRecord {
            pid: 1,
            tid: 1,
            iter_start_ns: 1,
            req: 0,
            ts_ns: 1,
            frames,
            sp: SP,
            fp,
            stack: stack.iter().flat_map(|w| w.to_ne_bytes()).collect(),
        }
    }

    fn pcs(w: &Walked) -> Vec<u64> {
        w.frames.iter().map(|f| f.pc).collect()
    }

    /// A frame-pointer walk is kept while its frames are code: the garbage
    /// "return address" that is the text of a path ends it.
    #[test]
    fn a_walk_stops_where_it_leaves_the_code() {
        let none = UnwinderX86_64::new();
        let r = record(vec![frame(0x40_1000), frame(0x40_2000), frame(0x6f6d_5f65_646f_6e2e), frame(0x40_3000)], 0, vec![]);
        let w = walk(&r, &code, &none);
        assert_eq!(pcs(&w), [0x40_1000, 0x40_2000]);
        assert!(w.truncated);
        // All inside: all kept, not truncated.
        let r = record(vec![frame(0x40_1000), frame(0x40_2000)], 0, vec![]);
        let w = walk(&r, &code, &none);
        assert_eq!((pcs(&w).len(), w.truncated), (2, false));
        // A pc outside the code at the leaf: nothing is a frame.
        let w = walk(&record(vec![frame(0x10)], 0, vec![]), &code, &none);
        assert_eq!((pcs(&w).len(), w.truncated), (0, true));
        // A return address at the start of a mapping is looked up at the
        // call before it: outside.
        let w = walk(&record(vec![frame(0x40_1000), frame(CODE.start)], 0, vec![]), &code, &none);
        assert_eq!((pcs(&w), w.truncated), (vec![0x40_1000], true));
        assert!(walk(&record(vec![], 0, vec![]), &code, &none).frames.is_empty());
    }

    /// A leaf in a library whose rbp holds something else: unwound over the
    /// stack copy (here by frame pointer: the test has no CFI for its fake
    /// library) until it reaches a frame the kernel's walk also has, whose
    /// walk (function objects included) goes on from there.
    #[test]
    fn a_library_leaf_is_unwound_over_the_copy_and_joins_the_kernel_walk() {
        let none = UnwinderX86_64::new();
        // The stack: at SP+0x20 a frame (saved rbp, return address into
        // node's code), whose saved rbp SP+0x40 is the next frame.
        let mut stack = vec![0u64; 16];
        stack[2] = 0x2001; // fp-16 of the frame at SP+0x20 (a JSFunction)
        stack[3] = 0x3001; // fp-8 (a context)
        stack[4] = SP + 0x40;
        stack[5] = 0x40_1111;
        stack[6] = 0x5001;
        stack[7] = 0x6001;
        stack[8] = SP + 0x60;
        stack[9] = 0x40_2222;
        stack[10] = 0x8001;
        stack[11] = 0x9001;
        stack[13] = 0x6f6d_5f65_646f_6e2e; // above: not code
        let mut joined = frame(0x40_2222);
        joined.fp_m16 = 0x8001;
        joined.fp_m8 = 0x9001;
        joined.obj[0] = 0xabc;
        // The kernel's walk from the leaf's rbp: garbage after the leaf,
        // then (through luck) the real frame.
        let kernel = vec![frame(LIB.start + 0x10), frame(0x6f6d_5f65_646f_6e2e), joined, frame(0x40_3333)];
        let r = record(kernel.clone(), SP + 0x20, stack.clone());
        let w = walk(&r, &code, &none);
        assert_eq!(pcs(&w), [LIB.start + 0x10, 0x40_1111, 0x40_2222, 0x40_3333], "{w:?}");
        assert!(!w.truncated);
        assert_eq!((w.frames[1].fp_m16, w.frames[1].fp_m8), (0x5001, 0x6001), "the words below the caller's frame pointer, from the copy");
        assert_eq!(w.frames[2].obj[0], 0xabc, "the kernel's frame, with the object it read");
        // The same pc but other words: not the same frame; the walk over
        // the copy goes on, to an address that is not code: truncated.
        let mut other = kernel.clone();
        other[2].fp_m8 = 0x7001;
        let w = walk(&record(other, SP + 0x20, stack.clone()), &code, &none);
        assert_eq!(pcs(&w), [LIB.start + 0x10, 0x40_1111, 0x40_2222]);
        assert!(w.truncated);
        // No copy: the kernel's walk, cut at the garbage.
        let w = walk(&record(kernel, SP + 0x20, vec![]), &code, &none);
        assert_eq!((pcs(&w), w.truncated), (vec![LIB.start + 0x10], true));
    }

    #[test]
    fn words_of_the_copy_are_read_within_it() {
        let s: Vec<u8> = (0u8..16).collect();
        assert_eq!(word(&s, 100, 100), Some(u64::from_ne_bytes([0, 1, 2, 3, 4, 5, 6, 7])));
        assert_eq!(word(&s, 100, 108), Some(u64::from_ne_bytes([8, 9, 10, 11, 12, 13, 14, 15])));
        assert_eq!(word(&s, 100, 109), None);
        assert_eq!(word(&s, 100, 99), None);
        assert_eq!(word(&s, 100, u64::MAX), None);
    }

    /// The unwinder over a real library: this test process's libc,
    /// as a sampled process's is read.
    #[test]
    fn a_library_of_this_process_loads_as_a_module() {
        let maps = procfs::process::Process::myself().and_then(|p| p.maps()).expect("maps");
        let libc = maps
            .iter()
            .find(|m| {
                m.perms.contains(procfs::process::MMPermissions::EXECUTE)
                    && matches!(&m.pathname, procfs::process::MMapPath::Path(p) if p.to_string_lossy().contains("libc.so"))
            })
            .expect("libc mapped");
        let procfs::process::MMapPath::Path(path) = &libc.pathname else { unreachable!() };
        let m = LibMapping { range: libc.address.0..libc.address.1, offset: libc.offset, name: "libc.so.6".into(), library: true };
        let f = std::fs::File::open(path).expect("libc");
        let (_, bytes) = module_of(&m, &f, MODULES_BYTES_MAX).expect("a module");
        assert!(bytes > 0 && bytes <= (TEXT_MAX + 2 * SECTION_MAX) as usize, "{bytes}");
        // Node's own code: its unwind sections only, no .text.
        let node = LibMapping { library: false, ..m.clone() };
        let (_, unwind_only) = module_of(&node, &f, MODULES_BYTES_MAX).expect("a module");
        assert!(unwind_only < bytes, "{unwind_only} {bytes}");
        // Over the budget: not kept.
        assert!(module_of(&m, &f, 16).is_err());
        // Bounded: a process keeps at most MODULES_MAX modules.
        let mut mods = Modules::default();
        for i in 0..MODULES_MAX as u64 + 4 {
            let at = LibMapping { range: m.range.start + i..m.range.end, ..m.clone() };
            mods.ensure(&at, &f);
        }
        assert!(mods.added.len() <= MODULES_MAX && mods.bytes <= MODULES_BYTES_MAX, "{} {}", mods.added.len(), mods.bytes);
        assert!(mods.has(u64::MAX), "past the bounds, nothing more is tried");
    }

    /// A uretprobe's trampoline in place of a return address: skipped, the
    /// walk goes on by the frame pointer (as the kernel's did).
    #[test]
    fn a_uretprobe_trampoline_is_not_a_frame_and_does_not_end_the_walk() {
        const TRAMP: u64 = 0x7fff_ffff_e000;
        let code = |a: u64| if (TRAMP..TRAMP + 0x1000).contains(&a) { Code::Trampoline } else { code(a) };
        let none = UnwinderX86_64::new();
        let r = record(vec![frame(0x40_1000), frame(0x40_2000), frame(TRAMP), frame(0x40_3000)], 0, vec![]);
        let w = walk(&r, &code, &none);
        assert_eq!((pcs(&w), w.truncated), (vec![0x40_1000, 0x40_2000, 0x40_3000], false));
        // A return address just past the trampoline's page is not code.
        let r = record(vec![frame(0x40_1000), frame(TRAMP + 0x1000)], 0, vec![]);
        assert!(walk(&r, &code, &none).truncated);
        // Over the copy from a library leaf: also skipped.
        let mut stack = vec![0u64; 12];
        stack[4] = SP + 0x40;
        stack[5] = TRAMP;
        stack[8] = SP + 0x50;
        stack[9] = 0x40_3333;
        let r = record(vec![frame(LIB.start + 0x10)], SP + 0x20, stack);
        let w = walk(&r, &code, &none);
        assert_eq!(pcs(&w)[..2], [LIB.start + 0x10, 0x40_3333], "{w:?}");
    }
}
