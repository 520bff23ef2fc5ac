//! --stacks: one CPU-clock perf event per CPU, running `loop_sample` at
//! [`crate::stacks::SAMPLE_HZ`] on whatever runs there; the BPF program keeps
//! a sample only on a traced loop thread during an iteration already longer
//! than the threshold (one map lookup otherwise).
//!
//! Per CPU, not per thread: a per-thread event is switched in and out with
//! the thread, and its timer re-armed, at every context switch — measured
//! here (a VM) at ~+10 µs of the app's CPU per sleep/wake of its loop
//! thread, 13% of a paced HTTP server's CPU per request. A per-CPU event
//! costs each CPU one interrupt per millisecond, whoever runs there: 0.7-2.1%
//! of a busy CPU on the benchmark's VM with no program on it (+2.6% with
//! uvspan's, bench part 2b).
//!
//! So the events are on only while a traced process's loop is slow: [`Gate`]
//! turns them on once a traced process's main-thread loop (the loop the
//! sampler serves) has been busy for half the loop threshold in its current
//! iteration (samples are kept from the threshold on), and off when none
//! is. It sleeps while no loop is slow: the BPF program `gate_tick`, on the
//! `hrtimer_expire_entry` tracepoint, looks at the thread each timer
//! interrupt (the scheduler tick among them) finds running and wakes the
//! gate through a small ring buffer once such a loop has been busy that
//! long. While the events are on, the gate reads the loops' state every
//! half threshold until none is slow. A thread polling at 200 Hz instead
//! cost ~1.3% of a CPU on the benchmark's VM (a wake-up from a 5 ms sleep
//! costs ~50 µs of CPU there); it is the fallback where the tracepoint
//! cannot be attached. A BPF timer per loop thread would need neither, but
//! uprobe programs may not use timers ("tracing progs cannot use bpf_timer
//! yet").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use crate::kernel::skel::types::{loop_event, loop_state};
use crate::kernel::wake::{Sleeper, Waker};

/// `ioctl` requests on a perf event fd (linux/perf_event.h: `_IO('$', 0)`
/// and `_IO('$', 1)`).
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

/// How long a loop thread's current iteration has been busy at `now` (ns,
/// CLOCK_MONOTONIC as the BPF side's clock): its time since its start less
/// its epoll waits, the one in progress included (`epoll_enter`, 0: none).
/// 0 for a thread with no iteration under way.
pub fn busy_ns(start_ns: u64, poll_wait_ns: u64, epoll_enter: u64, now: u64) -> u64 {
    if start_ns == 0 || now <= start_ns {
        return 0;
    }
    let waiting = if epoll_enter != 0 { now.saturating_sub(epoll_enter) } else { 0 };
    (now - start_ns).saturating_sub(poll_wait_ns).saturating_sub(waiting)
}

