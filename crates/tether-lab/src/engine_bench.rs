//! `tether bench engine`: what running the protocol in an engine process
//! costs, and how fast a node recovers when that process dies or hangs
//! (docs/ENGINE.md; Zhou et al. [FTGM], sections 5 and 6, whose figures
//! are the bars: ~1.7 s recovery, +0.25 us send overhead).
//!
//! Two `tether engine` processes on loopback, each with an application
//! attached (this process), against two embedded endpoints and the raw
//! socket in the same run:
//!
//! - cost: 8 B round trip and 64 KiB stream, engine against embedded (and
//!   the round trip against a raw spin loop); two applications on one
//!   engine: 8 B one-way latency and message rate;
//! - recovery: a verified stream, one message every `--pace-us`, while the
//!   sending or the receiving engine is killed with SIGKILL or stopped with
//!   SIGSTOP at random moments. Recovery is from the signal to the delivery
//!   of the first message the sender submitted after it (so it includes up
//!   to one pacing interval and one one-way trip); a hang's detection is
//!   from the signal to the supervisor's report of it.
//!
//! Every message is checked: lost, duplicated and corrupted are counted.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether_engine::{Client, ClientOptions, EngineCounters};
use tether_proto::Received;

use crate::args;
use crate::engine_proc::{EngineProcess, Line};
use crate::net::{loopback, NetOpts};
use crate::summary::Summary;
use crate::verified_stream::{self, Spec, Totals};
use crate::{pattern, pingpong, stream};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const WARMUP: u64 = 200;
/// Warm-up time before round trips are measured: two threads that only
/// spin and yield never sleep, so the scheduler moves one off a shared
/// core only at its periodic balancing (some runs of two applications on
/// one engine measured 1.67 us one way over the first few ms, 0.3 after).
const WARMUP_TIME: Duration = Duration::from_millis(50);
const STREAM_SIZE: usize = 64 * 1024;
/// The self-test's stream is this many times `--stream-messages` long.
pub const SELFTEST_STREAM: u64 = 8;
const RECOVERY_SIZE: usize = 1000;
const A: u32 = 1;
const B: u32 = 2;

