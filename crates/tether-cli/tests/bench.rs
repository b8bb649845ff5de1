//! `tether bench checksum`, `auth`, `shm`, `loss`, `contention` (also `--external`) and `calls` end to end: the JSON
//! documents of the bandwidth table (with the model), of the detection
//! table and of the authentication costs carry every record the issues
//! name, with figures that could only come from a measurement.
//! Small sizes keep it quick; no figure is compared with a bound here
//! (timed assertions do not belong in tests).

use std::process::Command;

fn tether_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tether")).args(args).output().expect("the tether binary runs");
    assert!(out.status.success(), "tether {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn positive(v: &serde_json::Value, what: &str) -> f64 {
    let x = v["median"].as_f64().unwrap_or_else(|| panic!("{what}: no median in {v}"));
    assert!(x.is_finite() && x > 0.0, "{what}: {x}");
    x
}

#[test]
fn bandwidth_document_has_a_record_per_algorithm_and_both_baselines() {
    let doc = tether_json(&[
        "bench",
        "checksum",
        "--runs",
        "1",
        "--block",
        "4096",
        "--large-mib",
        "2",
        "--model",
        "--model-runs",
        "1",
        "--model-sizes",
        "4096",
        "--json",
    ]);
    for base in ["memcpy_gb_s", "memory_read_gb_s"] {
        positive(&doc[base]["in_cache"], base);
        positive(&doc[base]["out_of_cache"], base);
    }
    let algos = doc["algorithms"].as_array().expect("algorithms");
    let names: Vec<_> = algos.iter().map(|a| a["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["none", "crc32c", "sum", "xor", "adler32", "fletcher64", "fnv1a", "murmur3", "xxh3"]);
    for a in algos {
        for field in ["alone_gb_s", "fused_gb_s", "two_pass_gb_s"] {
            positive(&a[field]["in_cache"], field);
            positive(&a[field]["out_of_cache"], field);
        }
    }
    assert!(!doc["crc32c_kernels"].as_array().expect("kernels").is_empty());
    let row = &doc["model"]["rows"][0];
    assert_eq!(row["size"], 4096);
    positive(&row["stream_none_mb_s"], "stream none");
    positive(&row["stream_checksum_mb_s"], "stream crc32c");
    assert!(row["predicted_paper"].as_f64().expect("prediction") > 0.0);
}

#[test]
fn detection_document_shows_what_sum_and_xor_miss() {
    let doc = tether_json(&["bench", "checksum", "--errors", "--trials", "4000", "--json"]);
    let undetected = |name: &str, pattern: &str| -> u64 {
        let a = doc["algorithms"].as_array().unwrap().iter().find(|a| a["name"] == name).expect(name);
        let c = a["cells"].as_array().unwrap().iter().find(|c| c["pattern"] == pattern).expect(pattern);
        assert_eq!(c["trials"], 4000);
        c["undetected"].as_u64().expect("count")
    };
    for p in ["single_bit", "two_bits", "burst32", "overwrite", "word_swap"] {
        assert_eq!(undetected("crc32c", p), 0, "crc32c missed a {p}");
        assert_eq!(undetected("none", p), 4000);
    }
    assert_eq!(undetected("sum", "word_swap"), 4000);
    assert_eq!(undetected("xor", "word_swap"), 4000);
    assert!(undetected("xor", "two_bits") > 0);
}

#[test]
fn auth_document_has_the_baseline_and_every_algorithm() {
    let doc = tether_json(&["bench", "auth", "--rounds", "1", "--stream-size", "4096", "--json"]);
    let datagrams = doc["datagrams"].as_array().expect("the datagram table");
    assert_eq!(datagrams.len(), 4 * 3, "every protection at three payload sizes");
    for d in datagrams {
        positive(&d["send_gb_s"], "send");
        positive(&d["receive_gb_s"], "receive");
    }
    let rows = doc["end_to_end"].as_array().expect("a row per protection");
    let names: Vec<_> = rows.iter().map(|r| r["protection"].as_str().expect("name")).collect();
    assert_eq!(names, ["crc32c", "aes-256-gcm", "chacha20-poly1305", "aes-256-gmac"]);
    let encrypted: Vec<_> = rows.iter().map(|r| r["encrypted"].as_bool().expect("encrypted")).collect();
    assert_eq!(encrypted, [false, true, true, false]);
    for r in rows {
        positive(&r["rtt_us"], "rtt");
        positive(&r["stream_mb_s"], "stream");
        positive(&r["rtt_ratio"], "rtt ratio");
        positive(&r["stream_ratio"], "stream ratio");
    }
    // The baseline against itself, in every round.
    assert_eq!(rows[0]["rtt_ratio"]["median"], 1.0);
    assert_eq!(rows[0]["stream_ratio"]["median"], 1.0);
}

#[test]
fn shm_document_has_both_figures_and_their_baselines() {
    let doc = tether_json(&[
        "bench",
        "shm",
        "--runs",
        "1",
        "--round-trips",
        "2000",
        "--records",
        "200000",
        "--json",
    ]);
    for field in ["baseline_one_way_ns", "ring_one_way_ns", "baseline_m_msgs_s", "ring_m_msgs_s"] {
        positive(&doc[field], field);
    }
}

#[test]
fn engine_document_has_every_cost_and_a_recovery_that_lost_nothing() {
    let doc = tether_json(&[
        "bench",
        "engine",
        "--runs",
        "1",
        "--round-trips",
        "200",
        "--stream-messages",
        "50",
        "--small-messages",
        "2000",
        "--kills",
        "2",
        "--hangs",
        "2",
        "--json",
    ]);
    for field in [
        "rtt_raw_us",
        "rtt_embedded_us",
        "rtt_engine_us",
        "rtt_no_backup_us",
        "stream_embedded_mb_s",
        "stream_engine_mb_s",
        "stream_no_selftest_mb_s",
        "small_stream_m_msgs_s",
        "small_stream_no_backup_m_msgs_s",
        "same_node_one_way_us",
        "same_node_m_msgs_s",
        "same_node_batch_m_msgs_s",
        "cpu_embedded_us",
        "cpu_engine_us",
        "cpu_ratio",
    ] {
        positive(&doc[field], field);
    }
    // A difference of two measurements: any sign, but a number.
    for field in ["backup_us_per_msg", "backup_rtt_us"] {
        assert!(doc[field]["median"].as_f64().is_some_and(f64::is_finite), "{field}: {}", doc[field]);
    }
    let r = &doc["recovery"];
    assert_eq!((r["kills"].as_u64(), r["hangs"].as_u64()), (Some(2), Some(2)));
    assert!(r["messages"].as_u64().is_some_and(|n| n > 0), "no messages: {r}");
    for field in ["lost", "duplicated", "corrupted"] {
        assert_eq!(r[field].as_u64(), Some(0), "{field}: {r}");
    }
}

#[test]
fn bench_rows_compare_tether_with_the_limit_and_the_transport() {
    let doc = tether_json(&["bench", "--sizes", "8,70000", "--runs", "1", "--count", "200", "--json"]);
    let rows = doc.as_array().expect("one row per size");
    assert_eq!(rows.len(), 2);
    for r in rows {
        for field in [
            "pingpong_limit_us",
            "pingpong_tether_us",
            "pingpong_raw_us",
            "stream_limit_mb_s",
            "stream_tether_mb_s",
            "stream_raw_mb_s",
        ] {
            positive(&r[field], field);
        }
        let ratio = r["pingpong_limit_ratio"].as_f64().unwrap();
        let want = r["pingpong_tether_us"]["median"].as_f64().unwrap()
            / r["pingpong_limit_us"]["median"].as_f64().unwrap();
        assert!((ratio - want).abs() < 1e-9, "the ratio is of the same run's medians: {r}");
        let delivered = r["stream_limit_delivered_fraction"].as_f64().unwrap();
        assert!(delivered > 0.0 && delivered <= 1.0, "{r}");
    }
}

/// `--mtu auto` is the path's largest datagram: on loopback, 65,507 B.
#[test]
fn mtu_auto_takes_the_paths_largest_datagram() {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["bench", "--mtu", "auto", "--sizes", "70000", "--runs", "1", "--count", "50"])
        .output()
        .expect("the tether binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mtu 65507 B"), "{text}");
}

