//! --stacks: one CPU-clock perf event per traced process, on its loop thread
//! (Node's main thread: tid == pid), running `loop_sample` at
//! [`crate::stacks::SAMPLE_HZ`] while the thread runs. The BPF program keeps
//! a sample only during an iteration already longer than the threshold.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;

/// A disabled CPU-clock sampling event on thread `tid` (any CPU), firing
/// every `period_ns` of the thread's CPU time; attaching a BPF program
/// enables it.
pub fn open_cpu_clock(tid: u32, period_ns: u64) -> io::Result<OwnedFd> {
    let mut attr = libbpf_sys::perf_event_attr {
        type_: libbpf_sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        config: u64::from(libbpf_sys::PERF_COUNT_SW_CPU_CLOCK),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = period_ns;
    attr.set_disabled(1);
    attr.set_exclude_hv(1);
    let tid = i32::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: perf_event_open(2) with a fully initialised attr that lives
    // across the call, a thread id, cpu -1 (any), no group, and a flag the
    // kernel knows; it returns a new fd or -1 with errno.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            tid,
            -1i32,
            -1i32,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
