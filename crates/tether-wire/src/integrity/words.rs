//! The checksums of Trahay et al. [NMAD] Figure 4 that no well-kept crate
//! provides in streaming form: plain sum, xor, Fletcher-64, FNV-1a and
//! MurmurHash3.
//!
//! Each is a small state fed with byte slices of any size; the result is
//! that of the concatenation, wherever the splits fall, because datagrams
//! are checksummed piece by piece as they are written (frame headers,
//! payloads, the header last). Word-based algorithms carry a partial word
//! across calls; the final partial word is zero-padded.

/// Bytes not yet making a whole word, carried to the next call.
#[derive(Clone, Copy)]
struct Pending<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Default for Pending<N> {
    fn default() -> Self {
        Pending { bytes: [0; N], len: 0 }
    }
}

impl<const N: usize> Pending<N> {
    /// Complete a carried word from the front of `data`; returns the word
    /// (if one is complete) and what is left of `data`.
    fn fill<'a>(&mut self, data: &'a [u8]) -> (Option<[u8; N]>, &'a [u8]) {
        if self.len == 0 {
            return (None, data);
        }
        let take = (N - self.len).min(data.len());
        self.bytes[self.len..self.len + take].copy_from_slice(&data[..take]);
        self.len += take;
        if self.len < N {
            return (None, &data[take..]);
        }
        self.len = 0;
        (Some(self.bytes), &data[take..])
    }

    /// Carry `tail` (less than a word) to the next call. An empty tail
    /// keeps what is carried: `fill` may have taken all the input into an
    /// unfinished word.
    fn keep(&mut self, tail: &[u8]) {
        if !tail.is_empty() {
            debug_assert_eq!(self.len, 0, "fill completes a carried word before new input is kept");
            self.bytes[..tail.len()].copy_from_slice(tail);
            self.len = tail.len();
        }
    }

    /// The last partial word, zero-padded, if any.
    fn last(&self) -> Option<[u8; N]> {
        (self.len > 0).then(|| {
            let mut w = [0u8; N];
            w[..self.len].copy_from_slice(&self.bytes[..self.len]);
            w
        })
    }
}

/// How a word fold combines two words.
pub trait Combine: Copy + Default {
    fn op(a: u64, b: u64) -> u64;
}

#[derive(Clone, Copy, Default)]
pub struct Add;
impl Combine for Add {
    fn op(a: u64, b: u64) -> u64 {
        a.wrapping_add(b)
    }
}

#[derive(Clone, Copy, Default)]
pub struct Xor;
impl Combine for Xor {
    fn op(a: u64, b: u64) -> u64 {
        a ^ b
    }
}

/// A fold of the little-endian 64-bit words with an associative,
/// commutative operation. Four lanes, so no operation waits on the last.
#[derive(Clone, Copy, Default)]
pub struct WordFold<C: Combine> {
    acc: u64,
    pending: Pending<8>,
    op: C,
}

/// Plain sum: the wrapping sum of the little-endian 64-bit words. The
/// fastest checksum there is, and blind to any change that keeps the sum
/// (Trahay et al. [NMAD] section 5.1: it "cannot reliably detect corruption
/// beyond a single bit").
pub type Sum64 = WordFold<Add>;
/// Xor of the little-endian 64-bit words: as fast, and blind to any two
/// flips of the same bit position in different words.
pub type Xor64 = WordFold<Xor>;

impl<C: Combine> WordFold<C> {
    /// Fold `src`; with `dst`, also copy it there in the same pass.
    fn fold(&mut self, mut dst: Option<&mut [u8]>, src: &[u8]) {
        let (carried, rest) = self.pending.fill(src);
        let head = src.len() - rest.len();
        if let Some(d) = dst.as_deref_mut() {
            d[..head].copy_from_slice(&src[..head]);
        }
        if let Some(w) = carried {
            self.acc = C::op(self.acc, u64::from_le_bytes(w));
        }
        let (words, tail) = rest.as_chunks::<8>();
        let whole = words.len() * 8;
        self.acc = match dst {
            Some(d) => {
                d[head + whole..].copy_from_slice(tail);
                fold_words::<C>(self.acc, Some(d[head..head + whole].as_chunks_mut::<8>().0), words)
            }
            None => fold_words::<C>(self.acc, None, words),
        };
        self.pending.keep(tail);
    }

    pub fn update(&mut self, data: &[u8]) {
        self.fold(None, data);
    }

    /// Copy `src` into `dst` (same length) and fold it in the same pass.
    pub fn copy_update(&mut self, dst: &mut [u8], src: &[u8]) {
        self.fold(Some(dst), src);
    }