/// `busy_ns` of one `loops` map value (a `struct loop_state`; a short one: 0).
fn busy_of(value: &[u8], now: u64) -> u64 {
    let ev = std::mem::offset_of!(loop_state, ev);
    let at = |off: usize| value.get(off..off + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
    busy_ns(
        at(ev + std::mem::offset_of!(loop_event, start_ns)),
        at(ev + std::mem::offset_of!(loop_event, poll_wait_ns)),
        at(std::mem::offset_of!(loop_state, epoll_enter)),
        now,
    )
}

/// What wakes a sleeping [`Gate`]: the BPF side's `gate_wake` ring buffer
/// and its `gate_awake` flag (set as it wakes the gate, cleared by it).
pub struct Wake {
    pub ring: MapHandle,
    pub awake: MapHandle,
}

/// How long a woken gate that finds no watched loop slow waits before it
/// lets the BPF side wake it again (a traced loop it does not watch: at
/// most one look per this, as a polling gate would).
const PARK_AFTER_NOTHING: Duration = Duration::from_millis(5);
/// The longest a sleeping gate sleeps without a wake-up (a missed one costs
/// at most this much of a slow iteration's samples).
const PARK_MAX: Duration = Duration::from_secs(1);

/// The sampler's per-CPU events, turned on while a traced loop thread is
/// slow (see the module's notes) by a thread of its own. Dropped: the
/// thread stops (the events stay as they were; their links close them).
pub struct Gate {
    /// Set, with `waker` rung, when dropped: the thread stops at once.
    stop: Arc<AtomicBool>,
    waker: Waker,
    switched_on: Arc<AtomicU64>,
    /// The traced processes (their main threads' loops are looked at).
    pids: Arc<Mutex<Vec<u32>>>,
    thread: Option<JoinHandle<()>>,
}

impl Gate {
    /// `events`: the per-CPU events (copies of their fds: the thread owns
    /// them apart from the links); `loops`: the BPF side's loop threads (of
    /// which those of the processes [`Gate::watch`] names are looked at);
    /// `lead`: how busy an iteration is when the events go on (and how often
    /// the thread looks while they are); `wake`: what wakes it (None: it
    /// looks every `lead`). The events start off.
    pub fn start(events: Vec<OwnedFd>, loops: MapHandle, lead: Duration, wake: Option<Wake>) -> anyhow::Result<Gate> {
        let waker = Waker::new()?;
        let stop = Arc::new(AtomicBool::new(false));
        let switched_on = Arc::new(AtomicU64::new(0));
        let set = |events: &[OwnedFd], on: bool| {
            for fd in events {
                // SAFETY: fd is an open perf event fd this gate owns; the
                // request takes no pointer argument.
                unsafe { libc::ioctl(fd.as_raw_fd(), if on { PERF_EVENT_IOC_ENABLE } else { PERF_EVENT_IOC_DISABLE }, 0) };
            }
        };
        set(&events, false);
        let pids: Arc<Mutex<Vec<u32>>> = Arc::default();
        let (n, watched, stopping, ringer) = (switched_on.clone(), pids.clone(), stop.clone(), waker.clone());
        let lead_ns = u64::try_from(lead.as_nanos()).unwrap_or(u64::MAX);
        let thread = std::thread::Builder::new().name("uvspan-sampler".into()).spawn(move || {
            let slow = || {
                let now = crate::events::clock::monotonic_ns();
                let list = watched.lock().map(|p| p.clone()).unwrap_or_default();
                // Unreadable (never expected): on, as it always was before.
                list.iter().any(|pid| match loops.lookup(&pid.to_ne_bytes(), MapFlags::ANY) {
                    Ok(v) => v.is_some_and(|v| busy_of(&v, now) >= lead_ns),
                    Err(_) => true,
                })
            };
            let stopped = || stopping.load(Ordering::Relaxed);
            let ring = wake.as_ref().and_then(|w| {
                let mut b = libbpf_rs::RingBufferBuilder::new();
                b.add(&w.ring, |_| 0).ok()?;
                b.build().ok()
            });
            // Sleeps until the ring buffer has a wake-up, the gate is
            // dropped, or the timeout.
            let Ok(sleeper) = Sleeper::new(ring.as_ref().map(|r| r.epoll_fd()), ringer) else {
                return;
            };
            let mut on = false;
            let mut woken = false;
            while !stopped() {
                let want = slow();
                if want {
                    woken = false;
                }
                if want != on {
                    set(&events, want);
                    on = want;
                    if on {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let (ring, wake) = match (&ring, &wake) {
                    (Some(r), Some(w)) if !on => (r, w),
                    // On (or no wake-up to wait for): look again in `lead`.
                    _ => {
                        sleeper.sleep(lead);
                        continue;
                    }
                };
                // Woken for a loop not watched: not woken again before this.
                if woken {
                    sleeper.sleep(PARK_AFTER_NOTHING);
                }
                // To sleep: let the BPF side wake it, then look once more (a
                // loop slow since would not).
                let _ = wake.awake.update(&0u32.to_ne_bytes(), &0u32.to_ne_bytes(), MapFlags::ANY);
                if slow() || stopped() {
                    woken = false;
                    continue;
                }
                sleeper.sleep(PARK_MAX);
                // A wake-up (not the timeout or the stop): see above.
                woken = ring.consume_raw() > 0;
            }
        })?;
        Ok(Gate { stop, waker, switched_on, pids, thread: Some(thread) })
    }

    /// Look at process `pid`'s main-thread loop from now on.
    pub fn watch(&self, pid: u32) {
        if let Ok(mut p) = self.pids.lock() {
            if !p.contains(&pid) {
                p.push(pid);
            }
        }
    }

    /// Process `pid` is gone.
    pub fn forget(&self, pid: u32) {
        if let Ok(mut p) = self.pids.lock() {
            p.retain(|&x| x != pid);
        }
    }

    /// How many times the events went on.
    pub fn switched_on(&self) -> u64 {
        self.switched_on.load(Ordering::Relaxed)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
    fn busy_is_the_iteration_less_its_waits() {
        // no iteration under way
        assert_eq!(busy_ns(0, 0, 0, 100), 0);
        // 10 ms since its start, 4 of them in waits before, none now
        assert_eq!(busy_ns(1_000, 4_000_000, 0, 10_001_000), 6_000_000);
        // in a wait since 2 ms ago: that is not busy either
        assert_eq!(busy_ns(1_000, 4_000_000, 8_001_000, 10_001_000), 4_000_000);
        // a clock read before the start (another CPU's), and waits over
        // the whole: 0, not a wrap
        assert_eq!(busy_ns(5_000, 0, 0, 4_000), 0);
        assert_eq!(busy_ns(1_000, 20_000, 0, 11_000), 0);
        // a short value reads as no iteration
        assert_eq!(busy_of(&[0u8; 8], 100), 0);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
        assert!(online_cpus().is_ok_and(|c| !c.is_empty()));
    }
}
