//! Fuzz the call envelope (crates/tether-rpc/src/envelope.rs) and the two
//! sides that take it from the network: arbitrary bytes parse to a typed
//! error or to an envelope that writes back to exactly those bytes; fed as
//! a stream of envelopes from one node to a server and to a caller with
//! calls open, nothing panics and the server holds no more than its
//! credit per caller life.

use core::time::Duration;
use tether_proto::Instant;
use tether_rpc::{Caller, Envelope, MemLog, RpcConfig, Target};

/// One fuzz input.
pub fn run(input: &[u8]) {
    if let Ok(e) = Envelope::parse(input) {
        assert_eq!(e.to_vec(), input);
    }
    let config = RpcConfig { credit: 4, lives_per_node: 2, ..RpcConfig::default() };
    let mut server = Target::new(config.clone());
    server.register(1);
    let mut log = MemLog::new(4096);
    let mut caller = Caller::new(config.clone(), 5);
    let mut now = Instant::from_nanos(1);
    for handler in [1, 2] {
        let _ = caller.request(now, 9, handler, bytes::Bytes::from_static(b"x"), false, None, true);
    }
    // Length-prefixed envelopes, each to both sides.
    let mut data = input;
    while let Some((&len, rest)) = data.split_first() {
        let n = (len as usize).min(rest.len());
        let (env, tail) = rest.split_at(n);
        data = tail;
        let _ = server.handle(now, 9, env, &mut log);
        let _ = caller.handle(now, 9, env);
        while let Some(d) = server.poll_dispatch(&mut log) {
            let _ = server.complete(d.from, d.call, &d.args, &mut log);
        }
        now = now + Duration::from_millis(1);
        server.handle_timeout(now);
        caller.handle_timeout(now);
        while server.poll_transmit().is_some() {}
        while caller.poll_transmit().is_some() {}
        assert!(server.entries() <= (config.credit as usize) * config.lives_per_node);
    }
}
