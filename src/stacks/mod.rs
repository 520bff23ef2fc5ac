//! Who blocked the loop (--stacks): stack samples of a loop thread taken
//! while an iteration was already slow (bpf/stacks.h `loop_sample`)
//! are named here while the process still runs — JS frames from V8's heap
//! ([`v8`], offsets from the binary's postmortem metadata), native frames
//! from ELF symbols (blazesym), JIT code from the process's perf map when
//! it writes one (read by uvspan within bounds: [`perfmap`]) — and folded
//! per iteration ([`fold`]) until the iteration's record arrives.

pub mod fold;
pub mod perfmap;
pub mod unwind;
pub mod v8;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::Pid;

use crate::events::decode::{RawFrame, StackRecord};
use crate::symbols::v8meta::V8Layout;
use fold::{Blocked, Folder, Frame};
use perfmap::PerfMapFile;

/// The sampling rate: 999 Hz rather than 1000 so the samples do not fall
/// in lockstep with work the app schedules on whole milliseconds.
pub const SAMPLE_HZ: u64 = 999;

/// Per-process caches are emptied when they grow past this many entries.
const CACHE_MAX: usize = 16384;
/// Iterations with samples but no record yet, kept per process.
const PENDING_MAX: usize = 8;

/// A process's memory through /proc/PID/mem.
struct ProcMem(File);

impl v8::Memory for ProcMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.0.read_exact_at(buf, addr).is_ok()
    }
}

/// One executable mapping of a process.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    /// None: anonymous (JIT code).
    path: Option<PathBuf>,
    /// How its code is unwound.
    code: unwind::Code,
    /// Its file, opened while the process ran (the process's mappings
    /// are named and unwound from it also when its samples are read after
    /// it exited, or from another mount namespace); freed with the process.
    file: Option<Arc<File>>,
}

struct Proc {
    node_major: Option<u32>,
    /// Resolved at the first sample (the process has exec'd by then).
    v8: Option<Result<V8Layout, String>>,
    mem: Option<ProcMem>,
    maps: Vec<Mapping>,
    maps_read: Option<Instant>,
    /// Whether /proc/PID/map_files can be opened (CAP_SYS_ADMIN or
    /// CAP_CHECKPOINT_RESTORE); else blazesym opens the files by path.
    map_files: bool,
    /// Its `/tmp/perf-PID.map` (opened at the first sample).
    perf_map: Option<PerfMapFile>,
    js: HashMap<u64, Option<v8::JsFunction>>,
    /// Maps seen to be JSFunction maps (maps do not move).
    fn_maps: std::collections::HashSet<u64>,
    /// Frames named without V8's heap; true: JIT code (anonymous memory),
    /// whose JS function, when it is one, names it better.
    native: HashMap<u64, (Frame, bool)>,
    pending: Vec<(u64, Folder)>,
    /// --stacks all-ops: submit stacks by request address, until the
    /// request's record arrives.
    ops: rustc_hash::FxHashMap<u64, String>,
    /// Its libraries' unwind info (read at the first sample in each).
    modules: unwind::Modules,
    /// The inode of its executable (its mappings are node's own code).
    exe_inode: Option<u64>,
}

pub struct Stacks {
    symbolizer: Symbolizer,
    procs: rustc_hash::FxHashMap<u32, Proc>,
    period_ns: u64,
}

impl Default for Stacks {
    fn default() -> Self {
        Self::new()
    }
}

fn node_major(version: Option<&str>) -> Option<u32> {
    version?.trim_start_matches('v').split('.').next()?.parse().ok()
}

impl Stacks {
    pub fn new() -> Stacks {
        Stacks { symbolizer: Symbolizer::new(), procs: Default::default(), period_ns: 1_000_000_000 / SAMPLE_HZ }
    }

