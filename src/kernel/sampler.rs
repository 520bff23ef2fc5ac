//! --stacks: one CPU-clock perf event per CPU, running `loop_sample` at
//! [`crate::stacks::SAMPLE_HZ`] on whatever runs there; the BPF program keeps
//! a sample only on a traced loop thread during an iteration already longer
//! than the threshold (one map lookup otherwise).
//!
//! Per CPU, not per thread: a per-thread event is switched in and out with
//! the thread, and its timer re-armed, at every context switch — measured
//! here (a VM) at ~+10 µs of the app's CPU per sleep/wake of its loop
//! thread, 13% of a paced HTTP server's CPU per request. A per-CPU event
//! costs each CPU one interrupt per millisecond, whoever runs there.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;

/// A disabled CPU-clock sampling event on `cpu` (every thread), firing every
/// `period_ns`; attaching a BPF program enables it.
pub fn open_cpu_clock(cpu: u32, period_ns: u64) -> io::Result<OwnedFd> {
    let mut attr = libbpf_sys::perf_event_attr {
        type_: libbpf_sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        config: u64::from(libbpf_sys::PERF_COUNT_SW_CPU_CLOCK),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = period_ns;
    attr.set_disabled(1);
    attr.set_exclude_hv(1);
    let cpu = i32::try_from(cpu).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: perf_event_open(2) with a fully initialised attr that lives
    // across the call, pid -1 (every thread), a CPU number, no group, and a
    // flag the kernel knows; it returns a new fd or -1 with errno.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            -1i32,
            cpu,
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

/// The online CPUs (`/sys/devices/system/cpu/online`: "0-3,6").
pub fn online_cpus() -> io::Result<Vec<u32>> {
    parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online")?)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unreadable list of online CPUs"))
}

fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<u32>().ok()?..=b.trim().parse::<u32>().ok()?),
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
        assert!(online_cpus().is_ok_and(|c| !c.is_empty()));
    }
}
