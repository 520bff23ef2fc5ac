//! Waiting for the kernel and for the rest of uvspan at once, and leaving
//! without waiting for the kernel.
//!
//! The reader sleeps in one epoll set holding the ring buffer's own epoll fd
//! and an eventfd that any thread can ring ([`Waker`]): a command that exits,
//! a signal, symbols read by the discovery worker. So uvspan reacts at once
//! instead of at its next poll timeout.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

/// An eventfd other threads write to, to wake the reader.
#[derive(Clone, Debug)]
pub struct Waker(Arc<OwnedFd>);

impl Waker {
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd has no memory preconditions; a non-negative return
        // is a new fd that we own from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: fd was just returned by eventfd and is owned by nobody else.
        Ok(Waker(Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Wakes the reader (cheap; wake-ups before it sleeps are not lost).
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        // A full counter (EAGAIN) means a wake-up is pending anyway.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our eventfd
        // (non-blocking: EAGAIN when nothing is pending).
        let _ = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// One epoll set: a ring buffer's epoll fd (if any) and the waker.
pub struct Sleeper {
    epoll: OwnedFd,
    waker: Waker,
}

impl Sleeper {
    pub fn new(ring_epoll_fd: Option<RawFd>, waker: Waker) -> Result<Sleeper> {
        // SAFETY: epoll_create1 has no memory preconditions; a non-negative
        // return is a new fd that we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_create1");
        }
        // SAFETY: fd was just created and is owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        for watched in ring_epoll_fd.into_iter().chain([waker.0.as_raw_fd()]) {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: watched as u64 };
            // SAFETY: both fds are open for the life of the Sleeper (the ring
            // buffer and the waker outlive it); ev is a valid epoll_event.
            if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, watched, &mut ev) } != 0 {
                return Err(std::io::Error::last_os_error()).context("epoll_ctl");
            }
        }
        Ok(Sleeper { epoll, waker })
    }

    /// Sleeps until records are ready, the waker rings, or `timeout` passes.
    pub fn sleep(&self, timeout: Duration) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 2];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: events is a live array of 2 epoll_events and we pass its length.
        unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 2, ms) };
        self.waker.drain();
    }
}

/// Leaves the detaching of probes to a child process, so that uvspan's exit
/// (and the exit status a shell waits for) is not held up by it.
///
/// Closing the last fd of a multi-uprobe link waits for the kernel's RCU
/// grace periods (~40 ms measured here), in the exiting task. The child
/// inherits every fd, waits until this process is gone (its end of a pipe
/// closes), then exits and pays that wait itself. It runs only
/// async-signal-safe calls (close, setsid, read, _exit), and closes stdin, stdout
/// and stderr first, so that a reader of uvspan's output sees it end when
/// uvspan exits, and leaves uvspan's session and process group (setsid), so
/// that what waits for the group is not held up by it either. When fork
/// fails, uvspan simply detaches itself on exit.
pub fn detach_after_exit() {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    // SAFETY: fork in a multi-threaded process: the child below only calls
    // close, setsid, read and _exit, which are async-signal-safe.
    match unsafe { libc::fork() } {
        0 => {
            let mut b = [0u8; 1];
            // SAFETY: fds are the pipe's two ends, inherited; the read
            // returns 0 when the parent (the only other writer) has exited.
            unsafe {
                for fd in [0, 1, 2, fds[1]] {
                    libc::close(fd);
                }
                libc::setsid();
                while libc::read(fds[0], b.as_mut_ptr().cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
                libc::_exit(0);
            }
        }
        _ => {
            // Parent (or fork failed): keep the write end until exit.
            // SAFETY: closes the read end, which this process does not use.
            unsafe { libc::close(fds[0]) };
        }
    }
}
