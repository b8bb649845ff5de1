//! `tether demo --cluster` end to end: eleven processes on loopback, one
//! member killed, one frozen, one cut off and one manager replica killed
//! while every node multicasts to the group through faulty links. Its
//! report must show every failure detected within the bar's eight
//! heartbeat periods, nobody else removed, one sequence of views, the
//! replica replaced by a spare, and one order of deliveries, each in its
//! view, with the deliveries it checked really made.

use std::process::Command;

#[test]
fn the_cluster_agrees_through_kills_freezes_cuts_and_a_lost_replica() {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["demo", "--cluster", "--json"])
        .output()
        .expect("the tether binary runs");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("one JSON document; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "tether demo --cluster failed: {doc}");
    let n = |k: &str| doc[k].as_u64().unwrap_or_else(|| panic!("{k} in {doc}"));
    let strikes = doc["strikes"].as_array().expect("strikes");
    assert_eq!(strikes.len(), 4, "{doc}");
    for s in strikes {
        let periods = s["detected_periods"].as_f64().unwrap_or_else(|| panic!("undetected: {s}"));
        assert!(periods > 0.0 && periods <= 8.0, "detected after {periods} periods: {s}");
    }
    assert_eq!(n("false_alarms"), 0, "{doc}");
    assert_eq!((n("view_disagreements"), n("views_out_of_order")), (0, 0), "{doc}");
    assert_eq!((n("order_disagreements"), n("outside_view"), n("unequal_views")), (0, 0, 0), "{doc}");
    assert_eq!(doc["replica_replaced"], true, "{doc}");
    let replicas: Vec<u64> =
        doc["final_replicas"].as_array().unwrap().iter().filter_map(|v| v.as_u64()).collect();
    assert!(!replicas.contains(&1) && replicas.len() == 3, "{doc}");
    assert!(n("views") > 11 && n("multicasts_sent") > 1000, "{doc}");
    assert!(n("deliveries") > 10 * n("multicasts_sent") / 2, "most multicasts reach most members: {doc}");
    assert_eq!(doc["ok"], true);
}
