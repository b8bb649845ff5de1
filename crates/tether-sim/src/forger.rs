//! An attacker on the path without the cluster key (the `forged_epochs`
//! mix; docs/PROTOCOL.md, "Incarnations, epochs"): it reads every header
//! going by, learns the live incarnations and each stream's epoch, and at
//! moments drawn from the seed sends one forged datagram beside a genuine
//! one: DATA toward the receiver under another epoch, or an ACK toward the
//! sender naming another epoch of its stream. The forged DATA frame lies
//! far past any window, so it is never delivered: what it can do is move
//! the receiver's epoch, and the genuine stream must resynchronise without
//! losing a message (the documented threat model lets such an attacker
//! deliver forged data; it must never lock a peer out).

use std::collections::BTreeMap;

use rand::Rng;
use rand_pcg::Pcg64Mcg;
use tether_proto::NodeId;
use tether_wire::{AckRepr, DataFlags, Frame, Header, Packet, PacketWriter};

/// Epochs the forger names, relative to the stream's: near, far, exactly
/// half the space away, just past half (older), and just behind.
const DELTAS: [u32; 8] = [1, 2, 3, 1 << 20, (1 << 31) - 1, 1 << 31, (1 << 31) + 1, u32::MAX];

/// A forged datagram to deliver: from, to, bytes.
pub type Forged = (NodeId, NodeId, Vec<u8>);

#[derive(Debug)]
pub struct Forger {
    /// Datagrams seen so far.
    seen: u64,
    /// The datagrams after which it forges (ascending), each DATA or ACK.
    plan: Vec<(u64, bool)>,
    /// Each stream's epoch as its sender's headers show it.
    epochs: BTreeMap<(NodeId, NodeId), u32>,
    pub forged_data: u64,
    pub forged_acks: u64,
}

impl Forger {
    /// `count` forgeries at datagrams drawn from `spread`, DATA and ACK in
    /// turn (which comes first drawn too).
    pub fn new(rng: &mut Pcg64Mcg, count: usize, spread: std::ops::Range<u64>) -> Self {
        let first_data = rng.gen_bool(0.5);
        let mut plan: Vec<(u64, bool)> =
            (0..count).map(|i| (rng.gen_range(spread.clone()), (i % 2 == 0) == first_data)).collect();
        plan.sort_unstable();
        Forger { seen: 0, plan, epochs: BTreeMap::new(), forged_data: 0, forged_acks: 0 }
    }

    /// A genuine datagram from `src` to `dst` goes by: perhaps one forged
    /// beside it.
    pub fn on_pass(
        &mut self,
        rng: &mut Pcg64Mcg,
        src: NodeId,
        dst: NodeId,
        datagram: &[u8],
    ) -> Option<Forged> {
        let packet = Packet::parse(datagram).ok()?;
        let header = packet.header;
        self.seen += 1;
        let carries_data = packet.frames().any(|f| matches!(f, Frame::Data(_)));
        if header.dst_inc == 0 {
            // No session yet: nothing to forge against.
            return None;
        }
        if carries_data {
            self.epochs.insert((src, dst), header.epoch);
        }
        let &(at, data) = self.plan.first()?;
        if self.seen < at {
            return None;
        }
        let delta = DELTAS[rng.gen_range(0..DELTAS.len())];
        let mut buf = vec![0u8; 256];
        if data {
            // Toward the receiver, from its sender, under another epoch.
            let &epoch = self.epochs.get(&(src, dst))?;
            let h = Header { epoch: epoch.wrapping_add(delta), ..header };
            let mut w = PacketWriter::new(&mut buf, &h).ok()?;
            w.push_data(1 << 40, DataFlags::new(true, true), 0, b"forged").ok()?;
            let n = w.finish();
            buf.truncate(n);
            self.forged_data += 1;
            self.plan.remove(0);
            Some((src, dst, buf))
        } else {
            // Toward `dst` as if from `src`, naming another epoch of the
            // stream `dst` sends to `src`.
            let &epoch = self.epochs.get(&(dst, src))?;
            let mut w = PacketWriter::new(&mut buf, &header).ok()?;
            w.push_ack(&AckRepr::new(epoch.wrapping_add(delta), 0)).ok()?;
            let n = w.finish();
            buf.truncate(n);
            self.forged_acks += 1;
            self.plan.remove(0);
            Some((src, dst, buf))
        }
    }
}
