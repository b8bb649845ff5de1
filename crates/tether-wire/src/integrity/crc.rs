//! CRC32C fused with a copy: one pass reads each byte once, stores it, and
//! folds it into the CRC (Trahay et al. [NMAD] section 5.1: "combining the
//! checksum and the memory copy wherever it happens").
//!
//! No crate fuses the two, so the loop is here. It folds with carry-less
//! multiplication (Gopal et al., "Fast CRC Computation for Generic
//! Polynomials Using PCLMULQDQ", Intel 2009): four accumulators each take
//! one new vector per step and store it to the destination as they go, so
//! every byte is loaded once. Two kernels: 512-bit registers (AVX-512,
//! 256 bytes a step, the xors fused into one ternary-logic instruction)
//! and 256-bit registers (AVX2, 128 bytes a step). The folded 128 bits are
//! finished with the CRC32 instruction via the `crc32c` crate. Where the
//! CPU lacks the instructions, or for short inputs, the copy is blocked at
//! L1 size and each block handed to `crc32c` while it is hot. Results are
//! identical on every path (tests compare each kernel with the crate).
//!
//! On this project's machine (AMD EPYC, Zen 5, ~4.3 GHz) `tether bench
//! checksum` shows the AVX-512 kernel at about 42 GB/s on 32 KiB blocks,
//! against 31 GB/s for `crc32c` alone, 24 GB/s for the AVX2 kernel and 23
//! GB/s for copy-then-CRC; but memcpy of an L1-resident block runs near
//! 100 GB/s. The loop is bound by VPCLMULQDQ: a 512-bit one issues every
//! second cycle here (2.1 G/s measured), and each folds 32 bytes, so no
//! clmul fold can pass ~68 GB/s; eight accumulators ran no faster than
//! four. Interleaving CRC32-instruction lanes (another execution unit)
//! could add up to ~30 GB/s more at the cost of combining partial CRCs;
//! not done.

use core::mem::MaybeUninit;

use super::BLOCK;

/// Inputs shorter than this take the blocked path: the fused loops need
/// 128 (AVX2) or 256 (AVX-512) bytes to start, and gain nothing on a few
/// cache lines.
const FUSED_MIN: usize = 256;

/// The loops that can compute a fused copy + CRC32C, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrcCopyKernel {
    /// Four 512-bit accumulators (AVX-512 + VPCLMULQDQ): 256 bytes a step.
    Avx512,
    /// Four 256-bit accumulators (AVX2 + VPCLMULQDQ): 128 bytes a step.
    Avx2,
    /// Copy an L1-sized block, then CRC it with the `crc32c` crate.
    Blocked,
}

impl CrcCopyKernel {
    const ALL: [CrcCopyKernel; 3] = [CrcCopyKernel::Avx512, CrcCopyKernel::Avx2, CrcCopyKernel::Blocked];

    /// Every kernel this CPU can run, fastest first (`Blocked` always).
    pub fn available() -> Vec<CrcCopyKernel> {
        Self::ALL.into_iter().filter(|k| k.runs_here()).collect()
    }

    /// True when this CPU has the instructions the kernel needs.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            let clmul = has!("pclmulqdq") && has!("vpclmulqdq");
            match self {
                CrcCopyKernel::Avx512 => clmul && has!("avx512f") && has!("avx512vl"),
                CrcCopyKernel::Avx2 => clmul && has!("avx2"),
                CrcCopyKernel::Blocked => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == CrcCopyKernel::Blocked
        }
    }

    /// The kernel [`crc32c_copy`] uses on this CPU (detected once).
    pub fn best() -> CrcCopyKernel {
        use std::sync::atomic::{AtomicU8, Ordering};
        // 0 unknown, else 1 + the kernel's index in `ALL`. A relaxed atomic
        // load is cheaper than feature detection on the per-datagram path.
        static BEST: AtomicU8 = AtomicU8::new(0);
        match BEST.load(Ordering::Relaxed) {
            0 => {
                let i = Self::ALL.iter().position(|k| k.runs_here()).expect("Blocked runs everywhere");
                let k = Self::ALL[i];
                BEST.store(i as u8 + 1, Ordering::Relaxed);
                k
            }
            i => Self::ALL[usize::from(i) - 1],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CrcCopyKernel::Avx512 => "avx512-vpclmulqdq",
            CrcCopyKernel::Avx2 => "avx2-vpclmulqdq",
            CrcCopyKernel::Blocked => "blocked",
        }
    }
}

/// True when this CPU runs a single-pass fused kernel.
pub fn has_fused_crc32c() -> bool {
    CrcCopyKernel::best() != CrcCopyKernel::Blocked
}