#[derive(Debug, Clone, Args)]
pub struct EngineBenchOpts {
    /// Measurements of each cost figure (raw, embedded and engine in turn).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = args::int_in::<usize>(1, 1000, "", ""))]
    pub runs: usize,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 5_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 100_000_000, "", ""))]
    pub round_trips: u64,
    /// 64 KiB messages per stream measurement.
    #[arg(long, default_value_t = 2_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 100_000_000, "", ""))]
    pub stream_messages: u64,
    /// 8 B messages per rate measurement between two applications on one engine.
    #[arg(long, default_value_t = 200_000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000_000, "", ""))]
    pub small_messages: u64,
    /// Engines killed with SIGKILL during the verified stream (each 60 to
    /// 120 ms after the previous fault's recovery).
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = args::int_in::<usize>(0, 100_000, "", ""))]
    pub kills: usize,
    /// Engines stopped with SIGSTOP during the verified stream.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = args::int_in::<usize>(0, 100_000, "", ""))]
    pub hangs: usize,
    /// The supervisors' hang threshold (`tether engine --hang-after-us`).
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 60_000_000, "", ""))]
    pub hang_after_us: u64,
    /// One message of the verified stream every this many microseconds.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000, "", ""))]
    pub pace_us: u64,
    /// Seed of the moments faults strike and of which engine they strike.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct EngineReport {
    /// 8 B round trip, us: medians of the runs.
    pub rtt_raw_us: Summary,
    pub rtt_embedded_us: Summary,
    pub rtt_engine_us: Summary,
    /// Engine over embedded, per run.
    pub rtt_ratio: Summary,
    /// 64 KiB stream, MB/s.
    pub stream_embedded_mb_s: Summary,
    pub stream_engine_mb_s: Summary,
    pub stream_ratio: Summary,
    /// The same stream (`SELFTEST_STREAM` times longer) alone through fresh engines with the self-test
    /// and audit off, MB/s, and with them (default interval) over without,
    /// per run (the two in alternating order).
    pub stream_no_selftest_mb_s: Summary,
    pub selftest_ratio: Summary,
    /// The time the self-test and the state audit took during the stream
    /// with them (as the engines report it), as a share of the stream's
    /// time, %: the busier of the two engines. And the probes sent meanwhile.
    pub checking_pct: Summary,
    pub selftest_probes: Summary,
    /// 8 B messages a second through two engines, millions, with the
    /// host-side backup (as always) and without it (engines with
    /// `--no-backup`, applications retaining nothing), and what the
    /// backup costs per message: 1/with - 1/without, us, per run.
    pub small_stream_m_msgs_s: Summary,
    pub small_stream_no_backup_m_msgs_s: Summary,
    pub backup_us_per_msg: Summary,
    /// The 8 B round trip without the backup, us, and with minus without.
    pub rtt_no_backup_us: Summary,
    pub backup_rtt_us: Summary,
    /// Two applications on one engine: 8 B one-way latency (round trip / 2), us.
    pub same_node_one_way_us: Summary,
    /// ... and 8 B messages a second, millions.
    pub same_node_m_msgs_s: Summary,
    /// ... and with the batch API (`send_batch` of `BATCH`, `recv_batch`).
    pub same_node_batch_m_msgs_s: Summary,
    /// CPU time per 64 KiB message with every wait sleeping, us: embedded,
    /// through engines (applications and engines), the engines'
    /// supervisors besides, and engine over embedded.
    pub cpu_embedded_us: Summary,
    pub cpu_engine_us: Summary,
    pub cpu_supervisors_us: Summary,
    pub cpu_ratio: Summary,
    pub recovery: RecoveryReport,
}

#[derive(Debug, Default, Serialize)]
pub struct RecoveryReport {
    pub kills: usize,
    pub hangs: usize,
    /// From SIGKILL to the first message submitted after it delivered, ms.
    pub kill_recovery_ms: Option<Summary>,
    /// From SIGSTOP to the same, ms.
    pub hang_recovery_ms: Option<Summary>,
    /// From SIGSTOP to the supervisor's report of the hang, ms.
    pub hang_detection_ms: Option<Summary>,
    /// How long the heartbeat had stood still when the hang was declared, ms.
    pub hang_still_ms: Option<Summary>,
    /// Engines replaced that no fault struck (taken for hung on a busy machine).
    pub spurious_replacements: usize,
    /// Engines replaced during the cost measurements, before any fault.
    pub cost_replacements: usize,
    /// The verified stream's outcome (flattened: the same JSON fields).
    #[serde(flatten)]
    pub totals: Totals,
    /// `EngineRecovered` events each application was given.
    pub recovered_events_sender: u64,
    pub recovered_events_receiver: u64,
    pub seconds: f64,
}

/// Two supervised engines on loopback, an application attached to each,
/// each knowing the other.
struct Pair2 {
    // Fields drop in this order: the applications detach before their
    // engines stop (else each would wait `ClientOptions::recovery` for a
    // new engine).
    a: Client,
    b: Client,
    e1: EngineProcess,
    e2: EngineProcess,
}

fn engines(o: &EngineBenchOpts, name: &str) -> anyhow::Result<Pair2> {
    engines_with(o, name, &[])
}

/// `engines`, each `tether engine` given `more` arguments too.
fn engines_with(o: &EngineBenchOpts, name: &str, more: &[&str]) -> anyhow::Result<Pair2> {
    engines_with_options(o, name, more, ClientOptions::default())
}

/// Applications for engines run with `--no-backup`: they keep no copies
/// either, so the pair measures engine mode without the host-side backup.
fn no_backup_client() -> ClientOptions {
    ClientOptions { retain: false, ..ClientOptions::default() }
}

