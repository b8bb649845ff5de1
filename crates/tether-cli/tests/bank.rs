//! `tether demo --rpc` end to end: the bank's server processes killed with
//! SIGKILL and restarted on their call logs while transfers go through
//! faulty links; its report must show no transfer run twice, no money made
//! or lost, no account below zero and no false final state, with the kills
//! and faults it claims really made.

use std::process::Command;

#[test]
fn the_bank_survives_its_servers_being_killed() {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["demo", "--rpc", "--kills", "40", "--transfers", "1000", "--json"])
        .output()
        .expect("the tether binary runs");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("one JSON document; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "tether demo --rpc failed: {doc}");
    let n = |k: &str| doc[k].as_u64().unwrap_or_else(|| panic!("{k} in {doc}"));
    assert_eq!((n("ran_twice"), n("false_states"), n("negative_accounts")), (0, 0, 0), "{doc}");
    assert_eq!(doc["money_before"], doc["money_after"], "{doc}");
    assert!(n("kills") >= 40 && n("transfers") >= 1000, "{doc}");
    assert!(n("faults_injected") > 0, "{doc}");
    assert_eq!(n("applied") + n("refused_funds") + n("not_run") + n("unknown"), n("transfers"), "{doc}");
    assert_eq!(doc["ok"], true);
}
