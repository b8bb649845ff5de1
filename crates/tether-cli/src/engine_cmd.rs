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
    /// One UDP address per rail, in rail order (repeat for more rails);
    /// or `engine.bind` in tether.toml, or TETHER_ENGINE_BIND.
    #[arg(long = "bind")]
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
    /// With nothing to do, the engine polls its rings and rails this long
    /// (yielding the core between looks) before it sleeps; 0 sleeps at
    /// once (each wake-up then costs a system call on both sides).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(0, 1_000_000, "us", "at most a second"))]
    pub spin_us: u64,
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

/// The engine's settings from a `tether.toml` and `TETHER_*` variables
/// (`tether::settings`) where no flag was given on the command line (`m`,
/// the engine's matches): the flags win. The protocol's configuration,
/// every `config.*` key with the flags `--mtu`, `--key-file` and `--auth`
/// over theirs. A value the settings refuse, or no rail at all, is a
/// refusal of what was asked.
pub fn configure(o: &mut EngineOpts, m: &clap::ArgMatches) -> anyhow::Result<Config> {
    use clap::parser::ValueSource;
    let layers = tether::settings::Layers::load()?;
    let flag = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let mut t = tether::settings::Target::default();
    layers.apply(&mut t, |key| match key {
        "config.max_datagram" => flag("mtu"),
        "config.key_file" => flag("key_file"),
        "config.auth" => flag("auth") || flag("key_file"),
        _ => false,
    })?;
    let mut config = t.options.config;
    if flag("mtu") {
        config.max_datagram = o.mtu;
    }
    if flag("key_file") {
        config.key = o.key_file.clone().map(|k| k.with_auth(o.auth));
    } else if flag("auth") {
        config.key = config.key.map(|k| k.with_auth(o.auth));
    }
    let text = |key: &str| layers.get(key).filter(|_| !flag(flag_of(key))).map(|(v, _)| v.trim().to_string());
    let list =
        |v: String| v.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect::<Vec<_>>();
    // Checked when read (`Layers`): these parse.
    let bad = |key: &str, e: String| anyhow::anyhow!("{key}: {e}");
    if let Some(v) = text("engine.dir") {
        o.dir = Some(v.into());
    }
    if let Some(v) = text("engine.bind") {
        o.binds = list(v)
            .iter()
            .map(|a| a.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("engine.bind", format!("{e}")))?;
    }
    if let Some(v) = text("engine.metrics") {
        o.metrics = Some(v.parse().map_err(|e| bad("engine.metrics", format!("{e}")))?);
    }
    for (key, at) in [
        ("engine.hang_after_us", &mut o.hang_after_us),
        ("engine.spin_us", &mut o.spin_us),
        ("engine.selftest_every_ms", &mut o.selftest_every_ms),
        ("engine.selftest_deadline_ms", &mut o.selftest_deadline_ms),
        ("engine.seed", &mut o.seed),
    ] {
        if let Some(v) = text(key) {
            *at = v.replace('_', "").parse().map_err(|e| bad(key, format!("{e}")))?;
        }
    }
    if let Some(v) = text("engine.faults") {
        o.faults = if v == "none" { Vec::new() } else { list(v) };
    }
    if o.binds.is_empty() {
        anyhow::bail!(
            "tether engine needs a rail: --bind ADDR, or engine.bind in tether.toml, or TETHER_ENGINE_BIND"
        );
    }
    Ok(config)
}

/// The flag (its clap id) an `engine.*` key stands for.
fn flag_of(key: &str) -> &'static str {
    match key {
        "engine.dir" => "dir",
        "engine.bind" => "binds",
        "engine.metrics" => "metrics",
        "engine.hang_after_us" => "hang_after_us",
        "engine.spin_us" => "spin_us",
        "engine.selftest_every_ms" => "selftest_every_ms",
        "engine.selftest_deadline_ms" => "selftest_deadline_ms",
        "engine.seed" => "seed",
        "engine.faults" => "faults",
        _ => "",
    }
}

/// What `tether engine` uses for each `engine.*` key nobody set: its
/// flags' defaults, for `tether config`.
pub fn defaults(engine: &clap::Command) -> std::collections::BTreeMap<&'static str, String> {
    let mut out = std::collections::BTreeMap::new();
    for key in tether::settings::all().iter().map(|s| s.key).filter(|k| k.starts_with("engine.")) {
        let default = engine
            .get_arguments()
            .find(|a| a.get_id() == flag_of(key))
            .map(|a| {
                a.get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|d| !d.is_empty());
        let shown = match (key, default) {
            ("engine.dir", _) => tether_engine::attach::default_dir().display().to_string(),
            (_, Some(d)) => d,
            _ => "none".into(),
        };
        out.insert(key, shown);
    }
    out
}

pub fn run(o: &EngineOpts, config: Config) -> anyhow::Result<()> {
    let dir = o.dir.clone().unwrap_or_else(tether_engine::attach::default_dir);
    let faults = FaultPlan::parse_rules(o.seed, &o.faults).map_err(|e| anyhow::anyhow!("--fault: {e}"))?;
    let options = EngineOptions::new(&dir, o.binds.clone());
    let selftest = (o.selftest_every_ms > 0).then(|| SelfTestOptions {
        every: Duration::from_millis(o.selftest_every_ms),
        deadline: Duration::from_millis(o.selftest_deadline_ms),
    });
    let options = EngineOptions {
        config,
        faults,
        selftest,
        fault_hook: o.fault_hook,
        backup: !o.no_backup,
        spin: Duration::from_micros(o.spin_us),
        ..options
    };
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
