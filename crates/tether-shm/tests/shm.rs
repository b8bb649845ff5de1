//! Rings and control blocks in shared memory: exact delivery between two
//! mappings and between two processes, wrap-around, back-pressure, and
//! damage detected rather than trusted (torn blocks, stray writes, a writer
//! that died mid-record).

// Threads and processes on real shared memory: this is an I/O crate's test.
#![allow(clippy::disallowed_methods)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use proptest::prelude::*;
use tether_shm::{Block, ClientHeader, ClientRegion, Region, Ring, ShmError, StreamBackup, LAYOUT_VERSION};

/// A fresh region file, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
        Scratch(dir.join(format!("tether-shm-test-{}-{name}", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn record(i: u64) -> Vec<u8> {
    let len = [0usize, 1, 7, 8, 9, 100, 1000, 3000][(i % 8) as usize];
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

fn ring(path: &Scratch, capacity: usize) -> Ring {
    let region = Arc::new(Region::create(&path.0, Ring::footprint(capacity)).unwrap());
    Ring::create(region, 0, capacity).unwrap()
}

#[test]
fn records_come_out_as_they_went_in_across_the_wrap() {
    let s = Scratch::new("wrap");
    let mut r = ring(&s, 4096);
    let mut out = Vec::new();
    // Far more bytes than the ring holds, so it wraps many times, with
    // padding wherever a record would not fit before the end.
    for i in 0..10_000u64 {
        let m = record(i % 7);
        assert_eq!(r.next_len(), None, "nothing published");
        r.push(&m).unwrap();
        // Past a padding marker too: the length the next pop takes.
        assert_eq!(r.next_len(), Some(m.len()), "record {i}");
        assert!(r.pop(&mut out).unwrap());
        assert_eq!(out, m, "record {i}");
    }
    assert!(!r.pop(&mut out).unwrap(), "empty");
}

#[test]
fn a_full_ring_refuses_and_an_oversized_record_is_an_error() {
    let s = Scratch::new("full");
    let mut r = ring(&s, 1024);
    assert!(matches!(r.push(&[0; 1024]), Err(ShmError::RecordTooLarge(1024))));
    let mut n = 0;
    while r.push(&[7; 100]).is_ok() {
        n += 1;
    }
    assert_eq!(n, 1024 / 128, "128-byte records (16 + 100 padded to 112) fill a 1 KiB ring");
    assert!(matches!(r.push(&[7; 100]), Err(ShmError::Full { .. })));
    let mut out = Vec::new();
    assert!(r.pop(&mut out).unwrap());
    r.push(&[8; 100]).unwrap();
}

#[test]
fn two_mappings_of_one_region_pass_a_million_records_exactly() {
    let s = Scratch::new("threads");
    let mut producer = ring(&s, 1 << 16);
    let mut consumer = Ring::attach(Arc::new(Region::open(&s.0).unwrap()), 0).unwrap();
    const N: u64 = 1_000_000;
    let t = std::thread::spawn(move || {
        for i in 0..N {
            let m = record(i);
            while producer.push(&m).is_err() {
                // Two cores and several tests at once: give the other side the CPU.
                std::thread::yield_now();
            }
        }
    });
    let mut out = Vec::new();
    let mut i = 0;
    while i < N {
        if consumer.pop(&mut out).unwrap() {
            assert_eq!(out, record(i), "record {i}");
            i += 1;
        } else {
            std::thread::yield_now();
        }
    }
    t.join().unwrap();
    assert!(!consumer.pop(&mut out).unwrap());
}

/// The producer half of `two_processes_pass_records_exactly`, run in a
/// child process (the test binary again) when the variable names a region.
#[test]
fn child_producer() {
    let Ok(path) = std::env::var("TETHER_SHM_CHILD_RING") else { return };
    let mut r = Ring::attach(Arc::new(Region::open(path.as_ref()).unwrap()), 0).unwrap();
    for i in 0..100_000 {
        let m = record(i);
        while r.push(&m).is_err() {
            // Two cores and several tests at once: give the other side the CPU.
            std::thread::yield_now();
        }
    }
}

#[test]
fn two_processes_pass_records_exactly() {
    let s = Scratch::new("processes");
    let mut consumer = ring(&s, 1 << 14);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_producer", "--test-threads", "1", "--quiet"])
        .env("TETHER_SHM_CHILD_RING", &s.0)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    let mut i = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while i < 100_000 {
        assert!(std::time::Instant::now() < deadline, "the child stopped after {i} records");
        if consumer.pop(&mut out).unwrap() {
            assert_eq!(out, record(i), "record {i}");
            i += 1;
        } else {
            std::thread::yield_now();
        }
    }
    assert!(child.wait().unwrap().success());
}

#[test]
fn damage_is_detected_and_the_ring_left_as_it_was() {
    let s = Scratch::new("damage");
    let mut r = ring(&s, 1024);
    let mut out = Vec::new();
    r.push(b"first record").unwrap();
    r.push(b"second").unwrap();
    // A stray write into the first record's payload (after its 16-byte header).
    r.scribble(16 + 3, b"X");
    for _ in 0..2 {
        assert!(matches!(r.pop(&mut out), Err(ShmError::Corrupt { at: 0, why: "record checksum mismatch" })));
    }
    assert!(out.is_empty(), "nothing of a damaged record is handed out");
    r.scribble(16 + 3, b"s");
    // A length field damaged (header bytes 8..12): 199 bytes claimed where
    // 12 were written.
    r.scribble(8, &200u32.to_le_bytes());
    assert!(matches!(r.pop(&mut out), Err(ShmError::Corrupt { at: 0, why: "record checksum mismatch" })));
    // One past what any record may be.
    r.scribble(8, &1000u32.to_le_bytes());
    assert!(matches!(r.pop(&mut out), Err(ShmError::Corrupt { why: "record length out of bounds", .. })));
    assert_eq!(r.len(), 32 + 32, "nothing consumed");
    // Repaired, it checks again: the damage was the only fault.
    r.scribble(8, &13u32.to_le_bytes());
    assert!(r.pop(&mut out).unwrap());
    assert_eq!(out, b"first record");
}

/// A long record (copied and checked in one pass) is checked as well:
/// any byte damaged is found, and the repaired record reads back whole.
#[test]
fn damage_to_a_long_record_is_detected() {
    let mut out = Vec::new();
    let long: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    for at in [0, 1, 63, 64, 65, 1500, 2999] {
        // A fresh ring each time: the record at position 0.
        let s = Scratch::new(&format!("damage-long-{at}"));
        let mut r = ring(&s, 16384);
        r.push(&long).unwrap();
        let was = long[at];
        r.scribble(16 + at, &[was ^ 0x10]);
        assert!(
            matches!(r.pop(&mut out), Err(ShmError::Corrupt { why: "record checksum mismatch", .. })),
            "byte {at}"
        );
        assert!(out.is_empty(), "nothing of a damaged record is handed out");
        r.scribble(16 + at, &[was]);
        assert!(r.pop(&mut out).unwrap());
        assert_eq!(out, long, "byte {at}");
    }
}

/// A padding marker forged by a stray write (a valid tag at the consumer's
/// position) would move the consumer past the producer: it is checked like
/// a record (found by the `shm` fuzz target, which then overflowed the
/// producer's free-space sum).
#[test]
fn a_forged_padding_marker_is_refused() {
    let s = Scratch::new("forged-pad");
    let mut r = ring(&s, 1024);
    let mut header = (!0u64).to_le_bytes().to_vec();
    header.extend_from_slice(&u32::MAX.to_le_bytes());
    header.extend_from_slice(&[0; 4]);
    r.scribble(0, &header);
    let mut out = Vec::new();
    assert!(matches!(r.pop(&mut out), Err(ShmError::Corrupt { at: 0, why: "padding checksum mismatch" })));
    r.push(b"still works").unwrap();
}

/// The positions live in shared memory too, where the other process (or
/// a stray write) can put anything: one off the records' grid is a typed
/// error for the producer, and positions at the end of their range wrap
/// as they would after 2^64 bytes, never overflow.
#[test]
fn positions_moved_by_another_process_are_errors_or_wrap() {
    let s = Scratch::new("positions");
    let region = Arc::new(Region::create(&s.0, Ring::footprint(1024)).unwrap());
    let mut r = Ring::create(region.clone(), 0, 1024).unwrap();
    let set = |at: usize, pos: u64| {
        // SAFETY: the producer's (64) or the consumer's (128) position,
        // 8-aligned inside the ring's header, in a mapping `region` keeps.
        unsafe { (region.as_ptr().add(at) as *mut u64).write_volatile(pos) };
    };
    let (tail, head) = (64, 128);
    set(tail, 3);
    assert!(matches!(r.push(b"x"), Err(ShmError::Corrupt { at: 3, .. })));
    let last = u64::MAX - 15;
    set(tail, last);
    set(head, last);
    let mut out = Vec::new();
    for record in [&b"at the end"[..], b"wrapped"] {
        r.push(record).unwrap();
        assert!(r.pop(&mut out).unwrap());
        assert_eq!(out, record);
    }
    assert!(!r.pop(&mut out).unwrap());
}

#[test]
fn a_record_its_writer_never_published_is_invisible() {
    let s = Scratch::new("unpublished");
    let mut r = ring(&s, 1024);
    r.push(b"published").unwrap();
    // A producer that died while writing the next record: its payload in
    // the ring, its header (written last, to publish it) never stored.
    r.scribble(32 + 16, b"half");
    let mut out = Vec::new();
    assert!(r.pop(&mut out).unwrap());
    assert_eq!(out, b"published");
    assert!(!r.pop(&mut out).unwrap(), "the half-written record is not there");
}

#[test]
fn attaching_checks_the_ring() {
    let s = Scratch::new("attach");
    let region = Arc::new(Region::create(&s.0, 8192).unwrap());
    assert!(matches!(Ring::attach(region.clone(), 0), Err(ShmError::NotARing)), "zeroes are no ring");
    assert!(matches!(Ring::create(region.clone(), 0, 1000), Err(ShmError::BadField(_))));
    assert!(matches!(Ring::create(region.clone(), 0, 16384), Err(ShmError::TooSmall { .. })));
    assert!(matches!(Ring::create(region.clone(), 10, 1024), Err(ShmError::BadField(_))), "unaligned");
    Ring::create(region.clone(), 64, 4096).unwrap();
    assert_eq!(Ring::attach(region, 64).unwrap().capacity(), 4096);
}

fn backup(sent_upto: u64) -> StreamBackup {
    StreamBackup {
        peer: 2,
        epoch: 1,
        peer_incarnation: 88,
        max_datagram: 1472,
        tx_pn_hi: 1,
        settled_msg: 3,
        settled_seq: sent_upto / 2,
        sent_upto,
    }
}

#[test]
fn a_block_reads_back_whole_or_says_why_not() {
    let s = Scratch::new("block");
    let region = Arc::new(Region::create(&s.0, 4096).unwrap());
    let mut b = Block::<StreamBackup>::at(region.clone(), 128).unwrap();
    assert_eq!(b.read().unwrap(), None, "never written");
    b.write(&backup(10));
    // Another mapping of the same region reads it.
    let other = Block::<StreamBackup>::at(Arc::new(Region::open(&s.0).unwrap()), 128).unwrap();
    assert_eq!(other.read().unwrap(), Some(backup(10)));
    // A writer that dies mid-write: torn until the next whole write.
    b.tear();
    assert!(matches!(other.read(), Err(ShmError::Torn)));
    b.write(&backup(11));
    assert_eq!(other.read().unwrap(), Some(backup(11)));
    // Any damaged byte of the version, body or checksum is caught.
    for at in 0..60 {
        let mut fresh = Block::<StreamBackup>::at(region.clone(), 0).unwrap();
        fresh.write(&backup(12));
        fresh.scribble(at, 0xA5 ^ at as u8);
        let got = fresh.read();
        assert!(got.is_err() || got.as_ref().unwrap() == &Some(backup(12)), "byte {at}: {got:?}");
        assert!(!matches!(got, Ok(Some(b)) if b != backup(12)), "byte {at} damaged and trusted");
    }
    // Fields that cannot be: refused even under a good checksum.
    b.write(&StreamBackup { settled_seq: 20, sent_upto: 10, ..backup(10) });
    assert!(matches!(b.read(), Err(ShmError::BadField(_))));
}

proptest! {
    /// Any interleaving of pushes and pops behaves as a queue of records
    /// bounded in bytes.
    #[test]
    fn a_ring_is_a_bounded_queue(ops in proptest::collection::vec((any::<bool>(), 0usize..300), 1..400)) {
        let s = Scratch::new(&format!("prop-{}", rand_suffix(&ops)));
        let mut r = ring(&s, 2048);
        let mut model = VecDeque::new();
        let mut out = Vec::new();
        for (i, (push, len)) in ops.into_iter().enumerate() {
            if push {
                let m: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
                match r.push(&m) {
                    Ok(()) => model.push_back(m),
                    Err(ShmError::Full { .. }) => prop_assert!(!model.is_empty(), "full while empty"),
                    Err(e) => prop_assert!(false, "{e}"),
                }
            } else {
                prop_assert_eq!(r.next_len(), model.front().map(Vec::len));
                let got = r.pop(&mut out).unwrap();
                match model.pop_front() {
                    Some(m) => prop_assert!(got && out == m),
                    None => prop_assert!(!got),
                }
            }
        }
    }
}

fn rand_suffix<T: core::fmt::Debug>(t: &T) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{t:?}").hash(&mut h);
    h.finish()
}

fn client_header() -> ClientHeader {
    ClientHeader {
        version: LAYOUT_VERSION,
        node: 3,
        port: 1,
        pid: std::process::id(),
        incarnation: 99,
        submission_capacity: 4096,
        completion_capacity: 8192,
        streams: 4,
    }
}

/// An application lays out its region; an engine opens it knowing only
/// the path, and both sides see the same rings and backups.
#[test]
fn an_engine_opens_what_its_application_laid_out() {
    let s = Scratch::new("client");
    let mut app = ClientRegion::create(&s.0, client_header()).unwrap();
    let mut engine = ClientRegion::open(&s.0).unwrap();
    assert_eq!(engine.header, client_header());
    assert_eq!(engine.backups.len(), 4);
    app.submissions.push(b"send this").unwrap();
    let mut out = Vec::new();
    assert!(engine.submissions.pop(&mut out).unwrap());
    assert_eq!(out, b"send this");
    engine.completions.push(b"delivered").unwrap();
    assert!(app.completions.pop(&mut out).unwrap());
    assert_eq!(out, b"delivered");
    engine.backups[2].write(&backup(40));
    assert_eq!(app.backups[2].read().unwrap(), Some(backup(40)));
    assert_eq!(app.backups[1].read().unwrap(), None);
}

/// The control line is shared, and a wake-up is never lost: a side about
/// to sleep that raises its flag either sees the work published before it,
/// or is seen by the publisher.
#[test]
fn the_control_line_is_shared_and_wake_ups_are_not_lost() {
    use std::sync::atomic::Ordering;
    use tether_shm::Control;
    let s = Scratch::new("control");
    let mut app = ClientRegion::create(&s.0, client_header()).unwrap();
    let mut engine = ClientRegion::open(&s.0).unwrap();
    engine.control.heartbeat().fetch_add(7, Ordering::Relaxed);
    assert_eq!(app.control.heartbeat().load(Ordering::Relaxed), 7);
    // The engine goes to sleep with nothing submitted...
    let mut out = Vec::new();
    assert!(!Control::before_sleep(engine.control.engine_asleep(), || engine
        .submissions
        .pop(&mut out)
        .unwrap()));
    // ...so the application that submits must wake it, exactly once.
    app.submissions.push(b"work").unwrap();
    assert!(Control::should_wake(app.control.engine_asleep()));
    assert!(!Control::should_wake(app.control.engine_asleep()), "woken once");
    // Work published before the flag went up is found by the last look.
    app.submissions.push(b"more").unwrap();
    assert!(Control::before_sleep(engine.control.engine_asleep(), || engine
        .submissions
        .pop(&mut out)
        .unwrap()));
    assert!(!Control::should_wake(app.control.engine_asleep()), "it did not sleep");
}

/// A region an engine must not trust is refused with the reason: not laid
/// out yet, a damaged header, a file shorter than its header says, a
/// header that cannot be.
#[test]
fn a_region_that_does_not_check_is_refused() {
    let s = Scratch::new("client-bad");
    assert!(matches!(
        ClientRegion::create(&s.0, ClientHeader { version: LAYOUT_VERSION + 1, ..client_header() }),
        Err(ShmError::BadField("layout version"))
    ));
    assert!(matches!(
        ClientRegion::create(&s.0, ClientHeader { submission_capacity: 1000, ..client_header() }),
        Err(ShmError::BadField("ring capacity"))
    ));
    std::fs::write(&s.0, [0u8; 8192]).unwrap();
    assert!(matches!(ClientRegion::open(&s.0), Err(ShmError::BadField(_))), "zeroes: no header");
    ClientRegion::create(&s.0, client_header()).unwrap();
    let mut header = Block::<ClientHeader>::at(Arc::new(Region::open(&s.0).unwrap()), 0).unwrap();
    // A byte of the incarnation (99), never 0x55 already. (Byte 20, used
    // before, is the pid's lowest, which is 0x55 in one run in 256: the
    // scribble then changed nothing and the test failed.)
    header.scribble(24, 0x55);
    assert!(matches!(ClientRegion::open(&s.0), Err(ShmError::BadChecksum)));
    ClientRegion::create(&s.0, client_header()).unwrap();
    let len = std::fs::metadata(&s.0).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&s.0).unwrap().set_len(len - 64).unwrap();
    assert!(matches!(ClientRegion::open(&s.0), Err(ShmError::TooSmall { .. })));
}
