//! Where exactly in a function to put its uprobe.
//!
//! The kernel runs the instruction under a uprobe either by emulating it
//! (push reg, jmp/jcc/call rel, nop: cheap) or by single-stepping a copy of
//! it out of line (a second trap: measured ~30 µs per hit on this project's
//! VMs, against ~1 µs emulated). Functions often start with an instruction
//! of the second kind (`test %rdi,%rdi` in uv_fs_req_cleanup, `mov
//! 0x78(%rdi),%eax` in uv_async_send). The probe then moves forward, over
//! at most a few straight-line instructions that change neither the
//! argument registers the probes read nor the stack pointer, to the first
//! instruction the kernel emulates. Every call still passes that point, and
//! the arguments read there are the entry values. Unless a branch in the
//! function lands on a skipped instruction or on the point itself: the
//! probe would fire again there, so it stays at the entry.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

/// The chosen point: bytes after the symbol, and whether the kernel
/// emulates the instruction there (false: each hit is single-stepped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub delta: u64,
    pub emulated: bool,
}

/// Registers the probes read at the probe point (System V arguments and the
/// stack pointer, through which stack arguments are read).
const KEEP: [Register; 7] = [Register::RDI, Register::RSI, Register::RDX, Register::RCX, Register::R8, Register::R9, Register::RSP];

/// How far the probe may move at most (instructions skipped).
const MAX_SKIP: usize = 3;

fn emulated(i: &iced_x86::Instruction, bytes: &[u8]) -> bool {
    match i.flow_control() {
        FlowControl::UnconditionalBranch | FlowControl::Call => i.op0_kind() == OpKind::NearBranch64,
        FlowControl::ConditionalBranch => {
            // jcc only: the kernel does not emulate loop/jrcxz.
            i.op0_kind() == OpKind::NearBranch64
                && !matches!(i.mnemonic(), Mnemonic::Loop | Mnemonic::Loope | Mnemonic::Loopne | Mnemonic::Jrcxz | Mnemonic::Jecxz)
        }
        FlowControl::Next => matches!(i.code(), Code::Push_r64) || (i.len() == 1 && bytes.first() == Some(&0x90)),
        _ => false,
    }
}

/// Whether a direct branch in `body` (a function's code, from its start)
/// lands after its first instruction and at or before `delta`. A function
/// whose size is not known (an empty body) is taken as having none.
fn lands_within(body: &[u8], delta: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, body, 0, DecoderOptions::NONE);
    while decoder.can_decode() {
        let i = decoder.decode();
        let direct = matches!(i.flow_control(), FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call);
        if direct && i.op0_kind() == OpKind::NearBranch64 && (1..=delta).contains(&i.near_branch_target()) {
            return true;
        }
    }
    false
}

/// The probe point for a function whose first bytes are `code` (`body`: all
/// of its code, to check the branches in it; empty if its size is not
/// known). With `args_may_change`, instructions that write argument
/// registers may be skipped too (the probe's handler copes with them: see
/// its catalog row).
pub fn choose(code: &[u8], body: &[u8], args_may_change: bool) -> Point {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut delta = 0u64;
    for skipped in 0..=MAX_SKIP {
        if !decoder.can_decode() {
            break;
        }
        let i = decoder.decode();
        if i.is_invalid() {
            break;
        }
        let at = &code[delta as usize..];
        if emulated(&i, at) {
            if delta > 0 && lands_within(body, delta) {
                break;
            }
            return Point { delta, emulated: true };
        }
        // Only straight-line instructions that leave the arguments alone may be skipped.
        let writes_kept = info.info(&i).used_registers().iter().any(|r| {
            let reg = r.register().full_register();
            let kept = reg == Register::RSP || (!args_may_change && KEEP.contains(&reg));
            kept && !matches!(r.access(), OpAccess::Read | OpAccess::CondRead)
        });
        if skipped == MAX_SKIP || i.flow_control() != FlowControl::Next || writes_kept || i.has_rep_prefix() {
            break;
        }
        delta += i.len() as u64;
    }
    Point { delta: 0, emulated: false }
}

