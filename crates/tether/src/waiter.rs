//! Sleeping until there is something to do: a datagram on the socket, a
//! wake-up from another thread, or a deadline.
//!
//! `poll(2)` on the transports' descriptors (one per rail) plus an eventfd
//! that any thread can signal, so a thread blocked in the kernel can be
//! woken without a datagram (shutdown).

use std::os::fd::RawFd;
use std::time::Duration;

/// Most descriptors waited on: the eventfd and one socket per rail.
const MAX_FDS: usize = 1 + tether_proto::MAX_RAILS;

pub(crate) struct Waiter {
    /// The rails' descriptors; `None` if any rail has none (then waits
    /// are sliced, as nothing would wake them).
    sockets: Option<Vec<RawFd>>,
    event: RawFd,
}

/// Longest sleep when the transport has no descriptor to wait on.
const NO_FD_SLICE: Duration = Duration::from_micros(200);

impl Waiter {
    /// `sockets`: each rail's descriptor, if it has one.
    pub fn new(sockets: &[Option<RawFd>]) -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; we check the result and own the fd.
        let event = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if event < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let sockets = sockets.iter().copied().collect::<Option<Vec<_>>>();
        Ok(Waiter { sockets: sockets.map(|s| s.into_iter().take(MAX_FDS - 1).collect()), event })
    }

    /// Wake every thread blocked in `wait`.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full
        // counter (EAGAIN) already means "woken", so the result is ignored.
        let _ = unsafe { libc::write(self.event, (&one as *const u64).cast(), 8) };
    }

    /// Block until the socket is readable, `wake` is called, or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        match &self.sockets {
            Some(fds) => self.poll(timeout, fds),
            None => self.poll(timeout.min(NO_FD_SLICE), &[]),
        }
    }

    fn poll(&self, timeout: Duration, sockets: &[RawFd]) {
        let idle = libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 };
        let mut fds = [idle; MAX_FDS];
        fds[0].fd = self.event;
        for (slot, &fd) in fds[1..].iter_mut().zip(sockets) {
            slot.fd = fd;
        }
        let count = 1 + sockets.len().min(MAX_FDS - 1);
        // ppoll, not poll: a pacing deadline is tens of microseconds away,
        // and poll's milliseconds would round it up a hundredfold.
        let timeout = timeout.min(Duration::from_secs(3600));
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // SAFETY: `fds` is a live array of at least `count` pollfd structs,
        // `ts` a live timespec; a null signal mask leaves the mask alone.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), count as libc::nfds_t, &ts, std::ptr::null()) };
        if n > 0 && fds[0].revents & libc::POLLIN != 0 {
            let mut buf = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live 8-byte buffer.
            let _ = unsafe { libc::read(self.event, buf.as_mut_ptr().cast(), 8) };
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // SAFETY: we own this fd and close it exactly once.
        unsafe { libc::close(self.event) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wake_interrupts_wait_and_timeout_bounds_it() {
        let w = Waiter::new(&[None]).unwrap();
        let t = Instant::now();
        w.wait(Duration::from_millis(5));
        assert!(t.elapsed() < Duration::from_millis(100));
        let w = std::sync::Arc::new(Waiter::new(&[Some(-1)]).unwrap());
        let w2 = w.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.wake();
        });
        let t = Instant::now();
        w.wait(Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5), "woken by the eventfd, not the timeout");
        waker.join().unwrap();
    }
}