/// `tether bench loss`: a pair of runs, the lossy one with datagrams
/// dropped and repaired, every message verified, and the ratio of the two
/// goodputs in the same pair.
#[test]
fn loss_document_pairs_a_lossy_run_with_a_loss_free_one() {
    let doc = tether_json(&["bench", "loss", "--runs", "1", "--count", "20000", "--rate", "0.1", "--json"]);
    assert_eq!(doc["size"], 1024);
    assert_eq!(doc["rate"], 0.1);
    let pairs = doc["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 1);
    let p = &pairs[0];
    assert!(p["lossy_dropped"].as_u64().expect("dropped") > 0, "the lossy run lost datagrams: {p}");
    assert!(p["lossy_retransmits"].as_u64().expect("retransmits") > 0, "and repaired them: {p}");
    let ratio = p["ratio"].as_f64().expect("ratio");
    let free = p["loss_free_mb_s"].as_f64().expect("loss-free");
    let lossy = p["lossy_mb_s"].as_f64().expect("lossy");
    assert!(free > 0.0 && lossy > 0.0 && (ratio - lossy / free).abs() < 1e-9, "{p}");
    assert_eq!(doc["ratio"]["median"].as_f64(), Some(ratio));
}

/// `tether bench contention`: the limit's and tether's round trips under
/// the same busy threads, each a distribution over runs, and their ratio.
#[test]
fn contention_document_has_both_round_trips_under_the_load() {
    let doc = tether_json(&["bench", "contention", "--runs", "1", "--count", "200", "--busy", "1", "--json"]);
    assert_eq!(
        (doc["size"].as_u64(), doc["busy_threads"].as_u64(), doc["count"].as_u64()),
        (Some(8), Some(1), Some(200))
    );
    let limit = positive(&doc["limit_us"], "limit");
    let tether = positive(&doc["tether_us"], "tether");
    positive(&doc["limit_p99_us"], "limit p99");
    positive(&doc["tether_p99_us"], "tether p99");
    let ratio = doc["ratio"].as_f64().expect("ratio");
    assert!((ratio - tether / limit).abs() < 1e-9, "{doc}");
}

/// `tether bench contention --external`: the same document with the load
/// other processes make (here processes that sleep and wake, and a
/// compiler loop), the p99 ratio beside the median's; and none of those
/// processes outlives the command.
#[test]
fn contention_beside_other_processes_names_the_load_and_leaves_none() {
    let doc = tether_json(&[
        "bench",
        "contention",
        "--external",
        "wake,build",
        "--per-kind",
        "1",
        "--runs",
        "1",
        "--count",
        "200",
        "--json",
    ]);
    assert_eq!(doc["busy_threads"].as_u64(), Some(0), "no busy threads unless asked: {doc}");
    assert_eq!(doc["external"], serde_json::json!(["wake", "build"]));
    assert_eq!(doc["per_kind"].as_u64(), Some(1));
    let (limit, tether) =
        (positive(&doc["limit_p99_us"], "limit p99"), positive(&doc["tether_p99_us"], "p99"));
    let p99 = doc["p99_ratio"].as_f64().expect("p99 ratio");
    assert!((p99 - tether / limit).abs() < 1e-9, "{doc}");
    let loops: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("sleep 0.0005") || c.contains("load.c"))
        .collect();
    assert!(loops.is_empty(), "the load outlived the command: {loops:?}");
}

