//! `tether report`: every experiment of the five papers run again, each
//! figure written beside the paper's, into one generated block of
//! docs/RESULTS.md with the command, date and machine that produced it.
//!
//! Each experiment is the `tether` command that already measures it, run
//! as a child process of this one with `--json` (so each runs alone, as a
//! user would run it, and its numbers are the ones its own tables print):
//! Zhou et al. [FTGM] Table 1 (`campaign --engine`), Figure 10 and
//! Table 2 (`bench engine`); Tang and Bilas [TB] Table 3 (`sim
//! --fabric-table`, `sim --mix fabric_move,...`) and Figures 5-9 (`bench
//! sweep`); Li et al. [CI] Tables 5-6 (`bench`), Figures 3-4
//! (`campaign`) and Figure 5 (`campaign --cluster`); Trahay et al.
//! [NMAD] Figure 4's table and T(L) (`bench checksum --model`); Kaur
//! [AMVIA] the LogGP parameters (`bench logp`) and the performability
//! model (`model`). `--quick` runs each at a size of seconds; without it
//! each runs at its own defaults.
//!
//! The block sits between two marker lines; the rest of the file (the
//! dated record of earlier runs) is left as it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::Value;

/// The first and last lines of the generated block.
pub const BEGIN: &str =
    "<!-- tether report: begin (written by `tether report`; edits inside are overwritten) -->";
pub const END: &str = "<!-- tether report: end -->";

/// `tether report`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportOpts {
    /// Each experiment at a size of seconds (the whole report in a minute
    /// or two) instead of at its own defaults (tens of minutes on two cores).
    #[arg(long)]
    pub quick: bool,
    /// The markdown file the report's block is written into (between its
    /// marker lines, or appended); created if missing.
    #[arg(long, default_value = "docs/RESULTS.md")]
    pub out: PathBuf,
    /// Where the experiments' plots (PNG) are written.
    #[arg(long, default_value = "docs/report")]
    pub plots: PathBuf,
    /// Only these sections, comma-separated (keys: ftgm-table1,
    /// ftgm-fig10, ftgm-table2, tb-table3, tb-move, tb-figs, ci-tables,
    /// ci-figs34, ci-fig5, nmad-fig4, amvia-loggp, amvia-model).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Print one JSON document (every section: its command, time and
    /// markdown) instead of writing the file.
    #[arg(long)]
    pub json: bool,
}

/// One experiment: the `tether` arguments that run it (`--json` added).
struct Experiment {
    key: &'static str,
    args: &'static [&'static str],
    /// A file or directory under the plots directory, given after `args`
    /// (which end with the option that takes it).
    plots: Option<&'static str>,
    /// Added for `--quick`, and for the full run.
    quick: &'static [&'static str],
    full: &'static [&'static str],
}

impl Experiment {
    fn args(&self, quick: bool, plots: &Path) -> Vec<String> {
        let mut a: Vec<String> = self.args.iter().map(|a| a.to_string()).collect();
        a.extend(self.plots.map(|name| plots.join(name).display().to_string()));
        a.extend(if quick { self.quick } else { self.full }.iter().map(|a| a.to_string()));
        a
    }
}

/// One section of the report: a paper's figure, the experiment that
/// answers it, and how its JSON becomes markdown beside the paper's.
struct Section {
    key: &'static str,
    title: &'static str,
    experiment: &'static str,
    render: fn(&Value) -> anyhow::Result<String>,
}

/// What one experiment came to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ran {
    pub experiment: String,
    pub command: String,
    pub seconds: f64,
    /// Why it gave no figures (not run as root, a failure), if it did not.
    pub skipped: Option<String>,
    #[serde(skip)]
    value: Option<Value>,
}

/// A section as written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Written {
    pub key: String,
    pub title: String,
    pub command: String,
    pub seconds: f64,
    /// Rendered from this run's figures (false: skipped, with why).
    pub figures: bool,
    pub markdown: String,
}

