//! Drops by reason reach the reports of both sides: the JSON documents and
//! the tables of `pingpong` and `stream`, with faults that make them drop
//! (corruption: checksum failures without a key, MAC failures with one).

use std::process::Command;

fn tether(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tether")).args(args).output().expect("the tether binary runs");
    assert!(out.status.success(), "tether {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn count(drops: &serde_json::Value, reason: &str) -> u64 {
    drops[reason].as_u64().unwrap_or(0)
}

#[test]
fn pingpong_reports_what_each_side_dropped() {
    let json = tether(&["pingpong", "--count", "300", "--runs", "1", "--fault", "modify:p=0.05", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    let run = &doc["runs"][0];
    assert!(count(&run["drops"], "checksum_failures") > 0, "this side: {}", run["drops"]);
    assert!(count(&run["echo_drops"], "checksum_failures") > 0, "echo side: {}", run["echo_drops"]);
    let text = tether(&["pingpong", "--count", "300", "--runs", "1", "--fault", "modify:p=0.05"]);
    assert!(text.contains("this side dropped, by reason: checksum_failures"), "{text}");
    assert!(text.contains("the echo side dropped, by reason: checksum_failures"), "{text}");
}

#[test]
fn stream_reports_what_each_side_dropped_with_a_key() {
    let key = std::env::temp_dir().join(format!("tether-reports-{}.key", std::process::id()));
    std::fs::write(&key, b"a cluster secret for the reports test").unwrap();
    let key = key.to_str().unwrap();
    let common = ["stream", "--size", "1024", "--count", "5000", "--runs", "1", "--fault", "modify:p=0.02"];
    let json = tether(&[&common[..], &["--key-file", key, "--json"]].concat());
    let doc: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    let run = &doc["runs"][0];
    assert!(count(&run["receiver_drops"], "mac_failures") > 0, "receiver: {}", run["receiver_drops"]);
    assert_eq!(count(&run["receiver_drops"], "checksum_failures"), 0, "with a key corruption fails the MAC");
    assert!(run["sender_drops"].is_object(), "the sender's drops are reported too");
    let text = tether(&[&common[..], &["--key-file", key, "--auth", "aes-256-gmac"]].concat());
    assert!(text.contains("the receiver dropped, by reason:") && text.contains("mac_failures"), "{text}");
    assert!(text.contains("the sender dropped"), "{text}");
    std::fs::remove_file(key).unwrap();
}

/// `tether sim --fabric-table`: [TB] Table 3's rows, each host moved 1-4
/// hops found again by a route as short as the oracle's, on the paper's
/// fabric and at 1,000 hosts; the table names the paper's figures.
#[test]
fn the_fabric_table_finds_every_moved_host() {
    let doc: serde_json::Value =
        serde_json::from_str(&tether(&["sim", "--fabric-table", "--json"])).expect("one JSON document");
    for (section, rows, hosts) in [("tang_bilas", 4, 4), ("thousand_hosts", 4, 1000), ("growth", 5, 0)] {
        let rows_got = doc[section].as_array().unwrap_or_else(|| panic!("{section}: {doc}"));
        assert_eq!(rows_got.len(), rows, "{section}");
        for r in rows_got {
            assert_eq!(r["found"], true, "{section}: {r}");
            assert_eq!(r["shortest"], r["hops"], "{section}: {r}");
            assert!(r["probes"].as_u64().unwrap() > 0);
            if hosts > 0 {
                assert_eq!(r["hosts"].as_u64(), Some(hosts));
            }
        }
    }
    assert_eq!(doc["paper"][3]["probes"].as_u64(), Some(186));
    let text = tether(&["sim", "--fabric-table"]);
    assert!(text.contains("Table 3") && text.contains("113, 73, 186, 83.567"), "{text}");
}

/// `--fabric-table --topology`: the same experiment on a fabric named or
/// read from a file, each move found by a shortest route, the search
/// costlier the further the host went.
#[test]
fn the_fabric_table_runs_on_a_named_or_written_fabric() {
    let file = format!("file:{}/../../docs/fabrics/tang-bilas.fabric", env!("CARGO_MANIFEST_DIR"));
    for (topology, hosts, moves) in
        [("torus:6x6", 144, 4), ("random:48,9,4,3", 192, 4), ("fat-tree:8", 24, 2), (file.as_str(), 4, 4)]
    {
        let doc: serde_json::Value =
            serde_json::from_str(&tether(&["sim", "--fabric-table", "--topology", topology, "--json"]))
                .expect("one JSON document");
        let t = &doc["topology"];
        let rows = t["moves"].as_array().unwrap_or_else(|| panic!("{topology}: {doc}"));
        assert_eq!(rows.len(), moves, "{topology}: {t}");
        for r in rows {
            assert_eq!(
                (r["found"].as_bool(), r["hosts"].as_u64()),
                (Some(true), Some(hosts)),
                "{topology}: {r}"
            );
            assert_eq!(r["shortest"], r["hops"], "{topology}: {r}");
        }
        let probes: Vec<u64> = rows.iter().map(|r| r["probes"].as_u64().unwrap()).collect();
        assert!(probes.windows(2).all(|w| w[1] > w[0]), "{topology}: {probes:?}");
    }
}