    /// Time one sample stands for.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// A process whose loop thread is sampled; `node_version` as found in
    /// its binary ("v20.20.2").
    pub fn add_process(&mut self, pid: u32, node_version: Option<&str>) {
        self.procs.insert(
            pid,
            Proc {
                node_major: node_major(node_version),
                v8: None,
                mem: None,
                maps: Vec::new(),
                maps_read: None,
                map_files: false,
                perf_map: None,
                js: HashMap::new(),
                fn_maps: Default::default(),
                native: HashMap::new(),
                pending: Vec::new(),
                ops: Default::default(),
                modules: Default::default(),
                exe_inode: None,
            },
        );
        // Its code's files are opened now, while it runs: a short job's
        // samples are often read after it exited.
        if let Some(p) = self.procs.get_mut(&pid) {
            p.map_files = map_files_readable(pid);
            p.exe_inode = std::fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
            refresh_maps(pid, p);
        }
    }

    /// Reads again the code mappings of every process whose were read
    /// over a second ago (its libraries, loaded after its exec, and
    /// addons): their files are opened while it still runs, for samples
    /// read after it exited.
    pub fn refresh_live(&mut self) {
        for (&pid, p) in self.procs.iter_mut() {
            if p.maps_read.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                refresh_maps(pid, p);
            }
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// One sample: named now (V8 may move objects later) and folded into
    /// its iteration.
    pub fn sample(&mut self, r: &StackRecord) {
        let Some(p) = self.procs.get_mut(&r.pid) else { return };
        if p.v8.is_none() {
            p.v8 = Some(v8_layout(r.pid));
            p.mem = File::open(format!("/proc/{}/mem", r.pid)).ok().map(ProcMem);
            p.perf_map = Some(perf_map_of(r.pid));
        }
        let stack = name_frames(&self.symbolizer, r.pid, p, r);
        if r.req != 0 {
            if p.ops.len() >= CACHE_MAX {
                p.ops.clear();
            }
            p.ops.insert(r.req, fold::render(&stack));
            return;
        }
        let notice = match &p.v8 {
            Some(Err(e)) => Some(format!("JS frames not named: {e}")),
            _ if p.mem.is_none() => Some(format!("JS frames not named: cannot open /proc/{}/mem", r.pid)),
            _ => None,
        };
        let at = match p.pending.iter().position(|(s, _)| *s == r.iter_start_ns) {
            Some(i) => i,
            None => {
                if p.pending.len() >= PENDING_MAX {
                    p.pending.remove(0);
                }
                p.pending.push((r.iter_start_ns, Folder::default()));
                p.pending.len() - 1
            }
        };
        let folder = &mut p.pending[at].1;
        if folder.notice.is_none() {
            folder.notice = notice;
        }
        folder.add(stack);
    }

    /// --stacks all-ops: the stack that submitted request `req`, rendered.
    pub fn take_op(&mut self, pid: u32, req: u64) -> Option<String> {
        let ops = &mut self.procs.get_mut(&pid)?.ops;
        if ops.is_empty() {
            return None; // --stacks all-ops off: no hash of the request
        }
        ops.remove(&req)
    }

    /// The samples of the iteration that started at `start_ns`, folded;
    /// samples of earlier iterations still waiting are dropped (their
    /// iteration was not reported).
    pub fn take(&mut self, pid: u32, start_ns: u64) -> Option<Blocked> {
        let p = self.procs.get_mut(&pid)?;
        let i = p.pending.iter().position(|(s, _)| *s == start_ns);
        let found = i.map(|i| p.pending.remove(i).1);
        p.pending.retain(|(s, _)| *s > start_ns);
        found.filter(|f| f.samples() > 0).map(|f| f.finish(self.period_ns))
    }
}

/// The V8 layout of the process's node: in its executable, or in the
/// libnode.so it maps (distribution builds).
fn v8_layout(pid: u32) -> Result<V8Layout, String> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let mut tried = Vec::new();
    let mut candidates = vec![exe];
    if let Ok(maps) = procfs::process::Process::new(pid as i32).and_then(|p| p.maps()) {
        for m in maps.iter() {
            if let procfs::process::MMapPath::Path(path) = &m.pathname {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if name.starts_with("libnode") {
                    let (s, e) = m.address;
                    candidates.push(PathBuf::from(format!("/proc/{pid}/map_files/{s:x}-{e:x}")));
                    break;
                }
            }
        }
    }
    for c in candidates {
        match V8Layout::read(&c) {
            Ok(l) => {
                if l.smi_value_shift != 32 {
                    return Err("this node uses pointer compression (31-bit Smis), which uvspan does not read".into());
                }
                if !fp_slots_match(&l) {
                    return Err(format!(
                        "this V8 keeps a frame's function at fp{:+} and its context at fp{:+}; uvspan's sampler reads fp-16 and fp-8",
                        l.off_fp_function, l.off_fp_context_or_frame_type
                    ));
                }
                return Ok(l);
            }
            Err(e) => tried.push(format!("{e:#}")),
        }
    }
    Err(tried.join("; "))
}

