//! The `Endpoint` API with the protocol in an engine (`Builder::engine`):
//! the same calls as an embedded endpoint, over real engines (each on a
//! thread here, as `tether engine` runs one in a process), real shared
//! memory and real UDP. An engine that stops is replaced under the
//! endpoint, which goes on with nothing lost.

#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tether::faults::FaultPlan;
use tether::{Endpoint, Error, Event, MessageState, SendError};
use tether_engine::{Engine, EngineOptions};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct Running {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start(name: &str) -> Self {
        let dir = PathBuf::from(format!("/dev/shm/tether-test-mode-{}-{name}", std::process::id()));
        Self::start_at(dir, vec!["127.0.0.1:0".parse().unwrap()])
    }

    fn start_at(dir: PathBuf, binds: Vec<SocketAddr>) -> Self {
        let mut engine = Engine::bind(EngineOptions::new(&dir, binds)).unwrap();
        let (addrs, stop) = (engine.rail_addrs(), engine.stop_flag());
        let thread = std::thread::spawn(move || engine.run().unwrap());
        Running { dir, addrs, stop, thread: Some(thread) }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Stop the engine (its applications see their connection close, as
    /// on a crash) and start another on the same directory and ports.
    fn restart(&mut self) {
        self.stop();
        let new = Running::start_at(self.dir.clone(), self.addrs.clone());
        let mut old = std::mem::replace(self, new);
        old.dir = PathBuf::new();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn msg(i: usize) -> Vec<u8> {
    let len = [8, 700, 5000][i % 3];
    (0..len).map(|j| (i * 7 + j * 13) as u8).collect()
}

#[test]
fn endpoints_attached_to_engines_deliver_through_an_engine_restart() {
    let (e1, mut e2) = (Running::start("a"), Running::start("b"));
    let a = Endpoint::builder(1).engine(&e1.dir).peer(2, e2.addrs[0]).build().unwrap();
    let b = Endpoint::builder(2).engine(&e2.dir).peer(1, e1.addrs[0]).build().unwrap();
    assert_eq!(a.node(), 1);
    let n = 600;
    std::thread::scope(|s| {
        // One endpoint, two threads: b's receiving thread blocks in recv
        // while its other thread sends, as with an embedded endpoint.
        let receiver = s.spawn(|| {
            for i in 0..n {
                let d = b.recv(WAIT).unwrap_or_else(|e| panic!("message {i}: {e}"));
                assert_eq!((d.from, &d.message[..]), (1, &msg(i)[..]), "message {i}");
            }
        });
        let replies = b.send_blocking(1, b"from b while receiving", WAIT).unwrap();
        let mut handles = Vec::new();
        for i in 0..n {
            handles.push(a.send_blocking(2, &msg(i), WAIT).unwrap());
            if i == n / 2 {
                // The receiving side's engine goes; another takes over.
                e2.restart();
            }
        }
        receiver.join().unwrap();
        assert_eq!(replies.wait(WAIT).unwrap(), MessageState::Delivered);
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(h.wait(WAIT).unwrap(), MessageState::Delivered, "message {i}");
            assert_eq!(a.message_state(h.id().unwrap()), MessageState::Delivered);
        }
    });
    assert_eq!(a.recv(WAIT).unwrap().message[..], b"from b while receiving"[..]);
    a.flush(WAIT).unwrap();
    assert!(b.try_recv().is_none(), "nothing twice");
    let told = std::iter::from_fn(|| b.poll_event()).any(|e| matches!(e, Event::EngineRecovered { .. }));
    assert!(told, "the endpoint was told its engine was replaced");
    // The engine reports the endpoint's protocol counters to it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.stats().messages_acked < 600 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = a.stats();
    assert!(stats.messages_acked >= 600 && stats.datagrams_sent >= 600, "{stats:?}");
    a.close(Duration::from_secs(1)).unwrap();
    b.close(Duration::from_secs(1)).unwrap();
}

#[test]
fn what_the_engine_owns_is_refused_and_errors_are_typed() {
    let e = Running::start("c");
    let bind = Endpoint::builder(1).engine(&e.dir).bind("127.0.0.1:0".parse().unwrap()).build();
    assert!(matches!(bind, Err(Error::EngineOwns { .. })), "{bind:?}");
    let faults = Endpoint::builder(1).engine(&e.dir).faults(FaultPlan::default()).build();
    assert!(matches!(faults, Err(Error::EngineOwns { .. })), "{faults:?}");
    let nobody = Endpoint::builder(1).engine("/dev/shm/tether-test-mode-nobody-serves-this").build();
    assert!(matches!(nobody, Err(Error::Engine(_))), "{nobody:?}");
    let a = Endpoint::builder(1).engine(&e.dir).build().unwrap();
    assert!(matches!(a.send(9, b"x"), Err(Error::Send(SendError::UnknownPeer(9)))));
    assert!(matches!(a.recv(Some(Duration::from_millis(5))), Err(Error::TimedOut)));
}