/// `engines_with`, the applications attached with `client`.
fn engines_with_options(
    o: &EngineBenchOpts,
    name: &str,
    more: &[&str],
    client: ClientOptions,
) -> anyhow::Result<Pair2> {
    let hang = o.hang_after_us.to_string();
    let extra = [&["--hang-after-us", hang.as_str()], more].concat();
    let e1 = EngineProcess::start(&format!("bench-engine-{name}a"), &[loopback()], &extra)?;
    let e2 = EngineProcess::start(&format!("bench-engine-{name}b"), &[loopback()], &extra)?;
    let (a, b) = (e1.attach_with(A, client.clone())?, e2.attach_with(B, client)?);
    a.add_peer_rails(B, &e2.rails)?;
    b.add_peer_rails(A, &e1.rails)?;
    Ok(Pair2 { a, b, e1, e2 })
}

pub fn run(o: &EngineBenchOpts, net: &NetOpts, say: &dyn Fn(&str)) -> anyhow::Result<EngineReport> {
    let small = NetOpts { size: 8, ..net.clone() };
    let bulk = NetOpts { size: STREAM_SIZE, ..net.clone() };
    let (mut raw, mut emb, mut eng, mut ratio) = (vec![], vec![], vec![], vec![]);
    let (mut s_emb, mut s_eng, mut s_ratio) = (vec![], vec![], vec![]);
    let (mut one_way, mut rate, mut batch_rate) = (vec![], vec![], vec![]);
    let (mut cpu_emb, mut cpu_eng, mut cpu_sup, mut cpu_ratio) = (vec![], vec![], vec![], vec![]);
    let (mut s_quiet, mut st_ratio) = (vec![], vec![]);
    let (mut small_rate, mut small_nb, mut backup_cost) = (vec![], vec![], vec![]);
    let (mut rtt_nb, mut backup_rtt) = (vec![], vec![]);
    let (mut checking_pct, mut probes) = (vec![], vec![]);
    let mut cost_replacements = 0;
    // Through engines without the backup: 8 B round trip and rate.
    let without_backup = |r: usize, replaced: &mut usize| -> anyhow::Result<(f64, f64)> {
        say(&format!(
            "run {r}/{}: 8 B round trips and stream, through two engines without the backup",
            o.runs
        ));
        let n = engines_with_options(o, &format!("nobackup{r}"), &["--no-backup"], no_backup_client())?;
        let g = round_trips(&n.a, &n.b, B, o.round_trips).context("8 B round trips without the backup")?;
        let (_, m) =
            stream_through(&n.a, &n.b, B, 8, o.small_messages).context("8 B stream without the backup")?;
        *replaced += n.e1.replacements() + n.e2.replacements();
        Ok((g, m))
    };
    for r in 1..=o.runs {
        // Each side measured alone on the machine: the engines (and their
        // supervisors' watch) exist only while the engine side runs.
        say(&format!("run {r}/{}: 8 B round trips, raw", o.runs));
        raw.push(pingpong::raw_loopback(&small, o.round_trips)?.rtt_us.median);
        say(&format!("run {r}/{}: 8 B round trips, embedded", o.runs));
        let e = pingpong::reliable_loopback(&small, o.round_trips)?.rtt_us.median;
        say(&format!("run {r}/{}: 64 KiB stream, embedded", o.runs));
        let se = stream::reliable_loopback(&bulk, o.stream_messages)?.goodput_mb_s;
        // Alternated, so neither side of the backup's cost always runs first.
        let early = if r % 2 == 0 { Some(without_backup(r, &mut cost_replacements)?) } else { None };
        say(&format!("run {r}/{}: starting two tether engine processes", o.runs));
        let p = engines(o, &format!("cost{r}"))?;
        say(&format!("run {r}/{}: 8 B round trips, through two engines", o.runs));
        let g = round_trips(&p.a, &p.b, B, o.round_trips).context("8 B round trips through two engines")?;
        say(&format!("run {r}/{}: 64 KiB stream, through two engines", o.runs));
        let (sg, _) = stream_through(&p.a, &p.b, B, STREAM_SIZE, o.stream_messages)
            .context("64 KiB stream through two engines")?;
        say(&format!("run {r}/{}: 8 B stream, through two engines", o.runs));
        let (_, sm) =
            stream_through(&p.a, &p.b, B, 8, o.small_messages).context("8 B stream through two engines")?;
        say(&format!("run {r}/{}: two applications on one engine", o.runs));
        let (w, m, mb) = same_node(&p.e1, o).with_context(|| {
            format!("two applications on one engine ({} engines replaced meanwhile)", p.e1.replacements())
        })?;
        cost_replacements += p.e1.replacements() + p.e2.replacements();
        drop(p);
        // Two cores cannot show four busy parties' wall-clock ratio: the
        // CPU time each message costs, every party sleeping when idle.
        say(&format!("run {r}/{}: CPU time per 64 KiB message, embedded and through engines", o.runs));
        let c = cpu_per_message(o, net, r)?;
        cpu_emb.push(c.embedded_us);
        cpu_eng.push(c.engine_us);
        cpu_sup.push(c.supervisors_us);
        cpu_ratio.push(c.engine_us / c.embedded_us);
        let (gn, mn) = match early {
            Some(v) => v,
            None => without_backup(r, &mut cost_replacements)?,
        };
        small_rate.push(sm / 1e6);
        small_nb.push(mn / 1e6);
        backup_cost.push((1.0 / sm - 1.0 / mn) * 1e6);
        rtt_nb.push(gn);
        backup_rtt.push(g - gn);
        // The self-test's cost: fresh pairs with and without it, in
        // alternating order, the 64 KiB stream alone on each.
        let mut checked = None;
        let mut quiet = None;
        for on in if r % 2 == 0 { [false, true] } else { [true, false] } {
            let v = selftest_stream(o, r, on, &mut cost_replacements)?;
            *(if on { &mut checked } else { &mut quiet }) = Some(v);
        }
        let ((sc, pct, n), (sq, _, _)) = (checked.expect("measured"), quiet.expect("measured"));
        s_quiet.push(sq);
        st_ratio.push(sc / sq);
        checking_pct.push(pct);
        probes.push(n);
        emb.push(e);
        eng.push(g);
        ratio.push(g / e);
        s_emb.push(se);
        s_eng.push(sg);
        s_ratio.push(sg / se);
        one_way.push(w);
        rate.push(m);
        batch_rate.push(mb);
    }
    let mut recovery = if o.kills + o.hangs > 0 {
        say("starting two tether engine processes");
        let p = engines(o, "recovery")?;
        recover(o, &p, say)?
    } else {
        RecoveryReport::default()
    };
    recovery.cost_replacements = cost_replacements;
    let s = |v: &[f64]| Summary::of(v).expect("runs >= 1");
    Ok(EngineReport {
        rtt_raw_us: s(&raw),
        rtt_embedded_us: s(&emb),
        rtt_engine_us: s(&eng),
        rtt_ratio: s(&ratio),
        stream_embedded_mb_s: s(&s_emb),
        stream_engine_mb_s: s(&s_eng),
        stream_ratio: s(&s_ratio),
        stream_no_selftest_mb_s: s(&s_quiet),
        selftest_ratio: s(&st_ratio),
        checking_pct: s(&checking_pct),
        selftest_probes: s(&probes),
        small_stream_m_msgs_s: s(&small_rate),
        small_stream_no_backup_m_msgs_s: s(&small_nb),
        backup_us_per_msg: s(&backup_cost),
        rtt_no_backup_us: s(&rtt_nb),
        backup_rtt_us: s(&backup_rtt),
        same_node_one_way_us: s(&one_way),
        same_node_m_msgs_s: s(&rate),
        same_node_batch_m_msgs_s: s(&batch_rate),
        cpu_embedded_us: s(&cpu_emb),
        cpu_engine_us: s(&cpu_eng),
        cpu_supervisors_us: s(&cpu_sup),
        cpu_ratio: s(&cpu_ratio),
        recovery,
    })
}

