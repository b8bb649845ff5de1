//! `tether bench calls`: what a call costs, beside the limit. In each run,
//! one after the other on loopback: the limit's round trip (two spinning
//! connected sockets, `crate::limit`), tether's message round trip
//! (`tether pingpong`), and a call's round trip to an empty handler with
//! the server's log in memory, in a file synced never, and in a file
//! synced per record; then calls kept `--in-flight` deep, with the log in
//! a file synced never and per batch, the server taking one call at a
//! time (`serve`: two syncs a call) and then as many as are waiting
//! (`serve_batch`: a group commit, two syncs a batch); and last a
//! message's and a call's round trip between two applications attached to
//! two `tether engine` processes (the call layer in the applications, the
//! envelopes through the engines). Each figure is the median of the
//! runs' medians; the ratios are of those medians, measured in the same
//! invocation (Kaur's AMVIA added 16 us to VIA's 8 us round trip, 3x;
//! RIFL's completion record added 0.53 us to a write).

// The benchmark reads the wall clock.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::rpc::{CallLogOptions, CallOptions, Executed, SyncPolicy};
use tether::{Endpoint, Error, Options};

use crate::args;
use crate::net::{loopback, NetOpts};
use crate::scratch::{Base, Scratch};
use crate::summary::Summary;
use crate::{limit, pingpong};

const HANDLER: u32 = 1;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const WARMUP: u64 = 200;

