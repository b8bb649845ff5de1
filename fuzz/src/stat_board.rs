//! Fuzz what `tether stat` reads (docs/OPERATING.md): a node's board from
//! arbitrary bytes (its header and snapshot, as a stray writer or another
//! version could leave them) and a snapshot's JSON from arbitrary bytes.
//! No panic; a board is read whole or refused with a typed error; a
//! snapshot that parses survives a round trip through its JSON.

use tether_attach::stat;
use tether_shm::{BoardReader, BoardWriter, BOARD_HEADER};

/// One fuzz input.
pub fn run(input: &[u8]) {
    let Some((&first, rest)) = input.split_first() else { return };
    if first & 1 == 0 {
        if let Ok(s) = stat::parse_snapshot(rest) {
            let again = serde_json::to_vec(&s).expect("a parsed snapshot encodes");
            assert_eq!(stat::parse_snapshot(&again).as_ref(), Ok(&s), "a snapshot survives its JSON");
        }
        return;
    }
    let path = std::path::Path::new("/dev/shm").join(format!("tether-fuzz-board-{}", std::process::id()));
    if first & 2 == 0 {
        // Arbitrary bytes as a whole board: header and all.
        let mut bytes = rest.to_vec();
        bytes.resize(bytes.len().max(BOARD_HEADER), 0);
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(r) = BoardReader::open(&path) {
            let mut out = Vec::new();
            if let Ok(true) = r.read(&mut out) {
                assert!(out.len() <= bytes.len() - BOARD_HEADER, "a read stays within the board");
            }
        }
        let _ = stat::read_board(&path);
    } else {
        // Arbitrary bytes published as a snapshot: read back as they went.
        let mut w = BoardWriter::create(&path, 4096).unwrap();
        let fits = w.publish(rest).is_ok();
        let mut out = Vec::new();
        let read = BoardReader::open(&path).unwrap().read(&mut out).unwrap();
        assert_eq!(read, fits, "a snapshot that fit is there to read");
        if fits {
            assert_eq!(out, rest, "a board hands back what was published");
        }
        let _ = stat::read_board(&path);
    }
    let _ = std::fs::remove_file(&path);
}
