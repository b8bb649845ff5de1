//! `tether bench logp`: LogGP parameters (Culler et al.'s LogP with
//! Alexandrov et al.'s G) measured the way Kielmann, Bal and Verstoep's
//! "Fast measurement of LogP parameters for message passing platforms"
//! (and netgauge) do, by parametrised round trips: PRTT(n, d, s) is the
//! time for a client to send n messages of s bytes, d apart, and get one
//! answer back once the server has all n. Then, for each size s:
//!
//! - RTT(s) = PRTT(1, 0, s);
//! - g(s) = (PRTT(n, 0, s) - PRTT(1, 0, s)) / (n - 1), the gap between
//!   messages sent back to back;
//! - o_s(s): the time a send call takes, measured as the sends of
//!   PRTT(n, d, s) with d above the gap (so none waits for room);
//! - o_r(s): the time a receive call takes for a message already there
//!   (the client waits d, well past the answer's arrival, then receives);
//! - L = RTT(0)/2 - o_s - o_r (from the smallest size);
//! - G: the slope of g(s) over the largest sizes.
//!
//! For messages (`send` / `recv`) and for calls (`request` / `Call::wait`
//! to an empty handler), over a size sweep, with the number of datagrams a
//! message takes (the fragmentation points: where a size needs one more).
//! tether's progress thread does the protocol's receive work off the
//! application's thread, so o_r is what the application pays, not what the
//! host pays. Kaur's AMVIA thesis (Table 3.1) measured these for AMVIA and
//! AMUDP; its figures beside these are in docs/ARCHITECTURE.md, "Calls".

// The benchmark reads the wall clock.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tether::rpc::CallOptions;
use tether::{Endpoint, Error, Options};

use crate::args;
use crate::net::{loopback, NetOpts};
use crate::summary::Summary;

const HANDLER: u32 = 1;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const CLIENT: u32 = 1;
const SERVER: u32 = 2;

#[derive(Debug, Clone, clap::Args)]
pub struct LogpOpts {
    /// Message sizes, bytes (at least 8: each carries its round's count).
    #[arg(long, value_delimiter = ',', default_value = "8,64,512,1024,4096,16384,65536,131072",
          value_parser = args::size(8))]
    pub sizes: Vec<usize>,
    /// Messages per burst (n of PRTT(n, d, s)).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(2, 1024, "messages", ""))]
    pub burst: u32,
    /// Repetitions of each PRTT; the median is taken.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(1, 100_000, "repetitions", ""))]
    pub reps: u32,
    /// Also draw RTT, g, o_s and o_r against the size, for messages and
    /// calls, as a PNG at this path.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<std::path::PathBuf>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// LogGP at one size, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct AtSize {
    pub size: usize,
    /// Datagrams one message takes at the path's datagram size.
    pub datagrams: usize,
    pub rtt_us: f64,
    pub g_us: f64,
    pub o_s_us: f64,
    pub o_r_us: f64,
}

#[derive(Debug, Serialize)]
pub struct Loggp {
    /// `messages` or `calls`.
    pub what: &'static str,
    pub sizes: Vec<AtSize>,
    /// RTT/2 - o_s - o_r at the smallest size; `None` where that is not
    /// above zero (the overheads, measured apart, exceed half the round
    /// trip: on one machine the two sides' work overlaps), which is no
    /// latency.
    pub l_us: Option<f64>,
    /// Microseconds per byte, from the two largest sizes' gaps; `None`
    /// where the gap did not grow with the size (or one size was given).
    pub big_g_us_per_byte: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct LogpReport {
    pub burst: u32,
    pub reps: u32,
    pub max_datagram: usize,
    pub messages: Loggp,
    pub calls: Loggp,
}

/// The two sides, on loopback.
fn pair(net: &NetOpts) -> anyhow::Result<(Endpoint, Endpoint)> {
    let mut options: Options = net.options()?;
    options.calls.credit = options.calls.credit.max(1024);
    let server = Endpoint::udp(SERVER, loopback(), &[], options.clone())?;
    let client = Endpoint::udp(CLIENT, loopback(), &[], options)?;
    client.add_peer(SERVER, server.local_addr().expect("UDP"))?;
    server.add_peer(CLIENT, client.local_addr().expect("UDP"))?;
    server.register_handler(HANDLER, |_| Vec::new())?;
    Ok((client, server))
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).map_or(0.0, |s| s.median)
}

/// One side of the measurement: how a burst is sent and answered.
trait Side {
    /// Send message `i` of a burst of `n`, `size` bytes; its duration.
    fn send(&mut self, n: u32, i: u32, size: usize) -> anyhow::Result<Duration>;
    /// Wait for the burst's answer; how long the receive call itself took
    /// once called.
    fn answer(&mut self) -> anyhow::Result<Duration>;
}

