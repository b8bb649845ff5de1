//! Known answers from the algorithms' published test vectors, streaming
//! equal to one-shot wherever the input is split, and the fused copy equal
//! to copy-then-checksum.

use super::*;

fn one(kind: ChecksumKind, data: &[u8]) -> u64 {
    kind.compute(&[data])
}

#[test]
fn crc32c_known_answers() {
    // RFC 3720 B.4: the check value, and 32 bytes of zeros.
    assert_eq!(one(ChecksumKind::Crc32c, b"123456789"), 0xE306_9283);
    assert_eq!(one(ChecksumKind::Crc32c, &[0u8; 32]), 0x8A91_36AA);
    assert_eq!(one(ChecksumKind::Crc32c, &[0xFFu8; 32]), 0x62A8_AB43);
}

#[test]
fn adler32_known_answers() {
    // RFC 1950 / Wikipedia's "Wikipedia" example; zlib's adler32.
    assert_eq!(one(ChecksumKind::Adler32, b"Wikipedia"), 0x11E6_0398);
    assert_eq!(one(ChecksumKind::Adler32, b"123456789"), 0x091E_01DE);
    assert_eq!(one(ChecksumKind::Adler32, b""), 1);
}

#[test]
fn fletcher64_known_answers() {
    // Wikipedia, "Fletcher's checksum", test vectors for Fletcher-64.
    assert_eq!(one(ChecksumKind::Fletcher64, b"abcde"), 0xC8C6_C527_6463_62C6);
    assert_eq!(one(ChecksumKind::Fletcher64, b"abcdef"), 0xC8C7_2B27_6463_C8C6);
    assert_eq!(one(ChecksumKind::Fletcher64, b"abcdefgh"), 0x312E_2B28_CCCA_C8C6);
}

