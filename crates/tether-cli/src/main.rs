//! The `tether` command (docs/ARCHITECTURE.md, "Layers": the top one): the demo, the measurements,
//! the simulator. Tables for people, `--json` for machines.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod config_cmd;
mod engine_cmd;
mod metrics_cmd;
mod service;
mod stat_cmd;
mod table;

use tether_lab::{
    args, async_bench, auth_bench, bandwidth, bench, calls_bench, campaign, cluster_campaign,
    congestion_bench, contention_bench, demo, demo_cluster, demo_engine, demo_rpc, detect_bench, detection,
    engine_bench, engine_campaign, flows, group_bench, limit, logp_bench, loss_bench, model, net,
    performability_bench, pingpong, report, scratch, shm_bench, stream, summary, sweep, timeline,
};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use net::NetOpts;

#[derive(Parser)]
#[command(
    name = "tether",
    version,
    about = "Reliable messaging over unreliable networks: demo, benchmarks, simulation"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Verified all-to-all traffic among several endpoints through lossy, corrupting, reordering links.
    Demo(demo::DemoOpts),
    /// Round-trip latency (one command on loopback, or --listen / --connect across hosts).
    Pingpong(NetOpts),
    /// One-way throughput (one command on loopback, or --listen / --connect across hosts).
    Stream(NetOpts),
    /// Pingpong and stream, raw and reliable, over a size sweep, with ratios.
    Bench(BenchOpts),
    /// Run the deterministic simulator over many seeds and check every guarantee.
    Sim(SimOpts),
    /// Fault campaign (Li et al. [CI] section 6): workloads under a sweep of
    /// fault kinds x rates x seeds; nothing may be lost, duplicated or corrupted.
    /// With --engine, the engine fault campaign (Zhou et al. [FTGM] Table 1).
    Campaign(campaign::CampaignOpts),
    /// The engine process of a node: owns the sockets of every rail and
    /// runs the protocol for the applications that attach to it.
    Engine(engine_cmd::EngineOpts),
    /// A running node looked into, read-only: its engine's (or endpoints')
    /// counters, peers and rails, refreshing like AeronStat or top.
    Stat(stat_cmd::StatOpts),
    /// The effective configuration from tether.toml and TETHER_* variables,
    /// and where each value came from.
    Config(config_cmd::ConfigOpts),
    /// A node's counters in the Prometheus text format, served over HTTP
    /// for a Prometheus server to scrape (what `tether stat` reads).
    Metrics(metrics_cmd::MetricsOpts),
    /// The performability model (Kaur [AMVIA] chapter 4): a round trip as
    /// a Markov chain with rates measured in this run, its prediction set
    /// against the round trip measured under the same fault rates, then
    /// embedded against engine mode and one rail against two.
    Model(performability_bench::ModelOpts),
    /// Every experiment of the five papers run again, each figure beside the paper's, written into docs/RESULTS.md with the command, date and machine (--quick: minutes)
    Report(report::ReportOpts),
    /// A bank server of `tether demo --rpc` (started by the demo).
    #[command(hide = true)]
    BankServer(demo_rpc::BankServerOpts),
    /// A node of `tether demo --cluster` (started by the demo).
    #[command(hide = true)]
    ClusterMember(demo_cluster::ClusterMemberOpts),
}