/// The 64 KiB stream through a fresh pair of engines, with their
/// self-test and audit (`on`) or without: MB/s, and (on) the share of the
/// stream's time the busier engine spent on them, %, and its probes.
fn selftest_stream(
    o: &EngineBenchOpts,
    r: usize,
    on: bool,
    replaced: &mut usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let what = if on { "with" } else { "without" };
    let more: &[&str] = if on { &[] } else { &["--selftest-every-ms", "0"] };
    let p = engines_with(o, &format!("selftest-{what}{r}"), more)?;
    let before = checking(&p);
    let t0 = Instant::now();
    // Eight times the cost stream: long enough (about 2 s here) for the
    // self-test to probe several times (every 500 ms, a rail in use).
    let (mb_s, _) = stream_through(&p.a, &p.b, B, STREAM_SIZE, SELFTEST_STREAM * o.stream_messages)
        .with_context(|| format!("64 KiB stream through two engines {what} their self-test"))?;
    let secs = t0.elapsed().as_secs_f64();
    let after = checking(&p);
    let spent = |i: usize| {
        let (a, b) = (&after[i], &before[i]);
        (a.selftest_ns + a.audit_ns).saturating_sub(b.selftest_ns + b.audit_ns)
    };
    let pct = spent(0).max(spent(1)) as f64 / 1e9 / secs * 100.0;
    let probes = (0..2).map(|i| after[i].selftest_probes - before[i].selftest_probes).sum::<u64>();
    *replaced += p.e1.replacements() + p.e2.replacements();
    Ok((mb_s, pct, probes as f64))
}