/// Messages: the server answers a burst with one 8-byte message once it
/// has all of it (each message carries the burst's size).
struct Messages<'a> {
    client: &'a Endpoint,
    buf: Vec<u8>,
}

impl Side for Messages<'_> {
    fn send(&mut self, n: u32, _: u32, size: usize) -> anyhow::Result<Duration> {
        self.buf.resize(size, 7);
        self.buf[..4].copy_from_slice(&n.to_le_bytes());
        let t = Instant::now();
        self.client.send_blocking(SERVER, &self.buf, WAIT)?;
        Ok(t.elapsed())
    }
    fn answer(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.client.recv(WAIT)?;
        Ok(t.elapsed())
    }
}

fn echo_bursts(server: &Endpoint, stop: &AtomicBool) -> anyhow::Result<()> {
    let mut got = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let d = match server.recv(Some(Duration::from_millis(20))) {
            Ok(d) => d,
            Err(Error::TimedOut) => continue,
            Err(e) => return Err(e.into()),
        };
        let n = u32::from_le_bytes(d.message[..4].try_into()?);
        got += 1;
        if got == n {
            got = 0;
            server.send_blocking(CLIENT, &[0u8; 8], WAIT)?;
        }
    }
    Ok(())
}

/// Calls: each message a request to an empty handler; the answer is the
/// burst's last reply (earlier ones are waited for too, after it).
struct Calls<'a> {
    client: &'a Endpoint,
    open: Vec<tether::rpc::Call>,
    buf: Vec<u8>,
}

impl Side for Calls<'_> {
    fn send(&mut self, _: u32, _: u32, size: usize) -> anyhow::Result<Duration> {
        self.buf.resize(size, 7);
        let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
        let t = Instant::now();
        let call = self.client.request_with(SERVER, HANDLER, &self.buf, &wait)?;
        let took = t.elapsed();
        self.open.push(call);
        Ok(took)
    }
    fn answer(&mut self) -> anyhow::Result<Duration> {
        let last = self.open.pop().expect("a burst was sent");
        let t = Instant::now();
        last.wait(WAIT)?;
        let took = t.elapsed();
        for c in self.open.drain(..) {
            c.wait(WAIT)?;
        }
        Ok(took)
    }
}

/// PRTT(n, d, size): its median over `reps`, and the median send call.
fn prtt(side: &mut dyn Side, n: u32, d: Duration, size: usize, reps: u32) -> anyhow::Result<(f64, f64)> {
    let (mut total, mut sends) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        for i in 0..n {
            sends.push(side.send(n, i, size)?.as_secs_f64() * 1e6);
            if !d.is_zero() && i + 1 < n {
                spin(d);
            }
        }
        side.answer()?;
        total.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok((median(&total), median(&sends)))
}

/// The receive call for an answer already there: send one, wait `d`
/// (well past its round trip), then receive.
fn receive_overhead(side: &mut dyn Side, d: Duration, size: usize, reps: u32) -> anyhow::Result<f64> {
    let mut r = Vec::new();
    for _ in 0..reps {
        side.send(1, 0, size)?;
        spin(d);
        r.push(side.answer()?.as_secs_f64() * 1e6);
    }
    Ok(median(&r))
}

/// `datagrams` is filled in by the caller, once the handshake has agreed
/// the datagram size.
fn measure(what: &'static str, side: &mut dyn Side, o: &LogpOpts) -> anyhow::Result<Loggp> {
    let mut sizes = Vec::new();
    // Warm up: handshakes, pools, caches, and the progress threads
    // handing the endpoints to the application's spinning calls (with 20
    // bursts only, the first size's round trip read 121 us, 12 us when
    // measured again after the others).
    prtt(side, 1, Duration::ZERO, o.sizes[0], 1000)?;
    prtt(side, o.burst, Duration::ZERO, o.sizes[0], 50)?;
    for &size in &o.sizes {
        let (rtt, _) = prtt(side, 1, Duration::ZERO, size, o.reps)?;
        let (burst, _) = prtt(side, o.burst, Duration::ZERO, size, o.reps)?;
        let g = (burst - rtt) / f64::from(o.burst - 1);
        // d above the gap and the round trip: no send waits for room.
        let d = Duration::from_secs_f64((g.max(rtt) * 2.0) / 1e6);
        let (_, o_s) = prtt(side, o.burst, d, size, o.reps)?;
        let o_r = receive_overhead(side, d, size, o.reps)?;
        sizes.push(AtSize { size, datagrams: 0, rtt_us: rtt, g_us: g, o_s_us: o_s, o_r_us: o_r });
    }
    let first = &sizes[0];
    let l_us = Some(first.rtt_us / 2.0 - first.o_s_us - first.o_r_us).filter(|&l| l > 0.0);
    let big_g_us_per_byte = match &sizes[..] {
        [.., a, b] if b.size > a.size => {
            Some((b.g_us - a.g_us) / (b.size - a.size) as f64).filter(|&g| g > 0.0)
        }
        _ => None,
    };
    Ok(Loggp { what, sizes, l_us, big_g_us_per_byte })
}