    pub fn finish(&self) -> u64 {
        let _ = self.op;
        self.pending.last().map_or(self.acc, |w| C::op(self.acc, u64::from_le_bytes(w)))
    }
}

/// The whole-word loop, fused with the copy when `dst` is given. Written
/// as a plain fold so the compiler vectorizes it, and compiled for AVX2
/// where the CPU has it (the baseline x86-64 target has only SSE2).
fn fold_words<C: Combine>(acc: u64, dst: Option<&mut [[u8; 8]]>, src: &[[u8; 8]]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked on the line above).
        return unsafe { fold_words_avx2::<C>(acc, dst, src) };
    }
    fold_words_portable::<C>(acc, dst, src)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fold_words_avx2<C: Combine>(acc: u64, dst: Option<&mut [[u8; 8]]>, src: &[[u8; 8]]) -> u64 {
    fold_words_portable::<C>(acc, dst, src)
}

#[inline(always)]
fn fold_words_portable<C: Combine>(acc: u64, dst: Option<&mut [[u8; 8]]>, src: &[[u8; 8]]) -> u64 {
    match dst {
        Some(d) => d.iter_mut().zip(src).fold(acc, |a, (d, s)| {
            *d = *s;
            C::op(a, u64::from_le_bytes(*s))
        }),
        None => src.iter().fold(acc, |a, s| C::op(a, u64::from_le_bytes(*s))),
    }
}

/// Fletcher-64 (Fletcher 1982; the fallback of Trahay et al. [NMAD] where
/// CRC32C has no instruction): two running sums modulo 2^32 - 1 over
/// little-endian 32-bit words, the second summing the first, so the order of
/// words counts.
#[derive(Clone, Copy, Default)]
pub struct Fletcher64 {
    a: u64,
    b: u64,
    pending: Pending<4>,
}

const M32: u64 = 0xFFFF_FFFF;
/// Words that can be summed before the 64-bit sums must be reduced: after
/// n words a < 2^32 (n + 1) and b < 2^32 (1 + n (n + 3) / 2), which stays
/// below 2^64 for n up to about 92000.
const FLETCHER_RUN: usize = 1 << 16;

impl Fletcher64 {
    pub fn update(&mut self, data: &[u8]) {
        let (carried, rest) = self.pending.fill(data);
        if let Some(w) = carried {
            self.words(&w);
        }
        let whole = rest.len() / 4 * 4;
        self.words(&rest[..whole]);
        self.pending.keep(&rest[whole..]);
    }

    fn words(&mut self, data: &[u8]) {
        for run in data.chunks(FLETCHER_RUN * 4) {
            for w in run.chunks_exact(4) {
                self.a += u64::from(u32::from_le_bytes(w.try_into().expect("4 bytes")));
                self.b += self.a;
            }
            self.a %= M32;
            self.b %= M32;
        }
    }

    pub fn finish(&self) -> u64 {
        let mut s = *self;
        if let Some(w) = self.pending.last() {
            s.words(&w);
        }
        (s.b << 32) | s.a
    }
}

/// FNV-1a, 64 bits (Fowler, Noll, Vo): xor a byte, multiply by the prime.
/// One byte per multiply, so slow, but the paper measured it.
#[derive(Clone, Copy)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a64 {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// MurmurHash3, x86 32-bit variant (Appleby), seed 0, streaming over
/// 4-byte blocks; the successor of the paper's MurmurHash2a.
#[derive(Clone, Copy, Default)]
pub struct Murmur3 {
    h: u32,
    len: u64,
    pending: Pending<4>,
}

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

fn mix_k(k: u32) -> u32 {
    k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

impl Murmur3 {
    pub fn update(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        let (carried, rest) = self.pending.fill(data);
        if let Some(w) = carried {
            self.block(u32::from_le_bytes(w));
        }
        let mut blocks = rest.chunks_exact(4);
        for b in &mut blocks {
            self.block(u32::from_le_bytes(b.try_into().expect("4 bytes")));
        }
        self.pending.keep(blocks.remainder());
    }

    fn block(&mut self, k: u32) {
        self.h ^= mix_k(k);
        self.h = self.h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }

    pub fn finish(&self) -> u32 {
        let mut h = self.h;
        if let Some(tail) = self.pending.last() {
            h ^= mix_k(u32::from_le_bytes(tail));
        }
        h ^= self.len as u32;
        h ^= h >> 16;
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        h = h.wrapping_mul(0xc2b2_ae35);
        h ^ (h >> 16)
    }
}
