//! The kernel's types that the programs' CO-RE relocations can match, cut
//! out of the kernel's BTF.
//!
//! libbpf resolves each CO-RE relocation by searching the kernel's BTF for
//! the local type's name: every local type a relocation names costs a scan
//! of all of the kernel's ~150k types, the scan is repeated in each copy of
//! the object ([`super::tracer`] loads two), and each copy parses the
//! kernel's 5 MB of BTF first. That was a fifth of start-up. Given the
//! same types in a BTF of their own (`btf_custom_path`), libbpf searches
//! only those: the named types of the object's own BTF, found in the
//! kernel's, with every type they contain (members, array elements,
//! typedefs, qualifiers) and pointers kept as pointers to `void`. A field
//! relocation walks members and array elements only, and a pointer field
//! matches any pointer, so every relocation resolves as it does against
//! the whole BTF (the root test below compares the relocated programs).
//!
//! Written here rather than with libbpf's BTF writer: one pass over the
//! raw bytes, no copy of the kernel's BTF in libbpf's structures, and pure
//! (tested on bytes without root).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use libbpf_rs::skel::OpenSkel;
use libbpf_rs::AsRawLibbpf;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::kernel::skel::OpenUvspanSkel;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

const INT: u32 = 1;
const PTR: u32 = 2;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const FWD: u32 = 7;
const TYPEDEF: u32 = 8;
const VOLATILE: u32 = 9;
const CONST: u32 = 10;
const RESTRICT: u32 = 11;
const FUNC: u32 = 12;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const FLOAT: u32 = 16;
const DECL_TAG: u32 = 17;
const TYPE_TAG: u32 = 18;
const ENUM64: u32 = 19;

/// One type of a BTF blob: its 12-byte head and the kind's data after it.
#[derive(Clone, Copy, Debug)]
struct Type<'a> {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    extra: &'a [u8],
}

impl Type<'_> {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
}

/// A parsed BTF blob: where each type starts in its type section (id 1
/// at `offsets[0]`), and its string section.
#[derive(Debug)]
struct Btf<'a> {
    type_sec: &'a [u8],
    offsets: Vec<u32>,
    strings: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// Bytes of kind data after a type's head.
fn extra_len(kind: u32, vlen: usize) -> Result<usize, String> {
    Ok(match kind {
        INT | VAR | DECL_TAG => 4,
        ARRAY => 12,
        STRUCT | UNION | DATASEC | ENUM64 => 12 * vlen,
        ENUM | FUNC_PROTO => 8 * vlen,
        PTR | FWD | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | FLOAT | TYPE_TAG => 0,
        k => return Err(format!("unknown BTF kind {k}")),
    })
}

