//! The `tether` command given bad input: every row of the table below must
//! end by itself (no hang: killed and failed after `LIMIT`), with a
//! non-zero exit, not by a signal, and a message on stderr that names the
//! problem (the row's fragment) and is no panic. Run with `--nocapture` to
//! see the table of inputs and the first line each one printed.
//!
//! Rows that need the network use addresses where nothing listens and a
//! short `--give-up-after`, so the whole table runs in a few seconds.

// A test runs processes and waits on them with a deadline.
#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longer than any row may take: the slowest waits 2 s for an echo.
const LIMIT: Duration = Duration::from_secs(20);

struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    timed_out: bool,
}

/// Run `tether args`, killing it at `LIMIT`.
fn tether(args: &[String]) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tether binary runs");
    // Drain both pipes on threads, so a chatty child cannot block on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let (status, timed_out) = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break (s, false);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            break (child.wait().expect("wait after kill"), true);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = out.join();
    Outcome {
        code: status.code(),
        signal: status.signal(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
    }
}

/// An address on loopback where nothing listens: a port the kernel just
/// handed out and took back.
fn silent_addr() -> String {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("bound").to_string()
}

/// A file in the temporary directory with `text`, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("tether-bad-input-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write a temporary file");
        TempFile(path)
    }
    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn every_bad_input_is_refused_in_one_clear_line() {
    let bad_value = TempFile::new("value.toml", "[[fault]]\nkind = \"drop\"\np = 2\n");
    let bad_syntax = TempFile::new("syntax.toml", "[[fault]]\nkind = \"drop\"\np = \n");
    let unknown_field =
        TempFile::new("field.toml", "seed = 3\n\n[[fault]]\nkind = \"drop\"\n p = 0.1\n q = 1\n");
    let a_file = TempFile::new("not-a-dir", "");
    let bad_fabric = TempFile::new("bad.fabric", "switch 0 ports 4\nhost 1 at 0:9\n");
    let (to, from) = (silent_addr(), silent_addr());
    // Held for the whole table, so binding it must fail with EADDRINUSE.
    let holder = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let taken = holder.local_addr().expect("bound").to_string();
    let in_use = format!("address {taken} already in use");
    let too_big = "100000000000";
    #[rustfmt::skip]
    let rows: Vec<(String, &str)> = vec![
        // Zero, negative, huge, non-numeric and out-of-range numbers.
        ("pingpong --count 0".into(), "--count <COUNT>': must be between 1 and"),
        ("pingpong --count -5".into(), "negative: must be between 1 and"),
        ("stream --count abc".into(), "not a whole number"),
        (format!("pingpong --size {too_big}"), "the protocol's largest message is 64 MiB"),
        ("stream --size -1".into(), "negative"),
        ("stream --rails 9".into(), "--rails <RAILS>': must be between 1 and 8"),
        ("pingpong --rails 0".into(), "must be between 1 and 8"),
        ("stream --runs 0".into(), "--runs <RUNS>': must be between 1 and"),
        ("stream --window 0".into(), "must be between 2 and 65536 segments"),
        ("stream --mtu 10".into(), "must be between 244 and 65507 bytes"),
        ("stream --rto-min-us 0".into(), "microseconds"),
        ("stream --spin-us 99999999999".into(), "--spin-us"),
        ("pingpong --connected-peers 5000".into(), "--connected-peers"),
        ("stream --seed -1".into(), "--seed <SEED>': negative"),
        ("stream --loss nan".into(), "not a probability: must be between 0 and 1"),
        ("stream --loss -0.5".into(), "not a probability: must be between 0 and 1"),
        ("stream --give-up-after 10".into(), "not a duration"),
        ("stream --give-up-after 1ms".into(), "must be between 250ms"),
        ("stream --checksum bogus".into(), "unknown checksum `bogus`"),
        ("stream --mode sideways".into(), "invalid value 'sideways' for '--mode"),
        // Fault rules and plan files.
        ("stream --fault explode:p=1".into(), "unknown fault kind `explode`"),
        ("stream --fault drop:p=3".into(), "--fault drop:p=3: fault 0 (drop): field `p`"),
        ("stream --fault-plan /nonexistent/plan.toml".into(), "No such file"),
        (format!("stream --fault-plan {}", bad_value.path()), "value.toml:3:1: fault 0 (drop): field `p`"),
        (format!("stream --fault-plan {}", bad_syntax.path()), "syntax.toml:3:5:"),
        (format!("stream --fault-plan {}", unknown_field.path()), "field.toml:6:2: fault 0 (drop): unknown field `q`"),
        // Addresses, modes and flags that do not go together.
        ("stream --listen notanaddr".into(), "invalid socket address syntax"),
        ("stream --listen 127.0.0.1:7000 --connect 127.0.0.1:7001".into(), "not both"),
        ("stream --listen 127.0.0.1:0".into(), "--listen needs --peer"),
        ("stream --listen 127.0.0.1:0 --accept --peer 127.0.0.1:7001".into(), "not with --peer"),
        ("stream --listen 127.0.0.1:0 --accept --raw".into(), "--raw needs the sender's --peer"),
        ("stream --connect 127.0.0.1:7000 --bind 127.0.0.1:7001 --accept".into(), "the listener's option"),
        ("stream --connect 127.0.0.1:7000".into(), "--connect needs --bind"),
        ("stream --listen 127.0.0.1:0 --peer [::1]:7001".into(), "different address families"),
        ("stream --connect 0.0.0.0:7000 --bind 127.0.0.1:7001".into(), "need a real address and port"),
        ("stream --connect 127.0.0.1:7000 --bind 127.0.0.1:0".into(), "give a fixed port"),
        ("stream --listen 192.0.2.1:7000 --peer 127.0.0.1:7001".into(), "cannot bind 192.0.2.1:7000"),
        (format!("stream --listen {taken} --peer 127.0.0.1:7001"), in_use.as_str()),
        ("stream --rail 127.0.0.1:1".into(), "expected LOCAL=REMOTE"),
        ("stream --peer 127.0.0.1:7001".into(), "--peer is for two-process mode"),
        ("pingpong --rail 127.0.0.1:7000=127.0.0.1:7001".into(), "--rail is for two-process mode"),
        (format!("stream --connect {to} --bind {from} --runs 3"), "--runs repeats loopback runs"),
        (format!("stream --listen {to} --peer {from} --rails 2"), "--rails is for loopback"),
        ("stream --raw --window 64".into(), "--raw measures the bare transport"),
        ("pingpong --raw --checksum xxh3".into(), "--checksum does not apply"),
        ("stream --rail-policy stripe".into(), "--rail-policy needs two or more rails"),
        // Nobody at the other end: refused in bounded time, saying so.
        (format!("stream --connect {to} --bind {from} --count 10 --give-up-after 1s"), "nobody answered at"),
        (format!("pingpong --connect {to} --bind {from} --count 10 --give-up-after 1s"), "nobody answered at"),
        // bench: options it would ignore.
        ("bench --size 64".into(), "bench sweeps --sizes"),
        ("bench --listen 127.0.0.1:7000".into(), "bench runs on loopback"),
        ("bench --raw".into(), "bench measures raw and reliable side by side"),
        (format!("bench --sizes 8,{too_big}"), "the protocol's largest message"),
        ("bench checksum --runs 0".into(), "must be between 1 and"),
        ("bench checksum --large-mib 100000".into(), "two buffers of it are allocated"),
        (format!("bench checksum --block {too_big}"), "--block <BLOCK>': must be between 64 and"),
        ("bench checksum --errors --error-len 0".into(), "the word swap needs two 8-byte words"),
        ("bench checksum --errors --model".into(), "--errors measures detection only"),
        ("bench checksum --trials 5".into(), "--trials is for --errors"),
        ("bench checksum --model-runs 3".into(), "--model-runs is for --model"),
        ("bench checksum --algorithms crc99".into(), "unknown checksum `crc99`"),
        ("bench auth --algorithms md5".into(), "unknown authentication `md5`"),
        ("bench auth --rounds 0".into(), "must be between 1 and"),
        ("bench shm --records 0".into(), "must be between 1 and"),
        ("stream --auth aes-256-gmac".into(), "--key-file <FILE>"),
        // sim, campaign, demo.
        ("sim --mix bogus".into(), "invalid value 'bogus' for '--mix"),
        ("sim --seeds 0".into(), "--seeds <SEEDS>': must be between 1 and"),
        ("sim --first-seed 18446744073709551615 --seeds 2".into(), "passes the last seed"),
        ("sim --mix clean --members 100 --seeds 1".into(), "sizes the membership mixes; `clean` is not one"),
        ("sim --mix membership --members 1".into(), "--members <MEMBERS>': must be between 2 and"),
        ("sim --mix clean --topology torus:4x4".into(), "gives the fabric mixes their fabric; `clean` is not one"),
        ("sim --fabric-table --topology ring:3".into(), "`ring:3` is not a topology: one of tang-bilas"),
        ("sim --fabric-table --topology torus:0x3".into(), "is not a topology"),
        (format!("sim --fabric-table --topology file:{}", bad_fabric.path()), "line 2: switch 0 has no port 9"),
        ("sim --mix fabric_move --topology file:/nonexistent.fabric".into(), "/nonexistent.fabric: No such file"),
        ("sim --mix fabric_move --topology chain:1,8,1".into(), "the run's 3 nodes are hosts 1 to 3: host 2 is not in it"),
        ("campaign --rates 0".into(), "must be above 0"),
        ("campaign --rates -0.1".into(), "not a probability in (0, 1]"),
        ("campaign --size 4".into(), "must be between 8 and"),
        (format!("campaign --messages {too_big}"), "each message is tracked"),
        ("campaign --workloads cpu --messages 5".into(), "--messages is for the comm workload"),
        ("campaign --kinds operation".into(), "a campaign sweeps message faults"),
        ("campaign --kinds gremlins".into(), "unknown fault kind `gremlins`"),
        ("campaign --compute 5".into(), "not a duration"),
        (format!("campaign --out {}", a_file.path()), "--out"),
        ("demo --nodes 1".into(), "--nodes <NODES>': must be between 2 and 256"),
        ("demo --nodes 100000".into(), "must be between 2 and 256"),
        ("demo --messages -3".into(), "negative"),
        ("demo --loss 1.5".into(), "not a probability: must be between 0 and 1"),
        ("demo --cut-rail-at 100".into(), "--cut-rail-at needs --rails 2 or more"),
        ("demo --fault nope".into(), "--fault nope"),
        ("demo --engine --rails 2 --cut-rail-at 100".into(), "not available with --engine"),
        ("demo --engine --fault drop:p=0.1,side=send".into(), "the engines inject faults on receive only"),
        ("demo --members 6".into(), "--members is for demo --cluster"),
        ("demo --servers 2".into(), "--servers is for demo --rpc"),
        ("demo --hang-after-us 900".into(), "--hang-after-us is for demo --engine"),
        ("demo --cluster --members 4".into(), "must be between 5 and 64"),
        ("demo --cluster --rpc".into(), "--cluster runs its processes embedded"),
        (
            "engine --unsupervised --dir /dev/shm/tether-bad-input --bind 127.0.0.1:0 --fault drop:p=0.1,side=send"
                .into(),
            "the engine injects faults on receive only",
        ),
        ("frobnicate".into(), "unrecognized subcommand 'frobnicate'"),
    ];
    assert!(rows.len() >= 25);
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for (args, fragment) in &rows {
        let argv: Vec<String> = args.split_whitespace().map(String::from).collect();
        let started = Instant::now();
        let o = tether(&argv);
        let took = started.elapsed();
        let first = o.stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
        table.push(format!("tether {args} -> {first}"));
        let mut wrong = Vec::new();
        if o.timed_out {
            wrong.push(format!("still running after {LIMIT:?}: killed"));
        }
        if let Some(sig) = o.signal {
            wrong.push(format!("killed by signal {sig}"));
        }
        if o.code == Some(0) {
            wrong.push("exit status 0".into());
        }
        if o.stderr.contains("panicked")
            || o.stderr.contains("RUST_BACKTRACE")
            || o.stderr.contains("stack backtrace")
        {
            wrong.push("a panic".into());
        }
        if first.is_empty() {
            wrong.push("nothing on stderr".into());
        } else if !o.stderr.contains(fragment) {
            wrong.push(format!("stderr lacks `{fragment}`"));
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "tether {args} ({took:.1?}): {}\n  stderr: {}",
                wrong.join(", "),
                o.stderr.trim()
            ));
        }
    }
    println!("{} bad inputs, each refused:", rows.len());
    for line in &table {
        println!("  {line}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

/// What was asked wrongly exits 2, as clap's own refusals do; what ran
/// and failed exits 1 (a shell script can tell the two apart).
#[test]
fn usage_errors_exit_2_and_failures_1() {
    let key = TempFile::new("key", "a cluster key of thirty-two bytes");
    let (to, from) = (silent_addr(), silent_addr());
    let rows: Vec<(String, i32, &str)> = vec![
        ("stream --listen 127.0.0.1:0".into(), 2, "--listen needs --peer"),
        ("pingpong --connect 127.0.0.1:7000".into(), 2, "--connect needs --bind"),
        ("stream --listen 127.0.0.1:0 --connect 127.0.0.1:7000".into(), 2, "not both"),
        (format!("stream --raw --key-file {}", key.path()), 2, "--raw measures the bare transport"),
        (format!("pingpong --raw --key-file {} --auth aes-256-gcm", key.path()), 2, "does not apply"),
        (
            format!("stream --connect {to} --bind {from} --count 10 --give-up-after 1s"),
            1,
            "nobody answered at",
        ),
    ];
    for (args, code, says) in rows {
        let argv: Vec<String> = args.split_whitespace().map(String::from).collect();
        let o = tether(&argv);
        assert_eq!(o.code, Some(code), "tether {args}: {}", o.stderr);
        assert!(o.stderr.contains(says), "tether {args}: {}", o.stderr);
    }
}

/// Every option of every command says what it does: no bare flag in any
/// `--help`.
#[test]
fn every_option_is_described() {
    let commands: &[&[&str]] = &[
        &[],
        &["demo"],
        &["pingpong"],
        &["stream"],
        &["bench"],
        &["bench", "checksum"],
        &["bench", "auth"],
        &["bench", "shm"],
        &["bench", "engine"],
        &["bench", "calls"],
        &["bench", "logp"],
        &["bench", "async"],
        &["sim"],
        &["campaign"],
        &["engine"],
    ];
    for cmd in commands {
        let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        args.push("--help".into());
        let out = Command::new(env!("CARGO_BIN_EXE_tether")).args(&args).output().expect("runs");
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if !(t.starts_with("--") || t.starts_with('-') && t.get(2..4) == Some(", ")) {
                continue;
            }
            // Short help: the description follows on the line after two
            // spaces; long help: it is the next line, indented.
            let same_line = t.split_once("  ").is_some_and(|(_, d)| !d.trim().is_empty());
            let next_line =
                lines.get(i + 1).is_some_and(|n| n.starts_with("          ") && !n.trim().is_empty());
            assert!(same_line || next_line, "tether {}: `{}` has no description", args.join(" "), t.trim());
        }
    }
}

/// `tether sim --help` lists exactly the mixes the simulator runs.
#[test]
fn sim_help_lists_the_mixes_that_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_tether")).args(["sim", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let listed = help.split("[possible values: ").nth(1).and_then(|r| r.split(']').next()).expect("a list");
    let listed: Vec<&str> = listed.split(',').map(str::trim).collect();
    let running: Vec<&str> = tether_sim::FaultMix::ALL.iter().map(|m| m.name()).collect();
    assert_eq!(listed, running);
}

/// The help and the README say what the parsers do: `demo --help`'s range
/// of `--nodes` is the one refused past, and every command but the
/// services (`engine`, `metrics`) takes `--json`, as the README says.
#[test]
fn help_and_readme_match_the_parsers() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tether")).args(args).arg("--help").output().expect("runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let demo = help(&["demo"]);
    let most: u64 = demo
        .split("(2 to ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("demo --help gives the range of --nodes");
    let over = tether(&["demo".into(), "--nodes".into(), (most + 1).to_string()]);
    assert!(over.stderr.contains(&format!("must be between 2 and {most}")), "{}", over.stderr);

    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    assert!(
        readme.contains("command but `engine` and `metrics` (services, which log) takes `--json`"),
        "the README's claim"
    );
    let top = help(&[]);
    let commands: Vec<&str> = top
        .split("Commands:")
        .nth(1)
        .expect("a command list")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 7, "{commands:?}");
    for c in commands {
        let takes = help(&[c]).contains("--json");
        let service = matches!(c, "engine" | "metrics" | "bank-server");
        assert_eq!(takes, !service, "tether {c}: --json as the README says");
    }
}