/// Copy `src` into `dst` (same length) and return the CRC32C of `src`
/// appended to `crc` (as `crc32c::crc32c_append` would).
pub fn crc32c_copy(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "crc32c_copy needs equal lengths");
    // SAFETY: `dst` is valid for writes of src.len() bytes and cannot
    // overlap `src` (a shared and a mutable borrow), and `best` runs here.
    unsafe { dispatch(CrcCopyKernel::best(), crc, dst.as_mut_ptr(), src) }
}

/// [`crc32c_copy`] into memory not yet initialised (a receive buffer's
/// spare capacity): afterwards `dst` holds a copy of `src`.
pub fn crc32c_copy_uninit(crc: u32, dst: &mut [MaybeUninit<u8>], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "crc32c_copy needs equal lengths");
    // SAFETY: as in `crc32c_copy`; the kernels only write through `dst`,
    // never read it, so its being uninitialised does not matter.
    unsafe { dispatch(CrcCopyKernel::best(), crc, dst.as_mut_ptr().cast(), src) }
}

/// [`crc32c_copy`] with a chosen kernel, for tests and the bench.
///
/// # Panics
/// If the CPU cannot run `kernel` (see [`CrcCopyKernel::available`]) or
/// the lengths differ.
pub fn crc32c_copy_with(kernel: CrcCopyKernel, crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "crc32c_copy needs equal lengths");
    assert!(kernel.runs_here(), "this CPU cannot run {kernel:?}");
    // SAFETY: asserted above: the kernel runs here and `dst` is a distinct
    // writable slice of src.len() bytes.
    unsafe { dispatch(kernel, crc, dst.as_mut_ptr(), src) }
}

/// # Safety
/// The CPU must run `kernel`; `dst` must be valid for writes of
/// `src.len()` bytes and not overlap `src`.
unsafe fn dispatch(kernel: CrcCopyKernel, crc: u32, dst: *mut u8, src: &[u8]) -> u32 {
    if src.len() < FUSED_MIN || kernel == CrcCopyKernel::Blocked {
        // SAFETY: the caller's guarantees are this function's.
        return unsafe { copy_blocked_raw(crc, dst, src) };
    }
    #[cfg(target_arch = "x86_64")]
    match kernel {
        // SAFETY: the caller passes a kernel the CPU runs and a
        // destination for src.len() >= FUSED_MIN = 256 bytes.
        CrcCopyKernel::Avx512 => return unsafe { x86::crc32c_copy_avx512(crc, dst, src) },
        // SAFETY: as for the arm above.
        CrcCopyKernel::Avx2 => return unsafe { x86::crc32c_copy_avx2(crc, dst, src) },
        CrcCopyKernel::Blocked => {}
    }
    // SAFETY: the caller's guarantees are this function's.
    unsafe { copy_blocked_raw(crc, dst, src) }
}

/// The fallback, and the blocked variant the bench compares against.
pub fn crc32c_copy_blocked(crc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "crc32c_copy needs equal lengths");
    // SAFETY: `dst` is a distinct writable slice of src.len() bytes.
    unsafe { copy_blocked_raw(crc, dst.as_mut_ptr(), src) }
}

