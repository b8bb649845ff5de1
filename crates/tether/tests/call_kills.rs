//! A server process killed with SIGKILL at random moments and restarted on
//! its call log, while a client makes calls to it over UDP
//! (at most once, durably): no handler's effect happens twice, every call
//! ends, and what each call's final state says about its handler is true.
//!
//! The server is this test binary run again as a child (`server_child`,
//! which does nothing unless `TETHER_CALL_SERVER` is set), embedded or
//! attached to a `tether engine` that outlives its lives (the engine on a
//! thread of the test: the application's process is what dies). Each handler
//! appends its call's number to an effects file with one `write` (which a
//! SIGKILL cannot undo) and then sleeps a millisecond, so kills land
//! between a handler's effect and its completion record too.

// The test reads the wall clock to pace its kills.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tether::rpc::{CallLogOptions, CallOptions, Executed, RpcConfig, SyncPolicy};
use tether::{Config, Endpoint, Error, Options};

const HANDLER: u32 = 3;
const CALLS: u32 = 2_000;
/// Kills the test waits for, and the most calls it makes waiting.
const MIN_KILLS: u32 = 20;
const MAX_CALLS: u32 = 200_000;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

fn rpc() -> RpcConfig {
    RpcConfig {
        credit: 8,
        ack_timeout: Duration::from_millis(30),
        reply_timeout: Duration::from_millis(60),
        max_retry_interval: Duration::from_millis(200),
        retries: 30,
        ..RpcConfig::default()
    }
}

fn options() -> Options {
    let config = Config { rto_min: Duration::from_micros(500), ..Config::default() };
    Options { config, calls: rpc(), linger: Duration::ZERO, ..Options::default() }
}

/// The server's life: serve until killed.
#[test]
fn server_child() {
    let Ok(dir) = std::env::var("TETHER_CALL_SERVER") else { return };
    let dir = PathBuf::from(dir);
    let addr: SocketAddr = std::env::var("TETHER_CALL_SERVER_ADDR").unwrap().parse().unwrap();
    let client: SocketAddr = std::env::var("TETHER_CALL_CLIENT_ADDR").unwrap().parse().unwrap();
    let log = CallLogOptions { path: dir.join("calls.log"), capacity: 1 << 20, sync: SyncPolicy::None };
    let ep = match std::env::var("TETHER_CALL_SERVER_ENGINE") {
        // Attached: the engine owns the address the client knows.
        Ok(engine) => Endpoint::builder(2)
            .engine(engine)
            .peer(1, client)
            .calls(rpc())
            .linger(Duration::ZERO)
            .call_log(log)
            .build()
            .unwrap(),
        Err(_) => {
            let ep = Endpoint::udp(2, addr, &[], Options { call_log: Some(log), ..options() }).unwrap();
            ep.add_peer(1, client).unwrap();
            ep
        }
    };
    let effects = std::fs::OpenOptions::new().append(true).create(true).open(dir.join("effects")).unwrap();
    ep.register_handler(HANDLER, move |r| {
        (&effects).write_all(&r.args[..4]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
        r.args.to_vec()
    })
    .unwrap();
    loop {
        match ep.serve(Some(Duration::from_millis(100))) {
            Ok(()) | Err(Error::TimedOut) => {}
            Err(e) => panic!("serve: {e}"),
        }
    }
}

/// A server's life: a child process, attached to the engine serving
/// `engine` if given.
fn spawn(dir: &Path, addr: SocketAddr, client: SocketAddr, engine: Option<&Path>) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "server_child", "--nocapture", "--test-threads", "1"])
        .env("TETHER_CALL_SERVER", dir)
        .env("TETHER_CALL_SERVER_ADDR", addr.to_string())
        .env("TETHER_CALL_CLIENT_ADDR", client.to_string())
        .stdout(std::process::Stdio::null());
    if let Some(engine) = engine {
        c.env("TETHER_CALL_SERVER_ENGINE", engine);
    }
    c.spawn().unwrap()
}

#[test]
fn a_server_killed_and_restarted_on_its_log_runs_no_call_twice() {
    kills(false);
}

/// The same with the server attached to an engine: its call layer and
/// log are the application's, and die and come back with it.
#[test]
fn a_server_attached_to_an_engine_killed_and_restarted_runs_no_call_twice() {
    kills(true);
}

