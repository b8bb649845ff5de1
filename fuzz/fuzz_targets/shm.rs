//! Fuzz what parses shared memory (docs/ENGINE.md): control blocks (stream
//! backups and region headers) from arbitrary bytes, and a ring driven by
//! arbitrary pushes, pops and stray writes into its memory. No panic; a block that parses re-encodes to the
//! bytes it came from; a ring hands out only records within its bounds and,
//! until something scribbled on it, exactly the records pushed, in order.

#![no_main]

use std::collections::VecDeque;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tether_shm::{Block, BlockBody, ClientHeader, Region, Ring, StreamBackup};

fuzz_target!(|input: &[u8]| {
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
                if ring.push(&m).is_ok() {
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
});