#[derive(Debug, Clone, clap::Args)]
pub struct CallsOpts {
    /// Argument (and reply) size in bytes.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = args::size(0))]
    pub size: usize,
    /// Runs of each measurement.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 1000, "runs", ""))]
    pub runs: usize,
    /// Round trips (and calls) per run.
    #[arg(long, default_value_t = 2_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1 << 30, "round trips", ""))]
    pub count: u64,
    /// Calls kept open at once for the throughput runs.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(1, 4096, "calls", ""))]
    pub in_flight: u32,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct CallsBench {
    pub size: usize,
    pub count: u64,
    pub in_flight: u32,
    /// Round trips, microseconds (median, min, max of the runs' medians).
    pub limit_us: Summary,
    pub message_us: Summary,
    pub call_us: Summary,
    pub call_file_log_us: Summary,
    pub call_synced_us: Summary,
    /// Calls a second at `in_flight` open.
    pub calls_per_s: Summary,
    pub calls_per_s_batch_sync: Summary,
    /// The same, the server running the calls waiting in batches
    /// (`serve_batch`, up to `in_flight`): a group commit.
    pub calls_per_s_group_commit: Summary,
    /// Round trips between applications attached to two engine
    /// processes: a message, and a call (microseconds).
    pub engine_message_us: Summary,
    pub engine_call_us: Summary,
    /// Ratios of medians.
    pub call_over_limit: f64,
    pub call_over_message: f64,
    /// The file log's cost per call (sync never), over the log in memory.
    pub file_log_added_us: f64,
    pub per_record_sync_added_us: f64,
}

/// Which log the server keeps.
#[derive(Clone, Copy)]
enum Log {
    Memory,
    File(SyncPolicy),
}

/// A server endpoint with an empty-reply handler (it echoes the
/// arguments), served by a thread, and a client that knows it.
struct Pair {
    client: Endpoint,
    server: Endpoint,
    stop: AtomicBool,
    /// Calls the server runs at once, at most (`serve_batch`).
    batch: usize,
    _dir: Option<Scratch>,
}

/// `credit`: calls the client may keep open.
fn pair(net: &NetOpts, log: Log, credit: u32) -> anyhow::Result<Pair> {
    let mut options = net.options()?;
    options.calls.credit = options.calls.credit.max(credit);
    let (call_log, dir) = match log {
        Log::Memory => (None, None),
        Log::File(sync) => {
            let dir = Scratch::new(Base::Tmp, "bench-calls-log")?;
            let o = CallLogOptions { path: dir.path().join("calls.log"), capacity: 64 << 20, sync };
            (Some(o), Some(dir))
        }
    };
    let server = Endpoint::udp(2, loopback(), &[], Options { call_log, ..options.clone() })?;
    let client = Endpoint::udp(1, loopback(), &[], options)?;
    client.add_peer(2, server.local_addr().expect("UDP"))?;
    server.add_peer(1, client.local_addr().expect("UDP"))?;
    server.register_handler(HANDLER, |r| r.args.to_vec())?;
    Ok(Pair { client, server, stop: AtomicBool::new(false), batch: 1, _dir: dir })
}

impl Pair {
    fn serve(&self) -> anyhow::Result<()> {
        while !self.stop.load(Ordering::Relaxed) {
            match self.server.serve_batch(self.batch, Some(Duration::from_millis(10))) {
                Ok(_) | Err(Error::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `f` on the client while a thread serves; the server stops after.
    fn with_server<R>(&self, f: impl FnOnce() -> anyhow::Result<R>) -> anyhow::Result<R> {
        std::thread::scope(|s| {
            let server = s.spawn(|| self.serve());
            let r = f();
            self.stop.store(true, Ordering::Relaxed);
            server.join().map_err(|_| anyhow::anyhow!("the serving thread panicked"))??;
            r
        })
    }
}

fn checked(args: &[u8], out: tether::rpc::CallOutcome) -> anyhow::Result<()> {
    anyhow::ensure!(out.executed() == Executed::Yes, "a call ended {:?}", out.state);
    anyhow::ensure!(out.reply.as_deref() == Some(args), "a reply came back changed");
    Ok(())
}

/// The median round trips (microseconds) of `count` messages and then
/// `count` calls, one at a time, between two applications attached to two
/// `tether engine` processes on loopback.
fn through_engines(size: usize, count: u64) -> anyhow::Result<(f64, f64)> {
    // Declared first, dropped last: the applications detach before their
    // engines stop.
    let e1 = crate::engine_proc::EngineProcess::start("bench-calls-a", &[loopback()], &[])?;
    let e2 = crate::engine_proc::EngineProcess::start("bench-calls-b", &[loopback()], &[])?;
    let client = Endpoint::builder(1).engine(e1.dir()).peer(2, e2.rails[0]).build()?;
    let server = Endpoint::builder(2).engine(e2.dir()).peer(1, e1.rails[0]).build()?;
    server.register_handler(HANDLER, |r| r.args.to_vec())?;
    let p = Pair { client, server, stop: AtomicBool::new(false), batch: 1, _dir: None };
    let msg = vec![7u8; size];
    let message = std::thread::scope(|s| -> anyhow::Result<f64> {
        let echo = s.spawn(|| -> anyhow::Result<()> {
            for _ in 0..count + WARMUP {
                let d = p.server.recv(WAIT)?;
                p.server.send_blocking(1, &d.message, WAIT)?;
            }
            Ok(())
        });
        let mut rtt = Vec::with_capacity(count as usize);
        for i in 0..count + WARMUP {
            let t = Instant::now();
            p.client.send_blocking(2, &msg, WAIT)?;
            let d = p.client.recv(WAIT)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            anyhow::ensure!(d.message[..] == msg[..], "an echo came back changed");
            if i >= WARMUP {
                rtt.push(us);
            }
        }
        echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
        Ok(Summary::of(&rtt).expect("count >= 1").median)
    })?;
    let call = calls_one_at_a_time(&p, size, count)?;
    Ok((message, call))
}

/// The median round trip of `count` calls one at a time, microseconds.
fn round_trips(net: &NetOpts, log: Log, size: usize, count: u64) -> anyhow::Result<f64> {
    calls_one_at_a_time(&pair(net, log, 1)?, size, count)
}

/// `count` calls (after a warm-up) from `p`'s client, one at a time: the
/// median round trip, microseconds.
fn calls_one_at_a_time(p: &Pair, size: usize, count: u64) -> anyhow::Result<f64> {
    let args = vec![7u8; size];
    p.with_server(|| {
        let mut rtt = Vec::with_capacity(count as usize);
        for i in 0..count + WARMUP {
            let t = Instant::now();
            let out = p.client.request(2, HANDLER, &args)?.wait(WAIT)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            checked(&args, out)?;
            if i >= WARMUP {
                rtt.push(us);
            }
        }
        Ok(Summary::of(&rtt).expect("count >= 1").median)
    })
}

/// Calls a second with `in_flight` kept open.
/// `batch`: calls the server runs at once, at most.
fn throughput(
    net: &NetOpts,
    log: Log,
    size: usize,
    count: u64,
    in_flight: u32,
    batch: usize,
) -> anyhow::Result<f64> {
    let p = Pair { batch, ..pair(net, log, in_flight)? };
    let args = vec![7u8; size];
    p.with_server(|| {
        let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
        let mut open = std::collections::VecDeque::new();
        let mut t = Instant::now();
        for i in 0..count + WARMUP {
            if i == WARMUP {
                t = Instant::now();
            }
            if open.len() >= in_flight as usize {
                let c: tether::rpc::Call = open.pop_front().expect("in flight");
                checked(&args, c.wait(WAIT)?)?;
            }
            open.push_back(p.client.request_with(2, HANDLER, &args, &wait)?);
        }
        for c in open {
            checked(&args, c.wait(WAIT)?)?;
        }
        Ok(count as f64 / t.elapsed().as_secs_f64())
    })
}

pub fn run(o: &CallsOpts, mut net: NetOpts) -> anyhow::Result<()> {
    net.size = o.size;
    let file = Log::File(SyncPolicy::None);
    let mut v: [Vec<f64>; 10] = Default::default();
    for _ in 0..o.runs {
        v[0].push(limit::round_trips(o.size, o.count)?.median);
        v[1].push(pingpong::reliable_loopback(&net, o.count)?.rtt_us.median);
        v[2].push(round_trips(&net, Log::Memory, o.size, o.count)?);
        v[3].push(round_trips(&net, file, o.size, o.count)?);
        v[4].push(round_trips(&net, Log::File(SyncPolicy::Record), o.size, o.count.min(500))?);
        v[5].push(throughput(&net, file, o.size, o.count * 4, o.in_flight, 1)?);
        let batch = Log::File(SyncPolicy::Batch);
        v[6].push(throughput(&net, batch, o.size, o.count, o.in_flight, 1)?);
        v[7].push(throughput(&net, batch, o.size, o.count * 4, o.in_flight, o.in_flight as usize)?);
        let (message, call) = through_engines(o.size, o.count)?;
        v[8].push(message);
        v[9].push(call);
    }
    let of = |v: &[f64]| Summary::of(v).expect("at least one run");
    let doc = CallsBench {
        size: o.size,
        count: o.count,
        in_flight: o.in_flight,
        call_over_limit: of(&v[2]).median / of(&v[0]).median,
        call_over_message: of(&v[2]).median / of(&v[1]).median,
        file_log_added_us: of(&v[3]).median - of(&v[2]).median,
        per_record_sync_added_us: of(&v[4]).median - of(&v[3]).median,
        limit_us: of(&v[0]),
        message_us: of(&v[1]),
        call_us: of(&v[2]),
        call_file_log_us: of(&v[3]),
        call_synced_us: of(&v[4]),
        calls_per_s: of(&v[5]),
        calls_per_s_batch_sync: of(&v[6]),
        calls_per_s_group_commit: of(&v[7]),
        engine_message_us: of(&v[8]),
        engine_call_us: of(&v[9]),
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let s = |x: &Summary| format!("{:.1} ({:.1}-{:.1})", x.median, x.min, x.max);
    let k = |x: &Summary| format!("{:.0} ({:.0}-{:.0})", x.median, x.min, x.max);
    println!(
        "{} B arguments and reply, {} runs of {} round trips, median (min-max) of the runs' medians:",
        doc.size, o.runs, doc.count
    );
    println!("round trip, limit (two spinning sockets): {} us", s(&doc.limit_us));
    println!("round trip, tether message:               {} us", s(&doc.message_us));
    println!(
        "call to an empty handler, log in memory:  {} us: {:.3}x the limit, {:.3}x a message",
        s(&doc.call_us),
        doc.call_over_limit,
        doc.call_over_message
    );
    println!(
        "  log in a file, synced never:            {} us ({:+.2} us a call)",
        s(&doc.call_file_log_us),
        doc.file_log_added_us
    );
    println!(
        "  log in a file, synced per record:       {} us ({:+.2} us a call)",
        s(&doc.call_synced_us),
        doc.per_record_sync_added_us
    );
    println!("calls a second, {} open, log synced never:    {}", doc.in_flight, k(&doc.calls_per_s));
    println!(
        "calls a second, {} open, log synced per batch: {}",
        doc.in_flight,
        k(&doc.calls_per_s_batch_sync)
    );
    println!(
        "  the server running the calls waiting in batches (serve_batch, a group commit): {}",
        k(&doc.calls_per_s_group_commit)
    );
    println!(
        "through two engine processes: message round trip {} us, call {} us ({:.3}x the message)",
        s(&doc.engine_message_us),
        s(&doc.engine_call_us),
        doc.engine_call_us.median / doc.engine_message_us.median
    );
    Ok(())
}