/// `tether bench calls`: the limit's, a message's and a call's round
/// trips, the call's with each log, calls a second with many open, and
/// the ratios computed from those figures.
#[test]
fn calls_document_has_every_round_trip_and_ratio() {
    let doc = tether_json(&["bench", "calls", "--runs", "1", "--count", "100", "--in-flight", "8", "--json"]);
    assert_eq!(
        (doc["size"].as_u64(), doc["count"].as_u64(), doc["in_flight"].as_u64()),
        (Some(8), Some(100), Some(8))
    );
    let limit = positive(&doc["limit_us"], "limit");
    let message = positive(&doc["message_us"], "message");
    let call = positive(&doc["call_us"], "call");
    let file = positive(&doc["call_file_log_us"], "call, file log");
    let synced = positive(&doc["call_synced_us"], "call, synced log");
    positive(&doc["calls_per_s"], "calls a second");
    positive(&doc["calls_per_s_batch_sync"], "calls a second, batch sync");
    let near = |k: &str, x: f64| assert!((doc[k].as_f64().expect(k) - x).abs() < 1e-9, "{k}: {doc}");
    near("call_over_limit", call / limit);
    near("call_over_message", call / message);
    near("file_log_added_us", file - call);
    near("per_record_sync_added_us", synced - file);
}