/// Copy a block, then CRC the source block while it is still in L1.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and not overlap `src`.
unsafe fn copy_blocked_raw(mut crc: u32, dst: *mut u8, src: &[u8]) -> u32 {
    for (i, s) in src.chunks(BLOCK).enumerate() {
        // SAFETY: block i lies within the first src.len() bytes of `dst`.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), dst.add(i * BLOCK), s.len()) };
        crc = crc32c::crc32c_append(crc, s);
    }
    crc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Folding constants for the Castagnoli polynomial 0x1EDC6F41, in the
    /// bit-reflected form the CRC uses: (x^(d+32) mod P)' << 1 for the low
    /// 64 bits of a 128-bit lane and (x^(d-32) mod P)' << 1 for the high
    /// 64 bits, where d is the distance folded in bits.
    /// d = 1024: four 256-bit accumulators, 128 bytes per step.
    const FOLD_1024: (i64, i64) = (0x6992_cea2, 0x0d3b_6092);
    /// d = 128: one 128-bit lane onto the next.
    const FOLD_128: (i64, i64) = (0xf20c_0dfe, 0x1_4cd0_0bd6);

    /// Fold `acc` forward by the distance its constants encode.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold256(acc: __m256i, k: __m256i) -> __m256i {
        _mm256_xor_si256(_mm256_clmulepi64_epi128(acc, k, 0x00), _mm256_clmulepi64_epi128(acc, k, 0x11))
    }

    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn fold128(acc: __m128i, k: __m128i) -> __m128i {
        _mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00), _mm_clmulepi64_si128(acc, k, 0x11))
    }

    /// # Safety
    /// The CPU must have AVX2, VPCLMULQDQ and PCLMULQDQ; `src` must be at
    /// least 128 bytes and `dst` valid for writes of as many, not
    /// overlapping it.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    pub unsafe fn crc32c_copy_avx2(crc: u32, d: *mut u8, src: &[u8]) -> u32 {
        let n = src.len();
        debug_assert!(n >= 128);
        let s = src.as_ptr();
        // Unaligned 32-byte loads and stores at byte offset `at`; every
        // offset used is at most n - 32. Macros, not closures: a closure
        // does not inherit the function's target features, and would pass
        // each vector through memory. The store is an instruction of its
        // own (`asm!`): written as an intrinsic, the store of each vector
        // just loaded is a copy LLVM recognises, takes out of the loop and
        // makes one `memcpy` call ahead of it, so the data was read twice,
        // not once (seen in the disassembly).
        macro_rules! load {
            ($at:expr) => {
                // SAFETY: every `at` used is at most n - 32.
                unsafe { _mm256_loadu_si256(s.add($at).cast()) }
            };
        }
        macro_rules! store {
            ($at:expr, $v:expr) => {
                // SAFETY: 32 bytes at offset `$at` of `d` are writable (the
                // caller's promise; `$at` <= n - 32); `vmovdqu` takes any
                // alignment.
                unsafe {
                    core::arch::asm!(
                        "vmovdqu ymmword ptr [{p}], {v}",
                        p = in(reg) d.add($at),
                        v = in(ymm_reg) $v,
                        options(nostack, preserves_flags),
                    )
                }
            };
        }

        let mut acc = [load!(0), load!(32), load!(64), load!(96)];
        for (k, &v) in acc.iter().enumerate() {
            store!(32 * k, v);
        }
        // The running CRC enters as the first 32 bits of the message: for a
        // reflected CRC, state s over M equals state 0 over M with s xored
        // into its first four bytes.
        let init = _mm256_set_m128i(_mm_setzero_si128(), _mm_cvtsi32_si128(!crc as i32));
        acc[0] = _mm256_xor_si256(acc[0], init);
        let k = _mm256_set_epi64x(FOLD_1024.1, FOLD_1024.0, FOLD_1024.1, FOLD_1024.0);
        let mut at = 128;
        while at + 128 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = load!(at + 32 * j);
                store!(at + 32 * j, v);
                *a = _mm256_xor_si256(fold256(*a, k), v);
            }
            at += 128;
        }
        // Eight 128-bit lanes, in message order, folded into one.
        let k = _mm_set_epi64x(FOLD_128.1, FOLD_128.0);
        let mut x = _mm256_castsi256_si128(acc[0]);
        let lanes = [
            _mm256_extracti128_si256::<1>(acc[0]),
            _mm256_castsi256_si128(acc[1]),
            _mm256_extracti128_si256::<1>(acc[1]),
            _mm256_castsi256_si128(acc[2]),
            _mm256_extracti128_si256::<1>(acc[2]),
            _mm256_castsi256_si128(acc[3]),
            _mm256_extracti128_si256::<1>(acc[3]),
        ];
        for lane in lanes {
            x = _mm_xor_si128(fold128(x, k), lane);
        }
        while at + 16 <= n {
            // SAFETY: at + 16 <= n for both slices.
            let v = unsafe { _mm_loadu_si128(s.add(at).cast()) };
            // SAFETY: as for the load; `d` is valid for n bytes.
            unsafe { _mm_storeu_si128(d.add(at).cast(), v) };
            x = _mm_xor_si128(fold128(x, k), v);
            at += 16;
        }
        // SAFETY: `d` has room for all of `src` (the caller's promise).
        unsafe { finish(x, d, src, at) }
    }

    /// `x` is congruent to the message's first `at` bytes (initial state
    /// included): its CRC from state 0 is theirs. `crc32c_append(!0, ..)`
    /// starts from state 0 and returns the inverted state, the crate's
    /// form. The bytes from `at` on are copied and appended.
    ///
    /// # Safety
    /// `d` must be valid for writes of `src.len()` bytes.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn finish(x: __m128i, d: *mut u8, src: &[u8], at: usize) -> u32 {
        let mut folded = [0u8; 16];
        // SAFETY: 16 bytes into a 16-byte array.
        unsafe { _mm_storeu_si128(folded.as_mut_ptr().cast(), x) };
        let crc = crc32c::crc32c_append(!0, &folded);
        let rest = &src[at..];
        // SAFETY: [at, src.len()) of `d` is writable (the caller's promise).
        unsafe { core::ptr::copy_nonoverlapping(rest.as_ptr(), d.add(at), rest.len()) };
        crc32c::crc32c_append(crc, rest)
    }

    /// d = 2048: four 512-bit accumulators, 256 bytes per step.
    const FOLD_2048: (i64, i64) = (0xdcb1_7aa4, 0xb9e0_2b86);
    /// d = 512: one 512-bit accumulator onto the next.
    const FOLD_512: (i64, i64) = (0x740e_ef02, 0x9e4a_ddf8);
    /// d = 384 and 256: 128-bit lanes of one 512-bit register onto its last.
    const FOLD_384: (i64, i64) = (0x1c29_1d04, 0x1_d82c_63da);
    const FOLD_256: (i64, i64) = (0x1_384a_a63a, 0xba4f_c28e);

    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
        // Both products and the next data in one three-way xor.
        _mm512_ternarylogic_epi64(
            _mm512_clmulepi64_epi128(acc, k, 0x00),
            _mm512_clmulepi64_epi128(acc, k, 0x11),
            next,
            0x96,
        )
    }

    fn k512((lo, hi): (i64, i64)) -> __m512i {
        // SAFETY: AVX-512F is enabled on every caller (this is inlined
        // into target-feature functions only).
        unsafe { _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo) }
    }

    /// The AVX-512 kernel: the same fold as [`crc32c_copy_fused`], on
    /// registers twice as wide and with the xors fused into one
    /// ternary-logic instruction, so one step moves 256 bytes.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX-512VL, VPCLMULQDQ and PCLMULQDQ;
    /// `src` must be at least 256 bytes and `dst` valid for writes of as
    /// many, not overlapping it.
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq")]
    pub unsafe fn crc32c_copy_avx512(crc: u32, d: *mut u8, src: &[u8]) -> u32 {
        let n = src.len();
        debug_assert!(n >= 256);
        let s = src.as_ptr();
        // 64-byte unaligned loads and stores at offsets of at most n - 64;
        // the store in `asm!` for the reason `crc32c_copy_avx2` gives.
        macro_rules! load {
            ($at:expr) => {
                // SAFETY: every `at` used is at most n - 64.
                unsafe { _mm512_loadu_si512(s.add($at).cast()) }
            };
        }
        macro_rules! store {
            ($at:expr, $v:expr) => {
                // SAFETY: 64 bytes at offset `$at` of `d` are writable (the
                // caller's promise; `$at` <= n - 64); `vmovdqu64` takes any
                // alignment.
                unsafe {
                    core::arch::asm!(
                        "vmovdqu64 zmmword ptr [{p}], {v}",
                        p = in(reg) d.add($at),
                        v = in(zmm_reg) $v,
                        options(nostack, preserves_flags),
                    )
                }
            };
        }
        let mut acc = [load!(0), load!(64), load!(128), load!(192)];
        for (j, &v) in acc.iter().enumerate() {
            store!(64 * j, v);
        }
        // The running CRC enters xored into the first four message bytes.
        acc[0] = _mm512_xor_si512(acc[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32)));
        let k = k512(FOLD_2048);
        let mut at = 256;
        while at + 256 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = load!(at + 64 * j);
                store!(at + 64 * j, v);
                *a = fold512(*a, k, v);
            }
            at += 256;
        }
        // Four accumulators, in message order, into one; then whole
        // 64-byte blocks of what is left.
        let k = k512(FOLD_512);
        let mut x = fold512(fold512(fold512(acc[0], k, acc[1]), k, acc[2]), k, acc[3]);
        while at + 64 <= n {
            let v = load!(at);
            store!(at, v);
            x = fold512(x, k, v);
            at += 64;
        }
        // The four 128-bit lanes onto the last, each by its own distance.
        let lane = |k: (i64, i64), v: __m128i| {
            let k = _mm_set_epi64x(k.1, k.0);
            _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11))
        };
        let mut y = _mm_xor_si128(
            _mm_xor_si128(
                lane(FOLD_384, _mm512_extracti32x4_epi32::<0>(x)),
                lane(FOLD_256, _mm512_extracti32x4_epi32::<1>(x)),
            ),
            _mm_xor_si128(
                lane(FOLD_128, _mm512_extracti32x4_epi32::<2>(x)),
                _mm512_extracti32x4_epi32::<3>(x),
            ),
        );
        let k = _mm_set_epi64x(FOLD_128.1, FOLD_128.0);
        while at + 16 <= n {
            // SAFETY: at + 16 <= n for both slices.
            let v = unsafe { _mm_loadu_si128(s.add(at).cast()) };
            // SAFETY: as for the load; `d` is valid for n bytes.
            unsafe { _mm_storeu_si128(d.add(at).cast(), v) };
            y = _mm_xor_si128(fold128(y, k), v);
            at += 16;
        }
        // SAFETY: `d` has room for all of `src` (the caller's promise).
        unsafe { finish(y, d, src, at) }
    }
}
