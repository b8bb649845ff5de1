//! Fuzz the call log (crates/tether-rpc/src/record.rs): arbitrary bytes as
//! a log file a crash (or anyone) left. Replay reads whole records up to a
//! tear and never panics; what it read writes back to exactly the bytes it
//! came from; a server restarted on it comes up and answers.
//!
//! Random bytes seldom carry a valid CRC32C, so with the first byte odd
//! the rest is cut into record bodies (a length byte, then that many
//! bytes) and each is framed with its true length and checksum: the
//! fuzzer then reaches the field checks and the server's replay.

use tether_proto::Instant;
use tether_rpc::{replay, CallId, Envelope, MemLog, RpcConfig, Target};

fn framed(mut data: &[u8]) -> Vec<u8> {
    let mut log = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let n = (len as usize).min(rest.len());
        let (body, tail) = rest.split_at(n);
        data = tail;
        let start = log.len();
        log.extend_from_slice(&((8 + body.len()) as u32).to_le_bytes());
        log.extend_from_slice(&[0; 4]);
        log.extend_from_slice(body);
        let crc = crc32c::crc32c(&log[start + 8..]);
        log[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }
    log
}

/// One fuzz input.
pub fn run(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else { return };
    let bytes = if mode & 1 == 1 { framed(rest) } else { rest.to_vec() };
    let (records, _torn) = replay(&bytes);
    let mut again = Vec::new();
    records.iter().for_each(|r| r.write(&mut again));
    assert_eq!(&bytes[..again.len()], &again[..]);
    let config = RpcConfig { credit: 4, lives_per_node: 2, ..RpcConfig::default() };
    let mut server = Target::recover(config.clone(), &records);
    assert!(server.entries() <= config.credit as usize * records.len().max(1));
    let mut log = MemLog::new(1 << 16);
    let query = Envelope::Query { call: CallId { client: 1, seq: 0 }, first_incomplete: 0 }.to_vec();
    server.handle(Instant::from_nanos(1), 1, &query, &mut log).expect("a well-formed query");
    assert!(server.poll_transmit().is_some(), "a query is always answered");
}