/// `tether bench async`: both APIs' round trips and streams, and the
/// ratios derived from their medians.
#[test]
fn async_document_has_both_apis_and_their_ratios() {
    let doc = tether_json(&["bench", "async", "--runs", "2", "--pings", "50", "--count", "2000", "--json"]);
    let median = |k: &str| {
        let x = doc[k]["median"].as_f64().unwrap_or_else(|| panic!("{k}: {doc}"));
        assert!(x.is_finite() && x > 0.0, "{k}: {doc}");
        x
    };
    let (b, a) = (median("blocking_rtt_us"), median("async_rtt_us"));
    let (bs, asy) = (median("blocking_msgs_per_s"), median("async_msgs_per_s"));
    let near = |k: &str, x: f64| assert!((doc[k].as_f64().expect(k) - x).abs() < 1e-9, "{k}: {doc}");
    near("rtt_ratio", a / b);
    near("stream_ratio", asy / bs);
    assert_eq!(doc["met"].as_bool(), Some(a / b <= 1.2));
}

/// `tether bench logp`: LogGP for messages and calls at each size, L and
/// G derived from them as the PRTT method says, and the datagram counts.
#[test]
fn logp_document_has_loggp_for_messages_and_calls() {
    let png = std::env::temp_dir().join(format!("tether-logp-{}.png", std::process::id()));
    let plot = png.to_str().expect("a UTF-8 temporary path");
    let args = ["bench", "logp", "--sizes", "8,1024,70000", "--burst", "4", "--reps", "20", "--plot", plot];
    let doc = tether_json(&[&args[..], &["--json"]].concat());
    let drawn = std::fs::read(&png).expect("the plot was written");
    assert_eq!(&drawn[1..4], b"PNG");
    std::fs::remove_file(&png).unwrap();
    assert_eq!((doc["burst"].as_u64(), doc["reps"].as_u64()), (Some(4), Some(20)));
    let max_datagram = doc["max_datagram"].as_u64().expect("max_datagram");
    for what in ["messages", "calls"] {
        let l = &doc[what];
        let sizes = l["sizes"].as_array().expect("sizes");
        assert_eq!(sizes.len(), 3, "{what}");
        for s in sizes {
            for k in ["rtt_us", "o_s_us", "o_r_us"] {
                let x = s[k].as_f64().unwrap_or_else(|| panic!("{what} {k}"));
                assert!(x.is_finite() && x > 0.0, "{what} {k}: {s}");
            }
        }
        let first = &sizes[0];
        let l_us = first["rtt_us"].as_f64().unwrap() / 2.0
            - first["o_s_us"].as_f64().unwrap()
            - first["o_r_us"].as_f64().unwrap();
        // L is given where it is a latency (above zero), and said to be
        // undetermined (null) where the overheads measured apart exceed
        // half the round trip: never a negative latency.
        match l["l_us"].as_f64() {
            Some(given) => assert!(l_us > 0.0 && (given - l_us).abs() < 1e-9, "{what}: L {given} vs {l_us}"),
            None => assert!(l["l_us"].is_null() && l_us <= 0.0, "{what}: L null only when not above zero"),
        }
        // 70,000 bytes (and a call's 32-byte envelope) take more than one
        // datagram of at most 65,507.
        let extra: u64 = if what == "calls" { 32 } else { 0 };
        let datagrams: Vec<u64> = sizes.iter().map(|s| s["datagrams"].as_u64().unwrap()).collect();
        assert_eq!(datagrams, [1, 1, (70_000 + extra).div_ceil(max_datagram - 64)], "{what}");
        assert!(datagrams[2] >= 2, "{what}");
    }
}

