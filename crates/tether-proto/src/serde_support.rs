//! What the `serde` feature needs beyond derives: `Duration`s as whole
//! nanoseconds, and the tests that pin the JSON shapes.
//!
//! `Instant` is a number of nanoseconds, so durations are too: a reader of
//! the JSON subtracts and compares them without unit conversions, and
//! serde's default `{secs, nanos}` pair would be the one odd shape out.
//! `u64` nanoseconds reach 584 years, far past any duration the core holds.

/// A `Duration` as nanoseconds (`#[serde(with = "crate::serde_support::nanos")]`).
pub mod nanos {
    use core::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn to_nanos(d: &Duration) -> u64 {
        d.as_nanos().min(u64::MAX as u128) as u64
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        to_nanos(d).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_nanos)
    }
}

/// The same for an optional duration: `null` when absent.
pub mod nanos_option {
    use core::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::nanos::to_nanos;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.as_ref().map(to_nanos).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|n| n.map(Duration::from_nanos))
    }
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use serde_json::json;

    use crate::{
        Event, FailReason, FailedMessages, Failover, Instant, MessageId, MessageState, PathInfo, PathState,
        PathStats, RailPolicy, Stats,
    };

    /// The JSON shapes readers rely on, and that each reads back equal.
    #[test]
    fn reported_types_round_trip_in_the_documented_shapes() {
        let failed = FailedMessages { peer: 2, first: 5, end: 9, in_doubt_end: 7 };
        let events = [
            (
                Event::PathChanged {
                    peer: 2,
                    rail: 1,
                    from: PathState::Active,
                    to: PathState::Suspect,
                    at: Instant::from_nanos(1_500),
                },
                json!({"event": "path_changed", "peer": 2, "rail": 1, "from": "active", "to": "suspect", "at": 1500}),
            ),
            (
                Event::FailedOver {
                    peer: 2,
                    failover: Failover { from: 0, to: 1, gap: Duration::from_micros(7) },
                    at: Instant::from_nanos(9),
                },
                json!({"event": "failed_over", "peer": 2, "failover": {"from": 0, "to": 1, "gap": 7000}, "at": 9}),
            ),
            (
                Event::PeerUnreachable { failed },
                json!({"event": "peer_unreachable", "failed": {"peer": 2, "first": 5, "end": 9, "in_doubt_end": 7}}),
            ),
        ];
        for (event, want) in events {
            assert_eq!(serde_json::to_value(&event).unwrap(), want);
            assert_eq!(serde_json::from_value::<Event>(want).unwrap(), event);
        }

        let states = [
            (MessageState::Pending, json!("pending")),
            (MessageState::Failed(FailReason::PeerRestarted), json!({"failed": "peer_restarted"})),
        ];
        for (state, want) in states {
            assert_eq!(serde_json::to_value(state).unwrap(), want);
            assert_eq!(serde_json::from_value::<MessageState>(want).unwrap(), state);
        }

        let path = PathInfo {
            rail: 0,
            state: PathState::Down,
            since: Instant::from_nanos(3),
            rtt: Some(Duration::from_nanos(42)),
            last_answer: None,
            stats: PathStats { probes_sent: 4, ..PathStats::default() },
        };
        let v = serde_json::to_value(path).unwrap();
        assert_eq!(
            (&v["state"], &v["rtt"], &v["last_answer"], &v["stats"]["probes_sent"]),
            (&json!("down"), &json!(42), &json!(null), &json!(4))
        );
        assert_eq!(serde_json::from_value::<PathInfo>(v).unwrap(), path);

        let id = MessageId { peer: 1, seq: 3 };
        assert_eq!(serde_json::to_value(id).unwrap(), json!({"peer": 1, "seq": 3}));
        assert_eq!(serde_json::to_value(RailPolicy::PrimaryBackup).unwrap(), json!("primary_backup"));
        assert_eq!(PathState::Suspect.to_string(), "suspect");
    }

    /// Counters are named as `Stats::fields` names them, and a record that
    /// lacks a counter (written before it existed) still reads.
    #[test]
    fn stats_use_the_stable_names() {
        let s = Stats { retransmits: 3, ..Stats::default() };
        let v = serde_json::to_value(&s).unwrap();
        for (name, value) in s.fields() {
            assert_eq!(v[name], json!(value), "{name}");
        }
        assert_eq!(serde_json::from_value::<Stats>(json!({"retransmits": 3})).unwrap(), s);
    }
}