/// What each engine of the pair has reported of its checking, once its
/// latest report is in (engines report every 50 ms).
fn checking(p: &Pair2) -> [EngineCounters; 2] {
    std::thread::sleep(Duration::from_millis(60));
    [p.a.engine_counters(), p.b.engine_counters()]
}

/// `count` 8 B round trips from `a` to `peer` (`b`, echoing in a thread),
/// after a warm-up of at least `WARMUP` round trips and `WARMUP_TIME`: the
/// median round trip in microseconds. The echo stops at an empty message.
fn round_trips(a: &Client, b: &Client, peer: u32, count: u64) -> anyhow::Result<f64> {
    std::thread::scope(|s| {
        let echo = s.spawn(|| -> anyhow::Result<()> {
            for i in 0.. {
                let d = b.recv(WAIT).with_context(|| format!("echo: round trip {i}"))?;
                if d.message.is_empty() {
                    return Ok(());
                }
                b.send_bytes(d.from, &d.message, WAIT)?;
            }
            Ok(())
        });
        let mut buf = [0u8; 8];
        let mut samples = Vec::with_capacity(count as usize);
        let start = Instant::now();
        let mut warm = None;
        for i in 0.. {
            pattern::fill(&mut buf, A, i);
            let t0 = Instant::now();
            a.send(peer, &buf, WAIT)?;
            let d = a.recv(WAIT).with_context(|| format!("round trip {i}"))?;
            let rtt = t0.elapsed();
            anyhow::ensure!(pattern::verify(&d.message, A, i), "round trip {i} came back changed");
            if warm.is_none() && i >= WARMUP && start.elapsed() >= WARMUP_TIME {
                warm = Some(i);
            }
            if warm.is_some() {
                samples.push(rtt.as_secs_f64() * 1e6);
                if samples.len() as u64 == count {
                    break;
                }
            }
        }
        a.send(peer, &[], WAIT)?;
        echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
        Ok(Summary::of(&samples).expect("count >= 1").median)
    })
}

