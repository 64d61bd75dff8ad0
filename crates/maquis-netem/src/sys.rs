//! Small operating-system helpers: a stop event that poll(2) can wait on,
//! real-time scheduling for the current thread, and the root check.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::NetemError;

/// A one-shot stop signal: a flag plus an eventfd that becomes (and stays)
/// readable once set, so threads blocked in poll(2) wake up.
#[derive(Debug)]
pub struct StopEvent {
    flag: AtomicBool,
    fd: OwnedFd,
}

impl StopEvent {
    /// Creates an unset stop event.
    pub fn new() -> Result<Self, NetemError> {
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(NetemError::io("eventfd", io::Error::last_os_error()));
        }
        Ok(StopEvent {
            flag: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Sets the event and wakes every poller.
    pub fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd. A failed
        // write (counter overflow) leaves it readable anyway.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            );
        }
    }

    /// Whether the event was set.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Waits until `fd` is readable or the event is set. Returns `true` if
    /// `fd` is readable (or in error, so the caller's read reports it).
    pub fn wait_readable(&self, fd: RawFd, timeout: Option<Duration>) -> bool {
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: fds is a valid array of two pollfd structs.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        rc > 0 && fds[0].revents != 0 && !self.is_set()
    }
}

/// Moves the calling thread to SCHED_FIFO at `priority` and removes its
/// timer slack, so timed waits end on time even when every core is busy.
pub fn set_realtime(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_self is always valid; param is a valid sched_param.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    set_timer_slack(1);
    Ok(())
}

/// Sets the calling thread's nice value (Linux applies it per thread).
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid never fails; setpriority on our own thread id.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the calling thread's timer slack in nanoseconds (best effort).
pub fn set_timer_slack(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long value.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}

/// Fails with [`NetemError::NotRoot`] unless the effective user is root.
pub fn require_root() -> Result<(), NetemError> {
    // SAFETY: geteuid never fails.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(NetemError::NotRoot { euid });
    }
    Ok(())
}