#[derive(clap::Args)]
struct SimOpts {
    /// Fault mixes to run, comma-separated [default: all].
    // The names come from the simulator's own list, so the help and the
    // accepted names are the mixes that run, never a copy that drifts.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(tether_sim::FaultMix::ALL.map(|m| m.name())))]
    mix: Vec<String>,
    /// Seeds per mix.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1, 1_000_000, "", ""))]
    seeds: u64,
    /// First seed (a failure prints the seed to replay with --first-seed N --seeds 1).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = args::seed)]
    first_seed: u64,
    /// Members of the membership mixes, comma-separated: a row for each
    /// (what a member's load does as the cluster grows) [default: each mix's own].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true,
          value_parser = args::int_in::<u32>(2, 10_000, "members", ""))]
    members: Vec<u32>,
    /// Instead of the mixes: Tang and Bilas's Table 3 (a host moved 1 to 4
    /// switches away in a source-routed fabric, and the probes and time
    /// its peer's search took to find it again), on the paper's four
    /// switches and on a chain of 1,000 hosts, and the probe count's
    /// growth with the fabric's size.
    #[arg(long)]
    fabric_table: bool,
    /// A fabric for the fabric mixes (their moves kept), or for one more
    /// Table 3 with --fabric-table: tang-bilas, chain:SWITCHES[,PORTS[,HOSTS]],
    /// fat-tree:K[,HOSTS], torus:WxH[,HOSTS], random:SWITCHES[,PORTS[,HOSTS[,SEED]]],
    /// or file:PATH, a fabric file (docs/FABRIC.md, "Topologies").
    #[arg(long, value_name = "TOPOLOGY")]
    topology: Option<tether_sim::topology::Topology>,
    /// Print one JSON document (a record per mix) instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchOpts {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    #[command(flatten)]
    net: NetOpts,
    /// Sizes to sweep, comma-separated, in bytes [default: 8,64,1024,4096,16384,65536,262144,1048576].
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = args::size(0))]
    sizes: Vec<usize>,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Checksums (Trahay et al. [NMAD] section 5): bandwidth alone and fused
    /// with the copy against memcpy and memory reads, detection strength
    /// (--errors), and the T(L) overhead model against `tether stream` (--model).
    Checksum(bandwidth::ChecksumOpts),
    /// What authentication costs: small-message round trips and a
    /// large-message stream under each algorithm (--auth) against CRC32C
    /// alone, measured in turns in the same invocation.
    Auth(auth_bench::AuthOpts),
    /// The shared-memory ring between applications and an engine process:
    /// one-way latency and 8 B throughput against a cache line bounced
    /// between two cores and bare words through a ring.
    Shm(shm_bench::ShmOpts),
    /// The engine process (Zhou et al. [FTGM]): 8 B round trip and 64 KiB
    /// stream through two `tether engine` processes against embedded
    /// endpoints, two applications on one engine, and recovery from engines
    /// killed (SIGKILL) and hung (SIGSTOP) during a verified stream.
    Engine(engine_bench::EngineBenchOpts),
    /// Congestion control through a real bottleneck (two network
    /// namespaces, tc tbf at 1 Gbit/s with a shallow queue): N tether
    /// streams together (utilization, Jain fairness, queue drops), one
    /// beside a TCP Cubic connection (tether's share of fair), and the
    /// 8 B round trip through the idle link, shaped and not. Needs root.
    Congestion(congestion_bench::CongestionOpts),
    /// Goodput under random loss (--rate, 1%) against the same stream
    /// without it, in alternating pairs of runs so the machine's drift
    /// falls on both alike.
    Loss(loss_bench::LossOpts),
    /// The small-message round trip with a busy thread on every core,
    /// tether against the limit under the same load, alternating.
    Contention(contention_bench::ContentionOpts),
    /// Failure detectors over real heartbeats (unreliable messages on
    /// loopback), idle and beside a busy thread per core: false alarms and
    /// detection times of Li et al.'s [CI] two-miss rule and phi accrual,
    /// with and without the observer's own lateness forgiven.
    Detect(detect_bench::DetectOpts),
    /// Ordered multicast among three members of a group on loopback
    /// (virtual synchrony, docs/CLUSTER.md): ordered messages a second and
    /// the delivery latency, against tether's 8 B round trip in the same
    /// run.
    Group(group_bench::GroupOpts),
    /// What a call costs (active messages): the round trip of a
    /// call to an empty handler against the limit's and a message's, the
    /// server's log in memory, in a file, synced per record; calls a
    /// second with many open, the log synced never and per batch.
    Calls(calls_bench::CallsOpts),
    /// LogGP parameters (L, o_s, o_r, g, G) for messages and for calls,
    /// over a size sweep, by Kielmann et al.'s parametrised round trips
    /// (PRTT), with the sizes where a message takes one more datagram.
    Logp(logp_bench::LogpOpts),
    /// The async API (tokio) beside the blocking one, in turns: the 8 B
    /// round trip and a 1 KiB stream.
    Async(async_bench::AsyncOpts),
    /// The parameter study of Tang and Bilas [TB] (Figures 5-9): stream
    /// bandwidth against a fixed retransmission timer and against the send
    /// window, at error rates from none to 1e-2, with selective and
    /// go-back-N repair; application kernels' run time against the rate;
    /// the paper's findings beside this run's.
    Sweep(Box<sweep::SweepOpts>),
}

fn main() {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Warnings by default: refused traffic (another key, a key on one
    // side only, another --auth) shows as it happens, once a second. Not
    // in `sim`: its engines die and its datagrams are forged on purpose,
    // thousands of times a run, and its table says what came of it.
    // `RUST_LOG` overrides: `tether_proto=info` shows peers going up and
    // down, failovers and abandonments; `=trace`, every drop; `off`,
    // nothing. Colour only on a terminal: a log written to a file or a
    // pipe carries no escape codes.
    use std::io::IsTerminal;
    let quiet = matches!(cli.command, Command::Sim(_));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(if quiet { "off" } else { "warn" }));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Command::Pingpong(o) | Command::Stream(o) | Command::Bench(BenchOpts { net: o, .. }) =
        &mut cli.command
    {
        if let Err(e) = o.resolve_mtu() {
            eprintln!("tether: {}", message(&e));
            std::process::exit(2);
        }
    }
    // Refusals of what was asked (values that clash, options that would be
    // ignored) exit 2, as clap's own do; failures of what ran exit 1.
    if let Err(e) = refuse(&cli.command, &matches) {
        eprintln!("tether: {}", message(&e));
        std::process::exit(2);
    }
    // An engine's settings from tether.toml and TETHER_* variables, under
    // its flags; refused settings are refusals of what was asked too.
    let mut engine_config = None;
    if let (Command::Engine(o), Some(m)) = (&mut cli.command, matches.subcommand_matches("engine")) {
        match engine_cmd::configure(o, m) {
            Ok(c) => engine_config = Some(c),
            Err(e) => {
                eprintln!("tether: {}", message(&e));
                std::process::exit(2);
            }
        }
    }
    // What runs killed outright left (their directories in /dev/shm and
    // the temporary directory, their namespaces) goes first; then this
    // run's own goes with it however it ends: at the end of `main`, on
    // SIGINT, SIGTERM or SIGHUP, or when the command that started this
    // one (an engine, a bank server) is gone.
    let reclaimed = scratch::reclaim();
    if !reclaimed.dirs.is_empty() || !reclaimed.namespaces.is_empty() {
        tracing::info!(dirs = ?reclaimed.dirs, namespaces = ?reclaimed.namespaces, "removed what killed runs left");
    }
    if let Command::Engine(_) | Command::Metrics(_) = &cli.command {
        // Services stop cleanly and remove their files themselves.
        service::handle_interrupts();
        scratch::watch_owner(service::stop);
    } else {
        if let Err(e) = scratch::handle_interrupts() {
            eprintln!("tether: cannot watch for interruptions: {e}");
            std::process::exit(1);
        }
        // Its owner gone, what the owner's run holds is garbage, and this
        // command may have written into it (a bank server's call log in
        // its demo's directory) after the owner removed it: removed with
        // the rest of the dead runs' directories, as the next command would.
        scratch::watch_owner(|| {
            scratch::reclaim();
            scratch::clean_up_and_exit(128 + libc::SIGTERM)
        });
    }
    let result = match cli.command {
        Command::Demo(o) => run_demo(&o),
        Command::Pingpong(o) => run_pingpong(&o),
        Command::Stream(o) => run_stream(&o),
        Command::Bench(o) => run_bench(&o),
        Command::Sim(o) => run_sim(&o),
        Command::Campaign(o) => run_campaign(&o),
        Command::Engine(o) => engine_cmd::run(&o, engine_config.take().unwrap_or_default()),
        Command::Stat(o) => stat_cmd::run(&o),
        Command::Config(o) => config_cmd::run(
            &o,
            &engine_cmd::defaults(Cli::command().find_subcommand("engine").expect("the engine command")),
        ),
        Command::Metrics(o) => metrics_cmd::run(&o),
        Command::Model(o) => measured(
            o.json,
            |say| performability_bench::run(&o, default_net()?, say),
            |r| performability_bench::print(r, &o),
        ),
        Command::Report(o) => report::run(&o),
        Command::BankServer(o) => demo_rpc::serve(&o),
        Command::ClusterMember(o) => demo_cluster::serve(&o),
    };
    scratch::clean_up();
    if let Err(e) = result {
        eprintln!("tether: {}", message(&e));
        std::process::exit(1);
    }
}

