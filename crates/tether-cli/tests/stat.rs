//! `tether stat` reads a running node: an engine's board (its counters,
//! each application's peers and paths, the engines its supervisor
//! replaced) and an endpoint's own (`Builder::publish_stats`), live,
//! while traffic flows and after the engine is killed and replaced.

#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether::Endpoint;

fn tether() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tether"))
}

/// A supervised `tether engine` on loopback: the process, its first
/// engine's pid and its rail.
fn engine(dir: &Path) -> (Child, u32, SocketAddr) {
    let mut child = tether()
        .args(["engine", "--dir", dir.to_str().unwrap(), "--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // The timeline goes on (deaths, replacements): read to its end, so the
    // supervisor never writes to a closed pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    // "tether engine: pid P (supervisor S) serving DIR on rails A"
    let pid = line.split_whitespace().nth(3).and_then(|p| p.parse().ok()).expect(&line);
    let rail = line.trim().rsplit(' ').next().and_then(|a| a.parse().ok()).expect(&line);
    (child, pid, rail)
}

fn stat_json(dir: &Path) -> serde_json::Value {
    let out = tether().args(["stat", "--json", "--dir", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "tether stat --json: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("exactly one JSON document")
}

/// Read `dir` until `ready` holds of its JSON (boards publish every 250 ms).
fn stat_until(dir: &Path, what: &str, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = stat_json(dir);
        if ready(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "tether stat never showed {what}: {v:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn counter(v: &serde_json::Value, name: &str) -> u64 {
    v["counters"][name].as_u64().unwrap_or(0)
}

#[test]
fn stat_shows_an_engine_its_applications_and_an_endpoint_live() {
    let base = PathBuf::from(format!("/dev/shm/tether-stat-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (engine_dir, boards) = (base.join("engine"), base.join("boards"));
    let (mut supervisor, first, rail) = engine(&engine_dir);
    // Node 1 attached to the engine, publishing its own board in the
    // engine's directory; node 2 embedded, publishing in another.
    let b = Endpoint::builder(2).bind("127.0.0.1:0".parse().unwrap()).publish_stats(&boards).build().unwrap();
    let a = Endpoint::builder(1)
        .engine(&engine_dir)
        .peer(2, b.local_addr().unwrap())
        .publish_stats(&engine_dir)
        .build()
        .unwrap();
    b.add_peer(1, rail).unwrap();
    let send = |n: usize| {
        for i in 0..n {
            a.send(2, &(i as u64).to_le_bytes()).unwrap();
        }
        for _ in 0..n {
            b.recv(Some(Duration::from_secs(10))).unwrap();
        }
    };
    send(100);
    let v = stat_until(&engine_dir, "node 1 and its peer 2 with a round trip", |v| {
        let app = &v["nodes"][0]["applications"][0];
        counter(app, "messages_sent") >= 100 && app["peers"][0]["rtt_us"].as_f64().is_some()
    });
    let engine_node = &v["nodes"][0];
    assert_eq!(engine_node["role"], "engine");
    assert_eq!(engine_node["pid"].as_u64(), Some(first as u64));
    assert_eq!(counter(engine_node, "attached"), 1);
    let app = &engine_node["applications"][0];
    assert_eq!(app["node"], 1);
    let peer = &app["peers"][0];
    assert_eq!(peer["peer"], 2);
    assert_eq!(peer["session"], true);
    assert_eq!(peer["paths"][0]["state"], "active");
    assert!(peer["paths"][0]["counters"]["datagrams_sent"].as_u64().unwrap() > 0);
    assert_eq!(v["nodes"][1]["role"], "endpoint", "the attached endpoint's own board, beside the engine's");

    // The engine killed: its supervisor replaces it; the board says so,
    // and the attached endpoint's own board counts the recovery.
    // SAFETY: a signal to the engine this test started.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    send(100);
    let v = stat_until(&engine_dir, "the replacement engine and the recovery", |v| {
        counter(&v["nodes"][0], "replaced_before") == 1 && counter(&v["nodes"][1], "engine_recoveries") == 1
    });
    assert_ne!(v["nodes"][0]["pid"].as_u64(), Some(first as u64), "a new engine publishes");

    // The embedded endpoint's board: its own peers and paths.
    let v = stat_until(&boards, "node 2's peer 1", |v| {
        counter(&v["nodes"][0]["applications"][0], "messages_delivered") >= 200
    });
    assert_eq!(v["nodes"][0]["applications"][0]["peers"][0]["peer"], 1);

    // The text view, refreshed twice.
    let out = tether()
        .args(["stat", "--dir", engine_dir.to_str().unwrap(), "--count", "2", "--every", "100ms"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("engine pid").count(), 2, "two looks: {text}");
    for want in ["node 1", "replaced_before 1", "active", "endpoint pid", "engine_recoveries 1"] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    println!("{text}");

    // Gone with what published them.
    drop(a);
    drop(b);
    // SAFETY: a signal to the supervisor this test started.
    unsafe { libc::kill(supervisor.id() as i32, libc::SIGTERM) };
    supervisor.wait().unwrap();
    for dir in [&engine_dir, &boards] {
        let left: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{} still holds {left:?}", dir.display());
    }
    let out = tether().args(["stat", "--once", "--dir", engine_dir.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing publishes") && err.contains("tether engine --dir"), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}
