//! `tether engine`: the engine process of a node (docs/ENGINE.md; Zhou et
//! al. [FTGM]): it owns the UDP socket of every rail and runs the protocol
//! for every application on this node that attaches to it
//! (`tether_engine::Client`, through the directory it serves).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tether::faults::FaultPlan;
use tether::{AuthKind, ClusterKey, Config};
use tether_engine::{supervise, Engine, EngineOptions, Incident, SelfTestOptions, Watch};

use crate::net::{auth_kind, key_file};
use crate::{args, service};

#[derive(clap::Args)]
pub struct EngineOpts {
    /// The directory applications attach through (its socket and their
    /// shared-memory regions): this user's only [default: /dev/shm/tether-UID].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One UDP address per rail, in rail order (repeat for more rails).
    #[arg(long = "bind", required = true)]
    pub binds: Vec<SocketAddr>,
    /// Serve the engine's counters in the Prometheus text format at this
    /// address (`GET /metrics`), from a `tether metrics` process started
    /// beside it once it serves (docs/OPERATING.md).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Largest datagram the engine sends, header included.
    #[arg(long, default_value_t = Config::default().max_datagram,
          value_parser = args::config_field(|c, v| c.max_datagram = v))]
    pub mtu: usize,
    /// Shared secret of the cluster (16 bytes or more): every datagram is
    /// authenticated, peers may move. Every engine of the cluster needs the same.
    #[arg(long, value_name = "FILE", value_parser = key_file)]
    pub key_file: Option<ClusterKey>,
    /// With --key-file: aes-256-gmac, aes-256-gcm or chacha20-poly1305.
    #[arg(long, default_value = "aes-256-gmac", value_parser = auth_kind, requires = "key_file")]
    pub auth: AuthKind,
    /// A heartbeat still this long (the engine awake), or a sleep this far
    /// past its wake-up time, is a hang: the engine is killed and replaced.
    #[arg(long, default_value_t = 5000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(100, 60_000_000, "", ""))]
    pub hang_after_us: u64,
    /// Run the engine in this process, with no supervisor to replace it.
    #[arg(long)]
    pub unsupervised: bool,
    /// A fault injected into what the rails receive, in the compact form
    /// of `tether demo --fault` (e.g. `drop:p=0.05`); repeat for more.
    /// Receive-side rules only [default: none].
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<String>,
    /// Probe each rail in use at most this often with the self-test
    /// (loopback messages through the rail and the kernel, checked for
    /// count, bytes and latency); 0 turns it off.
    #[arg(long, default_value_t = 500, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(0, 3_600_000, "ms", "at most an hour"))]
    pub selftest_every_ms: u64,
    /// A self-test probe not delivered exact within this fails the engine
    /// (its supervisor replaces it).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 3_600_000, "ms", "at most an hour"))]
    pub selftest_deadline_ms: u64,
    /// Seed of the fault draws (each rail draws its own stream from it).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// Test only (`tether campaign --engine`): take requests to flip bits
    /// in the engine's own state on a socket in its directory.
    #[arg(long, hide = true)]
    pub fault_hook: bool,
    /// Measurement only (`tether bench engine`): write no stream backup,
    /// so a new engine has nothing to restore. Applications must not
    /// retain messages either (they could not be resumed).
    #[arg(long, hide = true)]
    pub no_backup: bool,
}

/// `tether metrics` for `dir` at `addr`, stopped with this engine (and on
/// its own if this process is killed: it watches its owner).
fn start_metrics(dir: &std::path::Path, addr: SocketAddr) -> anyhow::Result<std::process::Child> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("metrics").arg("--dir").arg(dir).arg("--listen").arg(addr.to_string());
    tether_lab::scratch::owned_by_this_run(&mut cmd);
    Ok(cmd.stdin(std::process::Stdio::null()).spawn()?)
}