/// `count` messages of `size` from `a` to `peer` (`b`, in a thread), every
/// one verified: MB/s and messages a second.
fn stream_through(a: &Client, b: &Client, peer: u32, size: usize, count: u64) -> anyhow::Result<(f64, f64)> {
    std::thread::scope(|s| {
        let receiver = s.spawn(|| -> anyhow::Result<Instant> {
            for i in 0..count {
                let d = b.recv(WAIT).with_context(|| format!("receiving message {i} of {count}"))?;
                anyhow::ensure!(
                    d.message.len() == size && pattern::verify(&d.message, A, i),
                    "stream message {i} arrived changed or out of order"
                );
            }
            Ok(Instant::now())
        });
        let mut buf = vec![0u8; size];
        let start = Instant::now();
        for i in 0..count {
            // As the embedded stream does (`stream::send_one`): a large
            // message written into a pooled buffer and handed over, so the
            // client keeps it until settled without a copy.
            let sent = if size >= stream::HAND_OVER_FROM {
                let msg = pattern::write_message(a.message_buffer(size), size, A, i);
                a.send_bytes(peer, &a.seal(msg), WAIT)
            } else {
                pattern::fill(&mut buf, A, i);
                a.send(peer, &buf, WAIT)
            };
            sent.with_context(|| format!("sending message {i} of {count}"))?;
        }
        let end = receiver.join().map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
        a.flush(WAIT)?;
        let secs = (end - start).as_secs_f64();
        Ok((count as f64 * size as f64 / secs / 1e6, count as f64 / secs))
    })
}

/// CPU time this process has used, every thread's (ended ones too), us.
fn own_cpu_us() -> f64 {
    // SAFETY: `getrusage` fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// CPU time process `pid` has used (user and system, every thread's), us,
/// from `/proc/PID/stat` (clock ticks).
fn process_cpu_us(pid: u32) -> anyhow::Result<f64> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("process {pid}"))?;
    // After the command's closing parenthesis: the state is field 3, so
    // utime and stime (fields 14 and 15) are the 12th and 13th words.
    let words: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        anyhow::bail!("/proc/{pid}/stat: no utime and stime in {stat:?}");
    };
    // SAFETY: `sysconf` only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((user + system) / hz * 1e6)
}

/// CPU time a 64 KiB message costs, us, with every wait sleeping rather
/// than polling (so the time is the work and the wake-ups, not spinning):
/// embedded (both endpoints in this process), and through two engines
/// (this process's applications and the two engines; their supervisors'
/// watch apart, as it runs by the clock, not per message).
struct CpuCost {
    embedded_us: f64,
    engine_us: f64,
    supervisors_us: f64,
}

fn cpu_per_message(o: &EngineBenchOpts, net: &NetOpts, r: usize) -> anyhow::Result<CpuCost> {
    let count = o.stream_messages;
    let sleeping = NetOpts { size: STREAM_SIZE, spin_us: 0, ..net.clone() };
    let before = own_cpu_us();
    stream::reliable_loopback(&sleeping, count).context("64 KiB stream, embedded, sleeping")?;
    let embedded_us = (own_cpu_us() - before) / count as f64;
    let client = ClientOptions { spin: Duration::ZERO, ..ClientOptions::default() };
    // Engines that sleep at once were declared hung at the default 5 ms
    // (a wake-up the scheduler delayed; 3 runs in 4 here) and replaced
    // mid-measurement: hangs are not what this measures.
    let patient = EngineBenchOpts { hang_after_us: 1_000_000, ..o.clone() };
    let p = engines_with_options(&patient, &format!("cpu{r}"), &["--spin-us", "0"], client)?;
    let engines = [p.e1.engine_pid(), p.e2.engine_pid()];
    let supervisors = [p.e1.supervisor_pid(), p.e2.supervisor_pid()];
    let cpu = |pids: &[u32]| -> anyhow::Result<f64> { pids.iter().map(|&pid| process_cpu_us(pid)).sum() };
    let (own0, eng0, sup0) = (own_cpu_us(), cpu(&engines)?, cpu(&supervisors)?);
    stream_through(&p.a, &p.b, B, STREAM_SIZE, count).context("64 KiB stream through engines, sleeping")?;
    let (own1, eng1, sup1) = (own_cpu_us(), cpu(&engines)?, cpu(&supervisors)?);
    anyhow::ensure!(
        p.e1.engine_pid() == engines[0] && p.e2.engine_pid() == engines[1],
        "an engine was replaced during the CPU measurement"
    );
    let per = |t: f64| t / count as f64;
    Ok(CpuCost { embedded_us, engine_us: per(own1 - own0 + eng1 - eng0), supervisors_us: per(sup1 - sup0) })
}

