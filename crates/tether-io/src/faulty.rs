//! Any transport with a fault plan applied where Li et al. [CI] Table 4 puts
//! each fault: drop, duplicate, inject, invocation and operation faults on
//! send; drop, duplicate, delay, reorder, modify and invocation faults on
//! receive. The faults come from `tether_fault::Injector`, the same code
//! the simulator uses; this wrapper only supplies the clock and the bytes.
//!
//! Delayed datagrams are held in the injector and handed out once due;
//! `next_wakeup` tells a sleeping driver when that is, so a delay costs
//! exactly its duration, not a poll interval.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tether_fault::{ErrorKind, FaultCounters, FaultPlan, Injector, PlanError, SendVerdict, Side};
// The inner receive batch holds the largest datagram tether emits or
// accepts: anything longer would be refused by the parser above anyway.
use tether_wire::MAX_DATAGRAM;

use crate::{NodeId, RecvBatch, Transport, TransportCounters, TransportError};

/// The typed transport error an injected fault fails a call with.
pub fn error_of(kind: ErrorKind) -> TransportError {
    match kind {
        ErrorKind::LocalResource => TransportError::LocalResource,
        ErrorKind::RemoteResource => TransportError::RemoteResource,
        ErrorKind::InvalidBuffer => TransportError::InvalidBuffer,
        ErrorKind::InvalidEndpoint => TransportError::InvalidEndpoint,
        ErrorKind::InvalidArgs => TransportError::InvalidArgs,
        ErrorKind::DestReject => TransportError::DestReject,
        ErrorKind::Unreachable => TransportError::Unreachable,
        ErrorKind::NotInitialized => TransportError::NotInitialized,
        ErrorKind::Interrupted => TransportError::Interrupted,
    }
}

#[derive(Default)]
struct Control {
    counters: Mutex<FaultCounters>,
    /// Sends the transport reported as successful whose operation then
    /// failed (injected operation faults): the completion statuses.
    operation_errors: Mutex<Vec<TransportError>>,
    disabled: AtomicBool,
    /// Datagrams the injector holds or has ready, and buffers it owns.
    queued: AtomicUsize,
    buffers: AtomicUsize,
}

/// Watch and steer a `FaultyTransport` from any thread, after it has been
/// handed to an endpoint: its counters, its completion statuses, and a switch.
#[derive(Clone, Default)]
pub struct FaultHandle(Arc<Control>);

impl std::fmt::Debug for FaultHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultHandle")
            .field("counters", &self.snapshot())
            .field("enabled", &!self.0.disabled.load(Ordering::SeqCst))
            .finish()
    }
}

impl FaultHandle {
    pub fn snapshot(&self) -> FaultCounters {
        *self.0.counters.lock().expect("fault counter lock")
    }

    /// Turn every fault off (`false`) or back on.
    pub fn set_enabled(&self, on: bool) {
        self.0.disabled.store(!on, Ordering::SeqCst);
    }

    /// Datagrams held back or waiting to be handed out, and every buffer
    /// the injector owns (in use or spare): what a run leaves behind.
    pub fn queued(&self) -> (usize, usize) {
        (self.0.queued.load(Ordering::Relaxed), self.0.buffers.load(Ordering::Relaxed))
    }

    /// Completion statuses of sends that failed after the call returned
    /// (injected operation faults), oldest first; taking them clears them.
    pub fn take_operation_errors(&self) -> Vec<TransportError> {
        std::mem::take(&mut *self.0.operation_errors.lock().expect("fault status lock"))
    }
}

/// Most completion statuses kept until someone takes them.
const MAX_STATUSES: usize = 1024;

pub struct FaultyTransport<T> {
    inner: T,
    injector: Injector,
    start: Instant,
    sends: bool,
    inner_batch: RecvBatch,
    control: FaultHandle,
    enabled: bool,
}

impl<T: std::fmt::Debug> std::fmt::Debug for FaultyTransport<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyTransport").field("inner", &self.inner).field("faults", &self.control).finish()
    }
}

impl<T: Transport> FaultyTransport<T> {
    /// Wrap `inner` with `plan`, drawing from `seed` (give each endpoint of
    /// a run its own seed derived from the run's).
    pub fn new(inner: T, plan: &FaultPlan, seed: u64) -> Result<Self, PlanError> {
        let injector = Injector::with_seed(plan, seed)?;
        // Runs the inner transport coalesces are taken whole, then handed
        // on one datagram at a time.
        let slot = inner.coalesced_slot().unwrap_or(0).max(MAX_DATAGRAM);
        Ok(FaultyTransport {
            inner,
            sends: injector.touches(Side::Send),
            injector,
            start: Instant::now(),
            inner_batch: RecvBatch::new(32, slot),
            control: FaultHandle::default(),
            enabled: true,
        })
    }

