//! `tether engine` as the process it is meant to be: two engines, each a
//! `tether engine` process, with an application attached to each (this
//! test process), exchanging verified messages; then one engine is killed
//! with SIGKILL and its application learns of it at once.

#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether::{MessageId, MessageState};
use tether_engine::{Client, ClientOptions, EngineError};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct EngineProcess {
    child: Child,
    dir: PathBuf,
    rails: Vec<SocketAddr>,
}

impl EngineProcess {
    fn start(name: &str, rails: usize) -> Self {
        let dir = PathBuf::from(format!("/dev/shm/tether-test-cli-{}-{name}", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether"));
        cmd.arg("engine").arg("--dir").arg(&dir);
        for _ in 0..rails {
            cmd.args(["--bind", "127.0.0.1:0"]);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("tether engine starts");
        // "tether engine: pid P serving DIR on rails A, B"
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let rails = line
            .split(" on rails ")
            .nth(1)
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .trim()
            .split(", ")
            .map(|a| a.parse().unwrap())
            .collect();
        EngineProcess { child, dir, rails }
    }

    fn attach(&self, node: u32) -> Client {
        Client::attach(&self.dir, node, ClientOptions::default()).unwrap()
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 131 + j * 3) as u8).collect()
}

#[test]
fn applications_talk_through_two_engine_processes_and_see_one_killed() {
    let (e1, mut e2) = (EngineProcess::start("a", 2), EngineProcess::start("b", 2));
    let (mut a, mut b) = (e1.attach(1), e2.attach(2));
    assert_eq!(a.engine_pid(), e1.child.id(), "attached to the engine process, not to itself");
    a.add_peer_rails(2, &e2.rails).unwrap();
    b.add_peer_rails(1, &e1.rails).unwrap();
    let sizes = [8, 1000, 20_000];
    for i in 0..1000 {
        a.send(2, &msg(i, sizes[i % 3]), WAIT).unwrap();
    }
    for i in 0..1000 {
        let d = b.recv(WAIT).unwrap();
        assert_eq!((d.from, &d.message[..]), (1, &msg(i, sizes[i % 3])[..]), "message {i}");
    }
    for i in 0..100 {
        b.send(1, &msg(i, 64), WAIT).unwrap();
        assert_eq!(a.recv(WAIT).unwrap().message[..], msg(i, 64)[..]);
    }
    a.flush(WAIT).unwrap();
    assert_eq!(a.message_state(MessageId { peer: 2, seq: 999 }), MessageState::Delivered);
    // kill -9 the receiving side's engine: its application is told at once.
    e2.child.kill().unwrap();
    e2.child.wait().unwrap();
    let started = Instant::now();
    assert!(matches!(b.recv(Some(Duration::from_secs(5))), Err(EngineError::EngineGone)));
    assert!(started.elapsed() < Duration::from_secs(1), "noticed after {:?}", started.elapsed());
}