/// Whether `/proc/PID/map_files` can be opened (root, same user namespace).
fn map_files_readable(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/map_files"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .is_some_and(|e| std::fs::metadata(e.path()).is_ok())
}

fn refresh_maps(pid: u32, p: &mut Proc) {
    if p.maps_read.is_some_and(|t| t.elapsed() < Duration::from_millis(200)) {
        return;
    }
    p.maps_read = Some(Instant::now());
    let Ok(maps) = procfs::process::Process::new(pid as i32).and_then(|pr| pr.maps()) else { return };
    let exe = p.exe_inode;
    let old = std::mem::take(&mut p.maps);
    p.maps = maps
        .iter()
        .filter(|m| m.perms.contains(procfs::process::MMPermissions::EXECUTE))
        .map(|m| {
            let (start, end) = m.address;
            let path = match &m.pathname {
                procfs::process::MMapPath::Path(path) => Some(path.clone()),
                _ => None,
            };
            // Anonymous code (V8's JIT, the vDSO) keeps frame pointers;
            // node's own code (its executable, libnode) mostly; other
            // files are libraries; the kernel's uretprobe trampoline is
            // not code of the process (unwind::Code).
            let code = match path.as_deref() {
                None if matches!(&m.pathname, procfs::process::MMapPath::Other(o) if o == "uprobes") => unwind::Code::Trampoline,
                None => unwind::Code::FramePointers,
                Some(path) if Some(m.inode) == exe || base_name(path).starts_with("libnode") => unwind::Code::Node,
                Some(_) => unwind::Code::Library,
            };
            // The same mapping as before keeps its open file.
            let file = path.as_ref().and_then(|path| {
                let same = old.iter().find(|o| o.start == start && o.end == end && o.offset == m.offset && o.path.as_ref() == Some(path));
                match same {
                    Some(o) => o.file.clone(),
                    None if p.map_files => File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}")).ok().map(Arc::new),
                    None => File::open(format!("/proc/{pid}/root{}", path.display())).ok().map(Arc::new),
                }
            });
            Mapping { start, end, offset: m.offset, path, code, file }
        })
        .collect();
}

/// What `pc` is in process `p` (its maps as last read).
fn code_of(p: &Proc, pc: u64) -> unwind::Code {
    mapping_of(p, pc).map_or(unwind::Code::Outside, |m| m.code)
}

