//! Flows in one process share it fairly (crates/tether/src/progress.rs,
//! "A worker's endpoints share it fairly"): 64 streams on loopback, as
//! `tether stream --flows 64 --size 1024 --count 5000` runs them, on two
//! cores. When the first flow has delivered all its messages, every flow
//! has delivered at least half the mean, in every run: counts, not rates.
//!
//! Before the progress workers handed steps to the calls parked on them,
//! and while some calls drove their endpoints for themselves, every
//! process had a run with a flow below half the mean, often one with a
//! flow that had delivered nothing at all: the 64 senders filling their
//! buffers kept the two workers from the CPU, the flows whose threads
//! drove for themselves got going, and the others waited.
//!
//! One test in this binary: it confines the whole process to two cores.

// Tests measure wall-clock intervals on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tether::{Config, Endpoint, Options};

const FLOWS: usize = 64;
const SIZE: usize = 1024;
/// Messages each flow sends: the first to have all of them delivered ends
/// the run.
const COUNT: u64 = 5000;
const RUNS: usize = 3;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Confine this process to (at most) two of the cores it may use, before
/// any endpoint exists: the progress threads and the leaves to drive are
/// counted for two cores, whatever the machine.
fn two_cores() {
    // SAFETY: cpu_set_t is plain data; the calls read and write only the
    // set passed, for this process (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        let mut two: libc::cpu_set_t = std::mem::zeroed();
        let mut taken = 0;
        for cpu in 0..libc::CPU_SETSIZE as usize {
            if taken < 2 && libc::CPU_ISSET(cpu, &set) {
                libc::CPU_SET(cpu, &mut two);
                taken += 1;
            }
        }
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &two), 0);
    }
}

/// The command's loopback options: datagrams as large as loopback carries,
/// a window of 1024 segments; a short linger, as a run stops its flows with
/// messages still buffered.
fn options() -> Options {
    let config = Config { max_datagram: 65507, send_window: 1024, recv_window: 1024, ..Config::default() };
    Options { config, linger: Duration::from_millis(20), ..Options::default() }
}

/// One run: what each flow had delivered when the first was done.
fn run() -> Vec<u64> {
    // Memory handed back to the system, as a process's first run has it:
    // the senders' buffers then cost page faults, the CPU time that kept
    // the workers waiting (later runs, on memory the allocator kept, were
    // less often unfair before the fix).
    #[cfg(target_env = "gnu")]
    // SAFETY: only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    let flows: Vec<(Endpoint, Endpoint)> = (0..FLOWS)
        .map(|_| {
            let rx = Endpoint::udp(1, any(), &[], options()).unwrap();
            let tx = Endpoint::udp(0, any(), &[(1, rx.local_addr().unwrap())], options()).unwrap();
            rx.add_peer(0, tx.local_addr().unwrap()).unwrap();
            (tx, rx)
        })
        .collect();
    let delivered: Vec<AtomicU64> = (0..FLOWS).map(|_| AtomicU64::new(0)).collect();
    let done: Mutex<Option<Vec<u64>>> = Mutex::new(None);
    let (go, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let at_line = AtomicUsize::new(0);
    let snapshot = || delivered.iter().map(|d| d.load(Ordering::Relaxed)).collect::<Vec<u64>>();
    let poll = Some(Duration::from_millis(50));
    std::thread::scope(|s| {
        for (i, (tx, rx)) in flows.iter().enumerate() {
            let (go, stop, at_line) = (&go, &stop, &at_line);
            s.spawn(move || {
                at_line.fetch_add(1, Ordering::AcqRel);
                while !go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                let msg = [7u8; SIZE];
                let mut sent = 0;
                while sent < COUNT && !stop.load(Ordering::Relaxed) {
                    match tx.send_blocking(1, &msg, poll) {
                        Ok(_) => sent += 1,
                        Err(tether::Error::TimedOut) => {}
                        Err(e) => panic!("send: {e}"),
                    }
                }
            });
            let (delivered, done) = (&delivered, &done);
            s.spawn(move || {
                at_line.fetch_add(1, Ordering::AcqRel);
                while !go.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                let mut got = 0;
                while !stop.load(Ordering::Relaxed) {
                    match rx.recv(poll) {
                        Ok(d) => assert_eq!(d.message.len(), SIZE),
                        Err(tether::Error::TimedOut) => continue,
                        Err(e) => panic!("recv: {e}"),
                    }
                    got += 1;
                    delivered[i].fetch_add(1, Ordering::Relaxed);
                    if got == COUNT {
                        done.lock().unwrap().get_or_insert_with(snapshot);
                    }
                }
            });
        }
        // All at once: every thread waits runnable, yielding (parked, each
        // waited for this thread to wake it, and this thread, preempted by
        // the first it woke, came back to the rest milliseconds later).
        while at_line.load(Ordering::Acquire) < 2 * FLOWS {
            std::thread::yield_now();
        }
        let start = Instant::now();
        go.store(true, Ordering::Release);
        while done.lock().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(60), "no flow done: {:?}", snapshot());
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
    });
    done.into_inner().unwrap().unwrap()
}

#[test]
fn flows_in_one_process_share_it_fairly() {
    two_cores();
    let slowest: Vec<f64> = (0..RUNS)
        .map(|i| {
            let counts = run();
            let mean = counts.iter().sum::<u64>() as f64 / FLOWS as f64;
            let least = *counts.iter().min().unwrap() as f64 / mean;
            eprintln!("run {i}: the slowest flow had {least:.2} of the mean; messages {counts:?}");
            least
        })
        .collect();
    assert!(
        slowest.iter().all(|&s| s >= 0.5),
        "a flow had less than half the mean when the first was done: the slowest in each run had {slowest:.2?}"
    );
}
