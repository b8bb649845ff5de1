//! A node's counters in the Prometheus text format (OpenMetrics), served
//! over HTTP for a Prometheus server to scrape (feature `metrics`;
//! docs/OPERATING.md, "Metrics").
//!
//! What is exported is what a node publishes on its board
//! (`tether_attach::stat`): [`encode`] turns snapshots into metrics named
//! by Prometheus's conventions (a `tether_` prefix, base units, counters
//! ending in `_total`, labels for the node, peer and rail), through
//! prometheus-client's registry and encoder. [`MetricsServer`] answers
//! `GET /metrics` (tiny_http) with what a closure gives at each scrape: an
//! engine's exporter reads its board (`tether metrics`, `tether engine
//! --metrics`), an endpoint its own state (`Builder::metrics`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tether_attach::stat::NodeStat;

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter<u64>>;
type Seconds = Family<Labels, Counter<f64, AtomicU64>>;
type Floats = Family<Labels, Gauge<f64, AtomicU64>>;

/// The metric families of one encoding, made as names are met.
struct Families {
    registry: Registry,
    counters: std::collections::BTreeMap<String, Counters>,
    seconds: std::collections::BTreeMap<String, Seconds>,
    gauges: std::collections::BTreeMap<String, Floats>,
}

impl Families {
    fn counter(&mut self, name: &str, help: &str, labels: &Labels, value: u64) {
        let family = self.counters.entry(name.to_string()).or_insert_with(|| {
            let f = Counters::default();
            self.registry.register(name, help, f.clone());
            f
        });
        family.get_or_create(labels).inc_by(value);
    }

    fn seconds(&mut self, name: &str, help: &str, labels: &Labels, value: f64) {
        let family = self.seconds.entry(name.to_string()).or_insert_with(|| {
            let f = Seconds::default();
            self.registry.register(name, help, f.clone());
            f
        });
        family.get_or_create(labels).inc_by(value);
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &Labels, value: f64) {
        let family = self.gauges.entry(name.to_string()).or_insert_with(|| {
            let f = Floats::default();
            self.registry.register(name, help, f.clone());
            f
        });
        family.get_or_create(labels).set(value);
    }
}

fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// `name` as a metric name's tail: what a Prometheus name may hold.
fn metric_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// A counter in nanoseconds, in the base unit: seconds.
fn seconds_name(name: &str) -> Option<String> {
    name.strip_suffix("_ns").map(|base| format!("{base}_seconds"))
}