/// The true frames of sample `r` ([`unwind`]): its libraries' unwind info
/// read when its leaf is in one of them.
fn true_frames(pid: u32, p: &mut Proc, r: &StackRecord) -> unwind::Walked {
    let first = r.frames.first().map(|f| f.pc);
    if r.frames.iter().enumerate().any(|(i, f)| mapping_of(p, if i == 0 { f.pc } else { f.pc.wrapping_sub(1) }).is_none()) {
        refresh_maps(pid, p);
    }
    if !first.is_some_and(|pc| code_of(p, pc) == unwind::Code::Library) || r.stack.is_empty() {
        let p: &Proc = p;
        return unwind::walk(r, &|pc| code_of(p, pc), &p.modules.unwinder);
    }
    // Lazily: the unwind info of the library the leaf is in, then of each
    // file the walk stops in (at most a few more).
    let mut at = first;
    for _ in 0..=UNWIND_RETRIES {
        let added = at.and_then(|pc| mapping_of(p, pc).cloned()).is_some_and(|m| add_module(p, &m));
        if !added && at != first {
            break;
        }
        let walked = {
            let p: &Proc = p;
            unwind::walk(r, &|pc| code_of(p, pc), &p.modules.unwinder)
        };
        // Where it stopped: the last frame's code, if a file's.
        let last =
            walked.frames.len().checked_sub(1).map(|i| if i == 0 { walked.frames[0].pc } else { walked.frames[i].pc.wrapping_sub(1) });
        let stopped_in_file = last.and_then(|pc| mapping_of(p, pc)).is_some_and(|m| m.file.is_some() && !p.modules.has(m.start));
        if !walked.truncated || !stopped_in_file {
            return walked;
        }
        at = last;
    }
    let p: &Proc = p;
    unwind::walk(r, &|pc| code_of(p, pc), &p.modules.unwinder)
}

/// Files whose unwind info is added after the leaf's, per sample.
const UNWIND_RETRIES: usize = 3;

/// Adds the unwind info of mapping `m`'s file; false if it was added before
/// or cannot be.
fn add_module(p: &mut Proc, m: &Mapping) -> bool {
    let (Some(path), Some(file)) = (&m.path, &m.file) else { return false };
    if !matches!(m.code, unwind::Code::Library | unwind::Code::Node) {
        return false;
    }
    let lib =
        unwind::LibMapping { range: m.start..m.end, offset: m.offset, name: base_name(path), library: m.code == unwind::Code::Library };
    p.modules.ensure(&lib, file)
}

fn mapping_of(p: &Proc, pc: u64) -> Option<&Mapping> {
    p.maps.iter().find(|m| m.start <= pc && pc < m.end)
}

fn base_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.to_string_lossy().into_owned(), |n| n.to_string_lossy().into_owned())
}

/// Names every frame of a sample, innermost first.
fn name_frames(sym: &Symbolizer, pid: u32, p: &mut Proc, r: &StackRecord) -> Vec<Frame> {
    if p.js.len() > CACHE_MAX {
        p.js.clear();
    }
    if p.fn_maps.len() > CACHE_MAX {
        p.fn_maps.clear();
    }
    if p.native.len() > CACHE_MAX {
        p.native.clear();
    }
    let walked = true_frames(pid, p, r);
    // Return addresses point after the call: look up the call itself.
    let lookups: Vec<u64> = walked.frames.iter().enumerate().map(|(i, f)| if i == 0 { f.pc } else { f.pc.saturating_sub(1) }).collect();
    let missing: Vec<u64> = lookups.iter().copied().filter(|a| !p.native.contains_key(a)).collect();
    if !missing.is_empty() && name_native(sym, pid, p, &missing).is_none() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(walked.frames.len() + 1);
    for (f, addr) in walked.frames.iter().zip(&lookups) {
        let (native, jit) = p.native.get(addr).cloned().unwrap_or_else(|| (Frame::native("[unknown]", None), false));
        // A JS frame runs JIT code (anonymous memory) or one of V8's
        // builtins (the interpreter, baseline code; in a stripped node they
        // have no symbol): only there is the frame's function slot asked.
        let maybe_js = jit || native.function == "[unknown]" || native.function.starts_with("Builtins_");
        out.push(match js_function(p, f, maybe_js) {
            Some(j) => Frame::js(&j.name, js_location(&j)),
            None => native,
        });
    }
    if walked.truncated {
        out.push(Frame::native(fold::TRUNCATED, None));
    }
    out
}