const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        key: "engine-campaign",
        args: &["campaign", "--engine", "--out"],
        plots: Some("engine-campaign"),
        quick: &["--classes", "kill,hang", "--strikes", "10"],
        // The other classes need the engine's fault hook.
        full: if cfg!(feature = "fault-hook") { &[] } else { &["--classes", "kill,hang"] },
    },
    Experiment {
        key: "bench-engine",
        args: &["bench", "engine"],
        plots: None,
        quick: &[
            "--runs",
            "3",
            "--round-trips",
            "2000",
            "--stream-messages",
            "500",
            "--small-messages",
            "50000",
            "--kills",
            "20",
            "--hangs",
            "20",
        ],
        full: &[],
    },
    Experiment { key: "fabric-table", args: &["sim", "--fabric-table"], plots: None, quick: &[], full: &[] },
    Experiment {
        key: "fabric-move",
        args: &["sim", "--mix", "fabric_move,fabric_move_1000,fabric_move_torus,fabric_move_random"],
        plots: None,
        quick: &["--seeds", "20"],
        full: &["--seeds", "100"],
    },
    Experiment {
        key: "sweep",
        args: &["bench", "sweep", "--out"],
        plots: Some("sweep"),
        quick: &["--quick", "--runs", "1"],
        full: &[],
    },
    Experiment {
        key: "bench",
        args: &["bench", "--sizes", "8,64,1024,4096"],
        plots: None,
        quick: &["--runs", "3", "--count", "50000"],
        full: &[],
    },
    Experiment {
        key: "campaign",
        args: &["campaign", "--out"],
        plots: Some("campaign"),
        quick: &["--rates", "0.01", "--seeds", "2", "--messages", "2000", "--rounds", "20"],
        full: &[],
    },
    Experiment {
        key: "cluster-campaign",
        args: &["campaign", "--cluster", "--out"],
        plots: Some("cluster-campaign"),
        quick: &["--seeds", "1", "--cell-secs", "1", "--rates", "0.001,0.01"],
        full: &[],
    },
    Experiment {
        key: "checksum",
        args: &["bench", "checksum", "--model"],
        plots: None,
        quick: &["--runs", "3", "--large-mib", "16", "--model-runs", "3"],
        full: &[],
    },
    Experiment {
        key: "logp",
        args: &["bench", "logp", "--plot"],
        plots: Some("logp.png"),
        quick: &["--sizes", "8,1024,16384,65536"],
        full: &[],
    },
    Experiment {
        key: "model",
        args: &["model"],
        plots: None,
        quick: &["--rates", "1e-4,1e-3,1e-2", "--count", "2000", "--runs", "3"],
        full: &[],
    },
];

const SECTIONS: &[Section] = &[
    Section {
        key: "ftgm-table1",
        title: "Zhou et al. [FTGM] Table 1: faults injected into the engine, and what caught them",
        experiment: "engine-campaign",
        render: ftgm_table1,
    },
    Section {
        key: "ftgm-fig10",
        title: "Zhou et al. [FTGM] Figure 10: recovery of a failed engine",
        experiment: "bench-engine",
        render: ftgm_fig10,
    },
    Section {
        key: "ftgm-table2",
        title: "Zhou et al. [FTGM] Table 2: what the engine and its fault tolerance cost",
        experiment: "bench-engine",
        render: ftgm_table2,
    },
    Section {
        key: "tb-table3",
        title: "Tang and Bilas [TB] Table 3: a host moved, found again by probes",
        experiment: "fabric-table",
        render: tb_table3,
    },
    Section {
        key: "tb-move",
        title: "Tang and Bilas [TB] section 4.2: the move in a running stream",
        experiment: "fabric-move",
        render: tb_move,
    },
    Section {
        key: "tb-figs",
        title: "Tang and Bilas [TB] Figures 5-9: timer, send queue and error rate",
        experiment: "sweep",
        render: tb_figs,
    },
    Section {
        key: "ci-tables",
        title: "Li et al. [CI] Tables 5-6: the reliable layer over the unreliable one",
        experiment: "bench",
        render: ci_tables,
    },
    Section {
        key: "ci-figs34",
        title: "Li et al. [CI] Figures 3-4: workloads under message faults",
        experiment: "campaign",
        render: ci_figs34,
    },
    Section {
        key: "ci-fig5",
        title: "Li et al. [CI] Figure 5: the cluster under message faults",
        experiment: "cluster-campaign",
        render: ci_fig5,
    },
    Section {
        key: "nmad-fig4",
        title: "Trahay et al. [NMAD] Figure 4 and the T(L) model: checksums",
        experiment: "checksum",
        render: nmad_fig4,
    },
    Section {
        key: "amvia-loggp",
        title: "Kaur [AMVIA] section 3.5: LogGP parameters of messages and calls",
        experiment: "logp",
        render: amvia_loggp,
    },
    Section {
        key: "amvia-model",
        title: "Kaur [AMVIA] chapter 4: the performability model against measurement",
        experiment: "model",
        render: amvia_model,
    },
];