pub fn run(o: &LogpOpts, net: NetOpts) -> anyhow::Result<()> {
    let (client, server) = pair(&net)?;
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|s| -> anyhow::Result<LogpReport> {
        let echo = s.spawn(|| echo_bursts(&server, &stop));
        let messages = measure("messages", &mut Messages { client: &client, buf: Vec::new() }, o);
        stop.store(true, Ordering::Relaxed);
        echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
        stop.store(false, Ordering::Relaxed);
        let serving = s.spawn(|| -> anyhow::Result<()> {
            while !stop.load(Ordering::Relaxed) {
                match server.serve(Some(Duration::from_millis(20))) {
                    Ok(()) | Err(Error::TimedOut) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        });
        let calls = measure("calls", &mut Calls { client: &client, open: Vec::new(), buf: Vec::new() }, o);
        stop.store(true, Ordering::Relaxed);
        serving.join().map_err(|_| anyhow::anyhow!("the serving thread panicked"))??;
        let (mut messages, mut calls) = (messages?, calls?);
        let max_datagram =
            client.max_datagram_to(SERVER).ok_or_else(|| anyhow::anyhow!("no datagram size agreed"))?;
        // A fragment's payload: the datagram less tether's header, frame
        // and trailer, near enough for the count (a call adds its
        // envelope's 32 bytes).
        let payload = max_datagram.saturating_sub(64).max(1);
        for (l, extra) in [(&mut messages, 0), (&mut calls, 32)] {
            for s in &mut l.sizes {
                s.datagrams = (s.size + extra).div_ceil(payload).max(1);
            }
        }
        Ok(LogpReport { burst: o.burst, reps: o.reps, max_datagram, messages, calls })
    })?;
    if let Some(path) = &o.plot {
        plot(&report, path)?;
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "LogGP on loopback (PRTT method, bursts of {}, medians of {} repetitions; datagrams of {} B), microseconds:",
        report.burst, report.reps, report.max_datagram
    );
    for l in [&report.messages, &report.calls] {
        let g = match (l.big_g_us_per_byte, &l.sizes[..]) {
            (Some(g), _) => format!("G {g:.6} us/byte ({:.0} MB/s)", 1.0 / g),
            (None, [.., a, b]) if b.size > a.size => format!(
                "G not determined: the gap did not grow from {} B to {} B ({:.2} -> {:.2} us)",
                a.size, b.size, a.g_us, b.g_us
            ),
            (None, _) => "G not measured (give two sizes, the largest last)".to_owned(),
        };
        let first = &l.sizes[0];
        let latency = match l.l_us {
            Some(v) => format!("L {v:.2} us"),
            None => format!(
                "L not determined: half the round trip ({:.2} us) is below o_s + o_r ({:.2} us), measured apart \
                 (on one machine the two sides' work overlaps)",
                first.rtt_us / 2.0,
                first.o_s_us + first.o_r_us
            ),
        };
        println!("{}: {latency}, {g}", l.what);
        println!("  {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}", "size", "datagrams", "RTT", "g", "o_s", "o_r");
        let mut last = 0;
        for s in &l.sizes {
            let mark = if s.datagrams != last && last != 0 { "  <- fragmented from here" } else { "" };
            last = s.datagrams;
            println!(
                "  {:>8} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>9.2}{mark}",
                s.size, s.datagrams, s.rtt_us, s.g_us, s.o_s_us, s.o_r_us
            );
        }
    }
    Ok(())
}

/// RTT, g, o_s and o_r of messages and calls against the size.
fn plot(r: &LogpReport, path: &std::path::Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    for l in [&r.messages, &r.calls] {
        type Figure = fn(&AtSize) -> f64;
        let pick: [(&str, Figure); 4] =
            [("RTT", |s| s.rtt_us), ("g", |s| s.g_us), ("o_s", |s| s.o_s_us), ("o_r", |s| s.o_r_us)];
        for (name, f) in pick {
            let points = l.sizes.iter().map(|s| (s.size as f64, f(s).max(0.0))).collect();
            series.push(crate::plot::Series { label: format!("{} {name}", l.what), points });
        }
    }
    let title = format!("LogGP on loopback (bursts of {}, medians of {})", r.burst, r.reps);
    let chart = crate::plot::Chart {
        title: &title,
        x_label: "message size, bytes",
        y_label: "microseconds",
        log_x: true,
        series: &series,
    };
    crate::plot::line_png(path, &chart, 1000, 600)
}