fn parse(raw: &[u8]) -> Result<Btf<'_>, String> {
    let magic = raw.get(..2).map(|m| u16::from_ne_bytes([m[0], m[1]]));
    if magic != Some(MAGIC) {
        return Err("not BTF in this machine's byte order".into());
    }
    let field = |i: usize| u32_at(raw, 4 + 4 * i).map(|v| v as usize).ok_or("short BTF header");
    let (hdr_len, type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
    let section = |off: usize, len: usize| {
        hdr_len
            .checked_add(off)
            .and_then(|s| Some((s, s.checked_add(len)?)))
            .and_then(|(s, e)| raw.get(s..e))
            .ok_or("BTF section out of bounds")
    };
    let (type_sec, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
    // The kernel's types average ~36 bytes.
    let mut offsets = Vec::with_capacity(type_sec.len() / 32);
    let mut at = 0;
    while at < type_sec.len() {
        let info = u32_at(type_sec, at + 4).filter(|_| at + 12 <= type_sec.len()).ok_or("truncated BTF type")?;
        let end = at + 12 + extra_len((info >> 24) & 0x1f, (info & 0xffff) as usize)?;
        if end > type_sec.len() {
            return Err("truncated BTF type data".into());
        }
        offsets.push(at as u32);
        at = end;
    }
    Ok(Btf { type_sec, offsets, strings })
}

impl<'a> Btf<'a> {
    /// Type `id` (1-based; parse checked that it lies whole in the section).
    fn ty(&self, id: u32) -> Option<Type<'a>> {
        let at = *self.offsets.get((id as usize).checked_sub(1)?)? as usize;
        let s = self.type_sec;
        let (name_off, info, size_or_type) = (u32_at(s, at)?, u32_at(s, at + 4)?, u32_at(s, at + 8)?);
        let len = extra_len((info >> 24) & 0x1f, (info & 0xffff) as usize).ok()?;
        Some(Type { name_off, info, size_or_type, extra: s.get(at + 12..at + 12 + len)? })
    }

    fn types(&self) -> impl Iterator<Item = Type<'a>> + '_ {
        (1..=self.offsets.len() as u32).filter_map(|id| self.ty(id))
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// The positions in `t.extra` of the type ids it refers to, and
    /// whether its head's third word is one (pointers' are not followed).
    fn refs(t: &Type) -> (bool, Vec<usize>) {
        let vlen = (t.info & 0xffff) as usize;
        match t.kind() {
            ARRAY => (false, vec![0, 4]),
            STRUCT | UNION => (false, (0..vlen).map(|i| 12 * i + 4).collect()),
            FUNC_PROTO => (true, (0..vlen).map(|i| 8 * i + 4).collect()),
            DATASEC => (false, (0..vlen).map(|i| 12 * i).collect()),
            TYPEDEF | VOLATILE | CONST | RESTRICT | TYPE_TAG | FUNC | VAR | DECL_TAG => (true, Vec::new()),
            _ => (false, Vec::new()),
        }
    }

    /// The name offsets in `t.extra` (members', enumerators', parameters').
    fn extra_names(t: &Type) -> Vec<usize> {
        let vlen = (t.info & 0xffff) as usize;
        match t.kind() {
            STRUCT | UNION | ENUM64 => (0..vlen).map(|i| 12 * i).collect(),
            ENUM | FUNC_PROTO => (0..vlen).map(|i| 8 * i).collect(),
            _ => Vec::new(),
        }
    }
}

/// The name libbpf matches candidates by: up to a `___` flavour suffix.
fn essential(name: &[u8]) -> &[u8] {
    name.windows(3).position(|w| w == b"___").map_or(name, |i| &name[..i])
}

/// The kinds of type a relocation can start from.
fn root_kind(kind: u32) -> bool {
    matches!(kind, STRUCT | UNION | ENUM | ENUM64 | FWD | TYPEDEF | INT | FLOAT)
}

/// The named types of `local` (the object's own BTF) that a relocation
/// can start from, by essential name.
fn local_names(local: &Btf) -> FxHashSet<Vec<u8>> {
    local.types().filter(|t| root_kind(t.kind())).map(|t| essential(local.name(t.name_off)).to_vec()).filter(|n| !n.is_empty()).collect()
}

/// A BTF blob of the types of `kernel` named in `names` and everything they
/// contain; pointers point to `void`.
fn cut<'a>(kernel: &Btf<'a>, names: &FxHashSet<Vec<u8>>) -> Result<Vec<u8>, String> {
    let n = kernel.offsets.len();
    // Old id → new id (0: not kept); kept types in new-id order.
    let mut new_id = vec![0u32; n + 1];
    let mut kept: Vec<u32> = Vec::new();
    let mut stack: Vec<u32> = Vec::new();
    let mut keep = |id: u32, kept: &mut Vec<u32>, stack: &mut Vec<u32>| -> Result<(), String> {
        let slot = new_id.get_mut(id as usize).ok_or_else(|| format!("BTF type id {id} out of range"))?;
        if id != 0 && *slot == 0 {
            kept.push(id);
            *slot = kept.len() as u32;
            stack.push(id);
        }
        Ok(())
    };
    for (i, t) in kernel.types().enumerate() {
        // (`names` holds no empty name: unnamed types are never roots.)
        if root_kind(t.kind()) && names.contains(kernel.name(t.name_off)) {
            keep(i as u32 + 1, &mut kept, &mut stack)?;
        }
    }
    if kept.is_empty() {
        return Err("none of the object's types is in the kernel's BTF".into());
    }
    let ty = |id: u32| kernel.ty(id).ok_or_else(|| format!("BTF type id {id} out of range"));
    while let Some(id) = stack.pop() {
        let t = &ty(id)?;
        let (head, at) = Btf::refs(t);
        if head {
            keep(t.size_or_type, &mut kept, &mut stack)?;
        }
        for a in at {
            keep(u32_at(t.extra, a).ok_or("truncated BTF type data")?, &mut kept, &mut stack)?;
        }
    }
    let mut strings: Vec<u8> = vec![0];
    let mut offsets: FxHashMap<&'a [u8], u32> = FxHashMap::default();
    let mut string = |s: &'a [u8], strings: &mut Vec<u8>| -> u32 {
        if s.is_empty() {
            return 0;
        }
        *offsets.entry(s).or_insert_with(|| {
            let off = strings.len() as u32;
            strings.extend_from_slice(s);
            strings.push(0);
            off
        })
    };
    let remap = |id: u32| new_id.get(id as usize).copied().unwrap_or(0);
    let mut type_sec: Vec<u8> = Vec::new();
    for &id in &kept {
        let t = &ty(id)?;
        let (head, at) = Btf::refs(t);
        let third = match t.kind() {
            PTR => 0,
            _ if head => remap(t.size_or_type),
            _ => t.size_or_type,
        };
        let mut extra = t.extra.to_vec();
        for a in at {
            let v = remap(u32_at(t.extra, a).unwrap_or(0));
            extra[a..a + 4].copy_from_slice(&v.to_ne_bytes());
        }
        for a in Btf::extra_names(t) {
            let v = string(kernel.name(u32_at(t.extra, a).unwrap_or(0)), &mut strings);
            extra[a..a + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let name = string(kernel.name(t.name_off), &mut strings);
        for w in [name, t.info, third] {
            type_sec.extend_from_slice(&w.to_ne_bytes());
        }
        type_sec.extend_from_slice(&extra);
    }
    let mut out = Vec::with_capacity(HEADER_LEN + type_sec.len() + strings.len());
    out.extend_from_slice(&MAGIC.to_ne_bytes());
    out.extend_from_slice(&[1, 0]); // version 1, no flags
    for w in [HEADER_LEN, 0, type_sec.len(), type_sec.len(), strings.len()] {
        out.extend_from_slice(&(w as u32).to_ne_bytes());
    }
    out.extend_from_slice(&type_sec);
    out.extend_from_slice(&strings);
    Ok(out)
}

/// The id of the function `name` in BTF `raw`.
fn func_id(raw: &[u8], name: &[u8]) -> Option<u32> {
    let btf = parse(raw).ok()?;
    let found = btf.types().position(|t| t.kind() == FUNC && btf.name(t.name_off) == name);
    found.map(|i| i as u32 + 1)
}

/// The id of kernel function `name` in the kernel's BTF (what a program
/// attached to it names).
pub fn kernel_func_id(name: &str) -> Option<u32> {
    func_id(Kernel::open()?.bytes(), name.as_bytes())
}

/// The kernel's BTF.
const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The cut BTF, in a memory file that libbpf reads by path (given at
/// open, read at prepare: [`CoreBtf::fill`] writes it in between).
pub struct CoreBtf {
    file: File,
    kernel: Kernel,
}

/// The kernel's BTF: mapped read-only and private where the kernel allows
/// it (recent ones do), else read (4 KiB a read call: ~5 ms here).
enum Kernel {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl Kernel {
    fn open() -> Option<Kernel> {
        let file = File::open(KERNEL_BTF).ok()?;
        // SAFETY: the kernel's BTF is read-only and never changes while
        // the kernel runs; the private mapping is only read.
        match unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) } {
            Ok(m) => Some(Kernel::Mapped(m)),
            Err(_) => std::fs::read(KERNEL_BTF).ok().map(Kernel::Read),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Kernel::Mapped(m) => m,
            Kernel::Read(v) => v,
        }
    }
}

impl CoreBtf {
    /// Reads the kernel's BTF and makes the (empty) memory file; `None`
    /// where either fails (libbpf then searches the kernel's BTF itself).
    pub fn new() -> Option<CoreBtf> {
        let kernel = Kernel::open()?;
        // SAFETY: memfd_create with a NUL-terminated name and valid flags;
        // it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"uvspan-core-btf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by
        // nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let me = CoreBtf { file, kernel };
        // /proc/self must name this process (a /proc of another PID namespace
        // would not): checked by finding the file there.
        std::fs::metadata(me.path()).ok().filter(|m| m.len() == 0)?;
        Some(me)
    }

    /// The path libbpf opens.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Writes the kernel's types that the opened object's BTF names
    /// (before the object is prepared). Once.
    pub fn fill(&self, open: &OpenUvspanSkel<'_>) -> std::io::Result<()> {
        self.fill_for(&object_btf(open))
    }

    /// Writes the kernel's types that `local` (an object's BTF, raw)
    /// names; the whole kernel BTF if it cannot be cut. Once.
    fn fill_for(&self, local: &[u8]) -> std::io::Result<()> {
        if self.file.metadata()?.len() != 0 {
            return Ok(());
        }
        let cut = parse(local).and_then(|l| parse(self.kernel.bytes()).and_then(|k| cut(&k, &local_names(&l))));
        let bytes = match &cut {
            Ok(b) => b.as_slice(),
            Err(e) => {
                if std::env::var_os("UVSPAN_DEBUG").is_some_and(|v| v != "0") {
                    eprintln!("uvspan: the kernel's BTF not cut ({e}): libbpf searches all of it");
                }
                self.kernel.bytes()
            }
        };
        (&self.file).write_all(bytes)
    }
}

/// The raw BTF of an opened object (empty if it has none).
fn object_btf(open: &OpenUvspanSkel<'_>) -> Vec<u8> {
    let object = open.open_object().as_libbpf_object().as_ptr();
    // SAFETY: `object` is the skeleton's live bpf_object; bpf_object__btf
    // returns its BTF or NULL, owned by the object.
    let btf = unsafe { libbpf_rs::libbpf_sys::bpf_object__btf(object) };
    if btf.is_null() {
        return Vec::new();
    }
    let mut size: u32 = 0;
    // SAFETY: `btf` is the object's live BTF; btf__raw_data returns its
    // serialized bytes (owned by the BTF, valid until it changes) and
    // their length in `size`, or NULL.
    let data = unsafe { libbpf_rs::libbpf_sys::btf__raw_data(btf, &mut size) };
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: libbpf returned `size` readable bytes at `data`; copied at once.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size as usize) }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob from (name, info, third word, extra words) and strings.
    fn blob(types: &[(u32, u32, u32, &[u32])], strings: &[u8]) -> Vec<u8> {
        let mut ts = Vec::new();
        for (name, info, third, extra) in types {
            for w in [*name, *info, *third].iter().chain(extra.iter()) {
                ts.extend_from_slice(&w.to_ne_bytes());
            }
        }
        let mut out = MAGIC.to_ne_bytes().to_vec();
        out.extend_from_slice(&[1, 0]);
        for w in [24, 0, ts.len(), ts.len(), strings.len()] {
            out.extend_from_slice(&(w as u32).to_ne_bytes());
        }
        out.extend_from_slice(&ts);
        out.extend_from_slice(strings);
        out
    }

    fn set(names: &[&[u8]]) -> FxHashSet<Vec<u8>> {
        names.iter().map(|n| n.to_vec()).collect()
    }

    fn info(kind: u32, vlen: u32) -> u32 {
        (kind << 24) | vlen
    }

    /// Strings: 1 "int", 5 "a", 7 "b", 9 "c", 11 "x", 13 "y", 15 "z", 17 "a___v2".
    const STRS: &[u8] = b"\0int\0a\0b\0c\0x\0y\0z\0a___v2\0";

    /// 1 int; 2 struct a { int x; struct b y; struct c *z; }; 3 struct b
    /// { int x[4]; }; 4 struct c { int x; }; 5 ptr → 4; 6 array of 1
    /// (index 1, 4 elements).
    fn kernel() -> Vec<u8> {
        blob(
            &[
                (1, info(INT, 0), 4, &[(1 << 24) | 32]),
                (5, info(STRUCT, 3), 24, &[11, 1, 0, 13, 3, 32, 15, 5, 192]),
                (7, info(STRUCT, 1), 16, &[11, 6, 0]),
                (9, info(STRUCT, 1), 4, &[11, 1, 0]),
                (0, info(PTR, 0), 4, &[]),
                (0, info(ARRAY, 0), 0, &[1, 1, 4]),
            ],
            STRS,
        )
    }

    #[test]
    fn keeps_the_named_types_and_what_they_contain_and_not_what_they_point_to() {
        let k = kernel();
        let names = set(&[b"a"]);
        let out = cut(&parse(&k).unwrap(), &names).unwrap();
        let b = parse(&out).unwrap();
        let described: Vec<(String, u32, u32, Vec<u32>)> = b
            .types()
            .map(|t| {
                let words = t.extra.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
                (String::from_utf8_lossy(b.name(t.name_off)).into_owned(), t.kind(), t.size_or_type, words)
            })
            .collect();
        // Discovery order: a; then its members from the last (a stack).
        let s = |n: &str| {
            b.strings.windows(n.len() + 2).position(|w| w[0] == 0 && &w[1..=n.len()] == n.as_bytes() && w[n.len() + 1] == 0).unwrap() as u32
                + 1
        };
        assert_eq!(
            described,
            vec![
                ("a".into(), STRUCT, 24, vec![s("x"), 2, 0, s("y"), 3, 32, s("z"), 4, 192]),
                ("int".into(), INT, 4, vec![(1 << 24) | 32]),
                ("b".into(), STRUCT, 16, vec![s("x"), 5, 0]),
                ("".into(), PTR, 0, vec![]),
                ("".into(), ARRAY, 0, vec![2, 2, 4]),
            ]
        );
    }

    #[test]
    fn finds_functions_by_name() {
        // 7 func "c" → type 6 (a function prototype is not needed to find it).
        let k = blob(&[(1, info(INT, 0), 4, &[32]), (9, info(FUNC, 0), 1, &[])], STRS);
        assert_eq!(func_id(&k, b"c"), Some(2));
        assert_eq!(func_id(&k, b"int"), None, "not a function");
        assert!(kernel_func_id("__x64_sys_epoll_wait").is_some(), "the kernel's epoll_wait entry");
    }

    #[test]
    fn flavours_match_by_their_essential_name() {
        let local = blob(&[(17, info(STRUCT, 0), 0, &[])], STRS);
        let names = local_names(&parse(&local).unwrap());
        assert_eq!(names, set(&[b"a"]));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let k = kernel();
        for len in 0..k.len() {
            let _ = parse(&k[..len]).and_then(|b| cut(&b, &set(&[b"a"])));
        }
        assert!(parse(&k[..k.len() - 1]).is_err());
        // A member pointing past the last type.
        let bad = blob(&[(5, info(STRUCT, 1), 4, &[11, 99, 0])], STRS);
        assert!(cut(&parse(&bad).unwrap(), &set(&[b"a"])).is_err());
        assert!(cut(&parse(&k).unwrap(), &set(&[b"nothing"])).is_err());
    }

    #[test]
    fn the_kernels_task_struct_keeps_its_layout() {
        let raw = std::fs::read(KERNEL_BTF).expect("the kernel's BTF (uvspan needs it)");
        let k = parse(&raw).unwrap();
        let out = cut(&k, &set(&[b"task_struct"])).unwrap();
        let b = parse(&out).unwrap();
        assert!(b.offsets.len() < k.offsets.len() / 10, "{} of {} types kept", b.offsets.len(), k.offsets.len());
        fn find<'a>(btf: &Btf<'a>, name: &[u8]) -> Type<'a> {
            btf.types().find(|t| t.kind() == STRUCT && btf.name(t.name_off) == name).unwrap()
        }
        let members = |btf: &Btf, t: Type| -> Vec<(Vec<u8>, u32)> {
            t.extra.chunks(12).map(|m| (btf.name(u32_at(m, 0).unwrap()).to_vec(), u32_at(m, 8).unwrap())).collect()
        };
        for name in [&b"task_struct"[..], b"sched_entity", b"sched_info"] {
            let (old, new) = (find(&k, name), find(&b, name));
            assert_eq!(old.size_or_type, new.size_or_type);
            assert_eq!(members(&k, old), members(&b, new));
        }
        assert!(b.types().all(|t| t.kind() != PTR || t.size_or_type == 0));
    }

    /// Root: every program of the object, CO-RE-relocated (prepared) with
    /// the cut BTF and with the whole of the kernel's, is the same code.
    #[test]
    fn relocates_as_against_the_whole_kernel_btf() {
        use crate::kernel::skel::UvspanSkelBuilder;
        use libbpf_rs::skel::SkelBuilder;
        use std::collections::BTreeMap;
        use std::mem::MaybeUninit;

        let core = CoreBtf::new().expect("the kernel's BTF and a memory file");
        // Each program's instructions, opened and prepared; the map fds in
        // 64-bit loads (which differ between objects) zeroed.
        type Code = BTreeMap<String, Vec<[u8; 8]>>;
        let code = |custom: bool| -> (Code, Code) {
            let object = Box::leak(Box::new(MaybeUninit::uninit()));
            let mut builder = UvspanSkelBuilder::default();
            if custom {
                builder.obj_builder.btf_custom_path(core.path()).unwrap();
            }
            let mut open = builder.open(object).unwrap();
            if custom {
                core.fill(&open).unwrap();
            }
            let read = |open: &OpenUvspanSkel| -> Code {
                let mut code = Code::new();
                for p in open.open_object().progs() {
                    let mut wide = false;
                    let insns = p
                        .insns()
                        .iter()
                        .map(|i| {
                            let first_of_wide = i.code == 0x18 && !wide;
                            wide = first_of_wide;
                            let imm = if first_of_wide && matches!(i.src_reg(), 1 | 2) { 0 } else { i.imm };
                            let mut b = [0u8; 8];
                            b[0] = i.code;
                            b[1] = i.dst_reg() | (i.src_reg() << 4);
                            b[2..4].copy_from_slice(&i.off.to_ne_bytes());
                            b[4..].copy_from_slice(&imm.to_ne_bytes());
                            b
                        })
                        .collect();
                    code.insert(p.name().to_string_lossy().into_owned(), insns);
                }
                code
            };
            for mut p in open.open_object_mut().progs_mut() {
                p.set_autoload(true);
            }
            let before = read(&open);
            let object = open.open_object_mut().as_libbpf_object().as_ptr();
            // SAFETY: the skeleton's live bpf_object, opened, not prepared.
            let rc = unsafe { libbpf_rs::libbpf_sys::bpf_object__prepare(object) };
            assert_eq!(rc, 0, "bpf_object__prepare (root needed)");
            (before, read(&open))
        };
        let (before, whole) = code(false);
        let (_, cut) = code(true);
        assert!(whole.len() >= 10, "{} programs", whole.len());
        assert_eq!(whole.keys().collect::<Vec<_>>(), cut.keys().collect::<Vec<_>>());
        // Relocated at all: the session program reads kernel structures.
        let changed = whole.iter().filter(|(name, code)| before.get(*name) != Some(code)).count();
        assert!(changed > 0, "no program changed by its relocations");
        // libbpf marks a relocation it could not resolve with this call.
        let poisoned = |code: &Code| code.values().flatten().any(|i| i[0] == 0x85 && i[4..] == 0x0bad_2310_i32.to_ne_bytes());
        assert!(!poisoned(&whole) && !poisoned(&cut));
        for (name, code) in &whole {
            assert!(cut[name] == *code, "program {name} relocated differently against the cut BTF");
        }
    }
}