/// Run the report.
pub fn run(o: &ReportOpts) -> anyhow::Result<()> {
    for k in &o.only {
        if !SECTIONS.iter().any(|s| s.key == k) {
            let keys: Vec<&str> = SECTIONS.iter().map(|s| s.key).collect();
            bail!("--only: no section `{k}` (sections: {})", keys.join(", "));
        }
    }
    let sections: Vec<&Section> =
        SECTIONS.iter().filter(|s| o.only.is_empty() || o.only.iter().any(|k| k == s.key)).collect();
    std::fs::create_dir_all(&o.plots).with_context(|| format!("plots directory {}", o.plots.display()))?;
    let exe = std::env::current_exe().context("the running tether's path")?;
    let started = Instant::now();
    let mut ran: Vec<Ran> = Vec::new();
    for sec in &sections {
        if ran.iter().any(|r| r.experiment == sec.experiment) {
            continue;
        }
        let e =
            EXPERIMENTS.iter().find(|e| e.key == sec.experiment).expect("every section's experiment exists");
        eprintln!("tether report: {} ...", e.key);
        let r = run_one(&exe, e, o.quick, &o.plots);
        eprintln!(
            "tether report: {} {} in {:.1} s",
            e.key,
            if r.skipped.is_some() { "gave no figures" } else { "done" },
            r.seconds
        );
        ran.push(r);
    }
    let written: Vec<Written> = sections
        .iter()
        .map(|sec| {
            let r = ran.iter().find(|r| r.experiment == sec.experiment).expect("run above");
            let (figures, markdown) = match (&r.value, &r.skipped) {
                (Some(v), None) => match (sec.render)(v) {
                    Ok(md) => (true, md),
                    Err(e) => (false, format!("No figures: the output did not read: {e:#}.\n")),
                },
                (_, Some(why)) => (false, format!("No figures from this run: {why}.\n")),
                (None, None) => (false, "No figures from this run.\n".into()),
            };
            Written {
                key: sec.key.into(),
                title: sec.title.into(),
                command: r.command.clone(),
                seconds: r.seconds,
                figures,
                markdown,
            }
        })
        .collect();
    if o.json {
        let doc = serde_json::json!({
            "quick": o.quick,
            "seconds": started.elapsed().as_secs_f64(),
            "machine": machine(),
            "sections": written,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let block = block(o, &written, started.elapsed().as_secs_f64());
    write_block(&o.out, &block)?;
    let missing: Vec<&str> = written.iter().filter(|w| !w.figures).map(|w| w.key.as_str()).collect();
    eprintln!(
        "tether report: wrote {} sections into {} in {:.0} s{}",
        written.len(),
        o.out.display(),
        started.elapsed().as_secs_f64(),
        if missing.is_empty() { String::new() } else { format!("; without figures: {}", missing.join(", ")) }
    );
    Ok(())
}

fn run_one(exe: &Path, e: &Experiment, quick: bool, plots: &Path) -> Ran {
    let mut args = e.args(quick, plots);
    args.push("--json".into());
    let command = format!("tether {}", args.join(" "));
    let t = Instant::now();
    let out = Command::new(exe).args(&args).stdin(Stdio::null()).stderr(Stdio::piped()).output();
    let seconds = t.elapsed().as_secs_f64();
    let mut ran = Ran { experiment: e.key.into(), command, seconds, skipped: None, value: None };
    let out = match out {
        Ok(out) => out,
        Err(err) => {
            ran.skipped = Some(format!("it did not start: {err}"));
            return ran;
        }
    };
    // A campaign prints its document and then fails when a cell lost a
    // message: the document is what shows it.
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(v) => {
            if let Some(why) = v.get("skipped").and_then(Value::as_str) {
                ran.skipped = Some(format!("skipped: {why}"));
            }
            ran.value = Some(v);
        }
        Err(_) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            ran.skipped = Some(format!("it failed ({}): {}", out.status, last.trim()));
        }
    }
    ran
}

/// Where and on what the report ran.
fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    // Figures from a tree with changes not yet committed are not that
    // commit's: say so.
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    let commit = if dirty { format!("{commit} with changes not committed") } else { commit };
    serde_json::json!({ "cpu": cpu, "cores": cores, "kernel": kernel, "commit": commit })
}

fn block(o: &ReportOpts, written: &[Written], seconds: f64) -> String {
    let m = machine();
    let date = utc_now();
    let mut b = String::new();
    b.push_str(BEGIN);
    b.push_str("\n\n## Every experiment of the five papers (`tether report`)\n\n");
    b.push_str(&format!(
        "`tether report{}` on {date}: {} ({} cores), Linux {}, commit {}; {:.0} s in all. Each section \
         gives the command that measured it (run by the report as a child process) and its time; \
         the papers' figures are their hardware's (docs/REFERENCES.md). {}\n",
        if o.quick { " --quick" } else { "" },
        m["cpu"].as_str().unwrap_or(""),
        m["cores"],
        m["kernel"].as_str().unwrap_or(""),
        m["commit"].as_str().unwrap_or(""),
        seconds,
        if o.quick {
            "This is the quick run: every experiment at a size of seconds, so the spread is wider than \
             in the dated sections below; `tether report` runs each at its own defaults (17 minutes here, 2026-12-03)."
        } else {
            ""
        }
    ));
    for w in written {
        b.push_str(&format!("\n### {}\n\n`{}` ({:.1} s)\n\n{}", w.title, w.command, w.seconds, w.markdown));
    }
    let plots = plots_from(&o.plots, &o.out);
    if !plots.is_empty() {
        b.push_str("\n### Plots of this run\n\n");
        for p in plots {
            b.push_str(&format!("- [{p}]({p})\n"));
        }
    }
    b.push('\n');
    b.push_str(END);
    b.push('\n');
    b
}

/// The PNGs under `plots`, as links from the directory of `out`.
fn plots_from(plots: &Path, out: &Path) -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "png") {
                found.push(p);
            }
        }
    }
    let mut found = Vec::new();
    walk(plots, &mut found);
    found.sort();
    let base = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    found
        .iter()
        .map(|p| {
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            abs.strip_prefix(&base).map_or_else(|_| abs.display().to_string(), |r| r.display().to_string())
        })
        .collect()
}

/// The date and time now, UTC, as `2026-12-03 04:10 UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y}-{mo:02}-{d:02} {:02}:{:02} UTC", rest / 3600, rest % 3600 / 60)
}

