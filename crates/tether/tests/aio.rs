//! The async API (`tether::aio`, the `tokio` feature) over UDP on
//! loopback: streams arrive exact and in order under loss, duplication,
//! corruption and reordering; every future is cancellation-safe (a
//! `select!` that drops receives and sends loses and repeats nothing);
//! events arrive as a stream (a peer gone, with the exact messages that
//! failed); calls reach async handlers; an endpoint attached to an engine
//! works the same.

#![cfg(feature = "tokio")]
#![allow(clippy::disallowed_methods)]

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tether::aio;
use tether::faults::FaultPlan;
use tether::rpc::OperationStatus;
use tether::{Config, Event, MessageState, Options};

const LIMIT: Duration = Duration::from_secs(20);

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn msg(i: u32) -> Vec<u8> {
    let len = [8usize, 700, 3000, 1, 20_000][i as usize % 5];
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// Two endpoints on loopback that know each other, with `options` each.
fn pair(a: Options, b: Options) -> (aio::Endpoint, aio::Endpoint) {
    let a = tether::Endpoint::builder(1).bind(any()).options(a).build().unwrap();
    let b = tether::Endpoint::builder(2).bind(any()).options(b).build().unwrap();
    a.add_peer(2, b.local_addr().unwrap()).unwrap();
    b.add_peer(1, a.local_addr().unwrap()).unwrap();
    (a.into(), b.into())
}

fn faulty(seed: u64) -> Options {
    let rules = ["drop:p=0.05", "duplicate:p=0.05", "modify:p=0.02", "reorder:p=0.05"];
    Options { faults: FaultPlan::parse_rules(seed, &rules).unwrap(), ..Options::default() }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f).await.expect("within the limit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_arrives_exact_and_in_order_through_faults() {
    for seed in 1..=3 {
        let (a, b) = pair(faulty(seed), faulty(seed + 100));
        let (a, b) = (Arc::new(a), Arc::new(b));
        const N: u32 = 2_000;
        let receiver = tokio::spawn({
            let b = Arc::clone(&b);
            async move {
                for i in 0..N {
                    let d = within(b.recv()).await.unwrap();
                    assert_eq!((d.from, &d.message[..]), (1, &msg(i)[..]), "seed {seed}, message {i}");
                }
            }
        });
        let mut last = None;
        for i in 0..N {
            last = Some(within(a.send(2, &msg(i))).await.unwrap());
        }
        assert_eq!(within(last.unwrap().into_future()).await.unwrap(), MessageState::Delivered);
        receiver.await.unwrap();
        within(a.flush()).await.unwrap();
        assert!(b.get_ref().try_recv().is_none(), "seed {seed}: nothing twice");
    }
}

/// Receives and sends raced against a timer in `select!`, the loser
/// dropped each time: every message still arrives once, in order, and
/// nothing a dropped send had not returned was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_futures_lose_and_repeat_nothing() {
    let small = Options {
        // A send buffer of 16 messages: sends wait for room, and many are
        // dropped while they wait.
        config: Config { send_buffer_messages: 16, ..Config::default() },
        ..faulty(7)
    };
    let (a, b) = pair(small, faulty(8));
    let (a, b) = (Arc::new(a), Arc::new(b));
    const N: u32 = 3_000;
    let receiver = tokio::spawn({
        let b = Arc::clone(&b);
        async move {
            let (mut i, mut dropped) = (0, 0u32);
            while i < N {
                tokio::select! {
                    d = b.recv() => {
                        let d = d.unwrap();
                        assert_eq!(&d.message[..], &msg(i)[..], "message {i}");
                        i += 1;
                    }
                    _ = tokio::time::sleep(Duration::from_micros(50)) => dropped += 1,
                }
            }
            dropped
        }
    });
    let (mut i, mut dropped_sends) = (0, 0u32);
    let mut last = None;
    while i < N {
        let m = msg(i);
        tokio::select! {
            s = a.send(2, &m) => {
                last = Some(s.unwrap());
                i += 1;
            }
            _ = tokio::time::sleep(Duration::from_micros(20)) => dropped_sends += 1,
        }
    }
    let dropped_recvs = within(receiver).await.unwrap();
    assert_eq!(within(last.unwrap().into_future()).await.unwrap(), MessageState::Delivered);
    assert!(
        dropped_recvs > 0 && dropped_sends > 0,
        "the test dropped futures: {dropped_recvs}, {dropped_sends}"
    );
    assert_eq!(a.get_ref().stats().messages_sent, u64::from(N), "a dropped send sent nothing");
    assert!(b.get_ref().try_recv().is_none(), "nothing twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_gone_arrives_in_the_event_stream_with_what_failed() {
    use futures_core::Stream;
    let quick = || Options {
        config: Config { abandon_after: Duration::from_millis(300), ..Config::default() },
        ..Options::default()
    };
    let (a, b) = pair(quick(), quick());
    let first = within(a.send(2, b"before")).await.unwrap();
    assert_eq!(within(first.into_future()).await.unwrap(), MessageState::Delivered);
    b.close(Duration::ZERO).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(within(a.send(2, &msg(i))).await.unwrap().id().unwrap());
    }
    let mut events = std::pin::pin!(a.events());
    let failed = within(async {
        loop {
            let next = std::future::poll_fn(|cx| events.as_mut().poll_next(cx)).await;
            match next.expect("the stream goes on while the endpoint does") {
                Event::PeerUnreachable { failed } => break failed,
                _ => continue,
            }
        }
    })
    .await;
    assert_eq!(failed.peer, 2);
    assert_eq!(failed.ids().collect::<Vec<_>>(), ids, "exactly the messages sent after it went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_async_handlers_through_faults() {
    let (client, server) = pair(faulty(3), faulty(4));
    let server = Arc::new(server);
    server
        .register_handler(9, |r: aio::Request| async move {
            tokio::time::sleep(Duration::from_micros(100)).await;
            r.args.iter().rev().copied().collect()
        })
        .unwrap();
    let serving = tokio::spawn({
        let server = Arc::clone(&server);
        async move {
            let mut ran = 0;
            while ran < 200 {
                ran += server.serve(16).await.unwrap();
            }
            ran
        }
    });
    for i in 0..200u32 {
        let args = i.to_le_bytes();
        let out = within(client.request(2, 9, &args)).await.unwrap();
        assert_eq!(out.state.op, OperationStatus::Processed, "call {i}");
        let want: Vec<u8> = args.iter().rev().copied().collect();
        assert_eq!(out.reply.as_deref(), Some(&want[..]), "call {i}");
    }
    assert_eq!(within(serving).await.unwrap(), 200, "each handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_attached_to_an_engine_work_the_same() {
    use tether_engine::{Engine, EngineOptions};
    let dir = std::path::PathBuf::from(format!("/dev/shm/tether-test-aio-{}", std::process::id()));
    let mut engine = Engine::bind(EngineOptions::new(&dir, vec![any()])).unwrap();
    let (engine_addr, stop) = (engine.rail_addrs()[0], engine.stop_flag());
    let thread = std::thread::spawn(move || engine.run().unwrap());
    let embedded = tether::Endpoint::builder(1).bind(any()).build().unwrap();
    let attached = tether::Endpoint::builder(2).engine(&dir).build().unwrap();
    embedded.add_peer(2, engine_addr).unwrap();
    attached.add_peer(1, embedded.local_addr().unwrap()).unwrap();
    let (embedded, attached) = (aio::Endpoint::from(embedded), aio::Endpoint::from(attached));
    for i in 0..300 {
        within(attached.send(1, &msg(i))).await.unwrap();
        let d = within(embedded.recv()).await.unwrap();
        assert_eq!(&d.message[..], &msg(i)[..]);
        within(embedded.send(2, &d.message)).await.unwrap();
        let back = within(attached.recv()).await.unwrap();
        assert_eq!(&back.message[..], &msg(i)[..], "round trip {i}");
    }
    within(attached.flush()).await.unwrap();
    attached.close(Duration::from_secs(1)).await.unwrap();
    embedded.close(Duration::from_secs(1)).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A future that parks without spinning (no spin time, or no place to
/// spin) is woken by the worker's step, not by its 200 ms safety net:
/// 20 round trips, each side a fresh task, take well under the 4 s the
/// safety net alone would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_that_do_not_spin_are_woken_by_the_worker() {
    let still = || Options { spin: Duration::ZERO, ..Options::default() };
    let (a, b) = pair(still(), still());
    let (a, b) = (Arc::new(a), Arc::new(b));
    let start = std::time::Instant::now();
    for i in 0..20u32 {
        let echo = tokio::spawn({
            let b = Arc::clone(&b);
            async move {
                let d = b.recv().await.unwrap();
                b.send(1, &d.message).await.unwrap();
            }
        });
        // Each side a fresh task: no waker left registered by an
        // earlier future of the same task can stand in for its own.
        let ping = tokio::spawn({
            let a = Arc::clone(&a);
            async move {
                within(a.send(2, &i.to_le_bytes())).await.unwrap();
                within(a.recv()).await.unwrap()
            }
        });
        let back = ping.await.unwrap();
        assert_eq!(&back.message[..], &i.to_le_bytes()[..]);
        echo.await.unwrap();
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "20 round trips took {took:?}");
}