fn stop_metrics(child: Option<std::process::Child>) {
    if let Some(mut c) = child {
        // SAFETY: a signal to the child this process started, not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
    }
}

pub fn run(o: &EngineOpts) -> anyhow::Result<()> {
    let dir = o.dir.clone().unwrap_or_else(tether_engine::attach::default_dir);
    let config = Config {
        max_datagram: o.mtu,
        key: o.key_file.clone().map(|k| k.with_auth(o.auth)),
        ..Config::default()
    };
    let faults = FaultPlan::parse_rules(o.seed, &o.faults).map_err(|e| anyhow::anyhow!("--fault: {e}"))?;
    let options = EngineOptions::new(&dir, o.binds.clone());
    let selftest = (o.selftest_every_ms > 0).then(|| SelfTestOptions {
        every: Duration::from_millis(o.selftest_every_ms),
        deadline: Duration::from_millis(o.selftest_deadline_ms),
    });
    let options =
        EngineOptions { config, faults, selftest, fault_hook: o.fault_hook, backup: !o.no_backup, ..options };
    if o.unsupervised {
        let mut engine = Engine::bind(options)?;
        // An interruption stops the loop as it would the supervisor.
        let stop = engine.stop_flag();
        std::thread::spawn(move || {
            while !service::stopping() {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Relaxed);
        });
        let rails: Vec<String> = engine.rail_addrs().iter().map(|a| a.to_string()).collect();
        println!(
            "tether engine: pid {} serving {} on rails {}",
            std::process::id(),
            dir.display(),
            rails.join(", ")
        );
        let metrics = o.metrics.map(|a| start_metrics(&dir, a)).transpose()?;
        let ran = engine.run();
        stop_metrics(metrics);
        ran?;
        drop(engine);
        // Empty once the engine and its applications are gone: nothing
        // is left of it.
        let _ = std::fs::remove_dir(&dir);
        return Ok(());
    }
    let watch = Watch { hang_after: Duration::from_micros(o.hang_after_us), ..Watch::default() };
    let start = Instant::now();
    let mut rails = String::new();
    let mut first = true;
    let mut metrics = None;
    let mut metrics_failed = None;
    let stamp = |start: Instant| format!("{:>10.3} ms", start.elapsed().as_secs_f64() * 1e3);
    let supervised = supervise(options, watch, &service::STOP, |incident| {
        use std::io::Write;
        match incident {
            Incident::Serving { rails: bound } => {
                rails = bound.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
            }
            Incident::Started { pid } if first => {
                first = false;
                println!(
                    "tether engine: pid {pid} (supervisor {}) serving {} on rails {rails}",
                    std::process::id(),
                    dir.display(),
                );
                if let Some(addr) = o.metrics {
                    match start_metrics(&dir, addr) {
                        Ok(c) => metrics = Some(c),
                        Err(e) => metrics_failed = Some(e),
                    }
                }
            }
            Incident::Started { pid } => println!("{} engine {pid} started", stamp(start)),
            Incident::Died { pid, status } => println!("{} engine {pid} died: {status}", stamp(start)),
            Incident::Hung { pid, still } => {
                println!(
                    "{} engine {pid} hung: heartbeat still for {:.3} ms",
                    stamp(start),
                    still.as_secs_f64() * 1e3
                )
            }
            Incident::Fenced { pid } => println!("{} engine {pid} fenced (killed and reaped)", stamp(start)),
            Incident::Replaced { old, new, after } => println!(
                "{} engine {new} replaced {old}, {:.3} ms after the incident was detected",
                stamp(start),
                after.as_secs_f64() * 1e3
            ),
        }
        let _ = std::io::stdout().flush();
    });
    stop_metrics(metrics);
    supervised?;
    // Empty unless applications still hold their regions in it.
    let _ = std::fs::remove_dir(&dir);
    match metrics_failed {
        Some(e) => Err(e.context("--metrics")),
        None => Ok(()),
    }
}
