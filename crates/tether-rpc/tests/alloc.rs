//! The call layer's hot path does not allocate per call: envelopes,
//! arguments and replies are slices of each side's arena, queues keep
//! their room. Counted with a global allocator over 20,000 calls in the
//! steady state, caller and server handing envelopes to each other
//! directly. The tables' B-tree nodes still come and go now and then as
//! calls are added and freed: 0.016 allocations a call here. Before the
//! arenas each envelope, each copy of arguments and of a reply was an
//! allocation, and freeing the entries below a caller's first incomplete
//! (which moves with every request) built a new tree each time: that
//! alone was 1.016 a call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use tether_proto::Instant;
use tether_rpc::{Caller, MemLog, RpcConfig, Target};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const C: u32 = 1;
const S: u32 = 2;

/// `n` calls of 8 bytes each way, one at a time, through both sides.
fn calls(caller: &mut Caller, server: &mut Target, log: &mut MemLog, n: u64, now: &mut Instant) {
    let args = [7u8; 8];
    for _ in 0..n {
        *now = *now + std::time::Duration::from_micros(10);
        let call = caller.request(*now, S, 1, args, false, None, false).unwrap();
        while let Some(o) = caller.poll_transmit() {
            server.handle(*now, C, &o.bytes, log).unwrap();
        }
        let job = server.poll_dispatch(log).unwrap();
        server.complete(job.from, job.call, &job.args, log).unwrap();
        drop(job);
        while let Some(o) = server.poll_transmit() {
            caller.handle(*now, S, &o.bytes).unwrap();
        }
        assert_eq!(caller.take(call).map(|(_, r)| r.unwrap().len()), Some(8));
    }
}

#[test]
fn a_call_costs_no_allocation_of_its_own() {
    let config = RpcConfig { credit: 64, ..RpcConfig::default() };
    let mut caller = Caller::new(config.clone(), 9);
    let mut server = Target::new(config);
    server.register(1);
    // A log large enough never to compact in the run.
    let mut log = MemLog::new(64 << 20);
    let mut now = Instant::from_nanos(1_000_000);
    // Warm: the arenas' chunks, the queues' room.
    calls(&mut caller, &mut server, &mut log, 2_000, &mut now);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let n = 20_000;
    calls(&mut caller, &mut server, &mut log, n, &mut now);
    let per_call = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64;
    eprintln!("{per_call:.3} allocations a call");
    assert!(per_call < 0.05, "{per_call:.3} allocations a call");
}
