//! Sleeping until there is something to do: a datagram on the socket, a
//! wake-up from another thread, or a deadline.
//!
//! `poll(2)` on the transport's descriptor plus an eventfd that any thread
//! can signal, so a thread blocked in the kernel can be woken without a
//! datagram (shutdown; the progress thread handing over to the application).

use std::os::fd::RawFd;
use std::time::Duration;

pub(crate) struct Waiter {
    socket: Option<RawFd>,
    event: RawFd,
}

/// Longest sleep when the transport has no descriptor to wait on.
const NO_FD_SLICE: Duration = Duration::from_micros(200);

impl Waiter {
    pub fn new(socket: Option<RawFd>) -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; we check the result and own the fd.
        let event = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if event < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Waiter { socket, event })
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
        let timeout = if self.socket.is_none() { timeout.min(NO_FD_SLICE) } else { timeout };
        self.poll(timeout, self.socket.unwrap_or(-1));
    }

    /// Block until `wake` is called or `timeout` passes, ignoring the socket:
    /// for a thread that must not be woken by traffic someone else handles.
    pub fn wait_for_wake(&self, timeout: Duration) {
        self.poll(timeout, -1);
    }

    fn poll(&self, timeout: Duration, socket: RawFd) {
        let mut fds = [
            libc::pollfd { fd: self.event, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: socket, events: libc::POLLIN, revents: 0 },
        ];
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of two pollfd structs; a negative fd
        // is ignored by poll(2) by definition.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
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
        let w = Waiter::new(None).unwrap();
        let t = Instant::now();
        w.wait(Duration::from_millis(5));
        assert!(t.elapsed() < Duration::from_millis(100));
        let w = std::sync::Arc::new(Waiter::new(Some(-1)).unwrap());
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
