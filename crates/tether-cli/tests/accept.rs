//! `tether stream --listen ADDR --accept`: a listener that is not told its
//! sender's address takes in the one whose handshake completes - with
//! `--key-file`, only one holding the same key. Two processes over UDP on
//! loopback; the stream is verified end to end on both sides.

#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::net::UdpSocket;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn port() -> String {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

/// A key file, removed when dropped.
struct KeyFile(std::path::PathBuf);

impl KeyFile {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn key_file(material: &[u8]) -> KeyFile {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tether-accept-test-{}-{n}.key", std::process::id()));
    std::fs::File::create(&path).unwrap().write_all(material).unwrap();
    KeyFile(path)
}

/// A listener with `--accept` and a sender, each with `listener_extra` and
/// `sender_extra`: both outputs.
fn run(listener_extra: &[&str], sender_extra: &[&str]) -> (Output, Output) {
    let (listen, bind) = (port(), port());
    let common = ["stream", "--size", "1024", "--count", "20000", "--give-up-after", "2s", "--json"];
    let tether = || Command::new(env!("CARGO_BIN_EXE_tether"));
    let listener = tether()
        .args(common)
        .args(["--listen", &listen, "--accept"])
        .args(listener_extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the listener");
    std::thread::sleep(Duration::from_millis(300));
    let sender = tether()
        .args(common)
        .args(["--connect", &listen, "--bind", &bind])
        .args(sender_extra)
        .output()
        .expect("run the sender");
    if !sender.status.success() {
        // A refused sender leaves a listener waiting for its first message.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(listener.id() as libc::pid_t, libc::SIGINT) };
    }
    (listener.wait_with_output().unwrap(), sender)
}

fn delivered(out: &Output) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    v["runs"][0]["delivered"].as_u64().unwrap()
}

#[test]
fn a_listener_takes_in_a_sender_holding_its_key() {
    let key = key_file(b"the CLI accept test's cluster key");
    let k = key.path().to_str().unwrap();
    let (listener, sender) = run(&["--key-file", k], &["--key-file", k]);
    assert!(listener.status.success(), "{}", String::from_utf8_lossy(&listener.stderr));
    assert!(sender.status.success(), "{}", String::from_utf8_lossy(&sender.stderr));
    assert!(String::from_utf8_lossy(&listener.stderr).contains("from any sender"));
    assert_eq!(delivered(&listener), 20_000);
}

#[test]
fn a_listener_refuses_a_sender_with_another_key() {
    let (ours, theirs) =
        (key_file(b"the CLI accept test's cluster key"), key_file(b"another cluster's secret key!!"));
    let (listener, sender) =
        run(&["--key-file", ours.path().to_str().unwrap()], &["--key-file", theirs.path().to_str().unwrap()]);
    assert!(!sender.status.success(), "a sender with another key got through");
    assert!(!listener.status.success());
    let err = String::from_utf8_lossy(&listener.stderr);
    assert!(err.contains("failed authentication"), "the listener says why: {err}");
}

#[test]
fn without_a_key_accept_is_the_opt_in() {
    let (listener, sender) = run(&[], &[]);
    assert!(listener.status.success(), "{}", String::from_utf8_lossy(&listener.stderr));
    assert!(sender.status.success(), "{}", String::from_utf8_lossy(&sender.stderr));
    assert_eq!(delivered(&listener), 20_000);
}
