//! Metrics a real Prometheus server scrapes: Debian's `prometheus`
//! (installed by scripts/setup) scrapes a running `tether engine
//! --metrics` and an embedded endpoint's own listener
//! (`Builder::metrics`) while traffic flows, and the values are queried
//! back through Prometheus's HTTP API. Skips loudly without the package.

#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether::Endpoint;

/// A free loopback port (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` from `addr`: the body.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// A PromQL query, percent-encoded for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value Prometheus gives for `query` once it is at least `want`
/// (waiting for scrapes), with the whole answer; past a minute, a panic
/// with the last answer and `why()` (what the node says of itself).
fn query_until(prometheus: SocketAddr, query: &str, want: f64, why: &dyn Fn() -> String) -> (f64, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(body) = get(prometheus, &format!("/api/v1/query?query={}", encode(query))) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let value = v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse::<f64>().ok());
            if value.is_some_and(|x| x >= want) {
                return (value.unwrap(), body);
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus never gave {query} >= {want}; last answer: {last}\n{}", why());
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_an_engine_and_an_endpoint() {
    let Ok(prometheus_bin) = which("prometheus") else {
        eprintln!(
            "SKIPPED prometheus_scrapes_an_engine_and_an_endpoint: no `prometheus` on PATH \
             (scripts/setup installs Debian's package; `apt-get install prometheus`)"
        );
        return;
    };
    let base = PathBuf::from(format!("/dev/shm/tether-metrics-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let dir = base.join("engine");
    let engine_metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut engine = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["engine", "--dir", dir.to_str().unwrap(), "--bind", "127.0.0.1:0"])
        .args(["--metrics", &engine_metrics.to_string()])
        // What is scraped is one engine's life: a replacement starts its
        // counters afresh. Under a loaded machine (the whole suite on two
        // cores) the default 5 ms threshold replaced it now and then
        // ("replaced_before": 1, messages_sent 0); hangs are not what this
        // test is about.
        .args(["--hang-after-us", "1000000"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(base.join("engine.err")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(engine.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let rail: SocketAddr = first.trim().rsplit(' ').next().and_then(|a| a.parse().ok()).expect(&first);
    std::thread::spawn(move || for _ in lines {});
    let engine = Killed(engine);

    // An attached application and an embedded endpoint serving its own
    // metrics, talking.
    let b = Endpoint::builder(2)
        .bind("127.0.0.1:0".parse().unwrap())
        .metrics("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let endpoint_metrics = b.metrics_addr().expect("the endpoint serves its metrics");
    let a = Endpoint::builder(1).engine(&dir).peer(2, b.local_addr().unwrap()).build().unwrap();
    b.add_peer(1, rail).unwrap();
    for i in 0..500u64 {
        a.send(2, &i.to_le_bytes()).unwrap();
    }
    for _ in 0..500 {
        b.recv(Some(Duration::from_secs(10))).unwrap();
    }

    // The real Prometheus, scraping both every second.
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = base.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: engine\n    static_configs:\n      - targets: ['{engine_metrics}']\n  \
             - job_name: endpoint\n    static_configs:\n      - targets: ['{endpoint_metrics}']\n"
        ),
    )
    .unwrap();
    let prometheus = Killed(
        Command::new(prometheus_bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", base.join("tsdb").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // What the engine logged and what its board says, should a value
    // never come (a replaced engine, say).
    let why = || {
        let log = std::fs::read_to_string(base.join("engine.err")).unwrap_or_default();
        let stat = Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["stat", "--dir", dir.to_str().unwrap(), "--json"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!("the engine's log:\n{log}\ntether stat --json:\n{stat}")
    };
    let (sent, answer) =
        query_until(web, "tether_messages_sent_total{job=\"engine\",node=\"1\"}", 500.0, &why);
    println!("{answer}");
    assert_eq!(sent, 500.0, "the engine's application sent 500 messages");
    let (acked, _) = query_until(web, "tether_messages_acked_total{job=\"engine\",node=\"1\"}", 500.0, &why);
    assert_eq!(acked, 500.0);
    let (delivered, answer) =
        query_until(web, "tether_messages_delivered_total{job=\"endpoint\",node=\"2\"}", 500.0, &why);
    println!("{answer}");
    assert_eq!(delivered, 500.0, "the endpoint delivered 500 messages");
    let (up, _) =
        query_until(web, "tether_path_active{job=\"endpoint\",node=\"2\",peer=\"1\",rail=\"0\"}", 1.0, &why);
    assert_eq!(up, 1.0);
    let (attached, _) = query_until(web, "tether_engine_attached_total{job=\"engine\"}", 1.0, &why);
    assert_eq!(attached, 1.0);
    let (rtt, answer) =
        query_until(web, "tether_peer_rtt_seconds{job=\"engine\",node=\"1\",peer=\"2\"}", 0.0, &why);
    println!("{answer}");
    assert!(rtt > 0.0 && rtt < 1.0, "a round trip in seconds: {rtt}");
    drop(prometheus);
    drop((a, b));
    drop(engine);
    let _ = std::fs::remove_dir_all(&base);
}

/// Where `name` is on PATH.
fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|f| f.is_file()))
        .ok_or(())
}