/// `tether bench sweep` ([TB] Figures 5-9) on a small grid: a point per
/// repair mode, setting and rate (the timer sweep at window 32 and the
/// window sweep at 1 ms sharing their common setting), the error-free
/// point the unit of its row, drops injected and repaired where the rate
/// is not zero, every kernel setting at every rate, a finding per claim
/// and mode, and the CSVs and figures written.
#[test]
fn sweep_document_covers_its_grid_and_writes_its_figures() {
    let out = std::env::temp_dir().join(format!("tether-sweep-test-{}", std::process::id()));
    let doc = tether_json(&[
        "bench",
        "sweep",
        "--timers",
        "1ms,10ms",
        "--windows",
        "8,32",
        "--rates",
        "0,0.02",
        "--sizes",
        "16384",
        "--bytes",
        "1048576",
        "--rounds",
        "20",
        "--runs",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let points = doc["points"].as_array().expect("points");
    // Per mode: (1ms, 32), (10ms, 32), (1ms, 8), each at 2 rates.
    assert_eq!(points.len(), 2 * 3 * 2, "{points:?}");
    for p in points {
        let rate = p["rate"].as_f64().unwrap();
        let (relative, dropped) = (p["relative"].as_f64().unwrap(), p["dropped"].as_u64().unwrap());
        assert!(p["mb_s"].as_f64().unwrap() > 0.0, "{p}");
        if rate == 0.0 {
            assert_eq!((relative, dropped), (1.0, 0), "{p}");
        } else {
            assert!(
                dropped > 0 && p["retransmits"].as_u64().unwrap() > 0,
                "drops injected and repaired: {p}"
            );
        }
    }
    let kernels = doc["kernels"].as_array().expect("kernels");
    assert_eq!(kernels.len(), 2 * 4 * 2, "two kernels, four settings, two rates");
    assert!(kernels.iter().all(|k| k["seconds"].as_f64().unwrap() > 0.0));
    assert_eq!(doc["findings"].as_array().expect("findings").len(), 2 * 3);
    let mut files: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(
        files,
        [
            "kernels.csv",
            "sweep-kernel-all-to-all.png",
            "sweep-kernel-neighbour.png",
            "sweep-timer-go-back-n-16384.png",
            "sweep-timer-selective-16384.png",
            "sweep-window-go-back-n-16384.png",
            "sweep-window-selective-16384.png",
            "sweep.csv",
        ]
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `tether model` ([AMVIA] chapter 4): the chain's round trip beside the
/// measured one at the rate asked for, with the difference between them
/// as printed; the what-ifs grow with the failure rate, engine mode costs
/// more than embedded, and two rails never cost more than one.
#[test]
fn model_document_sets_the_chain_against_the_measurement() {
    let doc = tether_json(&["model", "--rates", "0.05", "--count", "500", "--runs", "1", "--json"]);
    let checks = doc["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1);
    let c = &checks[0];
    let (p, m) = (c["predicted_us"].as_f64().unwrap(), c["measured_us"].as_f64().unwrap());
    assert!(p > 0.0 && m > 0.0, "{c}");
    assert!((c["difference"].as_f64().unwrap() - (p - m) / m).abs() < 1e-9, "{c}");
    assert!(c["predicted_resent"].as_f64().unwrap() > 0.09, "two legs at 5%: about 0.105 resent: {c}");
    let response = |w: &serde_json::Value| w["prediction"]["response_us"].as_f64().unwrap();
    let engine = doc["engine"].as_array().expect("engine");
    assert_eq!(engine.len(), 12);
    for loss in engine.chunks(6) {
        assert_eq!(loss[0]["setting"], "embedded");
        assert!(loss.windows(2).all(|w| response(&w[0]) < response(&w[1])), "{loss:?}");
    }
    let rails = doc["rails"].as_array().expect("rails");
    assert_eq!(rails.len(), 8);
    for pair in rails.chunks(2) {
        assert_eq!((&pair[0]["setting"], &pair[1]["setting"]), (&"one rail".into(), &"two rails".into()));
        assert!(response(&pair[1]) <= response(&pair[0]), "{pair:?}");
    }
}
