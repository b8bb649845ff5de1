//! Two `tether stream` (or `pingpong`) processes started with settings that do not go
//! together: each side must end by itself, fail, and say in its last line
//! what differs - not "corrupted", not "is it running?" alone. A peer with
//! another key gets no answer at all (strangers get nothing), so the
//! listener names the cause from what it refused, and the sender from
//! what it refused of the listener's own handshakes.

// A test runs processes and waits on them with a deadline.
#![allow(clippy::disallowed_methods)]

use std::net::UdpSocket;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Two ports free a moment ago on loopback.
fn two_ports() -> (u16, u16) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// A key file in the temporary directory, removed on drop.
struct KeyFile(std::path::PathBuf);

impl KeyFile {
    fn new(byte: u8) -> Self {
        let path = std::env::temp_dir().join(format!("tether-mismatch-{}-{byte}.key", std::process::id()));
        std::fs::write(&path, [byte; 32]).unwrap();
        KeyFile(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The last line a process wrote to stderr.
fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string()
}

/// Run a listener with `listener` and a sender with `sender` (both added
/// to the two-process options); both outputs.
fn pair(listener: &[&str], sender: &[&str]) -> (Output, Output) {
    pair_of("stream", listener, sender)
}

/// `pair` for `cmd` (`stream` or `pingpong`).
fn pair_of(cmd: &str, listener: &[&str], sender: &[&str]) -> (Output, Output) {
    let (l, s) = two_ports();
    let (l, s) = (format!("127.0.0.1:{l}"), format!("127.0.0.1:{s}"));
    let common = [cmd, "--count", "200", "--give-up-after", "1s"];
    let spawn = |args: Vec<&str>| {
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tether binary runs")
    };
    let mut largs: Vec<&str> = common.to_vec();
    largs.extend(["--listen", &l, "--peer", &s]);
    largs.extend(listener);
    let lchild = spawn(largs);
    std::thread::sleep(Duration::from_millis(300));
    let mut sargs: Vec<&str> = common.to_vec();
    sargs.extend(["--connect", &l, "--bind", &s]);
    sargs.extend(sender);
    let start = Instant::now();
    let sout = spawn(sargs).wait_with_output().unwrap();
    let lout = lchild.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(30), "both ended by themselves, quickly");
    (lout, sout)
}

/// Both failed, and each side's last line has its fragment.
fn check(case: &str, (l, s): &(Output, Output), listener_says: &str, sender_says: &str) {
    let (ll, sl) = (last_line(l), last_line(s));
    eprintln!("{case}\n  listener: {ll}\n  sender:   {sl}");
    assert!(!l.status.success() && !s.status.success(), "{case}: both sides fail");
    assert!(ll.contains(listener_says), "{case}: the listener says {listener_says:?}: {ll}");
    assert!(sl.contains(sender_says), "{case}: the sender says {sender_says:?}: {sl}");
    for line in [&ll, &sl] {
        assert!(!line.contains("corrupt") || line.contains("corrupted on the way"), "{case}: {line}");
        assert!(!line.contains('\u{1b}'), "{case}: no colour codes in a pipe: {line:?}");
    }
}

#[test]
fn mismatched_settings_are_named_on_both_sides() {
    let (key1, key2) = (KeyFile::new(1), KeyFile::new(2));
    let (k1, k2) = (key1.path(), key2.path());

    let sizes = pair(&["--size", "1024"], &["--size", "8"]);
    let both = "the sender offers 200 messages of 8 B, the listener expects 200 messages of 1024 B";
    check("size", &sizes, both, both);
    assert!(last_line(&sizes.1).contains("refused the run"));

    let echo = pair_of("pingpong", &["--size", "64"], &["--size", "8"]);
    let both = "the sender offers 200 messages of 8 B, the listener expects 200 messages of 64 B";
    check("pingpong size", &echo, both, both);

    let keys = pair(&["--key-file", &k1], &["--key-file", &k2]);
    check(
        "another key",
        &keys,
        "failed authentication: the key differs",
        "failed authentication: the key differs",
    );

    let one = pair(&["--key-file", &k1], &[]);
    check("a key on the listener only", &one, "the other side has none", "a key on the other side only");

    let auth = pair(
        &["--key-file", &k1, "--auth", "aes-256-gcm"],
        &["--key-file", &k1, "--auth", "chacha20-poly1305"],
    );
    check("another --auth", &auth, "--auth differs", "--auth differs");
}
