//! The engine's notice board: its counters, and each application's peers
//! and paths, published every `PUBLISH_EVERY` on `engine.board` in its
//! directory for `tether stat` and the metrics exporter
//! (`tether_attach::stat`; docs/OPERATING.md). Readers map it read-only:
//! the engine never waits for them or knows they are there. Publishing
//! happens in housekeeping, never on the data path, into buffers kept
//! across publications.

use std::time::Instant as StdInstant;

use tether_attach::stat::{self, NodeStat, BOARD_CAPACITY, ENGINE_BOARD, FORMAT, PUBLISH_EVERY};
use tether_proto::Instant;
use tether_shm::BoardWriter;
use tracing::warn;

use crate::application::Application;
use crate::EngineStats;

pub(crate) struct Board {
    writer: BoardWriter,
    due: Instant,
    started: StdInstant,
    snapshot: NodeStat,
    bytes: Vec<u8>,
    /// Said once: a snapshot larger than the board.
    too_large: bool,
}

impl Board {
    pub(crate) fn create(dir: &std::path::Path) -> Result<Self, tether_shm::ShmError> {
        Ok(Board {
            writer: BoardWriter::create(&dir.join(ENGINE_BOARD), BOARD_CAPACITY)?,
            due: Instant::ZERO,
            started: StdInstant::now(),
            snapshot: NodeStat::default(),
            bytes: Vec::new(),
            too_large: false,
        })
    }
}

impl EngineStats {
    /// Every counter with its name, for the board and the metrics.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("attached", self.attached),
            ("detached", self.detached),
            ("attach_refused", self.attach_refused),
            ("reclaimed_regions", self.reclaimed_regions),
            ("unknown_destination", self.unknown_destination),
            ("send_dropped", self.send_dropped),
            ("bad_submissions", self.bad_submissions),
            ("turns", self.turns),
            ("audit_ns", self.audit_ns),
            ("replaced_before", self.replaced_before),
        ]
    }
}

impl Board {
    /// Is a snapshot due at `now`?
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        now >= self.due
    }

    /// Publish the snapshot if it is due: the engine's counters, its
    /// rails, and each application's protocol instance.
    pub(crate) fn publish_due(
        &mut self,
        now: Instant,
        stats: &EngineStats,
        rails: &[std::net::SocketAddr],
        supervised: bool,
        clients: &[Application],
    ) {
        if now < self.due {
            return;
        }
        self.due = now + PUBLISH_EVERY;
        let s = &mut self.snapshot;
        s.format = FORMAT;
        s.role = "engine".into();
        s.pid = std::process::id();
        // SAFETY: getppid has no preconditions.
        s.supervisor = supervised.then(|| unsafe { libc::getppid() } as u32);
        s.rails = rails.iter().map(|a| a.to_string()).collect();
        s.uptime_ms = self.started.elapsed().as_millis() as u64;
        s.published_unix_ms = stat::unix_ms();
        s.counters.clear();
        s.counters.extend(stats.fields().into_iter().map(|(k, v)| (k.to_string(), v)));
        s.applications.clear();
        s.applications.extend(clients.iter().map(|c| stat::app_stat(&c.core, c.pid)));
        self.bytes.clear();
        if let Err(e) = serde_json::to_writer(&mut self.bytes, &self.snapshot) {
            warn!(error = %e, "the engine's snapshot did not encode");
            return;
        }
        if let Err(e) = self.writer.publish(&self.bytes) {
            if !self.too_large {
                self.too_large = true;
                warn!(error = %e, "the engine's snapshot does not fit its board: tether stat shows an older one");
            }
        }
    }
}