/// Snapshots as metrics, in the OpenMetrics text format:
///
/// - an engine's own counters as `tether_engine_NAME_total` (time in
///   seconds: `audit_ns` is `tether_engine_audit_seconds_total`; the
///   engines its supervisor replaced, `tether_engine_replacements_total`);
///   a replacement engine counts from zero, which Prometheus takes as a
///   counter reset;
/// - an endpoint's own (its calls, its engine recoveries) as
///   `tether_endpoint_NAME_total{node}`;
/// - each protocol instance's counters (`tether_proto::Stats`, every drop
///   by reason) as `tether_NAME_total{node}`;
/// - per peer, gauges `tether_peer_rtt_seconds`, `tether_peer_window_bytes`,
///   `tether_peer_in_flight_bytes`, `tether_peer_buffered_bytes` and
///   `tether_peer_session` (1 with a session) `{node, peer}`;
/// - per path, `tether_path_active` (1 if active), `tether_path_rtt_seconds`
///   and the counters `tether_path_NAME_total{node, peer, rail}`.
pub fn encode_snapshots(nodes: &[NodeStat]) -> String {
    let mut f = Families {
        registry: Registry::default(),
        counters: Default::default(),
        seconds: Default::default(),
        gauges: Default::default(),
    };
    for n in nodes {
        let engine = n.role == "engine";
        let role = if engine { "engine" } else { "endpoint" };
        // An engine is the scrape target itself; an endpoint is one of
        // those publishing in a directory, known by its node.
        let own = match (engine, n.applications.first()) {
            (false, Some(a)) => labels(&[("node", a.node.to_string())]),
            _ => Labels::new(),
        };
        for (k, &v) in &n.counters {
            let help = format!("tether {role} counter {k} (docs/OPERATING.md)");
            match (k.as_str(), seconds_name(k)) {
                ("engine_pid", _) => {}
                ("replaced_before", _) => f.counter("tether_engine_replacements", &help, &own, v),
                (_, Some(s)) => {
                    f.seconds(&format!("tether_{role}_{}", metric_name(&s)), &help, &own, v as f64 / 1e9)
                }
                (_, None) => f.counter(&format!("tether_{role}_{}", metric_name(k)), &help, &own, v),
            }
        }
        for a in &n.applications {
            let node = labels(&[("node", a.node.to_string())]);
            for (k, &v) in &a.counters {
                let help = format!("tether_proto::Stats::{k}");
                f.counter(&format!("tether_{}", metric_name(k)), &help, &node, v);
            }
            f.gauge(
                "tether_unsettled_messages",
                "Messages neither acknowledged nor failed",
                &node,
                a.unsettled as f64,
            );
            for p in &a.peers {
                let peer = labels(&[("node", a.node.to_string()), ("peer", p.peer.to_string())]);
                f.gauge(
                    "tether_peer_session",
                    "1 while a session with the peer is up",
                    &peer,
                    p.session as u8 as f64,
                );
                if let Some(rtt) = p.rtt_us {
                    f.gauge("tether_peer_rtt_seconds", "Smoothed round trip to the peer", &peer, rtt / 1e6);
                }
                if let Some(w) = p.window_bytes {
                    f.gauge("tether_peer_window_bytes", "Congestion window toward the peer", &peer, w as f64);
                }
                f.gauge(
                    "tether_peer_in_flight_bytes",
                    "Payload bytes in flight",
                    &peer,
                    p.in_flight_bytes as f64,
                );
                f.gauge(
                    "tether_peer_buffered_bytes",
                    "Payload bytes kept for retransmission",
                    &peer,
                    p.buffered_bytes as f64,
                );
                for path in &p.paths {
                    let rail = labels(&[
                        ("node", a.node.to_string()),
                        ("peer", p.peer.to_string()),
                        ("rail", path.rail.to_string()),
                    ]);
                    let active = (path.state == "active") as u8 as f64;
                    f.gauge("tether_path_active", "1 while the path answers", &rail, active);
                    if let Some(rtt) = path.rtt_us {
                        f.gauge(
                            "tether_path_rtt_seconds",
                            "Smoothed round trip of the path's probes",
                            &rail,
                            rtt / 1e6,
                        );
                    }
                    for (k, &v) in &path.counters {
                        let help = format!("tether_proto::PathStats::{k}");
                        f.counter(&format!("tether_path_{}", metric_name(k)), &help, &rail, v);
                    }
                }
            }
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &f.registry);
    out
}

/// An HTTP listener answering `GET /metrics` with the snapshots a closure
/// gives at each scrape; stopped on drop.
pub struct MetricsServer {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

/// The content type of the OpenMetrics text format, which Prometheus asks
/// for and prometheus-client writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl MetricsServer {
    /// Listen on `addr` (port 0 picks one) and answer each scrape with
    /// `snapshots()`, encoded. Any other path is a 404.
    pub fn serve(
        addr: SocketAddr,
        snapshots: impl Fn() -> Vec<NodeStat> + Send + 'static,
    ) -> std::io::Result<Self> {
        let server = Arc::new(tiny_http::Server::http(addr).map_err(std::io::Error::other)?);
        let addr = server.server_addr().to_ip().ok_or_else(|| std::io::Error::other("not an IP listener"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (srv, stopped) = (server.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("tether-metrics".into()).spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let request = match srv.recv_timeout(Duration::from_millis(200)) {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(_) => return,
                };
                let response = if request.url() == "/metrics" || request.url().starts_with("/metrics?") {
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
                    tiny_http::Response::from_string(encode_snapshots(&snapshots())).with_header(header)
                } else {
                    tiny_http::Response::from_string("tether exports its metrics at /metrics\n")
                        .with_status_code(404)
                };
                // A scraper that hung up is its own business.
                let _ = request.respond(response);
            }
        })?;
        Ok(MetricsServer { addr, server, stop, thread: Some(thread) })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_attach::stat::{AppStat, PathStat, PeerStat};

    fn snapshot() -> NodeStat {
        let mut n = NodeStat { format: 1, role: "engine".into(), pid: 42, ..Default::default() };
        n.counters.insert("attached".into(), 2);
        n.counters.insert("audit_ns".into(), 1_500_000_000);
        n.counters.insert("replaced_before".into(), 1);
        let mut a = AppStat { node: 7, ..Default::default() };
        a.counters.insert("messages_sent".into(), 1000);
        let mut path = PathStat { rail: 1, state: "active".into(), rtt_us: Some(20.0), ..Default::default() };
        path.counters.insert("retransmits".into(), 3);
        a.peers.push(PeerStat {
            peer: 8,
            session: true,
            rtt_us: Some(25.0),
            paths: vec![path],
            ..Default::default()
        });
        n.applications.push(a);
        n
    }

    #[test]
    fn snapshots_encode_by_the_conventions() {
        let text = encode_snapshots(&[snapshot()]);
        for want in [
            "tether_engine_attached_total{} 2",
            "tether_engine_audit_seconds_total{} 1.5",
            "tether_engine_replacements_total{} 1",
            "tether_messages_sent_total{node=\"7\"} 1000",
            "tether_peer_rtt_seconds{node=\"7\",peer=\"8\"} 0.000025",
            "tether_path_retransmits_total{node=\"7\",peer=\"8\",rail=\"1\"} 3",
            "tether_path_active{node=\"7\",peer=\"8\",rail=\"1\"} 1",
            "# TYPE tether_messages_sent counter",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }

    #[test]
    fn the_server_answers_scrapes_and_nothing_else() {
        let server = MetricsServer::serve("127.0.0.1:0".parse().unwrap(), || vec![snapshot()]).unwrap();
        let get = |path: &str| {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.0 200") || ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(
            ok.contains("application/openmetrics-text") && ok.contains("tether_messages_sent_total"),
            "{ok}"
        );
        assert!(get("/other").contains(" 404 "));
    }
}