/// Where `uv__work_done` has taken the loop's finished threadpool jobs:
/// its call of `uv_mutex_unlock` (an emulated instruction), by which
/// libuv has moved `loop->wq` into a queue on its own stack, whose head
/// the instruction after the call reads (`mov disp(%rbp|%rsp), reg`: the
/// queue's first node). The jobs are all there then, and the lock still
/// keeps the pool's threads from adding any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkBatch {
    /// Bytes from the function's start to the call.
    pub delta: u64,
    /// The stack queue's head is at this register plus `disp`: the frame
    /// pointer (true) or the stack pointer (false).
    pub frame: bool,
    pub disp: i32,
}

/// The batch point of `uv__work_done` (its code from its start, at address
/// `start`), given `uv_mutex_unlock`'s address; None when the code is not
/// of that shape (then each job's completion is probed instead).
pub fn work_batch(body: &[u8], start: u64, unlock: u64) -> Option<WorkBatch> {
    let mut decoder = Decoder::with_ip(64, body, start, DecoderOptions::NONE);
    while decoder.can_decode() {
        let i = decoder.decode();
        if i.is_invalid() {
            return None;
        }
        if i.flow_control() != FlowControl::Call || i.op0_kind() != OpKind::NearBranch64 || i.near_branch_target() != unlock {
            continue;
        }
        // The first unlock: the next instruction loads the queue's first node.
        let next = decoder.can_decode().then(|| decoder.decode())?;
        let base = next.memory_base();
        let load = next.mnemonic() == Mnemonic::Mov
            && next.op_count() == 2
            && next.op0_kind() == OpKind::Register
            && next.op0_register().size() == 8
            && next.op1_kind() == OpKind::Memory
            && next.memory_index() == Register::None
            && matches!(base, Register::RBP | Register::RSP);
        let disp = next.memory_displacement64() as i64;
        if !load || !(-2048..2048).contains(&disp) {
            return None;
        }
        return Some(WorkBatch { delta: i.ip() - start, frame: base == Register::RBP, disp: disp as i32 });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_first_stays() {
        // push %rbp; mov %rsp,%rbp
        assert_eq!(choose(&[0x55, 0x48, 0x89, 0xe5], &[], false), Point { delta: 0, emulated: true });
    }

    #[test]
    fn test_then_je_moves_to_je() {
        // uv_fs_req_cleanup: test %rdi,%rdi; je rel32
        assert_eq!(choose(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xef, 0, 0, 0, 0x55], &[], false), Point { delta: 3, emulated: true });
    }

    #[test]
    fn mov_test_je_moves_two() {
        // uv_async_send: mov 0x78(%rdi),%eax; test %eax,%eax; je rel8
        assert_eq!(choose(&[0x8b, 0x47, 0x78, 0x85, 0xc0, 0x74, 0x09, 0x31, 0xc0], &[], false), Point { delta: 5, emulated: true });
    }

    #[test]
    fn never_skips_over_argument_writes_or_stack_changes() {
        // mov %rsi,%rdi (writes an argument register); push %rbx
        assert_eq!(choose(&[0x48, 0x89, 0xf7, 0x53], &[], false), Point { delta: 0, emulated: false });
        // sub $8,%rsp; push %rbx
        assert_eq!(choose(&[0x48, 0x83, 0xec, 0x08, 0x53], &[], false), Point { delta: 0, emulated: false });
        // endbr64; ret
        assert_eq!(choose(&[0xf3, 0x0f, 0x1e, 0xfa, 0xc3], &[], false), Point { delta: 0, emulated: false });
        // garbage
        assert_eq!(choose(&[], &[], false), Point { delta: 0, emulated: false });
    }

    #[test]
    fn argument_writes_are_skipped_only_when_the_handler_copes() {
        // llhttp_execute: add %rsi,%rdx; jmp rel32 (to llhttp__internal_execute)
        let code = [0x48, 0x01, 0xf2, 0xe9, 0x78, 0x15, 0, 0];
        assert_eq!(choose(&code, &[], false), Point { delta: 0, emulated: false });
        assert_eq!(choose(&code, &[], true), Point { delta: 3, emulated: true });
        // the stack pointer is never given up: sub $8,%rsp; push %rbx
        assert_eq!(choose(&[0x48, 0x83, 0xec, 0x08, 0x53], &[], true), Point { delta: 0, emulated: false });
    }

    #[test]
    fn a_branch_onto_the_skipped_code_or_the_point_keeps_the_entry() {
        // test %rdi,%rdi; je +5; xor %eax,%eax; jmp <the je>; ret; ret
        let body = [0x48, 0x85, 0xff, 0x74, 0x05, 0x31, 0xc0, 0xeb, 0xfa, 0xc3, 0xc3];
        assert_eq!(choose(&body, &[], false), Point { delta: 3, emulated: true }, "size unknown: moved");
        assert_eq!(choose(&body, &body, false), Point { delta: 0, emulated: false });
        // the same jumping back into the test instead (offset 1 is inside it, 0 would be the entry)
        let mut inside = body;
        inside[8] = 0xf8; // jmp to 1
        assert_eq!(choose(&inside, &inside, false), Point { delta: 0, emulated: false });
        // a jump to the entry is a call's start again, as at any entry probe
        let mut entry = body;
        entry[8] = 0xf7; // jmp to 0
        assert_eq!(choose(&entry, &entry, false), Point { delta: 3, emulated: true });
    }

    #[test]
    fn endbr_then_push_moves_past_endbr() {
        assert_eq!(choose(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55], &[], false), Point { delta: 4, emulated: true });
    }

    #[test]
    fn work_batch_is_the_unlock_call_and_the_head_the_next_load() {
        // Node 20's uv__work_done, from the mutex lock's return to the first callback:
        // call uv_mutex_lock; ...; call uv_mutex_unlock; mov -0x30(%rbp),%rax; cmp %r13,%rax
        let start = 0x18a8190u64;
        let body: Vec<u8> = [
            &[0x55, 0x48, 0x89, 0xe5][..],   // push %rbp; mov %rsp,%rbp
            &[0xe8, 0xc7, 0x2c, 0x01, 0x00], // call 18bae60 (lock), at +4
            &[0x4c, 0x89, 0xf7],             // mov %r14,%rdi
            &[0xe8, 0x0c, 0x2d, 0x01, 0x00], // call 18baeb0 (unlock), at +12
            &[0x48, 0x8b, 0x45, 0xd0],       // mov -0x30(%rbp),%rax
            &[0x4c, 0x39, 0xe8],             // cmp %r13,%rax
        ]
        .concat();
        let unlock = start + 12 + 5 + 0x12d0c;
        let lock = start + 4 + 5 + 0x12cc7;
        assert_eq!(work_batch(&body, start, unlock), Some(WorkBatch { delta: 12, frame: true, disp: -0x30 }));
        // the stack pointer as the base
        let mut rsp = body.clone();
        rsp.splice(17..21, [0x48, 0x8b, 0x44, 0x24, 0x10]); // mov 0x10(%rsp),%rax
        assert_eq!(work_batch(&rsp, start, unlock), Some(WorkBatch { delta: 12, frame: false, disp: 0x10 }));
        // no call of the unlock, or something else after it: not this shape
        assert_eq!(work_batch(&body, start, lock + 1), None);
        let mut other = body.clone();
        other.splice(17..21, [0x48, 0x8b, 0x47, 0x10]); // mov 0x10(%rdi),%rax
        assert_eq!(work_batch(&other, start, unlock), None);
        assert_eq!(work_batch(&[], start, unlock), None);
        assert_eq!(work_batch(&body[..17], start, unlock), None);
    }
}