fn kills(attached: bool) {
    if std::env::var("TETHER_CALL_SERVER").is_ok() {
        return;
    }
    let kind = if attached { "engine" } else { "embedded" };
    let dir = std::env::temp_dir().join(format!("tether-call-kills-{}-{kind}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An engine that outlives the server's lives, on a thread here.
    let engine = attached.then(|| {
        let engine_dir = PathBuf::from(format!("/dev/shm/tether-call-kills-{}", std::process::id()));
        let bind = vec!["127.0.0.1:0".parse().unwrap()];
        let mut engine =
            tether_engine::Engine::bind(tether_engine::EngineOptions::new(&engine_dir, bind)).unwrap();
        let (addr, stop) = (engine.rail_addrs()[0], engine.stop_flag());
        let thread = std::thread::spawn(move || engine.run().unwrap());
        (engine_dir, addr, stop, thread)
    });
    // A port for the server's every life (the engine's, attached).
    let addr = match &engine {
        Some((_, addr, ..)) => *addr,
        None => UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap(),
    };
    let engine_dir = engine.as_ref().map(|(d, ..)| d.as_path());
    let client = Endpoint::udp(1, "127.0.0.1:0".parse().unwrap(), &[], options()).unwrap();
    client.add_peer(2, addr).unwrap();
    let mut child = spawn(&dir, addr, client.local_addr().unwrap(), engine_dir);
    let done = AtomicBool::new(false);
    let killed = AtomicU32::new(0);
    let outcomes = std::thread::scope(|s| {
        let calls = s.spawn(|| {
            let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
            // At least CALLS calls, and on until MIN_KILLS kills happened
            // while they went (however fast this machine makes them).
            let mut calls = Vec::new();
            while (calls.len() < CALLS as usize || killed.load(Ordering::SeqCst) < MIN_KILLS)
                && calls.len() < MAX_CALLS as usize
            {
                let i = calls.len() as u32;
                calls.push(client.request_with(2, HANDLER, &i.to_le_bytes(), &wait).unwrap());
            }
            let outcomes: Vec<_> = calls.iter().map(|c| c.wait(WAIT).unwrap()).collect();
            done.store(true, Ordering::SeqCst);
            outcomes
        });
        // Kill and restart at pseudo-random moments (20-120 ms apart).
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let start = Instant::now();
        while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(50) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            std::thread::sleep(Duration::from_millis(20 + x % 100));
            if done.load(Ordering::SeqCst) {
                break;
            }
            child.kill().unwrap();
            child.wait().unwrap();
            killed.fetch_add(1, Ordering::SeqCst);
            child = spawn(&dir, addr, client.local_addr().unwrap(), engine_dir);
        }
        calls.join().unwrap()
    });
    let kills = killed.load(Ordering::SeqCst);
    child.kill().unwrap();
    child.wait().unwrap();
    let effects = std::fs::read(dir.join("effects")).unwrap();
    let mut ran = vec![0u32; outcomes.len()];
    for i in effects.chunks(4) {
        ran[u32::from_le_bytes(i.try_into().unwrap()) as usize] += 1;
    }
    let mut claims = [0; 3];
    for (i, out) in outcomes.iter().enumerate() {
        assert!(ran[i] <= 1, "call {i} ran {} times", ran[i]);
        claims[out.executed() as usize] += 1;
        match out.executed() {
            Executed::Yes => {
                assert_eq!(ran[i], 1, "call {i} says it ran: {:?}", out.state);
                assert_eq!(out.reply.as_deref(), Some(&(i as u32).to_le_bytes()[..]));
            }
            Executed::No => assert_eq!(ran[i], 0, "call {i} says it did not run: {:?}", out.state),
            Executed::Unknown => {}
        }
    }
    let calls = outcomes.len();
    eprintln!(
        "{kind}: {kills} kills, {calls} calls: ran {}, did not run {}, unknown {}",
        claims[0], claims[1], claims[2]
    );
    assert!(kills >= MIN_KILLS, "only {kills} kills in 50 s");
    std::fs::remove_dir_all(&dir).unwrap();
    if let Some((engine_dir, _, stop, thread)) = engine {
        stop.store(true, Ordering::Relaxed);
        thread.join().unwrap();
        let _ = std::fs::remove_dir_all(engine_dir);
    }
}