/// Put `block` in `path` in place of the old one (or at the end).
fn write_block(path: &Path, block: &str) -> anyhow::Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(a), Some(z)) if a < z => {
            let z = z + END.len();
            let z = if old[z..].starts_with('\n') { z + 1 } else { z };
            format!("{}{block}{}", &old[..a], &old[z..])
        }
        (None, None) => {
            let sep = if old.is_empty() || old.ends_with("\n\n") {
                ""
            } else if old.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{old}{sep}{block}")
        }
        _ => bail!("{}: the report's marker lines are out of order or one is missing", path.display()),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

// ---- reading the experiments' documents ----

fn f(v: &Value, key: &str) -> anyhow::Result<f64> {
    v.get(key).and_then(Value::as_f64).with_context(|| format!("no number `{key}`"))
}

fn u(v: &Value, key: &str) -> anyhow::Result<u64> {
    v.get(key).and_then(Value::as_u64).with_context(|| format!("no count `{key}`"))
}

fn arr<'a>(v: &'a Value, key: &str) -> anyhow::Result<&'a Vec<Value>> {
    v.get(key).and_then(Value::as_array).with_context(|| format!("no list `{key}`"))
}

/// A summary's median, with min-max beside it: `1.59 (1.20-2.28)`.
fn spread(v: &Value, key: &str, digits: usize) -> String {
    match v.get(key) {
        Some(sum) if sum.get("median").and_then(Value::as_f64).is_some() => format!(
            "{:.d$} ({:.d$}-{:.d$})",
            sum["median"].as_f64().unwrap_or(f64::NAN),
            sum["min"].as_f64().unwrap_or(f64::NAN),
            sum["max"].as_f64().unwrap_or(f64::NAN),
            d = digits
        ),
        _ => "-".into(),
    }
}

fn median(v: &Value, key: &str) -> anyhow::Result<f64> {
    v.get(key)
        .and_then(|s| s.get("median"))
        .and_then(Value::as_f64)
        .with_context(|| format!("no median `{key}`"))
}

fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        t.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    t
}

