//! What a running node shows of itself: a snapshot of its counters and of
//! every peer's and every rail's state, published a few times a second on
//! a notice board in shared memory (`tether_shm::BoardWriter`) that
//! `tether stat` and the metrics exporter read without disturbing the node
//! (Aeron's counters file and AeronStat are the model; docs/OPERATING.md).
//!
//! An engine publishes `engine.board` in its directory: its own counters
//! and those of each application it serves. An endpoint asked to
//! (`Builder::publish_stats`) publishes `endpoint-NODE-PID.board` in the
//! directory it is given: its own counters, its calls and, attached, its
//! engine's recoveries as it saw them.
//!
//! The snapshot is JSON: a reader of another version of tether still reads
//! the fields it knows, and a script can read the board with no tether at
//! all. It is small (about 2 KiB per peer), made from buffers reused
//! across publications, and made only at the publication's interval, never
//! on the data path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tether_proto::{Endpoint as Core, NodeId, Stats};
use tether_shm::{BoardReader, ShmError};

/// The engine's board in its directory.
pub const ENGINE_BOARD: &str = "engine.board";
/// How often a node publishes its snapshot.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// The largest snapshot a board holds.
pub const BOARD_CAPACITY: usize = 4 << 20;
/// The snapshot format; a reader refuses a larger one it cannot read.
pub const FORMAT: u32 = 1;

/// The board of endpoint `node` in process `pid`.
pub fn endpoint_board(node: NodeId, pid: u32) -> String {
    format!("endpoint-{node}-{pid}.board")
}

/// The process an endpoint board's name gives.
pub fn endpoint_board_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("endpoint-")?.strip_suffix(".board")?;
    rest.rsplit_once('-')?.1.parse().ok()
}

/// One node's snapshot: an engine, or an endpoint that publishes its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeStat {
    /// The snapshot format ([`FORMAT`]).
    pub format: u32,
    /// `engine` or `endpoint`.
    pub role: String,
    /// The publishing process.
    pub pid: u32,
    /// The engine's supervisor, if it has one.
    pub supervisor: Option<u32>,
    /// Where each rail is bound, in rail order.
    pub rails: Vec<String>,
    /// Since this process (this engine, for an engine) started.
    pub uptime_ms: u64,
    /// Wall-clock time of the publication (milliseconds since 1970), so a
    /// reader can tell a board nobody updates any more.
    pub published_unix_ms: u64,
    /// The node's own counters: an engine's (`EngineStats`), or an
    /// endpoint's calls and engine recoveries.
    pub counters: BTreeMap<String, u64>,
    /// The protocol instances: each application an engine serves, or the
    /// endpoint's own.
    pub applications: Vec<AppStat>,
}

/// One protocol instance: an application's, in an engine or embedded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppStat {
    /// The application's node id.
    pub node: NodeId,
    /// The application's process.
    pub pid: u32,
    /// This life's incarnation (a restart gets a larger one).
    pub incarnation: u64,
    /// Messages neither acknowledged nor failed.
    pub unsettled: u64,
    /// The core's counters (`tether_proto::Stats`), every drop by reason.
    pub counters: BTreeMap<String, u64>,
    /// Each peer it knows (an attached endpoint's own board has none: its
    /// engine's board shows them).
    pub peers: Vec<PeerStat>,
}

/// The state toward one peer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerStat {
    /// The peer's node id.
    pub peer: NodeId,
    /// A session is up (the handshake done).
    pub session: bool,
    /// Smoothed round trip, microseconds.
    pub rtt_us: Option<f64>,
    /// The congestion window in payload bytes (`None`: unlimited).
    pub window_bytes: Option<u64>,
    /// Payload bytes sent and neither acknowledged nor judged lost.
    pub in_flight_bytes: u64,
    /// The congestion controller's state.
    pub congestion: String,
    /// Payload bytes kept for retransmission.
    pub buffered_bytes: u64,
    /// One per rail toward the peer.
    pub paths: Vec<PathStat>,
}

/// One path (a peer over a rail).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PathStat {
    /// The rail the path leaves on.
    pub rail: u8,
    /// `up`, `suspect`, `down`, ... (`tether_proto::PathState`).
    pub state: String,
    /// Smoothed round trip of its probes, microseconds.
    pub rtt_us: Option<f64>,
    /// What went over it (`tether_proto::PathStats`).
    pub counters: BTreeMap<String, u64>,
}

/// The counters of `stats`, by name.
pub fn counters(stats: &Stats) -> BTreeMap<String, u64> {
    stats.fields().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The whole-number fields of a serializable value, by name.
pub fn numbers_of<T: Serialize>(value: &T) -> BTreeMap<String, u64> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(fields)) => {
            fields.into_iter().filter_map(|(k, v)| Some((k, v.as_u64()?))).collect()
        }
        _ => BTreeMap::new(),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// An application's protocol instance, as a snapshot.