#[test]
fn fnv1a_known_answers() {
    // The FNV reference test suite (isthe.com/chongo/tech/comp/fnv), FNV-1a 64.
    assert_eq!(one(ChecksumKind::Fnv1a, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(one(ChecksumKind::Fnv1a, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(one(ChecksumKind::Fnv1a, b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn murmur3_known_answers() {
    // MurmurHash3_x86_32, seed 0 (SMHasher's reference implementation).
    assert_eq!(one(ChecksumKind::Murmur3, b""), 0);
    assert_eq!(one(ChecksumKind::Murmur3, b"test"), 0xba6b_d213);
    assert_eq!(one(ChecksumKind::Murmur3, b"The quick brown fox jumps over the lazy dog"), 0x2e4f_f723);
}

#[test]
fn xxh3_known_answers() {
    // XXH3_64bits with seed 0 of the empty input (xxHash's test suite), and
    // streaming equal to the crate's one-shot function.
    assert_eq!(one(ChecksumKind::Xxh3, b""), 0x2D06_8005_38D3_94C2);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    assert_eq!(one(ChecksumKind::Xxh3, &data), xxhash_rust::xxh3::xxh3_64(&data));
}

#[test]
fn sum_and_xor_by_definition() {
    // "12345678" and "9" zero-padded, as little-endian words.
    let (w0, w1) = (0x3837_3635_3433_3231u64, 0x39u64);
    assert_eq!(one(ChecksumKind::Sum, b"123456789"), w0.wrapping_add(w1));
    assert_eq!(one(ChecksumKind::Xor, b"123456789"), w0 ^ w1);
    assert_eq!(one(ChecksumKind::None, b"123456789"), 0);
}

#[test]
fn crc32c_equals_a_table_driven_software_crc() {
    // The crc crate's table implementation never uses the CPU instruction:
    // the hardware path and the software path must agree everywhere.
    let table = ::crc::Crc::<u32>::new(&::crc::CRC_32_ISCSI);
    let data: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for len in [0, 1, 7, 8, 15, 64, 1000, 4096, 8191, 65_536, 70_000] {
        assert_eq!(one(ChecksumKind::Crc32c, &data[..len]), u64::from(table.checksum(&data[..len])), "{len}");
        let mut dst = vec![0u8; len];
        assert_eq!(crc32c_copy(0, &mut dst, &data[..len]), table.checksum(&data[..len]), "fused {len}");
        assert_eq!(dst, &data[..len]);
    }
}

#[test]
fn streaming_and_fused_equal_one_shot_wherever_split() {
    let data: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    for kind in ChecksumKind::ALL {
        for len in [0usize, 1, 3, 8, 31, 33, 100, 4097, 20_000] {
            let whole = one(kind, &data[..len]);
            for split in [0, 1, 5, 8, 9, 32, len / 2, len] {
                let split = split.min(len);
                let (a, b) = data[..len].split_at(split);
                assert_eq!(kind.compute(&[a, b]), whole, "{} len {len} split {split}", kind.name());
                // Fused copy, in two pieces, from any prior state.
                let mut c = Checksummer::new(kind);
                let mut dst = vec![0u8; len];
                let (da, db) = dst.split_at_mut(split);
                c.copy_update(da, a);
                c.copy_update(db, b);
                assert_eq!(c.finish(), whole, "fused {} len {len} split {split}", kind.name());
                assert_eq!(dst, &data[..len]);
                let mut c = Checksummer::new(kind);
                let mut dst2 = vec![0u8; len];
                c.copy_then_update(&mut dst2, &data[..len]);
                assert_eq!(c.finish(), whole);
            }
        }
    }
}

#[test]
fn names_widths_and_sets() {
    for k in ChecksumKind::ALL {
        assert_eq!(ChecksumKind::from_name(k.name()), Some(k));
        assert_eq!(ChecksumKind::from_u8(k as u8), Some(k));
        assert!(k.width() == 4 || k.width() == 8);
        if k.width() == 4 {
            assert!(ChecksumKind::compute(k, &[b"any input at all"]) <= u64::from(u32::MAX));
        }
    }
    assert_eq!(ChecksumKind::from_u8(9), None);
    assert_eq!(ChecksumKind::from_u8(200), None);
    let s = ChecksumSet::only(ChecksumKind::Xxh3).with(ChecksumKind::Crc32c);
    assert_eq!(s.iter().collect::<Vec<_>>(), [ChecksumKind::Crc32c, ChecksumKind::Xxh3]);
    assert!(!ChecksumSet::checked().contains(ChecksumKind::None));
    assert_eq!(ChecksumSet::checked().iter().count(), 8);
}

#[test]
fn fused_crc32c_matches_from_any_state_and_length() {
    // Every length around the kernel's steps (128-byte folds, 16-byte
    // tail folds, the byte tail), from several starting CRCs, whichever
    // path this CPU takes; the blocked path must agree too.
    let data: Vec<u8> = (0..2048u32).map(|i| (i.wrapping_mul(0x9E37_79B9) >> 11) as u8).collect();
    let kernels = CrcCopyKernel::available();
    for len in (0..1100).chain([2047, 2048]) {
        for start in [0u32, 1, 0xFFFF_FFFF, 0xE306_9283] {
            let want = crc32c::crc32c_append(start, &data[..len]);
            let mut dst = vec![0u8; len];
            assert_eq!(crc32c_copy(start, &mut dst, &data[..len]), want, "len {len} start {start:#x}");
            assert_eq!(dst, &data[..len]);
            for &k in &kernels {
                let mut dst = vec![0u8; len];
                assert_eq!(crc32c_copy_with(k, start, &mut dst, &data[..len]), want, "{k:?} len {len}");
                assert_eq!(dst, &data[..len], "{k:?} len {len}");
            }
        }
    }
    // Misaligned source and destination: the kernels use unaligned moves.
    for &k in &kernels {
        for (so, dof) in [(1, 3), (7, 0), (0, 13)] {
            let src = &data[so..so + 1500];
            let mut dst = vec![0u8; 1500 + dof];
            let want = crc32c::crc32c_append(0, src);
            assert_eq!(crc32c_copy_with(k, 0, &mut dst[dof..], src), want, "{k:?} offsets {so}/{dof}");
            assert_eq!(&dst[dof..], src);
        }
    }
    let names: Vec<_> = kernels.iter().map(|k| k.name()).collect();
    eprintln!("fused CRC32C kernels on this CPU: {names:?}; in use: {}", CrcCopyKernel::best().name());
    assert_eq!(has_fused_crc32c(), CrcCopyKernel::best() != CrcCopyKernel::Blocked);
}

#[test]
fn copy_into_uninitialised_memory_equals_the_fused_copy() {
    use core::mem::MaybeUninit;
    let data: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(0x2545_F491) >> 9) as u8).collect();
    for kind in ChecksumKind::ALL {
        for len in [0, 1, 7, 255, 256, 257, 1400, BLOCK + 3, 20_000] {
            let mut want = Checksummer::new(kind);
            want.update(b"prefix");
            let mut got = want.clone();
            want.update(&data[..len]);
            let mut spare: Vec<MaybeUninit<u8>> = Vec::with_capacity(len);
            // SAFETY: MaybeUninit needs no initialisation; the capacity is len.
            unsafe { spare.set_len(len) };
            got.copy_update_uninit(&mut spare, &data[..len]);
            assert_eq!(got.finish(), want.finish(), "{} len {len}", kind.name());
            // SAFETY: copy_update_uninit wrote every byte.
            let copied: Vec<u8> = spare.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(copied, &data[..len], "{} len {len}", kind.name());
        }
    }
}
