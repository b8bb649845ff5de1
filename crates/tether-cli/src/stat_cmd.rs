//! `tether stat`: a running node looked into, as AeronStat looks into a
//! media driver. It maps the boards a node publishes (`tether_attach::stat`)
//! read-only, so the node never knows it is read, and shows per
//! application, peer and rail what the node is doing: round trips,
//! windows, retransmissions, refusals and drops by reason, engine
//! recoveries. It refreshes like `top` until interrupted, or prints once
//! (`--once`, and always with `--json`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tether_engine::stat::{self, AppStat, NodeStat};
use tether_lab::args;

#[derive(Args, Debug, Clone)]
pub struct StatOpts {
    /// The directory to read: an engine's (`tether engine --dir`), where it
    /// publishes `engine.board`, or any directory endpoints publish their
    /// boards in (`Builder::publish_stats`). Default: the engine's default
    /// directory, /dev/shm/tether-UID.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON document (every board in the directory) and exit.
    #[arg(long)]
    pub json: bool,
    /// Print once and exit, instead of refreshing until interrupted.
    #[arg(long)]
    pub once: bool,
    /// Time between refreshes.
    #[arg(long, default_value = "1s", value_parser = args::duration_in(Duration::from_millis(100), Duration::from_secs(3600), "a refresh"))]
    pub every: Duration,
    /// Refresh this many times, then exit (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// A board not published for this long belongs to a node that is gone or
/// stuck: said beside its numbers.
const STALE_AFTER_MS: u64 = 5_000;

pub fn run(o: &StatOpts) -> anyhow::Result<()> {
    let dir = o.dir.clone().unwrap_or_else(tether_engine::attach::default_dir);
    if o.json {
        let nodes = read_all(&dir)?;
        let doc = serde_json::json!({ "dir": dir, "nodes": nodes });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal();
    let mut shown = 0u64;
    loop {
        let text = match read_all(&dir) {
            Ok(nodes) => render(&dir, &nodes),
            // Refreshing, a node that is not there yet (or any more) is
            // said and looked for again; once, it is the command's failure.
            Err(e) if !(o.once || o.count == 1) => format!("tether stat: {e}\n"),
            Err(e) => return Err(e),
        };
        if terminal && !o.once {
            // Home and clear, as `top` does.
            print!("\x1b[H\x1b[2J");
        } else if shown > 0 {
            println!();
        }
        print!("{text}");
        shown += 1;
        if o.once || (o.count > 0 && shown >= o.count) {
            return Ok(());
        }
        std::thread::sleep(o.every);
    }
}

/// Every board in `dir`, read.
fn read_all(dir: &Path) -> anyhow::Result<Vec<NodeStat>> {
    let boards = match stat::boards_in(dir) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => anyhow::bail!("{}: {e}", dir.display()),
    };
    if boards.is_empty() {
        anyhow::bail!(
            "nothing publishes in {}: start an engine with `tether engine --dir {}`, or give an endpoint \
             `Builder::publish_stats`",
            dir.display(),
            dir.display()
        );
    }
    let mut nodes = Vec::new();
    for b in boards {
        nodes.push(stat::read_board(&b)?);
    }
    Ok(nodes)
}

fn us(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
}

fn bytes(v: u64) -> String {
    match v {
        v if v >= 1 << 20 => format!("{:.1} MiB", v as f64 / (1u64 << 20) as f64),
        v if v >= 1 << 10 => format!("{:.1} KiB", v as f64 / 1024.0),
        v => format!("{v} B"),
    }
}

/// The text of one look at every node in `dir`.
pub fn render(dir: &Path, nodes: &[NodeStat]) -> String {
    let now = stat::unix_ms();
    let mut out = String::new();
    for n in nodes {
        let who = match n.supervisor {
            Some(s) => format!("{} pid {} (supervisor {s})", n.role, n.pid),
            None => format!("{} pid {}", n.role, n.pid),
        };
        let age = now.saturating_sub(n.published_unix_ms);
        let stale = if age > STALE_AFTER_MS {
            format!(" - NOT UPDATED FOR {:.1} s: stopped or stuck?", age as f64 / 1e3)
        } else {
            String::new()
        };
        out += &format!(
            "{who} in {}, rails {}, up {:.1} s{stale}\n",
            dir.display(),
            if n.rails.is_empty() { "-".to_string() } else { n.rails.join(", ") },
            n.uptime_ms as f64 / 1e3
        );
        let own: Vec<String> =
            n.counters.iter().filter(|(_, &v)| v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        if !own.is_empty() {
            out += &format!("  {}\n", own.join(", "));
        }
        for a in &n.applications {
            out += &application(a);
        }
        out += "\n";
    }
    out
}

/// Counters an operator looks at first, in this order; the rest that are
/// not zero follow on a line of their own.
const HEADLINE: [&str; 6] = [
    "messages_sent",
    "messages_delivered",
    "retransmissions",
    "datagrams_sent",
    "datagrams_received",
    "messages_failed",
];

fn application(a: &AppStat) -> String {
    let mut out = format!(
        "  node {} (pid {}, incarnation {:#x}): {} unsettled\n",
        a.node, a.pid, a.incarnation, a.unsettled
    );
    let get = |k: &str| a.counters.get(k).copied().unwrap_or(0);
    let head: Vec<String> =
        HEADLINE.iter().filter(|k| a.counters.contains_key(**k)).map(|k| format!("{k} {}", get(k))).collect();
    out += &format!("    {}\n", head.join(", "));
    let stats = tether::Stats::from_values(tether::Stats::default().fields().iter().map(|(k, _)| get(k)));
    for cause in tether::Refused::from_stats(&stats).causes() {
        out += &format!("    refused: {cause}\n");
    }
    let rest: Vec<String> = a
        .counters
        .iter()
        .filter(|(k, &v)| v > 0 && !HEADLINE.contains(&k.as_str()))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !rest.is_empty() {
        out += &format!("    also: {}\n", rest.join(", "));
    }
    if a.peers.is_empty() {
        out += "    no peers\n";
        return out;
    }
    let mut t = crate::table::table(&[
        "peer",
        "session",
        "rtt us",
        "window",
        "in flight",
        "buffered",
        "congestion",
        "rail",
        "path",
        "path rtt us",
        "sent",
        "retransmits",
        "received",
    ]);
    for p in &a.peers {
        let peer = [
            p.peer.to_string(),
            if p.session { "up" } else { "none" }.to_string(),
            us(p.rtt_us),
            p.window_bytes.map(bytes).unwrap_or_else(|| "unlimited".into()),
            bytes(p.in_flight_bytes),
            bytes(p.buffered_bytes),
            p.congestion.clone(),
        ];
        if p.paths.is_empty() {
            let mut row = peer.to_vec();
            row.extend(["-", "-", "-", "-", "-", "-"].map(String::from));
            t.add_row(row);
        }
        for (i, path) in p.paths.iter().enumerate() {
            let c = |k: &str| path.counters.get(k).copied().unwrap_or(0).to_string();
            let mut row: Vec<String> = if i == 0 { peer.to_vec() } else { vec![String::new(); peer.len()] };
            row.extend([
                path.rail.to_string(),
                path.state.clone(),
                us(path.rtt_us),
                c("datagrams_sent"),
                c("retransmits"),
                c("datagrams_received"),
            ]);
            t.add_row(row);
        }
    }
    crate::table::right(&mut t);
    for line in t.to_string().lines() {
        out += &format!("    {line}\n");
    }
    out
}
