//! Message contents that verify themselves: the receiver checks every byte
//! without a copy of what was sent, so benchmarks and the demo prove
//! "exact bytes" rather than assume it.

/// Message `index` from `src`, `size` bytes filled as `fill` fills it,
/// written into `v` (emptied first; grown if it is short): the buffer an
/// endpoint's `message_buffer` hands out, to be sealed and sent whole.
pub fn write_message(mut v: Vec<u8>, size: usize, src: u32, index: u64) -> Vec<u8> {
    use std::mem::MaybeUninit;
    v.clear();
    v.reserve(size);
    // Written once, not zeroed first: the pattern is the only pass.
    tile(&mut v.spare_capacity_mut()[..size], word(src, index).to_le_bytes().map(MaybeUninit::new));
    // SAFETY: `tile` wrote every one of the first `size` bytes.
    unsafe { v.set_len(size) };
    v
}

/// Fill `buf` with the pattern of message `index` from `src`.
pub fn fill(buf: &mut [u8], src: u32, index: u64) {
    tile(buf, word(src, index).to_le_bytes());
}

/// Every element of `buf` written: `word` repeated, cut short at the end.
fn tile<T: Copy>(buf: &mut [T], word: [T; 8]) {
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word);
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&word[..n]);
}

/// The index carried by a message of at least 8 bytes (its first word XORed back).
pub fn index_of(buf: &[u8], src: u32) -> Option<u64> {
    let w = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    Some(w ^ salt(src))
}

/// True when `buf` is exactly the pattern of message `index` from `src`.
pub fn verify(buf: &[u8], src: u32, index: u64) -> bool {
    let word = word(src, index).to_le_bytes();
    let mut chunks = buf.chunks_exact(8);
    let body_ok = chunks.by_ref().all(|c| c == word);
    let rest = chunks.remainder();
    body_ok && rest == &word[..rest.len()]
}

fn salt(src: u32) -> u64 {
    (src as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn word(src: u32, index: u64) -> u64 {
    index ^ salt(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_detects_any_change() {
        for len in [0usize, 1, 7, 8, 9, 100, 4096] {
            let mut b = vec![0u8; len];
            fill(&mut b, 3, 42);
            assert!(verify(&b, 3, 42));
            let used = vec![0xAAu8; 3];
            assert_eq!(
                write_message(used, len, 3, 42),
                b,
                "write_message() is fill() in a buffer emptied first"
            );
            if len >= 8 {
                assert_eq!(index_of(&b, 3), Some(42));
            }
            if len > 0 {
                assert!(!verify(&b, 3, 43) || len == 0);
                let mut c = b.clone();
                c[len - 1] ^= 0x10;
                assert!(!verify(&c, 3, 42));
            }
        }
    }
}