pub fn app_stat(core: &Core, pid: u32) -> AppStat {
    let peers = core
        .peers()
        .map(|peer| {
            let congestion = core.congestion(peer);
            let paths = core
                .paths(peer)
                .into_iter()
                .map(|p| PathStat {
                    rail: p.rail,
                    state: p.state.to_string(),
                    rtt_us: p.rtt.map(micros),
                    counters: numbers_of(&p.stats),
                })
                .collect();
            PeerStat {
                peer,
                session: core.has_session(peer),
                rtt_us: core.rtt(peer).map(micros),
                window_bytes: congestion.map(|c| c.window).filter(|&w| w != u64::MAX),
                in_flight_bytes: congestion.map(|c| c.in_flight).unwrap_or(0),
                congestion: congestion.map(|c| c.state.to_string()).unwrap_or_default(),
                buffered_bytes: core.buffered_bytes(peer) as u64,
                paths,
            }
        })
        .collect();
    AppStat {
        node: core.node(),
        pid,
        incarnation: core.incarnation(),
        unsettled: core.unsettled(),
        counters: counters(core.stats()),
        peers,
    }
}

/// Milliseconds since 1970 now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Why a board could not be read.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the fields are said by each variant's message
pub enum StatError {
    /// The board could not be mapped or read whole.
    #[error("{}: {source}", path.display())]
    Board { path: PathBuf, source: ShmError },
    /// Nothing was published on it yet.
    #[error("{}: nothing published yet", path.display())]
    Empty { path: PathBuf },
    /// Its bytes are not a snapshot.
    #[error("{}: not a snapshot: {why}", path.display())]
    Malformed { path: PathBuf, why: String },
    /// A snapshot of a newer tether.
    #[error("{}: snapshot format {found}, this tether reads up to {FORMAT}", path.display())]
    Format { path: PathBuf, found: u32 },
}

/// Read the snapshot on the board at `path`.
pub fn read_board(path: &Path) -> Result<NodeStat, StatError> {
    let board = |source| StatError::Board { path: path.to_owned(), source };
    let reader = BoardReader::open(path).map_err(board)?;
    let mut bytes = Vec::new();
    if !reader.read_settled(&mut bytes, 100).map_err(board)? {
        return Err(StatError::Empty { path: path.to_owned() });
    }
    parse(&bytes).map_err(|why| match why {
        Parse::Format(found) => StatError::Format { path: path.to_owned(), found },
        Parse::Json(why) => StatError::Malformed { path: path.to_owned(), why },
    })
}

enum Parse {
    Format(u32),
    Json(String),
}

fn parse(bytes: &[u8]) -> Result<NodeStat, Parse> {
    let stat: NodeStat = serde_json::from_slice(bytes).map_err(|e| Parse::Json(e.to_string()))?;
    if stat.format > FORMAT || stat.format == 0 {
        return Err(Parse::Format(stat.format));
    }
    Ok(stat)
}

/// A snapshot from bytes (a board's, or a fuzzer's): checked, never a
/// panic.
pub fn parse_snapshot(bytes: &[u8]) -> Result<NodeStat, String> {
    parse(bytes).map_err(|e| match e {
        Parse::Format(f) => format!("snapshot format {f}"),
        Parse::Json(why) => why,
    })
}

/// Every board in `dir`: the engine's, then the endpoints' (by name).
pub fn boards_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut endpoints: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| endpoint_board_owner(n).is_some()))
        .map(|e| e.path())
        .collect();
    endpoints.sort();
    let engine = dir.join(ENGINE_BOARD);
    let mut all: Vec<PathBuf> = engine.exists().then_some(engine).into_iter().collect();
    all.extend(endpoints);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_the_board_and_bad_bytes_are_refused() {
        let mut stat = NodeStat { format: FORMAT, role: "engine".into(), pid: 7, ..Default::default() };
        stat.counters.insert("attached".into(), 3);
        stat.applications.push(AppStat {
            node: 4,
            peers: vec![PeerStat { peer: 5, rtt_us: Some(12.5), ..Default::default() }],
            ..Default::default()
        });
        let json = serde_json::to_vec(&stat).unwrap();
        assert_eq!(parse_snapshot(&json).unwrap(), stat);
        let path = std::env::temp_dir().join(format!("tether-stat-test-{}.board", std::process::id()));
        let mut w = tether_shm::BoardWriter::create(&path, 4096).unwrap();
        assert!(matches!(read_board(&path), Err(StatError::Empty { .. })));
        w.publish(&json).unwrap();
        assert_eq!(read_board(&path).unwrap(), stat);
        w.publish(br#"{"format": 99}"#).unwrap();
        assert!(matches!(read_board(&path), Err(StatError::Format { found: 99, .. })));
        w.publish(b"not json").unwrap();
        assert!(matches!(read_board(&path), Err(StatError::Malformed { .. })));
        std::fs::remove_file(&path).unwrap();
        assert!(parse_snapshot(b"").is_err());
        assert!(parse_snapshot(br#"{"format": 0}"#).is_err());
    }

    #[test]
    fn endpoint_board_names_give_their_owner() {
        assert_eq!(endpoint_board_owner(&endpoint_board(3, 4242)), Some(4242));
        assert_eq!(endpoint_board_owner("engine.board"), None);
        assert_eq!(endpoint_board_owner("endpoint-3.board"), None);
    }
}
