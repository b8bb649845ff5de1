//! Every example of the crate runs as a user runs it and prints what it
//! says (`cargo test` builds them): hello, the request/reply server and
//! client as two processes, a killed peer's failure and its successor's
//! greeting, and a program attached to a real engine.

#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let profile = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let path = profile.join("examples").join(name);
    assert!(path.exists(), "{} not built (cargo test builds the examples)", path.display());
    path
}

fn run(name: &str, args: &[&str]) -> Output {
    let out = Command::new(example(name)).args(args).output().expect("the example runs");
    assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

fn free_addr() -> String {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

#[test]
fn hello() {
    let l = lines(&run("hello", &[]));
    assert_eq!(l[..2], ["node 2 says hello", "the message was Delivered"]);
    assert!(l[2].starts_with("the server took in node 2 at Some(127.0.0.1:"), "{l:?}");
}

#[test]
fn a_request_reply_server_answers_its_client() {
    let addr = free_addr();
    let mut server =
        Command::new(example("calls")).args(["server", &addr, "200"]).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let l = lines(&run("calls", &["client", &addr, "200"]));
    assert_eq!(l, ["200 calls answered, every reply right"]);
    assert!(server.wait().unwrap().success(), "the server answered 200 calls and closed");
}

#[test]
fn a_killed_peer_is_survived() {
    let l = lines(&run("killed_peer", &[]));
    assert_eq!(l[0], "first message: Delivered");
    assert!(l[1].starts_with("peer 2 unreachable: messages "), "{l:?}");
    assert_eq!(l[2..], ["peer 2 restarted: its new life greeted us", "sent to the new life: Delivered"]);
}

#[test]
fn a_program_attached_to_an_engine() {
    use tether_engine::{Engine, EngineOptions};
    let dir = PathBuf::from(format!("/dev/shm/tether-test-example-{}", std::process::id()));
    let mut engine = Engine::bind(EngineOptions::new(&dir, vec!["127.0.0.1:0".parse().unwrap()])).unwrap();
    let (addr, stop) = (engine.rail_addrs()[0], engine.stop_flag());
    let thread = std::thread::spawn(move || engine.run().unwrap());
    let out = run("engine", &[dir.to_str().unwrap(), &addr.to_string()]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(lines(&out), ["100 round trips through the engine, each exact"]);
}