/// Messages a `send_batch` call in the batch stream.
const BATCH: usize = 1024;

/// `count` messages of `size` from `a` to `peer` (`b`, in a thread) in
/// batches of `BATCH` (`send_batch`), taken with `recv_batch` into one
/// reused buffer; every one verified. Millions of messages a second.
fn batch_stream(a: &Client, b: &Client, peer: u32, size: usize, count: u64) -> anyhow::Result<f64> {
    std::thread::scope(|s| {
        let receiver = s.spawn(|| -> anyhow::Result<Instant> {
            let mut got = Received::new(4 * BATCH, 4 * BATCH * size);
            let mut i = 0;
            while i < count {
                b.recv_batch(&mut got, WAIT)
                    .with_context(|| format!("receiving from message {i} of {count}"))?;
                for (_, m) in got.iter() {
                    anyhow::ensure!(
                        m.len() == size && pattern::verify(m, A, i),
                        "batch stream message {i} arrived changed or out of order"
                    );
                    i += 1;
                }
            }
            Ok(Instant::now())
        });
        let mut msgs = vec![vec![0u8; size]; BATCH];
        let start = Instant::now();
        let mut i = 0;
        while i < count {
            let n = BATCH.min((count - i) as usize);
            for (k, m) in msgs[..n].iter_mut().enumerate() {
                pattern::fill(m, A, i + k as u64);
            }
            let sent =
                a.send_batch(peer, &msgs[..n], WAIT).with_context(|| format!("sending from message {i}"))?;
            i += sent.count as u64;
        }
        let end = receiver.join().map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
        a.flush(WAIT)?;
        Ok(count as f64 / (end - start).as_secs_f64())
    })
}

/// Two applications attached to one engine: 8 B one-way latency (us) and
/// rate (millions of messages a second), one message a call and with the
/// batch API.
fn same_node(e: &EngineProcess, o: &EngineBenchOpts) -> anyhow::Result<(f64, f64, f64)> {
    const C: u32 = 3;
    const D: u32 = 4;
    let (c, d) = (e.attach(C)?, e.attach(D)?);
    c.add_peer_rails(D, &e.rails)?;
    d.add_peer_rails(C, &e.rails)?;
    // The round trip helper names the sender A in its pattern; C plays it.
    let rtt = round_trips(&c, &d, D, o.round_trips).context("round trips")?;
    let (_, per_s) = stream_through(&c, &d, D, 8, o.small_messages).context("8 B stream")?;
    let batched = batch_stream(&c, &d, D, 8, o.small_messages).context("8 B stream, batches")?;
    c.close(Duration::from_secs(1))?;
    d.close(Duration::from_secs(1))?;
    Ok((rtt / 2.0, per_s / 1e6, batched / 1e6))
}

