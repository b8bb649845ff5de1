//! An endpoint's own notice board (`Builder::publish_stats`): its
//! counters, its calls' and, embedded, every peer's and path's state,
//! published every `PUBLISH_EVERY` on `endpoint-NODE-PID.board` in the
//! directory given, for `tether stat` and the metrics exporter
//! (`tether_attach::stat`; docs/OPERATING.md).
//!
//! A thread of its own publishes, so an endpoint driven by the application
//! (`Progress::Polling`) publishes too; it takes the endpoint's lock once
//! per publication, for as long as a snapshot takes to copy (tens of
//! microseconds for a few peers). Readers map the board read-only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tether_attach::stat::{self, AppStat, NodeStat, BOARD_CAPACITY, FORMAT, PUBLISH_EVERY};
use tether_attach::Client;
use tether_proto::NodeId;
use tether_shm::BoardWriter;

use crate::call_site::Host;
use crate::calls::CallStats;
use crate::shared::Shared;
use crate::Error;

/// Where the protocol whose state is published runs.
#[derive(Clone)]
pub(crate) enum Source {
    Embedded(Arc<Shared>),
    Attached(Arc<Client>),
}

impl Source {
    fn app(&self, pid: u32) -> AppStat {
        match self {
            Source::Embedded(shared) => stat::app_stat(&shared.lock().core, pid),
            // The peers and paths are the engine's: its board shows them.
            Source::Attached(client) => AppStat {
                node: client.node(),
                pid,
                incarnation: client.incarnation(),
                unsettled: client.unsettled(),
                counters: stat::counters(&client.stats()),
                peers: Vec::new(),
            },
        }
    }

    /// The endpoint's whole snapshot now: its own counters (its calls',
    /// attached its engine's recoveries) and its protocol instance's.
    pub(crate) fn snapshot(&self, calls: &Host, started: Instant, rails: &[String]) -> NodeStat {
        let pid = std::process::id();
        let mut snapshot = NodeStat {
            format: FORMAT,
            role: "endpoint".into(),
            pid,
            rails: rails.to_vec(),
            uptime_ms: started.elapsed().as_millis() as u64,
            published_unix_ms: stat::unix_ms(),
            ..Default::default()
        };
        snapshot.counters.extend(CallStats::of(calls).fields().into_iter().map(|(k, v)| (k.into(), v)));
        if let Source::Attached(client) = self {
            snapshot.counters.insert("engine_recoveries".into(), client.recoveries());
            snapshot.counters.insert("engine_pid".into(), client.engine_pid() as u64);
        }
        snapshot.applications = vec![self.app(pid)];
        snapshot
    }
}

/// The thread publishing an endpoint's board; stopped, and the board
/// removed, on drop.
pub(crate) struct Publisher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("path", &self.path).finish()
    }
}

impl Publisher {
    /// Publish `source`'s state (and its calls', from `calls`) for
    /// endpoint `node` in `dir`, whose rails are bound at `rails`.
    pub(crate) fn start(
        dir: &Path,
        node: NodeId,
        source: Source,
        calls: Host,
        rails: Vec<String>,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(stat::endpoint_board(node, std::process::id()));
        let mut writer = BoardWriter::create(&path, BOARD_CAPACITY)
            .map_err(|e| Error::Io(std::io::Error::other(format!("stats board {}: {e}", path.display()))))?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = stop.clone();
        let started = Instant::now();
        let thread = std::thread::Builder::new().name(format!("tether-stats-{node}")).spawn(move || {
            let (lock, cv) = &*stopped;
            let mut bytes = Vec::new();
            loop {
                let snapshot = source.snapshot(&calls, started, &rails);
                bytes.clear();
                if serde_json::to_writer(&mut bytes, &snapshot).is_ok() {
                    // Too large a snapshot leaves the last one (and
                    // BOARD_CAPACITY holds thousands of peers).
                    let _ = writer.publish(&bytes);
                }
                let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                let (guard, _) = cv
                    .wait_timeout_while(guard, PUBLISH_EVERY, |stop| !*stop)
                    .unwrap_or_else(|p| p.into_inner());
                if *guard {
                    return;
                }
            }
        })?;
        Ok(Publisher { stop, thread: Some(thread), path })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
