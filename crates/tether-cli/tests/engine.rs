//! `tether engine` as the process it is meant to be: two engines, each a
//! `tether engine` process, with an application attached to each (this
//! test process), exchanging verified messages; then one engine is killed
//! with SIGKILL mid-stream and a new one started on its ports resumes
//! from the applications' backups: nothing lost, nothing twice.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tether::{MessageId, MessageState};
use tether_engine::{Client, ClientOptions};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct EngineProcess {
    child: Child,
    dir: PathBuf,
    rails: Vec<SocketAddr>,
}

impl EngineProcess {
    fn start(name: &str, rails: usize) -> Self {
        let dir = PathBuf::from(format!("/dev/shm/tether-test-cli-{}-{name}", std::process::id()));
        Self::start_at(dir, &vec!["127.0.0.1:0".parse().unwrap(); rails])
    }

    /// kill -9, then a new `tether engine` on the same directory and ports.
    fn kill_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let new = Self::start_at(self.dir.clone(), &self.rails);
        let mut old = std::mem::replace(self, new);
        old.dir = PathBuf::new();
    }

    fn start_at(dir: PathBuf, binds: &[SocketAddr]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether"));
        cmd.arg("engine").arg("--dir").arg(&dir);
        for b in binds {
            cmd.args(["--bind", &b.to_string()]);
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
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn msg(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 131 + j * 3) as u8).collect()
}

#[test]
fn applications_go_on_through_engines_killed_with_sigkill() {
    let (mut e1, mut e2) = (EngineProcess::start("a", 2), EngineProcess::start("b", 2));
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
    // kill -9 the receiving side's engine mid-stream, then the sending
    // side's; each time a new engine takes over from the backups.
    let check = |i: usize, got: &[u8]| assert!(got == &msg(i, sizes[i % 3])[..], "message {i} differs");
    for (round, kill_receiver) in [(1, true), (2, false)] {
        let base = 1000 * round;
        let mut got = 0;
        for i in base..base + 1000 {
            a.send(2, &msg(i, sizes[i % 3]), WAIT).unwrap();
            if i == base + 300 {
                if kill_receiver {
                    e2.kill_and_restart()
                } else {
                    e1.kill_and_restart()
                }
            }
            while let Some(d) = b.try_recv().unwrap() {
                check(base + got, &d.message);
                got += 1;
            }
        }
        while got < 1000 {
            check(base + got, &b.recv(WAIT).unwrap().message);
            got += 1;
        }
        a.flush(WAIT).unwrap();
        for seq in base as u64..base as u64 + 1000 {
            assert_eq!(a.message_state(MessageId { peer: 2, seq }), MessageState::Delivered, "message {seq}");
        }
        assert!(b.try_recv().unwrap().is_none(), "nothing twice");
    }
    let told = |c: &mut Client| {
        std::iter::from_fn(|| c.poll_event().unwrap())
            .any(|e| matches!(e, tether::Event::EngineRecovered { .. }))
    };
    assert!(told(&mut a) && told(&mut b), "both applications were told of their engine's outage");
}