fn ftgm_table1(v: &Value) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for c in arr(v, "classes")?.iter().chain(std::iter::once(&v["all"])) {
        rows.push(vec![
            c["class"].as_str().unwrap_or("?").to_string(),
            u(c, "injected")?.to_string(),
            u(c, "crash")?.to_string(),
            u(c, "watchdog")?.to_string(),
            u(c, "self_test")?.to_string(),
            u(c, "no_effect")?.to_string(),
            u(c, "undetected")?.to_string(),
            c["coverage_pct"].as_f64().map_or("-".into(), |p| format!("{p:.1}")),
            spread(c, "recovery_ms", 3),
        ]);
    }
    // An episode that broke (a stall that never resumed) is the campaign
    // finding a recovery that failed: said, with the strikes that did it.
    let broken = v["broken_episodes"].as_u64().unwrap_or(0);
    let mut broke = String::new();
    if broken > 0 {
        let strikes: Vec<String> = arr(v, "strikes")?
            .iter()
            .filter(|s| {
                s["recovery_ms"].is_null() && s["effect"].as_str().is_some_and(|e| e.contains("stall"))
            })
            .map(|s| {
                format!(
                    "strike {} ({}, {} engine, at {:.0} ms)",
                    s["n"],
                    s["class"].as_str().unwrap_or("?"),
                    s["side"].as_str().unwrap_or("?"),
                    s["at_ms"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        broke = format!(
            "**{broken} of {} episodes broke**: the stream did not resume after {}; the messages it had not \
             delivered are counted lost, and the next strikes ran on fresh engines.\n\n",
            v["episodes"],
            if strikes.is_empty() { "a strike".into() } else { strikes.join(", ") }
        );
    }
    Ok(format!(
        "{}\nMessages {} sent, {} delivered, {} lost, {} duplicated, {} corrupted.\n\n{broke}\
         [FTGM] Table 1 (single bit flips in the NIC's SRAM and registers, LANai 9): coverage 99.3% \
         over `send_chunk` (1,056 faults, 40% of them failures: 30.5% hangs caught by the watchdog, \
         67.8% by the self-test, 1.7% host crashes), 99.2% over the DMA registers (192), about 95.6% \
         over the entire code segment (1,430 faults, 88 failures).\n",
        table(
            &[
                "class",
                "injected",
                "crash",
                "watchdog",
                "self-test",
                "no effect",
                "undetected",
                "coverage %",
                "recovery ms"
            ],
            &rows
        ),
        u(v, "messages")?,
        u(v, "delivered")?,
        u(v, "lost")?,
        u(v, "duplicated")?,
        u(v, "corrupted")?,
    ))
}

fn ftgm_fig10(v: &Value) -> anyhow::Result<String> {
    let r = &v["recovery"];
    let rows = vec![
        vec![
            "engine killed (SIGKILL): to the first message of the new one".into(),
            spread(r, "kill_recovery_ms", 3),
            "about 765 (FTD recovery; 500 of it reloading the NCP)".into(),
        ],
        vec![
            "engine hung (SIGSTOP): detected".into(),
            spread(r, "hang_detection_ms", 3),
            "watchdog interval 0.8".into(),
        ],
        vec![
            "engine hung: to the first message of the new one".into(),
            spread(r, "hang_recovery_ms", 3),
            "about 900 (per-port recovery)".into(),
        ],
    ];
    Ok(format!(
        "{}\n{} kills and {} hangs; {} messages, {} lost, {} duplicated, {} corrupted; {} replacements nobody caused.\n",
        table(&["event", "tether ms, median (min-max)", "[FTGM] ms"], &rows),
        u(r, "kills")?,
        u(r, "hangs")?,
        u(r, "messages")?,
        u(r, "lost")?,
        u(r, "duplicated")?,
        u(r, "corrupted")?,
        u(r, "spurious_replacements")?,
    ))
}

fn ftgm_table2(v: &Value) -> anyhow::Result<String> {
    let rows = vec![
        vec![
            "round trip, 8 B: raw UDP / embedded / engine, us".into(),
            format!(
                "{} / {} / {}",
                spread(v, "rtt_raw_us", 2),
                spread(v, "rtt_embedded_us", 2),
                spread(v, "rtt_engine_us", 2)
            ),
            "latency (half a round trip) GM 11.50, FTGM 13.00".into(),
        ],
        vec![
            "engine over embedded, round trip".into(),
            spread(v, "rtt_ratio", 3),
            "FTGM over GM 1.130".into(),
        ],
        vec![
            "64 KiB stream: embedded / engine, MB/s".into(),
            format!("{} / {}", spread(v, "stream_embedded_mb_s", 1), spread(v, "stream_engine_mb_s", 1)),
            "bandwidth GM 92.4, FTGM 92.0".into(),
        ],
        vec![
            "host-side backup, us a message".into(),
            spread(v, "backup_us_per_msg", 4),
            "housekeeping 0.25 on send, 0.4 on receive".into(),
        ],
        vec![
            "stream with self-test over without".into(),
            spread(v, "selftest_ratio", 3),
            "FDGM, self-test every 0.5 s: bandwidth -3.4%".into(),
        ],
        vec!["CPU a message, engine over embedded".into(), spread(v, "cpu_ratio", 2), "-".into()],
    ];
    Ok(table(&["what", "tether, median (min-max)", "[FTGM] Table 2"], &rows))
}

fn tb_table3(v: &Value) -> anyhow::Result<String> {
    let paper = arr(v, "paper")?;
    let tb = arr(v, "tang_bilas")?;
    let thousand = arr(v, "thousand_hosts")?;
    let mut rows = Vec::new();
    for (i, p) in paper.iter().enumerate() {
        let cell = |r: Option<&Value>| -> anyhow::Result<String> {
            let Some(r) = r else { return Ok("-".into()) };
            Ok(format!(
                "{} + {} = {}, {:.3} ms",
                u(r, "host_probes")?,
                u(r, "switch_probes")?,
                u(r, "probes")?,
                f(r, "ms")?
            ))
        };
        rows.push(vec![
            (i + 1).to_string(),
            format!(
                "{} + {} = {}, {:.3} ms",
                u(p, "host_probes")?,
                u(p, "switch_probes")?,
                u(p, "probes")?,
                f(p, "ms")?
            ),
            cell(tb.get(i))?,
            cell(thousand.get(i))?,
        ]);
    }
    Ok(format!(
        "{}\nHost + switch probes = total, and the search's time (tether's virtual: 1 us a link, 100 us \
         for an unanswered probe). The paper's fabric: two 16-port and two 8-port switches in a chain; \
         1,000 hosts: four 256-port switches.\n",
        table(&["hops", "[TB] Table 3", "tether, the paper's fabric", "tether, 1,000 hosts"], &rows)
    ))
}

fn tb_move(v: &Value) -> anyhow::Result<String> {
    let rows_in = v.as_array().context("a list of mixes")?;
    let mut rows = Vec::new();
    let mut by = Vec::new();
    for r in rows_in {
        let fab = r.get("fabric").filter(|f| !f.is_null()).context("a fabric mix")?;
        rows.push(vec![
            r["mix"].as_str().unwrap_or("?").into(),
            format!("`{}`", fab["topology"].as_str().unwrap_or("?")),
            u(fab, "hosts")?.to_string(),
            u(r, "runs")?.to_string(),
            u(r, "sent")?.to_string(),
            u(r, "delivered")?.to_string(),
            u(r, "failed")?.to_string(),
            u(r, "failed_runs")?.to_string(),
            u(fab, "searches")?.to_string(),
        ]);
        for h in arr(fab, "by_hops")? {
            by.push(vec![
                r["mix"].as_str().unwrap_or("?").into(),
                u(h, "hops")?.to_string(),
                format!("{:.1}", f(h, "host_probes")? + f(h, "switch_probes")?),
                format!("{:.0}", f(h, "us")?),
                format!("{:.2}", f(h, "noticed_ms")?),
                ["28", "73", "124", "186"].get(u(h, "hops")? as usize - 1).unwrap_or(&"-").to_string(),
            ]);
        }
    }
    Ok(format!(
        "{}\n{}\nTwo rails, each a source-routed fabric, 2% loss; node 1 moved 1 to 4 hops away mid-stream. \
         Nothing may be lost; the peers find it again after the core judges the paths down. [TB]'s fabric was a \
         chain, where the search grows linearly with the hops; around a torus the switches within reach, and \
         the probes, grow as the square of the distance.\n",
        table(
            &["mix", "fabric", "hosts", "runs", "sent", "delivered", "failed", "violating runs", "route searches"],
            &rows
        ),
        table(
            &[
                "mix",
                "hops",
                "probes to find the moved node",
                "us (virtual)",
                "ms from the move",
                "[TB] probes"
            ],
            &by
        )
    ))
}

fn tb_figs(v: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    let findings = arr(v, "findings")?;
    let rows: Vec<Vec<String>> = findings
        .iter()
        .map(|x| vec![x["paper"].as_str().unwrap_or("").into(), x["tether"].as_str().unwrap_or("").into()])
        .collect();
    out.push_str(&table(&["[TB]", "tether, this run"], &rows));
    // Figure 6's analogue: bandwidth against the error rate at window 32,
    // relative to the same setting error-free (selective repair).
    let points = arr(v, "points")?;
    let sel: Vec<&Value> = points.iter().filter(|p| p["mode"] == "selective" && p["window"] == 32).collect();
    let mut rates: Vec<f64> = sel.iter().filter_map(|p| p["rate"].as_f64()).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut timers: Vec<u64> = sel.iter().filter_map(|p| p["timer_us"].as_u64()).collect();
    timers.sort_unstable();
    timers.dedup();
    let mut t = Vec::new();
    for timer in &timers {
        let mut row = vec![format!("{timer} us")];
        for rate in &rates {
            let p = sel
                .iter()
                .find(|p| p["timer_us"].as_u64() == Some(*timer) && p["rate"].as_f64() == Some(*rate));
            row.push(p.map_or("-".into(), |p| {
                format!(
                    "{:.1} MB/s ({})",
                    p["mb_s"].as_f64().unwrap_or(f64::NAN),
                    p["relative"].as_f64().map_or("-".into(), |r| format!("{r:.2}"))
                )
            }));
        }
        t.push(row);
    }
    let head: Vec<String> = std::iter::once("timer, window 32".to_string())
        .chain(rates.iter().map(|r| format!("loss {r}")))
        .collect();
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    out.push_str(
        "\nBandwidth by timer and error rate, selective repair, window 32 (relative to error-free):\n\n",
    );
    out.push_str(&table(&head, &t));
    out.push_str(&format!(
        "\n{} application-kernel settings measured; plots in the `--out` directory (`sweep-timer-*.png`, `sweep-window-*.png`, `sweep-kernel-*.png`).\n",
        arr(v, "kernels")?.len()
    ));
    Ok(out)
}

fn ci_tables(v: &Value) -> anyhow::Result<String> {
    // [CI] Table 5 (one-way latency, us) and Table 6 (throughput, MB/s):
    // CL (unreliable) and RCL (reliable), by message size.
    const PAPER: [(u64, f64, f64, f64, f64); 4] = [
        (4, 26.5, 30.9, 0.147, 0.12),
        (64, 28.6, 32.16, 2.28, 1.94),
        (1024, 56.5, 72.0, 30.27, 25.3),
        (4096, 127.0, 170.0, 72.46, 67.0),
    ];
    let mut rows = Vec::new();
    for (i, r) in v.as_array().context("a list of sizes")?.iter().enumerate() {
        let raw = median(r, "pingpong_raw_us")? / 2.0;
        let rel = median(r, "pingpong_tether_us")? / 2.0;
        let sraw = median(r, "stream_raw_mb_s")?;
        let srel = median(r, "stream_tether_mb_s")?;
        let p = PAPER.get(i);
        rows.push(vec![
            u(r, "size")?.to_string(),
            format!("{raw:.2} / {rel:.2} = {:.3}", rel / raw),
            p.map_or("-".into(), |p| format!("{} / {} = {:.3}", p.1, p.2, p.2 / p.1)),
            format!("{sraw:.1} / {srel:.1} = {:.3}", srel / sraw),
            p.map_or("-".into(), |p| format!("{} / {} = {:.3}", p.3, p.4, p.4 / p.3)),
        ]);
    }
    Ok(format!(
        "{}\ntether's unreliable layer is the bare transport (`tether-io`, the paper's CL), its reliable one \
         tether (RCL); latency is half the median round trip. The paper's sizes are 4, 64, 1024 and \
         4096 B; tether's first row is 8 B (a message carries its count).\n",
        table(&["bytes", "one way, us: unreliable / reliable", "[CI] Table 5: CL / RCL", "MB/s: unreliable / reliable", "[CI] Table 6: CL / RCL"], &rows)
    ))
}

fn ci_figs34(v: &Value) -> anyhow::Result<String> {
    use std::collections::BTreeMap;
    let mut cells: BTreeMap<(String, String, String), Vec<&Value>> = BTreeMap::new();
    for c in v.as_array().context("a list of cells")? {
        let key = (
            c["workload"].as_str().unwrap_or("?").to_string(),
            c["fault"].as_str().unwrap_or("?").to_string(),
            format!("{}", c["rate"].as_f64().unwrap_or(0.0)),
        );
        cells.entry(key).or_default().push(c);
    }
    let mut rows = Vec::new();
    for ((w, fault, rate), cs) in &cells {
        let sum = |k: &str| cs.iter().map(|c| c[k].as_u64().unwrap_or(0)).sum::<u64>();
        let mut rel: Vec<f64> = cs.iter().filter_map(|c| c["relative_time"].as_f64()).collect();
        rel.sort_by(f64::total_cmp);
        rows.push(vec![
            w.clone(),
            fault.clone(),
            rate.clone(),
            cs.len().to_string(),
            sum("sent").to_string(),
            format!("{} / {} / {}", sum("lost"), sum("duplicated"), sum("corrupted")),
            sum("injected").to_string(),
            rel.get(rel.len() / 2).map_or("-".into(), |m| format!("{m:.2}")),
        ]);
    }
    Ok(format!(
        "{}\n[CI] Figures 3-4: every message delivered under every fault kind; CPU-bound runs within 5% of \
         the fault-free average, communication-bound ones up to 15%.\n",
        table(
            &[
                "workload",
                "fault",
                "rate",
                "seeds",
                "sent",
                "lost / dup / corrupt",
                "injected",
                "time vs fault-free"
            ],
            &rows
        )
    ))
}

fn ci_fig5(v: &Value) -> anyhow::Result<String> {
    use std::collections::BTreeMap;
    let mut cells: BTreeMap<(String, String), Vec<&Value>> = BTreeMap::new();
    for c in arr(v, "cells")? {
        let what = if c["busy"].as_bool() == Some(true) {
            "busy thread per core".to_string()
        } else {
            format!("{} each", c["rate"].as_f64().unwrap_or(0.0))
        };
        cells.entry((c["detector"].as_str().unwrap_or("?").to_string(), what)).or_default().push(c);
    }
    let mut rows = Vec::new();
    for ((det, what), cs) in &cells {
        let sum = |k: &str| cs.iter().map(|c| c[k].as_u64().unwrap_or(0)).sum::<u64>();
        let per = |k: &str| {
            if sum("injected") == 0 {
                "-".into()
            } else {
                format!("{:.3}", sum(k) as f64 / sum("injected") as f64)
            }
        };
        rows.push(vec![
            det.clone(),
            what.clone(),
            sum("injected").to_string(),
            per("retransmissions"),
            per("duplicates"),
            sum("false_alarms").to_string(),
            sum("self_diagnosis").to_string(),
            format!("{} ({})", sum("suspicions"), sum("refuted")),
        ]);
    }
    Ok(format!(
        "{}\n[CI] Figure 5 (no numbers in its text): R and D per injected fault stay constant across fault \
         rates; false alarms (A) and self-diagnosis (S) grow more slowly than the rate.\n",
        table(
            &["detector", "faults", "injected", "R / fault", "D / fault", "A", "S", "suspicions (refuted)"],
            &rows
        )
    ))
}

fn nmad_fig4(v: &Value) -> anyhow::Result<String> {
    // [NMAD] Figure 4, MB/s on 32 kB blocks (Xeon X5650).
    const PAPER: [(&str, &str, f64); 7] = [
        ("sum", "plain sum", 24102.98),
        ("xor", "xor", 15964.92),
        ("adler32", "Adler-32", 1764.71),
        ("fletcher64", "Fletcher-64", 6088.44),
        ("fnv1a", "Fowler/Noll/Vo", 6102.05),
        ("murmur3", "MurmurHash2a", 6091.84),
        ("crc32c", "SSE4.2 CRC32", 8129.00),
    ];
    let mut rows = vec![vec![
        "memcpy".into(),
        spread(&v["memcpy_gb_s"], "in_cache", 1),
        "-".into(),
        "copy 4530 MB/s".into(),
    ]];
    for a in arr(v, "algorithms")? {
        let name = a["name"].as_str().unwrap_or("?");
        let paper =
            PAPER.iter().find(|p| p.0 == name).map_or("-".into(), |p| format!("{} {} MB/s", p.1, p.2));
        rows.push(vec![
            name.into(),
            spread(&a["alone_gb_s"], "in_cache", 1),
            spread(&a["fused_gb_s"], "in_cache", 1),
            paper,
        ]);
    }
    let mut out =
        table(&["algorithm", "alone, GB/s in cache", "fused with the copy, GB/s", "[NMAD] Figure 4"], &rows);
    if let Some(m) = v.get("model").filter(|m| !m.is_null()) {
        let mut t = Vec::new();
        for r in arr(m, "rows")? {
            t.push(vec![
                u(r, "size")?.to_string(),
                format!("{:+.1}%", 100.0 * f(r, "predicted_paper")?),
                format!("{:+.1}%", 100.0 * f(r, "predicted_fused")?),
                format!("{:+.1}%", 100.0 * f(r, "measured")?),
            ]);
        }
        out.push_str(&format!(
            "\nT(L) = 2L/B_copy + 2L/B_csum + lambda_net + L/B_net (section 5.2): the checksum's cost on a message, \
             {} over loopback:\n\n{}\n[NMAD]: +7% at 4 kB and +10% at 32 kB (B_csum 24.1 GB/s, B_copy 4.5 GB/s, \
             B_net 3 GB/s, lambda_net 1.4 us); tether fuses the checksum with its one copy.\n",
            m["checksum"].as_str().unwrap_or("?"),
            table(&["bytes", "predicted, the paper's two passes", "predicted, fused", "measured"], &t)
        ));
    }
    Ok(out)
}

fn amvia_loggp(v: &Value) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for what in ["messages", "calls"] {
        let l = &v[what];
        for s in arr(l, "sizes")? {
            rows.push(vec![
                what.into(),
                u(s, "size")?.to_string(),
                format!("{:.2}", f(s, "rtt_us")?),
                format!("{:.2}", f(s, "o_s_us")?),
                format!("{:.2}", f(s, "o_r_us")?),
                format!("{:.2}", f(s, "g_us")?),
            ]);
        }
    }
    let lg = |what: &str| {
        let l = &v[what];
        format!(
            "{}: L {}, G {}",
            what,
            l["l_us"].as_f64().map_or("not determined".into(), |x| format!("{x:.2} us")),
            l["big_g_us_per_byte"].as_f64().map_or("not determined".into(), |x| format!("{x:.6} us/byte"))
        )
    };
    let first =
        |what: &str| arr(&v[what], "sizes").ok().and_then(|s| s.first()).and_then(|s| s["rtt_us"].as_f64());
    let ratio = match (first("calls"), first("messages")) {
        (Some(c), Some(m)) => format!("{:.2}", c / m),
        _ => "-".into(),
    };
    Ok(format!(
        "{}\n{}; {}. A call's round trip over a message's at the smallest size: {ratio}. [AMVIA]: the active \
         message layer added 16 us to VIA's 8 us round trip (3x), and g cannot be measured for its three-way \
         protocol; its Table 3.1 is not in our copy.\n",
        table(&["what", "bytes", "round trip us", "o_s us", "o_r us", "g us"], &rows),
        lg("messages"),
        lg("calls")
    ))
}

fn amvia_model(v: &Value) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for c in arr(v, "checks")? {
        rows.push(vec![
            format!("{}", f(c, "rate")?),
            format!("{:.1}", f(c, "predicted_us")?),
            format!(
                "{:.1} ({:.1}-{:.1})",
                f(c, "measured_us")?,
                f(c, "measured_min_us")?,
                f(c, "measured_max_us")?
            ),
            format!("{:+.1}%", 100.0 * f(c, "difference")?),
        ]);
    }
    let what_if = |key: &str| -> anyhow::Result<String> {
        let rows = arr(v, key)?
            .iter()
            .map(|x| {
                Ok(vec![
                    x["setting"].as_str().unwrap_or("?").to_string(),
                    format!("{}", f(x, "failures_per_s")?),
                    format!("{}", f(x, "loss")?),
                    format!("{:.1}", f(&x["prediction"], "response_us")?),
                    format!("{:.0}", f(&x["prediction"], "throughput_per_s")?),
                ])
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(table(
            &["setting", "failures a second", "loss", "predicted round trip us", "round trips a second"],
            &rows,
        ))
    };
    Ok(format!(
        "{}\nLargest difference {:.1}% (bar: within 15% at every rate: {}).\n\nWhat the model says of \
         embedded against engine mode:\n\n{}\nOf one rail against two:\n\n{}\n[AMVIA] chapter 4 (only \
         its outline in our copy): a Markov reward model of response time against each component's \
         failure rate, validated against fault-injection measurements.\n",
        table(&["loss rate", "predicted us", "measured us, median (min-max)", "difference"], &rows),
        100.0 * f(v, "worst_difference")?,
        if v["within_bar"].as_bool() == Some(true) { "met" } else { "missed" },
        what_if("engine")?,
        what_if("rails")?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_replaces_its_old_self_and_leaves_the_rest() {
        let dir = std::env::temp_dir().join(format!("tether-report-test-{}", std::process::id()));
        let p = dir.join("R.md");
        let _ = std::fs::remove_dir_all(&dir);
        write_block(&p, &format!("{BEGIN}\none\n{END}\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("{BEGIN}\none\n{END}\n"));
        std::fs::write(&p, format!("# Results\n\nbefore\n\n{BEGIN}\none\n{END}\n\nafter\n")).unwrap();
        write_block(&p, &format!("{BEGIN}\ntwo\n{END}\n")).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("# Results\n\nbefore\n\n{BEGIN}\ntwo\n{END}\n\nafter\n")
        );
        std::fs::write(&p, format!("x\n{END}\n{BEGIN}\n")).unwrap();
        assert!(write_block(&p, "y").is_err(), "markers out of order");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_section_has_its_experiment() {
        for s in SECTIONS {
            assert!(EXPERIMENTS.iter().any(|e| e.key == s.experiment), "{}", s.key);
        }
    }

    #[test]
    fn a_date_is_civil() {
        let d = utc_now();
        assert!(d.ends_with(" UTC") && d.len() == "2026-12-03 04:10 UTC".len(), "{d}");
    }
}
