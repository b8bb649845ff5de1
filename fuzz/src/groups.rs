//! Fuzz the groups' ordered multicast (`tether_members::groups`,
//! docs/CLUSTER.md "Groups"): its envelope parser on arbitrary bytes (an
//! envelope that parses encodes to one that parses back the same), and a
//! member of a group of three taking arbitrary envelopes from arbitrary
//! senders between its turns, views changing under it. No panic; what it
//! sends goes only to members of the group's views; it delivers in the
//! group's views only, each view's messages numbered 1, 2, 3... with none
//! twice; every number it hands out to its own messages is kept.

use bytes::Bytes;
use core::time::Duration;
use tether_members::group_wire::Envelope;
use tether_members::groups::{GroupOutput, Groups, GroupsConfig};
use tether_members::{Change, View, ViewChange};
use tether_proto::{Instant, MessagePool};

const G: u32 = 7;

/// One fuzz input.
pub fn run(input: &[u8]) {
    if let Ok(e) = Envelope::parse(Bytes::copy_from_slice(input)) {
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(out.len(), e.encoded_len());
        assert_eq!(Envelope::parse(Bytes::from(out)), Ok(e), "an envelope encodes to itself");
    }
    let mut view = View::default();
    let mut change = |view: &mut View, node, c| {
        assert!(view.apply(ViewChange { epoch: view.epoch + 1, node, change: c }));
    };
    for n in 1..=4 {
        change(&mut view, n, Change::Joined(1));
    }
    for n in 1..=3 {
        change(&mut view, n, Change::JoinedGroup(G));
    }
    let mut g = Groups::new(2, GroupsConfig::default(), MessagePool::new());
    g.on_view(&view);
    let mut now = Instant::from_nanos(1_000_000);
    let mut last_seq: Option<(u64, u64)> = None;
    let mut given = 0u64;
    // Each step: a control byte (low bits: the sender; bit 3: a view
    // change first; bit 4: submit a message), a length byte, an envelope.
    let mut data = input;
    while data.len() >= 2 {
        let (ctl, len) = (data[0], data[1] as usize);
        let n = len.min(data.len() - 2);
        let bytes = Bytes::copy_from_slice(&data[2..2 + n]);
        data = &data[2 + n..];
        now = now + Duration::from_micros(300);
        if ctl & 0x08 != 0 {
            // Member 1 or 3 leaves, or member 4 joins, the group.
            let (node, c) = match ctl >> 5 {
                0 => (1, Change::LeftGroup(G)),
                1 => (3, Change::LeftGroup(G)),
                _ => (4, Change::JoinedGroup(G)),
            };
            if view.group(G).contains(&node) != matches!(c, Change::JoinedGroup(_)) {
                change(&mut view, node, c);
                g.on_view(&view);
            }
        }
        if ctl & 0x10 != 0 {
            if let Ok(k) = g.submit(G, Bytes::from_static(b"mine")) {
                given += 1;
                assert_eq!(k, given, "numbers handed out in order");
            }
        }
        g.on_envelope(u32::from(ctl & 0x07), bytes);
        g.pump(now);
        let mut sent = 0;
        while let Some((to, _)) = g.poll_send() {
            sent += 1;
            assert!((1..=4).contains(&to), "an envelope to {to}");
        }
        assert!(sent <= 64, "{sent} envelopes from one step");
        while let Some(o) = g.poll_output() {
            match o {
                GroupOutput::View { group, epoch, .. } => {
                    assert_eq!(group, G);
                    last_seq = Some((epoch, 0));
                }
                GroupOutput::Delivered(m) => {
                    let (epoch, seq) = last_seq.expect("a delivery in a view");
                    assert_eq!((m.epoch, m.seq), (epoch, seq + 1), "in order, once each");
                    last_seq = Some((epoch, m.seq));
                }
                GroupOutput::Left { group, .. } => assert_eq!(group, G),
            }
        }
    }
}