/// An error and its causes on one line, each cause once: an error that
/// prints its source in its own message (`transport: invalid arguments`)
/// would otherwise show the source twice, and a message of several lines
/// (the TOML parser's) is joined so the first line says it all.
fn message(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.ends_with(&c) {
            out = format!("{out}: {c}");
        }
    }
    out.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// Was `id` given on the command line (not a default)?
fn given(m: &ArgMatches, id: &str) -> bool {
    m.value_source(id) == Some(ValueSource::CommandLine)
}

/// The first of `ids` given on the command line, as its flag.
fn first_given(m: &ArgMatches, ids: &[&str]) -> Option<String> {
    ids.iter().find(|id| given(m, id)).map(|id| flag(id))
}

/// The flag of an argument id (`rto_min_us` -> `--rto-min-us`).
fn flag(id: &str) -> String {
    match id {
        "faults" => "--fault".into(),
        "extra_rails" => "--rail".into(),
        _ => format!("--{}", id.replace('_', "-")),
    }
}

/// Refuse what the command would not do as asked: options it would ignore
/// in this mode, and values that cannot go together. Checked before
/// anything runs, so nobody reads a result they believe they configured.
fn refuse(command: &Command, m: &ArgMatches) -> anyhow::Result<()> {
    let Some((_, m)) = m.subcommand() else { return Ok(()) };
    match command {
        Command::Pingpong(o) if o.flows > 1 => {
            anyhow::bail!("--flows is for stream: a round trip is one flow at a time")
        }
        Command::Pingpong(o) | Command::Stream(o) => check_net(o, m),
        Command::Bench(o) => match (&o.what, m.subcommand()) {
            (Some(BenchWhat::Checksum(c)), Some((_, cm))) => check_checksum(c, cm),
            (
                Some(
                    BenchWhat::Auth(_)
                    | BenchWhat::Shm(_)
                    | BenchWhat::Engine(_)
                    | BenchWhat::Congestion(_)
                    | BenchWhat::Loss(_)
                    | BenchWhat::Contention(_)
                    | BenchWhat::Detect(_)
                    | BenchWhat::Calls(_)
                    | BenchWhat::Logp(_),
                ),
                _,
            ) => Ok(()),
            _ => check_bench(&o.net, m),
        },
        Command::Demo(o) => {
            demo::check(o)?;
            // Each mode's own options, refused without it.
            let modes: [(&str, bool, &[&str]); 3] = [
                ("--rpc", o.rpc, &["servers", "accounts", "transfers", "kills"]),
                ("--cluster", o.cluster, &["members", "period_ms", "rate", "detector"]),
                ("--engine", o.engine, &["hang_after_us"]),
            ];
            for (mode, on, ids) in modes {
                if let Some(f) = first_given(m, ids).filter(|_| !on) {
                    anyhow::bail!("{f} is for demo {mode}");
                }
            }
            Ok(())
        }
        Command::Sim(o) => {
            anyhow::ensure!(
                o.first_seed.checked_add(o.seeds).is_some(),
                "--first-seed {} plus --seeds {} passes the last seed, 2^64-1",
                o.first_seed,
                o.seeds
            );
            // Options that size or shape only some mixes, given others.
            let named: Vec<tether_sim::FaultMix> = match o.mix.is_empty() {
                true => tether_sim::FaultMix::ALL.to_vec(),
                false => o.mix.iter().filter_map(|m| tether_sim::FaultMix::from_name(m)).collect(),
            };
            if !o.fabric_table {
                let membership =
                    |m: &tether_sim::FaultMix| m.config(0).workload == tether_sim::Workload::Membership;
                if let Some(m) = named.iter().find(|m| !o.members.is_empty() && !membership(m)) {
                    anyhow::bail!("--members sizes the membership mixes; `{}` is not one", m.name());
                }
                if let Some(m) = named.iter().find(|m| o.topology.is_some() && m.config(0).fabric.is_none()) {
                    anyhow::bail!(
                        "--topology gives the fabric mixes their fabric; `{}` is not one",
                        m.name()
                    );
                }
            }
            Ok(())
        }
        Command::Campaign(o) => campaign::check(o, |id| given(m, id)),
        Command::Stat(_) | Command::Config(_) | Command::Metrics(_) | Command::BankServer(_) => Ok(()),
        Command::Model(_) => Ok(()),
        Command::Report(_) => Ok(()),
        Command::ClusterMember(_) => Ok(()),
        Command::Engine(_) => Ok(()),
    }
}

