//! Taking a dead engine's place (docs/ENGINE.md, "Restore"): the backup
//! blocks it left in each application's region, what the application
//! resubmits (every unsettled message, the failures it was told of, where
//! it stands in each peer's stream), and the cores rebuilt from both
//! before anything runs.

use std::collections::BTreeMap;

use bytes::Bytes;
use tether_proto::{
    Channel, Endpoint as Core, Instant, NodeId, RailId, ResumedStream, StreamMarks, Unsettled,
};
use tether_shm::{ClientRegion, StreamBackup};
use tracing::{debug, info};

use crate::application::Application;
use crate::heartbeat::Heartbeat;

/// The marks of a stream no block was ever written for: nothing was sent.
pub(crate) const FRESH: StreamMarks = StreamMarks {
    peer_incarnation: 0,
    max_datagram: 0,
    epoch: 1,
    settled_msg: 0,
    settled_seq: 0,
    sent_upto: 0,
    tx_pn: 1,
};

/// The backup blocks a dead engine left: per peer, its slot and the marks
/// of the first of its two blocks that reads whole.
pub(crate) fn read_backups(region: &ClientRegion) -> BTreeMap<NodeId, (usize, Option<StreamBackup>)> {
    let mut found = BTreeMap::new();
    for slot in 0..region.backups.len() / 2 {
        let pair = [&region.backups[2 * slot], &region.backups[2 * slot + 1]];
        if let Some(b) = pair.iter().find_map(|b| b.read().ok().flatten()) {
            found.insert(b.peer, (slot, Some(b)));
        }
    }
    found
}

impl Application {
    /// A message given again while resuming: the next of its peer's.
    pub(crate) fn resumed_message(
        &mut self,
        peer: NodeId,
        id: u64,
        payload: &[u8],
        channel: Channel,
    ) -> bool {
        let Some(r) = self.resuming.as_mut().and_then(|r| r.get_mut(&peer)) else { return false };
        // The id is the application's word: one near the end of the
        // numbers is refused like any other out of order, not overflowed.
        let next = r.first_id.unwrap_or(id).checked_add(r.messages.len() as u64);
        if next != Some(id) {
            return false;
        }
        r.first_id.get_or_insert(id);
        r.messages.push(Unsettled { data: Bytes::copy_from_slice(payload), channel });
        // The id was checked above; what is kept runs without a gap.
        assert!(
            r.first_id.is_some_and(|f| f.wrapping_add(r.messages.len() as u64 - 1) == id),
            "resuming {peer}: messages kept out of order"
        );
        true
    }

    /// Everything resubmitted: rebuild the core from the backup blocks and
    /// what the application kept (docs/ENGINE.md, "Restore").
    pub(crate) fn resume(&mut self, now: Instant, beat: Option<&Heartbeat>) -> Result<(), String> {
        let resumed = self.resuming.take().unwrap_or_default();
        let mut streams = Vec::new();
        for (peer, r) in resumed {
            let last = self.recovered.get(&peer).and_then(|(_, b)| *b);
            let mut marks = last.map_or(FRESH, |b| StreamMarks {
                peer_incarnation: b.peer_incarnation,
                max_datagram: b.max_datagram as usize,
                epoch: b.epoch,
                settled_msg: b.settled_msg,
                settled_seq: b.settled_seq,
                sent_upto: b.sent_upto,
                tx_pn: u64::from(b.tx_pn_hi) << 32,
            });
            if r.failed_upto > marks.settled_msg {
                // The dead engine abandoned the stream and told the
                // application before its block said so: go on as it would
                // have, on the next epoch, after what failed.
                marks = StreamMarks {
                    epoch: marks.epoch.wrapping_add(1),
                    settled_msg: r.failed_upto,
                    settled_seq: 0,
                    sent_upto: 0,
                    ..marks
                };
            }
            let first = r.first_id.unwrap_or(marks.settled_msg);
            if first > marks.settled_msg {
                return Err(format!(
                    "resuming {peer}: messages from {first}, the backup needs {}",
                    marks.settled_msg
                ));
            }
            let skip = (marks.settled_msg - first) as usize;
            let messages: Vec<Unsettled> = r.messages.into_iter().skip(skip).collect();
            let taken =
                r.taken.filter(|t| t.incarnation == marks.peer_incarnation).map(|t| (t.epoch, t.next));
            let rails = (0..self.rails.get(&peer).copied().unwrap_or(1) as RailId).collect();
            debug!(node = self.node, peer, ?marks, ?taken, messages = messages.len(), "resuming a stream");
            streams.push(ResumedStream { peer, rails, marks, messages, failures: Vec::new(), taken });
        }
        let config = self.core.config().clone();
        // Many messages take milliseconds to restore: the watchdog is told
        // the engine is making progress, not hung.
        let mut progress = || {
            if let Some(h) = beat {
                h.beat();
            }
        };
        let incarnation = self.core.incarnation();
        let mut core =
            Core::resume_with_progress(config, self.node, incarnation, streams, now, &mut progress)
                .map_err(|e| e.to_string())?;
        // The application's secret: a handshake the dead engine began is
        // finished by this one (its cookies check).
        core.seed_secrets(self.region.control.secret());
        info!(node = self.node, unsettled = core.unsettled(), "application resumed from its backup");
        self.core = core;
        self.settled.clear();
        Ok(())
    }
}
