//! Fuzz the membership protocol (`tether_members`, docs/CLUSTER.md): its
//! message parser on arbitrary bytes (a message that parses encodes back
//! to the same bytes), and a member in a view of five taking arbitrary
//! messages from arbitrary senders at arbitrary moments between its turns.
//! No panic; what it sends goes only to members of its view (as it
//! stands), its manager, or (a probe's answer: an observer of a newer view
//! may probe it) the node it just heard from; at most a few messages per
//! step; an alert names only one of its subjects. View changes count only
//! from the manager.

use core::time::Duration;
use tether_members::{Member, MemberConfig, Msg, View};
use tether_proto::Instant;

/// One fuzz input.
pub fn run(input: &[u8]) {
    if let Ok(m) = Msg::parse(input) {
        assert_eq!(m.to_vec(), input, "a message encodes back to its bytes");
    }
    let period = Duration::from_millis(10);
    let mut config = MemberConfig::new(period);
    if input.first().is_some_and(|b| b & 1 == 1) {
        config.detector = tether_members::DetectorKind::phi(period);
    }
    let mut now = Instant::from_nanos(1_000_000);
    let mut m = Member::new(3, 7, config, now);
    m.set_view(View { epoch: 4, members: (1..=5).map(|n| (n, 7)).collect(), ..View::default() }, now);
    m.set_managers(&[100]);
    let subjects: Vec<u32> = m.subjects().collect();
    m.join();
    // Each step: a sender byte (its high bit: the manager), a time step
    // byte, a length byte, a message.
    let mut data = input.get(1..).unwrap_or_default();
    while data.len() >= 3 {
        let from = if data[0] & 0x80 != 0 { 100 } else { u32::from(data[0] % 8) };
        let (step, len) = (data[1], data[2] as usize);
        let n = len.min(data.len() - 3);
        let bytes = &data[3..3 + n];
        data = &data[3 + n..];
        now = now + Duration::from_micros(u64::from(step) * 200);
        if let Ok(msg) = Msg::parse(bytes) {
            let passed = m.handle(from, msg, now);
            let for_managers = matches!(
                passed,
                Some(Msg::Alert { .. } | Msg::Join { .. } | Msg::ViewPull { .. } | Msg::Group { .. })
            );
            assert!(passed.is_none() || for_managers, "only the managers' messages are handed back");
        }
        m.turn(now);
        let mut sent = 0;
        while let Some((to, msg)) = m.poll_send() {
            sent += 1;
            // A probe's answer goes back, and so may a pull (to the manager).
            let answer = matches!(msg, Msg::ProbeAck { .. }) && to == from;
            let member = m.view().members.iter().any(|&(n, _)| n == to);
            assert!((1..=5).contains(&to) || member || to == 100 || answer, "{msg:?} to {to}");
            if let Msg::Alert { subject, .. } = msg {
                let watched = subjects.contains(&subject) || m.subjects().any(|s| s == subject);
                assert!(to == 100 && watched, "an alert about {subject} to {to}");
            }
        }
        assert!(sent <= 16, "{sent} messages from one step");
        while m.poll_event().is_some() {}
        assert!(m.next_deadline() > now || m.next_deadline() == now, "a deadline ahead");
    }
}
