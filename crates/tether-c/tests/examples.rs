//! The C library as C programs use it: `examples/hello.c` compiled
//! against `include/tether.h` and linked with `libtether.so` (and with
//! `libtether.a`), run, and its output checked; `examples/calls.c` as a
//! server process and a client process making 200 calls, every reply
//! checked by the client; `examples/killed_peer.c` (a receiver process
//! killed mid-stream, then its successor); `examples/engine.c` attached to
//! a real engine. Warnings are errors.

#![allow(clippy::disallowed_methods)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where cargo put this build's `libtether_c.so` and `libtether_c.a`
/// (installed as `libtether.so` and `libtether.a` by scripts/c-lib).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
    // `cargo test` builds only what Rust tests link: the C objects come
    // from a build of the crate (scripts/test makes one first).
    for lib in ["libtether_c.so", "libtether_c.a"] {
        assert!(
            dir.join(lib).exists(),
            "no {lib} in {}: build it first (`cargo build -p tether-c` with this test's profile)",
            dir.display()
        );
    }
    dir
}

/// `examples/NAME.c` compiled and linked (`shared`: with the .so, else the .a).
fn compile(name: &str, shared: bool) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let out = std::env::temp_dir().join(format!(
        "tether-c-{name}-{}-{}",
        if shared { "so" } else { "a" },
        std::process::id()
    ));
    let mut cc = Command::new("cc");
    cc.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join(format!("examples/{name}.c")))
        .arg("-o")
        .arg(&out);
    if shared {
        cc.arg("-L").arg(&lib).arg("-ltether_c").arg(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        // What rustc says a static Rust library needs from the system.
        cc.arg(lib.join("libtether_c.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
    }
    let status = cc.status().expect("a C compiler (`cc`; scripts/setup installs one)");
    assert!(status.success(), "{name}.c did not compile and link");
    out
}

#[test]
fn hello_runs_linked_shared_and_static() {
    for shared in [true, false] {
        let exe = compile("hello", shared);
        let out = Command::new(&exe).output().expect("hello runs");
        std::fs::remove_file(&exe).ok();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "hello failed: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.trim(), "node 2 says hello", "shared: {shared}");
    }
}

#[test]
fn a_server_answers_a_client_s_calls() {
    let exe = compile("calls", true);
    let addr = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let mut server = Command::new(&exe)
        .args(["server", &addr, "200"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the server starts");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let client = Command::new(&exe).args(["client", &addr, "200"]).output().expect("the client runs");
    let served = server.wait().expect("the server ends");
    std::fs::remove_file(&exe).ok();
    assert!(client.status.success(), "client: {}", String::from_utf8_lossy(&client.stderr));
    assert_eq!(String::from_utf8_lossy(&client.stdout).trim(), "200 calls answered, every reply right");
    assert!(served.success(), "the server answered 200 calls and closed");
}

/// Bad input is a status and a message, never a crash: null handles,
/// a string that is no address, a closed endpoint's calls.
#[test]
fn bad_input_is_a_status_with_a_message() {
    use std::ffi::{CStr, CString};
    use tether_c::tether_status::*;
    // SAFETY: the C API's own contract, exercised with bad values.
    unsafe {
        let last = || CStr::from_ptr(tether_c::tether_last_error()).to_string_lossy().into_owned();
        assert_eq!(
            tether_c::tether_builder_bind(std::ptr::null_mut(), c"127.0.0.1:0".as_ptr()),
            TETHER_ERR_INVALID
        );
        let b = tether_c::tether_builder_new(1);
        assert_eq!(tether_c::tether_builder_bind(b, c"no address".as_ptr()), TETHER_ERR_INVALID);
        assert!(last().contains("not an address"), "{}", last());
        let bad = CString::new("drop:p=7").unwrap();
        assert_eq!(tether_c::tether_builder_faults(b, 1, bad.as_ptr()), TETHER_ERR_FAULT_PLAN);
        assert_eq!(tether_c::tether_builder_bind(b, c"127.0.0.1:0".as_ptr()), TETHER_OK);
        let mut ep = std::ptr::null_mut();
        assert_eq!(tether_c::tether_build(b, &mut ep), TETHER_OK);
        assert_eq!(
            tether_c::tether_send(ep, 9, b"x".as_ptr(), 1, std::ptr::null_mut()),
            TETHER_ERR_UNKNOWN_PEER
        );
        let mut m = std::ptr::null_mut();
        assert_eq!(tether_c::tether_recv(ep, 10, &mut m), TETHER_ERR_TIMED_OUT);
        assert_eq!(tether_c::tether_recv(std::ptr::null(), 10, &mut m), TETHER_ERR_INVALID);
        assert_eq!(tether_c::tether_close(ep, 100), TETHER_OK);
    }
}

fn lines(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

#[test]
fn a_killed_peer_is_survived() {
    let exe = compile("killed_peer", true);
    let out = Command::new(&exe).output().expect("killed_peer runs");
    std::fs::remove_file(&exe).ok();
    assert!(out.status.success(), "killed_peer failed: {}", String::from_utf8_lossy(&out.stderr));
    let l = lines(&out);
    assert_eq!(l[0], "first message: delivered");
    assert!(l[1].starts_with("peer 2 unreachable: messages "), "{l:?}");
    assert_eq!(l[2..], ["peer 2 restarted: its new life greeted us", "sent to the new life: delivered"]);
}

#[test]
fn a_program_attached_to_an_engine() {
    use tether_engine::{Engine, EngineOptions};
    let exe = compile("engine", true);
    let dir = PathBuf::from(format!("/dev/shm/tether-test-c-engine-{}", std::process::id()));
    let mut engine = Engine::bind(EngineOptions::new(&dir, vec!["127.0.0.1:0".parse().unwrap()])).unwrap();
    let (addr, stop) = (engine.rail_addrs()[0], engine.stop_flag());
    let thread = std::thread::spawn(move || engine.run().unwrap());
    let out = Command::new(&exe).arg(&dir).arg(addr.to_string()).output().expect("engine runs");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::remove_file(&exe).ok();
    assert!(out.status.success(), "engine failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lines(&out), ["100 round trips through the engine, each exact"]);
}
