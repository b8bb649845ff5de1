//! Configuration without code, through the command: `tether config` shows
//! every setting with its value and where it came from (default, a
//! `tether.toml`, a `TETHER_*` variable); `tether engine` takes its rails
//! and directory from them, its flags winning; a misspelt setting is
//! refused naming where it was.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn tether(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether"));
    c.args(args).env_remove("TETHER_TOML");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn scratch(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tether-config-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn config_shows_each_value_and_its_source() {
    let dir = scratch("show");
    let toml = dir.join("tether.toml");
    std::fs::write(
        &toml,
        "[config]\nmax_datagram = 1400\nabandon_after = \"3s\"\n[endpoint.peers]\n2 = [\"10.0.0.2:7000\"]\n",
    )
    .unwrap();
    let out = tether(
        &["config", "--json"],
        &[("TETHER_TOML", toml.to_str().unwrap()), ("TETHER_CONFIG_ABANDON_AFTER", "5s")],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let of = |key: &str| v["settings"].as_array().unwrap().iter().find(|s| s["key"] == key).cloned().unwrap();
    assert_eq!(of("config.max_datagram")["value"], "1400");
    assert_eq!(of("config.max_datagram")["source"], format!("file {}", toml.display()));
    assert_eq!(of("config.abandon_after")["value"], "5s", "the variable over the file");
    assert_eq!(of("config.abandon_after")["source"], "env TETHER_CONFIG_ABANDON_AFTER");
    assert_eq!(of("config.rto_min")["source"], "default");
    assert_eq!(of("engine.hang_after_us")["value"], "5000", "the engine's flag default");
    assert_eq!(of("endpoint.peers.2")["value"], "10.0.0.2:7000");
    assert_eq!(of("calls.credit")["variable"], "TETHER_CALLS_CREDIT");

    // A misspelt variable: refused, named, with the setting meant.
    let out = tether(&["config"], &[("TETHER_CONFIG_MAX_DATAGRAMS", "1400")]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("TETHER_CONFIG_MAX_DATAGRAMS") && err.contains("did you mean config.max_datagram?"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The first line of a `tether engine`, which is then stopped.
fn engine_line(mut cmd: Command) -> String {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{line}: {status}");
    line
}

#[test]
fn an_engine_takes_its_rails_and_directory_from_the_settings_and_its_flags_win() {
    let base = scratch("engine");
    let (from_env, from_flag) = (base.join("from-env"), base.join("from-flag"));
    let env = [("TETHER_ENGINE_BIND", "127.0.0.1:0"), ("TETHER_ENGINE_DIR", from_env.to_str().unwrap())];
    let line = engine_line(tether(&["engine"], &env));
    assert!(line.contains(&format!("serving {} on rails 127.0.0.1:", from_env.display())), "{line}");
    let line = engine_line(tether(&["engine", "--dir", from_flag.to_str().unwrap()], &env));
    assert!(line.contains(&format!("serving {} on rails", from_flag.display())), "the flag wins: {line}");

    let out = tether(&["engine", "--dir", from_flag.to_str().unwrap()], &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--bind ADDR, or engine.bind in tether.toml, or TETHER_ENGINE_BIND"), "{err}");
    let out = tether(&["engine"], &[("TETHER_ENGINE_BIND", "nowhere")]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("env TETHER_ENGINE_BIND") && err.contains("nowhere"), "{err}");
    std::fs::remove_dir_all(base).unwrap();
}

/// docs/OPERATING.md's table lists every setting `tether config` knows,
/// with its variable.
#[test]
fn the_table_of_settings_lists_every_key() {
    let out = tether(&["config", "--json"], &[]).current_dir(std::env::temp_dir()).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/OPERATING.md")).unwrap();
    let settings = v["settings"].as_array().unwrap();
    assert!(settings.len() > 60, "{}", settings.len());
    for s in settings {
        let row = format!("| `{}` | `{}` |", s["key"].as_str().unwrap(), s["variable"].as_str().unwrap());
        assert!(doc.contains(&row), "docs/OPERATING.md lacks {row}");
    }
}