/// Names the native code addresses `missing` into `p.native` (and whether
/// each is JIT code): the ELF symbol, else the file and offset of its
/// mapping, else the perf map's name for JIT code. None: no such process id.
fn name_native(sym: &Symbolizer, pid: u32, p: &mut Proc, missing: &[u64]) -> Option<()> {
    if missing.iter().any(|&a| mapping_of(p, a).is_none()) {
        refresh_maps(pid, p);
    }
    let mut src = Process::new(Pid::Pid(std::num::NonZeroU32::new(pid)?));
    src.debug_syms = false;
    src.map_files = p.map_files;
    // The perf map is read by uvspan ([`perfmap`]), within bounds and
    // from where the process wrote it; blazesym would read all of it.
    src.perf_map = false;
    let mut named = sym.symbolize(&Source::Process(src), Input::AbsAddr(missing)).unwrap_or_default();
    named.resize_with(missing.len(), || Symbolized::Unknown(blazesym::symbolize::Reason::Unsupported));
    // What the process could not name (it has exited, or its files are
    // not where uvspan looks): by the file opened while it ran.
    for (i, &addr) in missing.iter().enumerate() {
        if matches!(named[i], Symbolized::Sym(_)) {
            continue;
        }
        let Some(Mapping { start, offset, path: Some(path), file: Some(file), .. }) = mapping_of(p, addr) else { continue };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&**file);
        let mut elf = Elf::new(format!("/proc/self/fd/{fd}"));
        elf.debug_syms = false;
        let off = addr - start + offset;
        if let Ok(Symbolized::Sym(mut s)) = sym.symbolize_single(&Source::Elf(elf), Input::FileOffset(off)) {
            s.module = Some(path.as_os_str().to_owned().into());
            named[i] = Symbolized::Sym(s);
        }
    }
    let now = Instant::now();
    for (i, &addr) in missing.iter().enumerate() {
        let frame = match named.get(i) {
            Some(Symbolized::Sym(s)) => {
                let module = s.module.as_deref().map(|m| base_name(Path::new(m)));
                (Frame::native(&s.name, module), false)
            }
            _ => match mapping_of(p, addr) {
                Some(Mapping { path: Some(path), start, offset, .. }) => {
                    (Frame::native("[unknown]", Some(format!("{}+{:#x}", base_name(path), addr - start + offset))), false)
                }
                // Not in a file: JIT code, named by the perf map if any.
                m => {
                    let jit = m.is_some();
                    let named = p.perf_map.as_mut().and_then(|pm| {
                        let file = pm.file_name();
                        pm.name(addr, now).map(|n| (n.to_string(), file))
                    });
                    match named {
                        Some((name, file)) => (Frame::native(&name, Some(file)), true),
                        None if jit => (Frame::native("[jit]", Some(format!("{addr:#x}"))), true),
                        None => (Frame::native("[unknown]", Some(format!("{addr:#x}"))), false),
                    }
                }
            },
        };
        p.native.insert(addr, frame);
    }
    if let Some(notice) = p.perf_map.as_mut().and_then(PerfMapFile::take_notice) {
        eprintln!("{notice}");
    }
    Some(())
}

/// The JS function of a sampled frame that may be one (`maybe_js`), named
/// from V8's heap; None for a native frame or one that cannot be named.
fn js_function(p: &mut Proc, f: &RawFrame, maybe_js: bool) -> Option<v8::JsFunction> {
    match (&p.v8, &p.mem) {
        // The kernel sends the words at fp-16 and fp-8; a JS frame
        // keeps its context (a heap object) at fp-8 where typed frames
        // (entry, exit, internal: not a JS function's own frame) keep a
        // frame-type marker (a small integer).
        (Some(Ok(l)), Some(mem)) if maybe_js && fp_slots_match(l) && f.fp_m8 & 1 == 1 => {
            // The JSFunction's words as the kernel copied them at the
            // sample (it may have moved since), else as it is now;
            // names are cached per SharedFunctionInfo (old space).
            let heap = v8::Heap::new(l, mem, p.node_major);
            // A function whose map was seen to be a JSFunction map and
            // whose SharedFunctionInfo is already named needs no read
            // (nor a live process: samples read after it exited).
            let shared_word = usize::try_from(l.js_function_shared / 8).ok().and_then(|i| f.obj.get(i)).copied();
            let known = shared_word.filter(|s| p.fn_maps.contains(&f.obj[0]) && p.js.contains_key(s));
            match known {
                Some(sfi) => p.js.get(&sfi).cloned().flatten(),
                None => {
                    let from_words = heap.shared_info_from(&f.obj);
                    if from_words.is_some() {
                        p.fn_maps.insert(f.obj[0]);
                    }
                    from_words
                        .or_else(|| heap.shared_info_of(f.fp_m16))
                        .and_then(|sfi| p.js.entry(sfi).or_insert_with(|| heap.describe(sfi)).clone())
                }
            }
        }
        _ => None,
    }
}