/// `pingpong` and `stream`: loopback or two processes, raw or reliable.
fn check_net(o: &NetOpts, m: &ArgMatches) -> anyhow::Result<()> {
    // A side without its other address is a usage error, as clap's are.
    two_process(o)?;
    let two_process = o.listen.is_some() || o.connect.is_some();
    if two_process {
        // One run and one rail are what two-process mode does, so asking
        // for them is fine; asking for more would be silently ignored.
        if given(m, "runs") && o.runs > 1 {
            anyhow::bail!("--runs repeats loopback runs; in two-process mode each process makes one run");
        }
        if o.rails > 1 {
            anyhow::bail!("--rails is for loopback; across hosts add each rail with --rail LOCAL=REMOTE");
        }
        if o.flows > 1 {
            anyhow::bail!(
                "--flows runs on loopback; across hosts start one --listen/--connect pair per flow"
            );
        }
    } else if let Some(f) = first_given(m, &["bind", "peer", "extra_rails"]) {
        anyhow::bail!("{f} is for two-process mode (--listen or --connect); on loopback use --rails N");
    }
    if o.raw {
        let reliable = [
            "window",
            "rto_min_us",
            "give_up_after",
            "checksum",
            "mode",
            "polling",
            "rails",
            "extra_rails",
            "rail_policy",
            "congestion",
            "flows",
            "key_file",
            "auth",
        ];
        if let Some(f) = first_given(m, &reliable) {
            anyhow::bail!("--raw measures the bare transport, without tether: {f} does not apply");
        }
    }
    if given(m, "rail_policy") && o.rails < 2 && o.extra_rails.is_empty() {
        anyhow::bail!("--rail-policy needs two or more rails (--rails N on loopback, --rail across hosts)");
    }
    net::check_addresses(o)?;
    // Read the fault plan now: a bad rule or file is refused before a
    // listener announces itself or a sender binds.
    o.plan()?;
    Ok(())
}

/// `bench`: the size sweep on loopback, raw and reliable side by side.
fn check_bench(o: &NetOpts, m: &ArgMatches) -> anyhow::Result<()> {
    if given(m, "size") {
        anyhow::bail!("bench sweeps --sizes; --size is for pingpong and stream");
    }
    if given(m, "raw") {
        anyhow::bail!("bench measures raw and reliable side by side; --raw is for pingpong and stream");
    }
    if let Some(f) = first_given(m, &["listen", "connect", "bind", "peer", "extra_rails"]) {
        anyhow::bail!("bench runs on loopback; {f} is for pingpong and stream across hosts");
    }
    if given(m, "rail_policy") && o.rails < 2 {
        anyhow::bail!("--rail-policy needs --rails 2 or more");
    }
    if given(m, "flows") {
        anyhow::bail!("bench sweeps one flow; --flows is for stream (and `bench congestion` runs its own)");
    }
    o.plan()?;
    Ok(())
}