    pub fn handle(&self) -> FaultHandle {
        self.control.clone()
    }

    pub fn inner(&self) -> &T {
        &self.inner
    }

    fn now(&mut self) -> Duration {
        let on = !self.control.0.disabled.load(Ordering::Relaxed);
        if on != self.enabled {
            self.enabled = on;
            self.injector.set_enabled(on);
        }
        self.start.elapsed()
    }

    fn publish(&self) {
        *self.control.0.counters.lock().expect("fault counter lock") = self.injector.counters();
        let queued = self.injector.holding() + self.injector.ready();
        self.control.0.queued.store(queued, Ordering::Relaxed);
        self.control.0.buffers.store(self.injector.buffers(), Ordering::Relaxed);
    }
}

impl<T: Transport> Transport for FaultyTransport<T> {
    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }
    fn raw_fd(&self) -> Option<RawFd> {
        self.inner.raw_fd()
    }
    fn has_peer(&self, node: NodeId) -> bool {
        self.inner.has_peer(node)
    }
    fn peer_addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.inner.peer_addr(node)
    }
    fn add_peer(&mut self, node: NodeId, addr: SocketAddr) -> Result<(), TransportError> {
        self.inner.add_peer(node, addr)
    }

    /// Not faulted: a handshake answer to a new address is rare, and the
    /// handshake's own retries cover its loss.
    fn send_to_addr(&mut self, addr: SocketAddr, datagram: &[u8]) -> Result<(), TransportError> {
        self.inner.send_to_addr(addr, datagram)
    }

    fn send_to(&mut self, dst: NodeId, datagram: &[u8]) -> Result<(), TransportError> {
        if !self.sends {
            return self.inner.send_to(dst, datagram);
        }
        let now = self.now();
        let (inner, mut first_error) = (&mut self.inner, None);
        let verdict = self.injector.on_send(now, dst, datagram, |to, bytes| {
            if let Err(e) = inner.send_to(to, bytes) {
                first_error.get_or_insert(e);
            }
        });
        self.publish();
        match verdict {
            SendVerdict::Invocation(e) => Err(error_of(e)),
            SendVerdict::Operation(e) => {
                let mut statuses = self.control.0.operation_errors.lock().expect("fault status lock");
                if statuses.len() < MAX_STATUSES {
                    statuses.push(error_of(e));
                }
                Ok(())
            }
            SendVerdict::Sent => first_error.map_or(Ok(()), Err),
        }
    }

    fn send_batch(&mut self, batch: &[(NodeId, &[u8])]) -> Result<usize, TransportError> {
        if !self.sends {
            return self.inner.send_batch(batch);
        }
        for (i, &(dst, d)) in batch.iter().enumerate() {
            if let Err(e) = self.send_to(dst, d) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(batch.len())
    }

    fn recv_batch(&mut self, batch: &mut RecvBatch) -> Result<usize, TransportError> {
        batch.clear();
        let now = self.now();
        if let Some(e) = self.injector.on_recv_call(now) {
            self.publish();
            return Err(error_of(e));
        }
        // Read more only while what is ready would not fill the caller's
        // batch: beyond that the socket buffer holds the rest, as it would
        // without faults.
        if self.injector.ready() < batch.capacity() {
            let n = match self.inner.recv_batch(&mut self.inner_batch) {
                Ok(n) => n,
                Err(TransportError::WouldBlock) => 0,
                Err(e) => return Err(e),
            };
            for (from, addr, d) in self.inner_batch.datagrams() {
                self.injector.on_recv(now, from, addr, d);
            }
            if n > 0 {
                self.publish();
            }
        }
        let before = self.injector.ready() + self.injector.holding();
        self.injector.drain_ready(now, |from, addr, d| batch.push(from, addr, d));
        if self.inner_batch.may_hold_more() {
            batch.set_partial();
        }
        if before > 0 {
            self.publish();
        }
        Ok(batch.len())
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool, TransportError> {
        match self.next_wakeup() {
            Some(d) if d.is_zero() => Ok(true),
            Some(d) => {
                let t = timeout.map_or(d, |t| t.min(d));
                Ok(self.inner.wait_readable(Some(t))? || self.next_wakeup().is_some_and(|d| d.is_zero()))
            }
            None => self.inner.wait_readable(timeout),
        }
    }

    fn next_wakeup(&self) -> Option<Duration> {
        if self.injector.ready() > 0 {
            return Some(Duration::ZERO);
        }
        let due = self.injector.next_release()?;
        Some(due.saturating_sub(self.start.elapsed()))
    }

    fn counters(&self) -> TransportCounters {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemNetwork;

    fn drain(b: &mut impl Transport, rx: &mut RecvBatch, until_quiet: Duration) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < until_quiet {
            if b.recv_batch(rx).unwrap() > 0 {
                got.extend(rx.iter().map(|(_, d)| d.to_vec()));
                quiet_since = Instant::now();
            }
        }
        got
    }

    #[test]
    fn faults_on_both_sides_and_nothing_else_lost() {
        let net = MemNetwork::new(100_000);
        let send_plan =
            FaultPlan::parse_rules(1, &["drop:p=0.1,side=send", "duplicate:p=0.05,side=send"]).unwrap();
        let recv_plan =
            FaultPlan::parse_rules(2, &["drop:p=0.1", "reorder:p=0.05", "delay:p=0.02,mean=200us"]).unwrap();
        let mut a = FaultyTransport::new(net.attach(1), &send_plan, 1).unwrap();
        let mut b = FaultyTransport::new(net.attach(2), &recv_plan, 2).unwrap();
        let n = 20_000u32;
        for i in 0..n {
            a.send_to(2, &i.to_le_bytes()).unwrap();
        }
        let got = drain(&mut b, &mut RecvBatch::new(32, 64), Duration::from_millis(50));
        let (s, r) = (a.handle().snapshot(), b.handle().snapshot());
        assert_eq!(s.sends_seen, n as u64);
        assert_eq!(r.receives_seen, n as u64 - s.dropped + s.duplicated);
        assert_eq!(
            got.len() as u64,
            r.receives_seen - r.dropped,
            "{r:?} holding {} ready {}",
            b.injector.holding(),
            b.injector.ready()
        );
        let sd = (n as f64 * 0.1 * 0.9).sqrt();
        assert!((s.dropped as f64 - n as f64 * 0.1).abs() < 5.0 * sd, "{s:?}");
        assert!(r.reordered > 0 && r.delayed > 0, "{r:?}");
    }

    #[test]
    fn invocation_faults_fail_the_call_and_touch_nothing() {
        let net = MemNetwork::new(1000);
        let plan = FaultPlan::parse_rules(1, &["invocation:every=2,side=send,error=local_resource"]).unwrap();
        let mut a = FaultyTransport::new(net.attach(1), &plan, 1).unwrap();
        let _b = net.attach(2);
        let results: Vec<_> = (0..4).map(|_| a.send_to(2, b"x")).collect();
        assert_eq!(
            results,
            vec![Ok(()), Err(TransportError::LocalResource), Ok(()), Err(TransportError::LocalResource)]
        );
        assert_eq!(a.inner().counters().datagrams_sent, 2);
        let plan = FaultPlan::parse_rules(1, &["invocation:every=1,side=recv,error=interrupted"]).unwrap();
        let mut b = FaultyTransport::new(net.attach(3), &plan, 1).unwrap();
        assert_eq!(b.recv_batch(&mut RecvBatch::new(4, 64)), Err(TransportError::Interrupted));
    }

    #[test]
    fn operation_faults_succeed_then_report_a_status() {
        let net = MemNetwork::new(1000);
        let plan = FaultPlan::parse_rules(1, &["operation:every=2,side=send,error=remote_resource"]).unwrap();
        let mut a = FaultyTransport::new(net.attach(1), &plan, 1).unwrap();
        let _b = net.attach(2);
        assert!((0..4).all(|_| a.send_to(2, b"x").is_ok()));
        assert_eq!(a.handle().take_operation_errors(), vec![TransportError::RemoteResource; 2]);
        assert!(a.handle().take_operation_errors().is_empty());
        assert_eq!(a.inner().counters().datagrams_sent, 2, "drop=1: the failed operations sent nothing");
    }

    #[test]
    fn a_delayed_datagram_wakes_the_waiter_when_due() {
        let net = MemNetwork::new(1000);
        let plan = FaultPlan::parse_rules(1, &["delay:every=1,fixed=30ms"]).unwrap();
        let mut a = net.attach(1);
        let mut b = FaultyTransport::new(net.attach(2), &plan, 1).unwrap();
        let start = Instant::now();
        a.send_to(2, b"late").unwrap();
        let mut rx = RecvBatch::new(4, 64);
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 0, "held, not delivered");
        let wake = b.next_wakeup().expect("a release is due");
        assert!(wake > Duration::from_millis(20) && wake <= Duration::from_millis(30), "{wake:?}");
        while !b.wait_readable(Some(Duration::from_secs(1))).unwrap() {}
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 1);
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn switched_off_at_run_time() {
        let net = MemNetwork::new(1000);
        let plan = FaultPlan::parse_rules(1, &["drop:p=1,side=send"]).unwrap();
        let mut a = FaultyTransport::new(net.attach(1), &plan, 1).unwrap();
        let _b = net.attach(2);
        a.send_to(2, b"x").unwrap();
        a.handle().set_enabled(false);
        a.send_to(2, b"y").unwrap();
        assert_eq!(a.inner().counters().datagrams_sent, 1);
        assert_eq!(a.handle().snapshot().dropped, 1);
    }
}
