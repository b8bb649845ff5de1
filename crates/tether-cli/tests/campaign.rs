//! `tether campaign` end to end, through the binary: every message fault
//! kind at a high rate over real UDP, a record per cell with every field
//! the issue names, zero loss / duplication / corruption at the
//! application, faults actually injected, and the CSV and PNG written.

use std::process::Command;

fn tether(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tether")).args(args).output().expect("the tether binary runs")
}

#[test]
fn campaign_masks_every_message_fault_and_writes_its_outputs() {
    let dir = std::env::temp_dir().join(format!("tether-campaign-test-{}", std::process::id()));
    let out = tether(&[
        "campaign",
        "--rates",
        "0.05",
        "--seeds",
        "2",
        "--messages",
        "2000",
        "--rounds",
        "20",
        "--json",
        "--out",
        dir.to_str().expect("utf-8 temp path"),
    ]);
    assert!(out.status.success(), "campaign failed: {}", String::from_utf8_lossy(&out.stderr));
    let cells: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let cells = cells.as_array().expect("an array of cells");
    // 2 workloads x (6 kinds x 1 rate + fault-free) x 2 seeds.
    assert_eq!(cells.len(), 2 * 7 * 2);
    for c in cells {
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {c}"));
        assert_eq!(n("delivered"), n("sent"), "{c}");
        for k in ["lost", "duplicated", "corrupted", "out_of_order", "failed"] {
            assert_eq!(n(k), 0, "{k} in {c}");
        }
        for k in ["retransmissions", "duplicates_discarded", "checksum_failures", "seed"] {
            n(k);
        }
        assert!(c["relative_time"].as_f64().is_some_and(|t| t > 0.0), "{c}");
        if c["fault"] != "none" {
            assert!(n("injected") > 0, "at 5% every cell must be struck: {c}");
        }
    }
    let modify: u64 = cells
        .iter()
        .filter(|c| c["fault"] == "modify")
        .map(|c| c["checksum_failures"].as_u64().unwrap_or(0))
        .sum();
    assert!(modify > 0, "modified datagrams must be caught by the checksum");
    let csv = std::fs::read_to_string(dir.join("campaign.csv")).expect("campaign.csv written");
    assert_eq!(csv.lines().count(), 1 + cells.len(), "a header and a line per cell");
    for png in ["campaign-comm.png", "campaign-cpu.png"] {
        let bytes = std::fs::read(dir.join(png)).expect("plot written");
        assert!(bytes.starts_with(b"\x89PNG"), "{png} is a PNG");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn campaign_rejects_what_it_cannot_sweep() {
    for (args, says) in [
        (&["campaign", "--kinds", "gremlins"][..], "unknown fault kind"),
        (&["campaign", "--kinds", "invocation"][..], "surface to the application"),
        (&["campaign", "--rates", "1.5"][..], "not a probability"),
        (&["campaign", "--delay", "soon"][..], "not a duration"),
    ] {
        let out = tether(args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Figure 5 for the cluster: at 1% of each of drop, duplicate and
/// corrupt, the reliable layer retransmits and discards duplicates (R and
/// D per injected fault above 0) while nobody alive is removed (A and S
/// 0); the busy-machine cells run too; and --out writes the CSV and a
/// plot per detector.
#[test]
fn cluster_campaign_counts_figure_5_per_injected_fault() {
    let dir = std::env::temp_dir().join(format!("tether-cluster-campaign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = tether(&[
        "campaign",
        "--cluster",
        "--rates",
        "0.01",
        "--seeds",
        "1",
        "--cell-secs",
        "2",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("one JSON document; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{doc}");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "two detectors at one rate, and the busy machine: {doc}");
    assert_eq!(doc["cells"].as_array().unwrap().len(), 4);
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert_eq!(f("unformed"), 0.0, "{r}");
        assert_eq!((f("false_alarms"), f("self_diagnosis")), (0.0, 0.0), "nobody died: {r}");
        if r["busy"] == false {
            assert!(f("injected") > 100.0 && f("r") > 0.0 && f("d") > 0.0, "{r}");
        } else {
            assert_eq!(f("injected"), 0.0, "{r}");
        }
    }
    for f in ["cluster-campaign.csv", "cluster-two-miss.png", "cluster-phi.png"] {
        assert!(dir.join(f).metadata().is_ok_and(|m| m.len() > 0), "{f} written");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