/// The verified stream under engine kills and hangs.
fn recover(o: &EngineBenchOpts, pair: &Pair2, say: &dyn Fn(&str)) -> anyhow::Result<RecoveryReport> {
    let (e1, e2, a, b) = (&pair.e1, &pair.e2, &pair.a, &pair.b);
    let spec = Spec {
        from: A,
        to: B,
        size: RECOVERY_SIZE,
        pace: Duration::from_micros(o.pace_us),
        // Room for the whole run at a generous 250 ms per fault.
        room: ((o.kills + o.hangs) as u128 * 250_000 / o.pace_us as u128 + 100_000) as usize,
        patience: Duration::from_secs(10),
    };
    // The faults, in a drawn order, each on a drawn side.
    let mut rng = Pcg64Mcg::seed_from_u64(o.seed);
    let mut faults: Vec<bool> = (0..o.kills).map(|_| true).chain((0..o.hangs).map(|_| false)).collect();
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.gen_range(0..=i));
    }
    let (mut kill_ms, mut hang_ms, mut detect_ms, mut still_ms) = (vec![], vec![], vec![], vec![]);
    let mut spurious = 0;
    let ((outcome, seconds), ended) = verified_stream::run(&spec, a, b, |p| {
        let started = Instant::now();
        let outcome = (|| -> anyhow::Result<()> {
            for (n, &kill) in faults.iter().enumerate() {
                if n % 10 == 0 {
                    say(&format!("verified stream: fault {}/{} (kills and hangs)", n + 1, faults.len()));
                }
                // Past the new engine's first 50 ms, when the supervisor gives
                // it four times the patience (docs/ENGINE.md): the steady state.
                std::thread::sleep(Duration::from_micros(rng.gen_range(60_000..120_000)));
                let victim = if rng.gen_bool(0.5) { e1 } else { e2 };
                let t = p.now();
                let pid = victim.signal_engine(if kill { libc::SIGKILL } else { libc::SIGSTOP })?;
                let lines = victim.await_replacement(pid, Duration::from_secs(10))?;
                // Replacements of other engines on the way were not ours.
                spurious += lines
                    .iter()
                    .filter(|(_, l)| matches!(l, Line::Replaced { old, .. } if *old != pid))
                    .count();
                if !kill {
                    let hung = lines.iter().find_map(|(at, l)| match l {
                        Line::Hung { still_ms } => Some((*at, *still_ms)),
                        _ => None,
                    });
                    let Some((at, still)) = hung else {
                        anyhow::bail!("engine {pid} was stopped but not reported hung (saw {lines:?})");
                    };
                    detect_ms.push((p.stamp_of(at) as f64 - t as f64) / 1e6);
                    still_ms.push(still);
                }
                let until = Instant::now() + Duration::from_secs(10);
                let first = p
                    .first_after(t, until)
                    .ok_or_else(|| anyhow::anyhow!("the sender stopped submitting"))?;
                let at = p.delivered_at(first, until).ok_or_else(|| {
                    anyhow::anyhow!(
                        "delivery did not resume within 10 s of fault {} (message {first})",
                        n + 1
                    )
                })?;
                let ms = (at - t) as f64 / 1e6;
                if kill {
                    kill_ms.push(ms)
                } else {
                    hang_ms.push(ms)
                }
            }
            Ok(())
        })();
        say("verified stream: draining");
        (outcome, started.elapsed().as_secs_f64())
    });
    outcome?;
    let ended = ended?;
    ended.flushed.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    // Replacements reported after the last fault's were not ours either.
    for e in [e1, e2] {
        while let Some((_, l)) = e.next_line(Duration::from_millis(10)) {
            spurious += matches!(Line::parse(&l), Line::Replaced { .. }) as usize;
        }
    }
    let t = ended.totals(a);
    Ok(RecoveryReport {
        kills: o.kills,
        hangs: o.hangs,
        kill_recovery_ms: Summary::of(&kill_ms),
        hang_recovery_ms: Summary::of(&hang_ms),
        hang_detection_ms: Summary::of(&detect_ms),
        hang_still_ms: Summary::of(&still_ms),
        spurious_replacements: spurious,
        cost_replacements: 0,
        totals: t,
        recovered_events_sender: verified_stream::drain_events(a)?.recovered,
        recovered_events_receiver: verified_stream::drain_events(b)?.recovered,
        seconds,
    })
}
