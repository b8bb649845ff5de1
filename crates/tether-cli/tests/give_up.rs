//! Every wait has the bound the user set: a sender whose listener froze
//! (SIGSTOP) and then went away (killed as soon as it was continued)
//! reports failure within `--give-up-after` of the last sign of life, for
//! every message size. Two `tether stream` processes over UDP on loopback.
//!
//! The freeze is what made it hard: the round trips measured across it
//! are as long as the freeze, and the endpoint's patience for silent peers
//! (sixteen of its slowest round trips, for an endpoint starved of CPU)
//! stretched the give-up to twelve times `--give-up-after` before the
//! user's bound capped it.

// Tests measure wall-clock bounds on real sockets; only the pure crates ban the clock.
#![allow(clippy::disallowed_methods)]

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GIVE_UP: Duration = Duration::from_secs(2);
/// Shorter than the give-up: the sender must ride it out.
const FREEZE: Duration = Duration::from_millis(1500);

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

fn frozen_then_gone(size: usize) {
    let port = |_| UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (listen, bind) = (port(0), port(1));
    let size = size.to_string();
    let common = ["stream", "--size", &size, "--count", "100000000", "--runs", "1", "--give-up-after", "2s"];
    let tether = || Command::new(env!("CARGO_BIN_EXE_tether"));
    let mut listener = tether()
        .args(common)
        .args(["--listen", &listen, "--peer", &bind])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the listener");
    std::thread::sleep(Duration::from_millis(200));
    let mut sender = tether()
        .args(common)
        .args(["--connect", &listen, "--bind", &bind])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the sender");
    std::thread::sleep(Duration::from_millis(700));
    assert!(sender.try_wait().unwrap().is_none(), "{size} B: the stream runs");
    signal(listener.id(), libc::SIGSTOP);
    std::thread::sleep(FREEZE);
    signal(listener.id(), libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(20));
    listener.kill().unwrap();
    let gone = Instant::now();
    listener.wait().unwrap();
    // The bound, with room for a loaded machine's scheduling. Before the
    // patience was capped by it, the 4 KiB sender's blocked send timed out
    // at 4.8 s ("timed out"), and one that lingered took 3.0 s.
    let bound = GIVE_UP + Duration::from_millis(750);
    let status = loop {
        if let Some(status) = sender.try_wait().unwrap() {
            break status;
        }
        if gone.elapsed() > bound * 3 {
            sender.kill().unwrap();
            sender.wait().unwrap();
            panic!("{size} B: the sender still ran {:?} after its listener went", gone.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = gone.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(sender.stderr.as_mut().unwrap(), &mut err).unwrap();
    eprintln!("{size} B: the sender gave up {took:?} after its listener went: {}", err.trim());
    assert!(!status.success(), "{size} B: the sender reports the failure");
    assert!(err.contains("stopped answering"), "{size} B: says who did not answer: {err}");
    assert!(took <= bound, "{size} B: gave up {took:?} after the listener went (--give-up-after 2s)");
}

#[test]
fn a_sender_gives_up_within_its_bound_at_every_size() {
    for size in [0, 8, 4096, 65536] {
        frozen_then_gone(size);
    }
}