/// The perf map of a process, at the path it wrote it to: its own `/tmp`
/// and the pid it sees itself as (its PID namespace's).
fn perf_map_of(pid: u32) -> PerfMapFile {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let ns_pid = crate::discover::pidns::nspid(&status).last().copied().unwrap_or(pid);
    PerfMapFile::new(pid, ns_pid, perfmap::uids_from_status(&status), perfmap::Limits::DEFAULT)
}

/// Whether the words the kernel reads around the frame pointer are the
/// ones this V8 uses (function at fp-16, context or marker at fp-8).
fn fp_slots_match(l: &V8Layout) -> bool {
    l.off_fp_function == -16 && l.off_fp_context_or_frame_type == -8
}

fn js_location(j: &v8::JsFunction) -> Option<String> {
    let script = j.script.as_deref()?;
    Some(match (j.line, j.column) {
        (Some(l), Some(c)) => format!("{script}:{l}:{c}"),
        (Some(l), None) => format!("{script}:{l}"),
        _ => script.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JIT code (anonymous executable memory) named from the process's
    /// perf map, read by uvspan (this test process stands for the app).
    #[test]
    fn jit_frames_are_named_from_the_perf_map() {
        use crate::events::decode::RawFrame;
        let len = 1 << 16;
        // SAFETY: a fresh private anonymous mapping, not touched, unmapped below.
        let code = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(code, libc::MAP_FAILED);
        let base = code as u64;
        let pid = std::process::id();
        let path = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
        std::fs::write(&path, format!("{:x} 100 JS:*hotLoop /srv/app.js:3:1\ngarbage\n", base + 0x1000)).unwrap();
        let mut st = Stacks::new();
        st.add_process(pid, Some("v20.0.0"));
        let frame = |pc: u64| RawFrame { pc, ..RawFrame::default() };
        let mut named = Vec::new();
        for (i, pc) in [base + 0x1010, base + 0x3000].into_iter().enumerate() {
            let start = 1_000 + i as u64;
            st.sample(&StackRecord {
                pid,
                tid: pid,
                iter_start_ns: start,
                req: 0,
                ts_ns: start,
                frames: vec![frame(pc)],
                sp: 0,
                fp: 0,
                stack: Vec::new(),
            });
            let blocked = st.take(pid, start).expect("folded");
            named.push(blocked.stacks[0].0[0].clone());
        }
        let _ = std::fs::remove_file(&path);
        // SAFETY: the mapping made above, of `len` bytes, no longer used.
        unsafe { libc::munmap(code, len) };
        assert_eq!(named[0], Frame::native("JS:*hotLoop /srv/app.js:3:1", Some(format!("perf-{pid}.map"))));
        assert_eq!(named[1], Frame::native("[jit]", Some(format!("{:#x}", base + 0x3000))));
    }

    #[test]
    fn node_major_from_the_version_string() {
        assert_eq!(node_major(Some("v20.20.2")), Some(20));
        assert_eq!(node_major(Some("24.1.0")), Some(24));
        assert_eq!(node_major(Some("garbage")), None);
        assert_eq!(node_major(None), None);
    }
}
