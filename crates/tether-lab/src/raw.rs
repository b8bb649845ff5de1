//! The baseline: the same measurements on the bare UDP transport, with no
//! tether header, no checksum and no reliability, waiting the same way
//! (busy-poll, then sleep on the socket) so a ratio compares like with like.

use std::time::{Duration, Instant};

use tether::NodeId;
use tether_io::{RecvBatch, Transport, TransportError};

pub struct RawPeer {
    pub t: Box<dyn Transport + Send>,
    pub batch: RecvBatch,
    spin: Duration,
}

impl RawPeer {
    pub fn new(t: Box<dyn Transport + Send>, mtu: usize, spin: Duration) -> Self {
        // Runs coalesced by the kernel where it can: the baseline gets every
        // offload tether gets.
        let slot = t.coalesced_slot().unwrap_or(0).max(mtu);
        RawPeer { t, batch: RecvBatch::new(32, slot), spin }
    }

    /// Send every datagram, waiting out back-pressure (a blocking sender).
    pub fn send_all(&mut self, batch: &[(NodeId, &[u8])]) -> Result<(), TransportError> {
        let mut at = 0;
        while at < batch.len() {
            match self.t.send_batch(&batch[at..]) {
                Ok(n) => at += n,
                Err(TransportError::WouldBlock) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Send every chunk as one datagram to `dst`, in batches of 32 built on
    /// the stack: the baseline must not pay for allocation either.
    pub fn send_chunks<'a>(
        &mut self,
        dst: NodeId,
        chunks: impl Iterator<Item = &'a [u8]>,
    ) -> Result<(), TransportError> {
        let mut batch: [(NodeId, &[u8]); 32] = [(0, &[][..]); 32];
        let mut k = 0;
        for c in chunks {
            batch[k] = (dst, c);
            k += 1;
            if k == batch.len() {
                self.send_all(&batch)?;
                k = 0;
            }
        }
        self.send_all(&batch[..k])
    }

    /// Wait for at least one datagram (spin, then sleep), up to `timeout`.
    /// Returns how many are in `self.batch`.
    pub fn recv(&mut self, timeout: Duration) -> Result<usize, TransportError> {
        let start = Instant::now();
        loop {
            let n = self.t.recv_batch(&mut self.batch)?;
            if n > 0 {
                return Ok(n);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Ok(0);
            }
            if waited >= self.spin {
                self.t.wait_readable(Some((timeout - waited).min(Duration::from_millis(20))))?;
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
