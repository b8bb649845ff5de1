//! The process's progress threads (crates/tether/src/progress.rs): many
//! endpoints share about one per core, every endpoint is driven while its
//! application does nothing, idle endpoints cost next to no CPU, and a
//! closed endpoint's sockets are let go.
//!
//! One test in this binary: the thread count and CPU time it reads are the
//! whole process's, which other tests running beside it would disturb.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tether::{Endpoint, MessageState, Options};

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// CPU time (user + system) of this process's progress threads so far.
fn progress_cpu() -> Duration {
    let tick = 1.0 / USER_HZ;
    let mut total = 0.0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("tether-progress") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is the 3rd field of
        // the whole line, utime and stime the 14th and 15th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) * tick;
    }
    Duration::from_secs_f64(total)
}

/// Clock ticks per second in /proc's times: USER_HZ, fixed at 100 in
/// Linux's user ABI whatever the kernel's own tick.
const USER_HZ: f64 = 100.0;

#[test]
fn endpoints_share_progress_threads_that_drive_them_and_idle_cheaply() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // More endpoints than cores: one thread each would be too many.
    let n = cores + 6;
    let eps: Vec<Endpoint> =
        (0..n as u32).map(|i| Endpoint::udp(i, any(), &[], Options::default()).unwrap()).collect();
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.local_addr().unwrap()).collect();
    for (i, e) in eps.iter().enumerate() {
        for j in [(i + 1) % n, (i + n - 1) % n] {
            e.add_peer(j as u32, addrs[j]).unwrap();
        }
    }
    // Each endpoint sends to the next one; nobody calls anything blocking,
    // so only the progress threads can carry the handshakes, the data and
    // the ACKs that make the handles say Delivered.
    let handles: Vec<_> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| e.send(((i + 1) % n) as u32, &[i as u8; 3000]).unwrap())
        .collect();
    let start = Instant::now();
    while handles.iter().any(|h| h.state() == MessageState::Pending) {
        assert!(start.elapsed() < Duration::from_secs(10), "messages not driven to delivery");
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in &handles {
        assert_eq!(h.state(), MessageState::Delivered);
    }
    // Counted once they have run (a thread takes its name as it starts).
    let workers = thread_names().iter().filter(|t| t.starts_with("tether-progress")).count();
    assert!(
        workers >= 1 && workers <= cores,
        "{workers} progress threads for {n} endpoints on {cores} cores"
    );
    for (i, e) in eps.iter().enumerate() {
        let d = e.try_recv().expect("delivered while the application slept");
        assert_eq!((d.from as usize, d.message.len()), ((i + n - 1) % n, 3000));
    }

    // Idle: the endpoints have nothing to do; their threads must not spin.
    std::thread::sleep(Duration::from_millis(200));
    let before = progress_cpu();
    std::thread::sleep(Duration::from_secs(1));
    let used = progress_cpu() - before;
    assert!(used < Duration::from_millis(10) * n as u32, "{n} idle endpoints took {used:?} of CPU in 1 s");

    // Closed endpoints let go of their sockets (the progress threads hold
    // none open): the ports can be bound again, while the send handles,
    // which keep their endpoint's state, still answer.
    for (e, addr) in eps.into_iter().zip(&addrs) {
        e.close(Duration::from_secs(1)).unwrap();
        std::net::UdpSocket::bind(addr).expect("the closed endpoint's port is free");
    }
    for h in &handles {
        assert_eq!(h.state(), MessageState::Delivered, "a handle outliving its endpoint");
        assert_eq!(h.wait(Some(Duration::from_millis(100))).ok(), Some(MessageState::Delivered));
    }
}