/// `bench checksum`: the bandwidth table (and model), or --errors.
fn check_checksum(o: &bandwidth::ChecksumOpts, m: &ArgMatches) -> anyhow::Result<()> {
    if o.errors {
        if let Some(f) = first_given(m, &["runs", "block", "large_mib"]) {
            anyhow::bail!("--errors measures detection only; {f} is for the bandwidth table");
        }
        if let Some(f) = first_given(m, &["model", "model_checksum", "model_runs", "model_sizes"]) {
            anyhow::bail!(
                "--errors measures detection only; {f} goes with the bandwidth table, not --errors"
            );
        }
    } else if let Some(f) = first_given(m, &["trials", "error_len", "seed"]) {
        anyhow::bail!("{f} is for --errors (detection strength); add --errors or leave it out");
    }
    if !o.model {
        if let Some(f) = first_given(m, &["model_checksum", "model_runs", "model_sizes"]) {
            anyhow::bail!("{f} is for --model; add --model or leave it out");
        }
    }
    anyhow::ensure!(
        o.block <= o.large_mib << 20,
        "--block {} B is larger than the out-of-cache buffer (--large-mib {})",
        o.block,
        o.large_mib
    );
    Ok(())
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn run_demo(o: &demo::DemoOpts) -> anyhow::Result<()> {
    if o.cluster {
        demo::check(o)?;
        let rules = [&demo::link_rules(o)[..], &o.faults[..]].concat();
        let run = demo_cluster::ClusterRun {
            members: o.members,
            period_ms: o.period_ms,
            rate: o.rate,
            detector: o.detector,
            seed: o.seed,
            rules,
        };
        let report = demo_cluster::run(&run)?;
        if o.json {
            print_json(&report)?;
        } else {
            demo_cluster::print(&report);
        }
        anyhow::ensure!(
            report.ok,
            "a failure went undetected, a live node was removed, views or the group's order disagreed, or the replica was not replaced"
        );
        return Ok(());
    }
    if o.rpc {
        demo::check(o)?;
        let plan = demo::plan(o)?;
        let report = demo_rpc::run(o.servers, o.accounts, o.transfers, o.kills, o.seed, plan)?;
        if o.json {
            print_json(&report)?;
        } else {
            demo_rpc::print(&report);
        }
        anyhow::ensure!(
            report.ok,
            "the bank ran a transfer twice, lost or made money, or a call's state was false"
        );
        return Ok(());
    }
    let report = demo::run(o)?;
    if o.json {
        print_json(&report)?;
    } else {
        table::demo(o, &report);
    }
    anyhow::ensure!(report.ok, "the demo saw lost, duplicated, corrupted or failed messages");
    Ok(())
}

#[derive(serde::Serialize)]
struct Measured<R> {
    mode: &'static str,
    size: usize,
    count: u64,
    runs: Vec<R>,
}

/// Two-process mode: who this side is.
enum Side {
    /// Listening at the address, for the sender.
    Listen(std::net::SocketAddr, tether_lab::net::Sender),
    /// Sending to the listener's address from this side's own.
    Connect(std::net::SocketAddr, std::net::SocketAddr),
}

fn two_process(o: &NetOpts) -> anyhow::Result<Option<Side>> {
    use tether_lab::net::Sender;
    match (o.listen, o.connect) {
        (Some(l), None) if o.accept => Ok(Some(Side::Listen(l, Sender::Any))),
        (Some(l), None) => {
            let peer = o.peer.or(o.bind).ok_or_else(|| {
                anyhow::anyhow!(
                    "--listen needs --peer ADDR (the sender's address), or --accept to take in any sender"
                )
            })?;
            Ok(Some(Side::Listen(l, Sender::At(peer))))
        }
        (None, Some(c)) => {
            let bind =
                o.bind.ok_or_else(|| anyhow::anyhow!("--connect needs --bind ADDR (this side's address)"))?;
            Ok(Some(Side::Connect(c, bind)))
        }
        (None, None) => Ok(None),
        (Some(_), Some(_)) => anyhow::bail!("give --listen or --connect, not both"),
    }
}

fn run_pingpong(o: &NetOpts) -> anyhow::Result<()> {
    let count = o.count.unwrap_or(pingpong::default_count(o.size));
    let mode = if o.raw { "raw" } else { "tether" };
    let runs = match two_process(o)? {
        Some(Side::Listen(addr, peer)) => {
            if let Some(drops) = pingpong::listen(o, addr, peer, count)? {
                if o.json {
                    print_json(&serde_json::json!({ "mode": mode, "size": o.size, "echo_drops": drops }))?;
                } else {
                    println!("{}", table::drops("the echo side", &drops));
                }
            }
            return Ok(());
        }
        Some(Side::Connect(addr, bind)) => vec![pingpong::connect(o, addr, bind, count)?],
        None => {
            (0..o.runs.max(1))
                .map(|_| {
                    if o.raw {
                        pingpong::raw_loopback(o, count)
                    } else {
                        pingpong::reliable_loopback(o, count)
                    }
                })
                .collect::<anyhow::Result<_>>()?
        }
    };
    let m = Measured { mode, size: o.size, count, runs };
    if o.json {
        print_json(&m)
    } else {
        table::pingpong(&m.runs, mode, o.size);
        Ok(())
    }
}

fn run_stream(o: &NetOpts) -> anyhow::Result<()> {
    let count = o.count.unwrap_or(stream::default_count(o.size));
    if o.flows > 1 {
        let runs = (0..o.runs.max(1))
            .map(|_| flows::loopback(o, o.flows, count))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let verified = runs.iter().flat_map(|r| &r.flows).all(|f| f.corrupted == 0 && f.out_of_order == 0);
        if o.json {
            print_json(&runs)?;
        } else {
            table::flows(&runs, o.size);
        }
        anyhow::ensure!(verified, "verification failed: reordered or corrupted messages");
        return Ok(());
    }
    let mode = if o.raw { "raw" } else { "tether" };
    let runs = match two_process(o)? {
        Some(Side::Listen(addr, peer)) => vec![stream::listen(o, addr, peer, count)?],
        Some(Side::Connect(addr, bind)) => vec![stream::connect(o, addr, bind, count)?],
        None => (0..o.runs.max(1))
            .map(|_| if o.raw { stream::raw_loopback(o, count) } else { stream::reliable_loopback(o, count) })
            .collect::<anyhow::Result<_>>()?,
    };
    let verified =
        o.raw || runs.iter().all(|r| r.corrupted == 0 && r.out_of_order == 0 && r.delivered == r.messages);
    let m = Measured { mode, size: o.size, count, runs };
    if o.json {
        print_json(&m)?;
    } else {
        table::stream(&m.runs, mode, o.size);
    }
    anyhow::ensure!(verified, "verification failed: lost, reordered or corrupted messages");
    Ok(())
}

fn run_sim(o: &SimOpts) -> anyhow::Result<()> {
    if o.fabric_table {
        return fabric_table(o.topology.as_ref(), o.json);
    }
    let mixes: Vec<tether_sim::FaultMix> = if o.mix.is_empty() {
        tether_sim::FaultMix::ALL.to_vec()
    } else {
        o.mix
            .iter()
            .map(|m| tether_sim::FaultMix::from_name(m).ok_or_else(|| anyhow::anyhow!("unknown mix `{m}`")))
            .collect::<anyhow::Result<_>>()?
    };
    if let Some(t) = &o.topology {
        // Refused now, with the reason, rather than in every run.
        let c = mixes[0].config(o.first_seed);
        tether_sim::FabricPlan::moving(t.clone(), c.nodes, 1, 1, std::time::Duration::ZERO)
            .map_err(|e| anyhow::anyhow!("--topology {t}: {e}"))?;
    }
    // Each mix at each size asked for (none: the mix's own).
    let sizes: Vec<Option<u32>> =
        if o.members.is_empty() { vec![None] } else { o.members.iter().copied().map(Some).collect() };
    let bar = (!o.json).then(|| {
        let b = indicatif::ProgressBar::new(o.seeds * (mixes.len() * sizes.len()) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}")
                .expect("valid template"),
        );
        b
    });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for mix in mixes {
        for &size in &sizes {
            let seeds = o.first_seed..o.first_seed + o.seeds;
            let adjust = |c: &mut tether_sim::SimConfig| {
                if let Some(n) = size {
                    c.nodes = n;
                }
                // The mix's move, on the fabric asked for (as far as it
                // has room: checked above for one hop).
                if let (Some(t), Some(plan)) = (&o.topology, &mut c.fabric) {
                    if let [(node, hops, at)] = plan.moves[..] {
                        if let Ok(p) = tether_sim::FabricPlan::moving(t.clone(), c.nodes, node, hops, at) {
                            *plan = p;
                        }
                    }
                }
            };
            let reports = tether_sim::swarm_with(mix, seeds, threads, adjust, |r| {
                if let Some(b) = &bar {
                    b.set_message(mix.name());
                    b.inc(1);
                }
                if !r.ok() {
                    let members = size.map(|n| format!(" (--members {n})")).unwrap_or_default();
                    failures.push(format!(
                        "{}{members}: {:?}",
                        tether_sim::replay_line(r),
                        r.violations.first()
                    ));
                }
            });
            rows.push(table::SimRow::of(mix, &reports));
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if o.json {
        print_json(&rows)?;
    } else {
        table::sim(&rows);
    }
    for f in &failures {
        eprintln!("{f}");
    }
    anyhow::ensure!(failures.is_empty(), "{} runs violated a guarantee", failures.len());
    Ok(())
}

fn run_bench(o: &BenchOpts) -> anyhow::Result<()> {
    match &o.what {
        Some(BenchWhat::Checksum(c)) => return run_bench_checksum(c),
        Some(BenchWhat::Auth(a)) => return run_bench_auth(a),
        Some(BenchWhat::Shm(s)) => return run_bench_shm(s),
        Some(BenchWhat::Engine(e)) => return run_bench_engine(e),
        Some(BenchWhat::Congestion(c)) => return congestion_bench::run(c),
        Some(BenchWhat::Loss(l)) => return loss_bench::run(l, default_net()?),
        Some(BenchWhat::Contention(c)) => return contention_bench::run(c, default_net()?),
        Some(BenchWhat::Detect(d)) => return detect_bench::run(d),
        Some(BenchWhat::Group(g)) => return group_bench::run(g),
        Some(BenchWhat::Async(a)) => return async_bench::run(a),
        Some(BenchWhat::Calls(c)) => return calls_bench::run(c, default_net()?),
        Some(BenchWhat::Logp(l)) => return logp_bench::run(l, default_net()?),
        Some(BenchWhat::Sweep(w)) => return run_bench_sweep(w),
        None => {}
    }
    let sizes = if o.sizes.is_empty() { bench::SIZES.to_vec() } else { o.sizes.clone() };
    let bar = (!o.net.json).then(|| {
        let b = indicatif::ProgressBar::new(sizes.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
        );
        b
    });
    let mut rows = Vec::new();
    for &size in &sizes {
        let say = |m: &str| {
            if let Some(b) = &bar {
                b.set_message(m.to_string());
            }
        };
        rows.push(bench::row(&o.net, size, &say)?);
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if o.net.json {
        print_json(&rows)
    } else {
        table::bench(&rows, &o.net);
        Ok(())
    }
}

fn run_campaign(o: &campaign::CampaignOpts) -> anyhow::Result<()> {
    if o.engine {
        return run_engine_campaign(o);
    }
    if o.cluster {
        return run_cluster_campaign(o);
    }
    let bar = indicatif::ProgressBar::new(campaign::cell_count(o)?);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} cells {elapsed_precise} {msg}")
            .expect("valid template"),
    );
    let cells = campaign::run(o, |c| {
        bar.set_message(format!("{} {} {} seed {}", c.workload, c.fault, c.rate, c.seed));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    if o.json {
        print_json(&cells)?;
    } else {
        table::campaign(&campaign::rows(&cells));
    }
    if let Some(dir) = &o.out {
        for path in campaign::write_out(dir, o, &cells)? {
            eprintln!("wrote {}", path.display());
        }
    }
    let bad: Vec<_> = cells.iter().filter(|c| !c.ok()).collect();
    for c in &bad {
        eprintln!(
            "{} {} rate {} seed {}: sent {} delivered {} lost {} duplicated {} corrupted {} out of order {} failed {}",
            c.workload, c.fault, c.rate, c.seed, c.sent, c.delivered, c.lost, c.duplicated, c.corrupted, c.out_of_order, c.failed
        );
    }
    anyhow::ensure!(
        bad.is_empty(),
        "{} of {} cells lost, duplicated, reordered or corrupted messages",
        bad.len(),
        cells.len()
    );
    Ok(())
}

/// `tether campaign --cluster`: Figure 5's table (and plots with --out).
fn run_cluster_campaign(o: &campaign::CampaignOpts) -> anyhow::Result<()> {
    let c = o.cluster_campaign();
    let count = (c.rates.len() as u64 + 1) * 2 * c.seeds;
    let bar = (!o.json).then(|| progress_bar(count, "{bar:40} {pos}/{len} cells {elapsed_precise} {msg}"));
    let cells = cluster_campaign::run(&c, |x| {
        if let Some(b) = &bar {
            let at = if x.busy { "busy machine".to_string() } else { format!("rate {}", x.rate) };
            b.set_message(format!("{} {at} seed {}", x.detector, x.seed));
            b.inc(1);
        }
    })?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let rows = cluster_campaign::rows(&cells);
    if o.json {
        print_json(&serde_json::json!({ "cells": cells, "rows": rows }))?;
    } else {
        table::cluster_campaign(&rows, &c);
    }
    if let Some(dir) = &o.out {
        for path in cluster_campaign::write_out(dir, &cells)? {
            eprintln!("wrote {}", path.display());
        }
    }
    let unformed = cells.iter().filter(|x| !x.formed).count();
    anyhow::ensure!(unformed == 0, "{unformed} of {} cells' clusters never formed", cells.len());
    Ok(())
}

/// `tether campaign --engine`: skipped loudly (exit 0) where namespaces
/// cannot be made, so a run without root is never read as a pass.
fn run_engine_campaign(o: &campaign::CampaignOpts) -> anyhow::Result<()> {
    let bar = (!o.json).then(|| progress_bar(0, "{spinner} {elapsed} {msg}"));
    let outcome = engine_campaign::run(o, &telling(&bar));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = match outcome? {
        engine_campaign::Outcome::Skipped(why) => {
            eprintln!("tether campaign --engine: SKIPPED: needs root and iproute2 (ip netns): {why}");
            if o.json {
                print_json(&serde_json::json!({ "skipped": why }))?;
            }
            return Ok(());
        }
        engine_campaign::Outcome::Ran(r) => r,
    };
    if o.json {
        print_json(&report)?;
    } else {
        table::engine_campaign(&report);
    }
    if let Some(dir) = &o.out {
        for path in engine_campaign::write_out(dir, &report)? {
            eprintln!("wrote {}", path.display());
        }
    }
    anyhow::ensure!(report.ok(), "the application saw {}", report.totals);
    Ok(())
}

fn progress_bar(len: u64, template: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len);
    b.set_style(indicatif::ProgressStyle::with_template(template).expect("valid template"));
    b
}

/// The default network options, as `tether stream` with no flags has them
/// (`--mtu auto` resolved: loopback's largest datagram).
fn default_net() -> anyhow::Result<NetOpts> {
    #[derive(Parser)]
    struct Defaults {
        #[command(flatten)]
        net: NetOpts,
    }
    let mut net = Defaults::parse_from(["tether"]).net;
    net.resolve_mtu()?;
    Ok(net)
}

/// What a long measurement says it is doing: on the spinner, if there is one.
fn telling(bar: &Option<indicatif::ProgressBar>) -> impl Fn(&str) + '_ {
    move |m: &str| {
        if let Some(b) = bar {
            b.set_message(m.to_string());
            b.tick();
        }
    }
}

/// A measurement with a spinner while it runs, then its report as JSON or
/// as the table `show` prints.
fn measured<R: serde::Serialize>(
    json: bool,
    run: impl FnOnce(&dyn Fn(&str)) -> anyhow::Result<R>,
    show: impl FnOnce(&R),
) -> anyhow::Result<()> {
    let bar = (!json).then(|| progress_bar(0, "{spinner} {elapsed} {msg}"));
    let report = run(&telling(&bar))?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if json {
        return print_json(&report);
    }
    show(&report);
    Ok(())
}

fn run_bench_sweep(o: &sweep::SweepOpts) -> anyhow::Result<()> {
    let mut written = Vec::new();
    measured(
        o.json,
        |say| {
            let s = sweep::run(o, default_net()?, say)?;
            if let Some(dir) = &o.out {
                written = sweep::write(&s, o, dir)?;
            }
            Ok(s)
        },
        |s| sweep::print(s, o),
    )?;
    for path in written {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn run_bench_shm(o: &shm_bench::ShmOpts) -> anyhow::Result<()> {
    measured(o.json, |say| shm_bench::run(o, say), |r| table::shm(r, o))
}

fn run_bench_engine(o: &engine_bench::EngineBenchOpts) -> anyhow::Result<()> {
    measured(o.json, |say| engine_bench::run(o, &default_net()?, say), |r| table::engine(r, o))
}

fn run_bench_auth(o: &auth_bench::AuthOpts) -> anyhow::Result<()> {
    measured(o.json, |say| auth_bench::run(o, &default_net()?, say), |r| table::auth(r, o))
}

fn run_bench_checksum(o: &bandwidth::ChecksumOpts) -> anyhow::Result<()> {
    let bar = (!o.json).then(|| progress_bar(0, "{spinner} {elapsed} {msg}"));
    let say = telling(&bar);
    if o.errors {
        let r = detection::measure(&o.kinds(), o.error_len, o.trials, o.seed, &say);
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        if o.json {
            return print_json(&r);
        }
        table::detection(&r);
        return Ok(());
    }
    let bandwidth = bandwidth::measure(o, &say);
    let model = if o.model {
        let net = NetOpts { checksum: o.model_checksum, runs: o.model_runs, ..default_net()? };
        say("network: raw pingpong and stream");
        let network = model::measure_network(&net, o.model_runs)?;
        let inputs = model::Inputs::from(&bandwidth, o.model_checksum, network)
            .ok_or_else(|| anyhow::anyhow!("--model needs {} among --algorithms", o.model_checksum.name()))?;
        let mut rows = Vec::new();
        for &size in &o.model_sizes {
            say(&format!("tether stream {size} B, with and without {}", o.model_checksum.name()));
            rows.push(model::row(&net, &inputs, size, o.model_runs)?);
        }
        Some(model::ModelReport { checksum: o.model_checksum.name(), inputs, rows })
    } else {
        None
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if o.json {
        #[derive(serde::Serialize)]
        struct Report {
            #[serde(flatten)]
            bandwidth: bandwidth::BandwidthReport,
            model: Option<model::ModelReport>,
        }
        return print_json(&Report { bandwidth, model });
    }
    table::bandwidth(&bandwidth);
    if let Some(m) = &model {
        table::model(m);
    }
    Ok(())
}

/// `tether sim --fabric-table`: [TB] Table 3 beside the search's figures
/// here (`tether_sim::fabric`; docs/FABRIC.md).
fn fabric_table(topology: Option<&tether_sim::topology::Topology>, json: bool) -> anyhow::Result<()> {
    use tether_sim::fabric::{Fabric, Mapped, MoveRow};
    // [TB] Table 3: host probes, switch probes, total, ms, for 1-4 hops.
    const PAPER: [(u64, u64, u64, f64); 4] =
        [(28, 0, 28, 3.054), (53, 20, 73, 25.855), (83, 41, 124, 48.488), (113, 73, 186, 83.567)];
    let record = |r: &MoveRow| {
        serde_json::json!({
            "hops": r.hops,
            "hosts": r.hosts,
            "found": matches!(r.run.outcome, Mapped::Found(_)),
            "shortest": r.shortest,
            "host_probes": r.run.counts.host,
            "switch_probes": r.run.counts.switch,
            "probes": r.run.counts.total(),
            "rounds": r.run.counts.rounds,
            "ms": r.run.time_ns as f64 / 1e6,
        })
    };
    // The paper's fabric: hosts 1-2 on the first switch, 3-4 on the last;
    // host 4 moved to port 3 of each switch in turn.
    let paper = Fabric::tang_bilas(2).moves(1, 4, Some(3), 4);
    // A thousand hosts: four 256-port switches of 250 hosts each; the last
    // host moved to port 250 of each.
    let thousand = Fabric::chain(4, 256, 250).moves(1, 1000, Some(250), 4);
    // The fabric asked for: its last host moved 1 to 4 switches from its
    // first, to any free port.
    let asked = match topology {
        Some(t) => {
            let f = t.build().map_err(|e| anyhow::anyhow!("--topology {t}: {e}"))?;
            let hosts: Vec<_> = f.hosts().collect();
            let [first, .., last] = hosts[..] else {
                anyhow::bail!("--topology {t}: the fabric has no two hosts to move one from the other")
            };
            let rows = f.moves(first, last, None, 4);
            anyhow::ensure!(
                !rows.is_empty(),
                "--topology {t}: no switch has a free port to move host {last} to"
            );
            Some((t.to_string(), f.switch_count(), rows))
        }
        None => None,
    };
    // Growth: four switches of each size, the last host moved 4 hops.
    let growth: Vec<MoveRow> = [16, 32, 64, 128, 256]
        .into_iter()
        .map(|ports| {
            let f = Fabric::chain(4, ports, ports - 6);
            let last = f.hosts().max().expect("hosts");
            f.moves(1, last, Some((ports - 6) as u8), 4).pop().expect("four hops")
        })
        .collect();
    let per_host: Vec<f64> = growth.iter().map(|r| r.run.counts.total() as f64 / r.hosts as f64).collect();
    if json {
        return print_json(&serde_json::json!({
            "paper": PAPER.iter().enumerate().map(|(i, p)| serde_json::json!({
                "hops": i + 1, "host_probes": p.0, "switch_probes": p.1, "probes": p.2, "ms": p.3
            })).collect::<Vec<_>>(),
            "tang_bilas": paper.iter().map(record).collect::<Vec<_>>(),
            "thousand_hosts": thousand.iter().map(record).collect::<Vec<_>>(),
            "growth": growth.iter().map(record).collect::<Vec<_>>(),
            "topology": asked.as_ref().map(|(name, switches, rows)| serde_json::json!({
                "topology": name, "switches": switches, "moves": rows.iter().map(record).collect::<Vec<_>>(),
            })),
        }));
    }
    println!("Tang and Bilas [TB] Table 3: a host moved 1-4 switches away, found again by breadth-first host and switch probes");
    println!("(times are virtual: 1 us a link, 100 us before a probe is given up; the paper's are its Myrinet cluster's)\n");
    let table = |title: &str, rows: &[MoveRow], paper: bool| {
        println!("{title}");
        println!(
            "{:>5} {:>6} {:>6} {:>12} {:>14} {:>7} {:>7} {:>9}{}",
            "hops",
            "hosts",
            "found",
            "host probes",
            "switch probes",
            "total",
            "rounds",
            "ms",
            if paper { "   paper: host, switch, total, ms" } else { "" }
        );
        for (i, r) in rows.iter().enumerate() {
            let found = if matches!(r.run.outcome, Mapped::Found(ref route) if route.len() == r.shortest) {
                "yes"
            } else {
                "NO"
            };
            let p = PAPER[i.min(3)];
            println!(
                "{:>5} {:>6} {:>6} {:>12} {:>14} {:>7} {:>7} {:>9.3}{}",
                r.hops,
                r.hosts,
                found,
                r.run.counts.host,
                r.run.counts.switch,
                r.run.counts.total(),
                r.run.counts.rounds,
                r.run.time_ns as f64 / 1e6,
                if paper { format!("   {}, {}, {}, {}", p.0, p.1, p.2, p.3) } else { String::new() }
            );
        }
        println!();
    };
    table(
        "the paper's fabric (two 16-port and two 8-port switches in a chain, two links between neighbours):",
        &paper,
        true,
    );
    table("1,000 hosts (four 256-port switches in a chain, 250 hosts on each):", &thousand, false);
    table("growth: four switches of 16 to 256 ports, the last host moved 4 hops:", &growth, false);
    println!(
        "probes per host at 4 hops: {}",
        per_host.iter().map(|p| format!("{p:.2}")).collect::<Vec<_>>().join(", ")
    );
    if let Some((name, switches, rows)) = &asked {
        println!();
        table(
            &format!("{name} ({switches} switches): the last host moved 1-4 switches from the first:"),
            rows,
            false,
        );
    }
    Ok(())
}
