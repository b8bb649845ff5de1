//! Fuzz what parses shared memory (docs/ENGINE.md): control blocks (stream
//! backups and region headers) from arbitrary bytes, and a ring driven by
//! arbitrary pushes, pops and stray writes into its memory, and a pair
//! region (two applications' direct path) from arbitrary bytes. No panic;
//! a block that parses re-encodes to the bytes it came from; a ring hands
//! out only records within its bounds and, until something scribbled on
//! it, exactly the records pushed (whole or in two parts), in order.

use std::collections::VecDeque;
use std::sync::Arc;

use tether_shm::{pair_len, Block, BlockBody, ClientHeader, PairEnd, Region, Ring, StreamBackup};

/// One fuzz input.
pub fn run(input: &[u8]) {
    let Some((&first, rest)) = input.split_first() else { return };
    if first & 1 == 0 {
        let mut raw = [0u8; 64];
        let n = rest.len().min(64);
        raw[..n].copy_from_slice(&rest[..n]);
        if first & 2 == 0 {
            if let Ok(Some(b)) = Block::<StreamBackup>::parse(&raw) {
                assert_eq!(&b.encode()[..], &raw[8..56], "a parsed block re-encodes to its bytes");
            }
        } else if let Ok(Some(h)) = Block::<ClientHeader>::parse(&raw) {
            assert_eq!(&h.encode()[..], &raw[8..56], "a parsed header re-encodes to its bytes");
            assert!(h.region_len() > 0);
        }
        return;
    }
    let path = std::path::Path::new("/dev/shm").join(format!("tether-fuzz-shm-{}", std::process::id()));
    if first & 2 != 0 {
        // A pair region of arbitrary bytes (its header, rings and words):
        // opened as node 1 with peer 2, it is refused or it works.
        let mut bytes = rest.to_vec();
        bytes.resize(bytes.len().max(pair_len(64)), 0);
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(mut end) = PairEnd::open(&path, 1, 2) {
            let _ = end.tx.push_parts(&7u64.to_le_bytes(), b"body");
            let mut out = Vec::new();
            while let Ok(true) = end.rx.pop(&mut out) {
                assert!(out.len() <= end.rx.max_record());
            }
            let _ = (end.peer_taken(), end.peer_needs_waking());
            end.set_taken(1);
        }
        let _ = std::fs::remove_file(&path);
        return;
    }
    let region = Arc::new(Region::create(&path, Ring::footprint(1024)).unwrap());
    let mut ring = Ring::create(region, 0, 1024).unwrap();
    let mut model = VecDeque::new();
    let mut scribbled = false;
    let mut out = Vec::new();
    let mut data = rest;
    while let Some((&op, tail)) = data.split_first() {
        data = tail;
        match op % 3 {
            0 => {
                let len = usize::from(op) * 3;
                let m: Vec<u8> = (0..len).map(|i| i as u8 ^ op).collect();
                // Some records in two parts: a prefix and the rest.
                let cut = if op & 8 != 0 { m.len().min(8) } else { 0 };
                if ring.push_parts(&m[..cut], &m[cut..]).is_ok() {
                    model.push_back(m);
                }
            }
            1 => match ring.pop(&mut out) {
                Ok(true) => {
                    assert!(out.len() <= ring.max_record());
                    let want = model.pop_front();
                    if !scribbled {
                        assert_eq!(Some(&out), want.as_ref(), "an intact ring hands out what went in");
                    }
                }
                Ok(false) => assert!(scribbled || model.is_empty(), "an intact ring lost a record"),
                Err(_) => assert!(scribbled, "an intact ring reported damage"),
            },
            _ => {
                let n = data.len().min(9);
                let (bytes, tail) = data.split_at(n);
                if let Some((&at, bytes)) = bytes.split_first() {
                    ring.scribble(usize::from(at) * 4, bytes);
                    scribbled |= !bytes.is_empty();
                }
                data = tail;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}
