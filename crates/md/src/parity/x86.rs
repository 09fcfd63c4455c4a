//! x86-64 SIMD kernels. Each processes the longest prefix that is a multiple of its
//! step and returns how many bytes it did; the scalar kernel finishes the tail.
//!
//! * Q by Horner's rule needs only "multiply by g": AVX2 and AVX-512BW use the
//!   kernel's trick (top bit -> 0x1d mask, byte add as shift, XOR); GFNI does it with
//!   one `GF2P8AFFINEQB` against the matrix of ×g, two data blocks per step (×g², ×g).
//! * Multiplying by an arbitrary constant (recovery, partial-stripe Q updates) uses
//!   PSHUFB nibble tables (AVX2, AVX-512BW) or `GF2P8AFFINEQB` (GFNI). GFNI's own
//!   `GF2P8MULB` cannot be used: it reduces by the AES polynomial 0x11b, not md's 0x11d.
//!
//! Loads and stores are unaligned; every other intrinsic is safe inside a function
//! compiled with the features it needs.

use std::arch::x86_64::*;

use super::gf;
use super::Impl;

// ---------------------------------------------------------------------------------------
// Loads and stores: the only pointer use. Each takes a slice and an index, and bounds-
// checks through slicing before touching memory.

#[inline]
#[target_feature(enable = "avx2")]
fn ld32(s: &[u8], i: usize) -> __m256i {
    let b: &[u8; 32] = s[i..i + 32].try_into().expect("32 bytes");
    // SAFETY: `b` is 32 readable bytes; the unaligned load has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn st32(s: &mut [u8], i: usize, v: __m256i) {
    let b: &mut [u8; 32] = (&mut s[i..i + 32]).try_into().expect("32 bytes");
    // SAFETY: `b` is 32 writable bytes; the unaligned store has no alignment requirement.
    unsafe { _mm256_storeu_si256(b.as_mut_ptr().cast(), v) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ld64(s: &[u8], i: usize) -> __m512i {
    let b: &[u8; 64] = s[i..i + 64].try_into().expect("64 bytes");
    // SAFETY: `b` is 64 readable bytes; the unaligned load has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn st64(s: &mut [u8], i: usize, v: __m512i) {
    let b: &mut [u8; 64] = (&mut s[i..i + 64]).try_into().expect("64 bytes");
    // SAFETY: `b` is 64 writable bytes; the unaligned store has no alignment requirement.
    unsafe { _mm512_storeu_si512(b.as_mut_ptr().cast(), v) }
}

/// A matrix as the `i64` `set1_epi64` takes (same bits).
fn bits64(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

// ---------------------------------------------------------------------------------------
// Dispatch

/// # Safety
/// `imp` must be available on this CPU and not `Scalar`; every block is `p.len()` bytes.
pub(super) unsafe fn gen_p(imp: Impl, data: &[&[u8]], p: &mut [u8]) -> usize {
    match imp {
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX2.
        Impl::Avx2 => unsafe { avx2::gen_p(data, p) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F.
        Impl::Avx512Bw | Impl::Avx512Gfni => unsafe { avx512::gen_p(data, p) },
        Impl::Scalar => 0,
    }
}

/// # Safety
/// As [`gen_p`]; `data` is not empty and `q` is as long as `p`.
pub(super) unsafe fn gen_pq(imp: Impl, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
    match imp {
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX2.
        Impl::Avx2 => unsafe { avx2::gen_pq(data, p, q) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW.
        Impl::Avx512Bw => unsafe { avx512::gen_pq(data, p, q) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW and GFNI.
        Impl::Avx512Gfni => unsafe { gfni::gen_pq(data, p, q) },
        Impl::Scalar => 0,
    }
}

/// # Safety
/// As [`gen_p`]; `src` is as long as `dst`.
pub(super) unsafe fn xor_into(imp: Impl, dst: &mut [u8], src: &[u8]) -> usize {
    match imp {
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX2.
        Impl::Avx2 => unsafe { avx2::xor_into(dst, src) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F.
        Impl::Avx512Bw | Impl::Avx512Gfni => unsafe { avx512::xor_into(dst, src) },
        Impl::Scalar => 0,
    }
}

/// # Safety
/// As [`xor_into`].
pub(super) unsafe fn mul_xor_into(imp: Impl, dst: &mut [u8], src: &[u8], c: u8) -> usize {
    match imp {
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX2.
        Impl::Avx2 => unsafe { avx2::mul(dst, Some(src), c) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW.
        Impl::Avx512Bw => unsafe { avx512::mul(dst, Some(src), c) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW and GFNI.
        Impl::Avx512Gfni => unsafe { gfni::mul(dst, Some(src), c) },
        Impl::Scalar => 0,
    }
}

/// # Safety
/// `imp` must be available on this CPU.
pub(super) unsafe fn mul_in_place(imp: Impl, buf: &mut [u8], c: u8) -> usize {
    match imp {
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX2.
        Impl::Avx2 => unsafe { avx2::mul(buf, None, c) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW.
        Impl::Avx512Bw => unsafe { avx512::mul(buf, None, c) },
        // SAFETY: `imp` is available (caller's contract), so the CPU has AVX-512F/BW and GFNI.
        Impl::Avx512Gfni => unsafe { gfni::mul(buf, None, c) },
        Impl::Scalar => 0,
    }
}

// ---------------------------------------------------------------------------------------

mod avx2 {
    use super::*;

    /// Bytes per loop step: two vectors keep two dependency chains in flight.
    const STEP: usize = 64;

    /// ×g on 32 bytes: bytes with the top bit set (negative as i8) get 0x1d XORed in
    /// after the shift.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul2(v: __m256i, poly: __m256i) -> __m256i {
        let top = _mm256_cmpgt_epi8(_mm256_setzero_si256(), v);
        _mm256_xor_si256(_mm256_add_epi8(v, v), _mm256_and_si256(top, poly))
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn gen_p(data: &[&[u8]], p: &mut [u8]) -> usize {
        let end = p.len() / STEP * STEP;
        let mut i = 0;
        while i < end {
            let mut a = _mm256_setzero_si256();
            let mut b = _mm256_setzero_si256();
            for d in data {
                a = _mm256_xor_si256(a, ld32(d, i));
                b = _mm256_xor_si256(b, ld32(d, i + 32));
            }
            st32(p, i, a);
            st32(p, i + 32, b);
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
        let end = p.len() / STEP * STEP;
        let poly = _mm256_set1_epi8(0x1d);
        let (top, rest) = data.split_last().expect("at least one data block");
        let mut i = 0;
        while i < end {
            let mut p0 = ld32(top, i);
            let mut p1 = ld32(top, i + 32);
            let mut q0 = p0;
            let mut q1 = p1;
            for d in rest.iter().rev() {
                let d0 = ld32(d, i);
                let d1 = ld32(d, i + 32);
                p0 = _mm256_xor_si256(p0, d0);
                p1 = _mm256_xor_si256(p1, d1);
                q0 = _mm256_xor_si256(mul2(q0, poly), d0);
                q1 = _mm256_xor_si256(mul2(q1, poly), d1);
            }
            st32(p, i, p0);
            st32(p, i + 32, p1);
            st32(q, i, q0);
            st32(q, i + 32, q1);
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn xor_into(dst: &mut [u8], src: &[u8]) -> usize {
        let end = dst.len() / STEP * STEP;
        let mut i = 0;
        while i < end {
            let a = _mm256_xor_si256(ld32(dst, i), ld32(src, i));
            let b = _mm256_xor_si256(ld32(dst, i + 32), ld32(src, i + 32));
            st32(dst, i, a);
            st32(dst, i + 32, b);
            i += STEP;
        }
        end
    }

    /// The nibble tables of `c`, each repeated in both 128-bit lanes (PSHUFB looks up
    /// within a lane).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn tables(c: u8) -> (__m256i, __m256i) {
        let (lo, hi) = gf::nibble_tables(c);
        let mut lo2 = [0u8; 32];
        let mut hi2 = [0u8; 32];
        lo2[..16].copy_from_slice(&lo);
        lo2[16..].copy_from_slice(&lo);
        hi2[..16].copy_from_slice(&hi);
        hi2[16..].copy_from_slice(&hi);
        (ld32(&lo2, 0), ld32(&hi2, 0))
    }

    /// c·v: look up the low and high nibble of every byte and XOR the products.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mulc(v: __m256i, lo: __m256i, hi: __m256i) -> __m256i {
        let mask = _mm256_set1_epi8(0x0f);
        let l = _mm256_and_si256(v, mask);
        let h = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        _mm256_xor_si256(_mm256_shuffle_epi8(lo, l), _mm256_shuffle_epi8(hi, h))
    }

    /// `dst ^= c·src` with a source, `dst = c·dst` without.
    #[target_feature(enable = "avx2")]
    pub(super) fn mul(dst: &mut [u8], src: Option<&[u8]>, c: u8) -> usize {
        let end = dst.len() / STEP * STEP;
        let (lo, hi) = tables(c);
        let mut i = 0;
        while i < end {
            for k in [i, i + 32] {
                let v = match src {
                    Some(s) => _mm256_xor_si256(ld32(dst, k), mulc(ld32(s, k), lo, hi)),
                    None => mulc(ld32(dst, k), lo, hi),
                };
                st32(dst, k, v);
            }
            i += STEP;
        }
        end
    }
}

mod avx512 {
    use super::*;

    /// Bytes per loop step: two 64-byte vectors.
    const STEP: usize = 128;

    /// `a ^ b ^ c` in one instruction.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
        _mm512_ternarylogic_epi32::<0x96>(a, b, c)
    }

    /// g·q ^ d: the top bits become a mask that selects 0x1d, the add shifts.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn mul2_xor(q: __m512i, d: __m512i, poly: __m512i) -> __m512i {
        let top = _mm512_movepi8_mask(q);
        xor3(_mm512_add_epi8(q, q), _mm512_maskz_mov_epi8(top, poly), d)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn gen_p(data: &[&[u8]], p: &mut [u8]) -> usize {
        let end = p.len() / STEP * STEP;
        let mut i = 0;
        while i < end {
            let mut a = _mm512_setzero_si512();
            let mut b = _mm512_setzero_si512();
            let mut pairs = data.chunks_exact(2);
            for pair in pairs.by_ref() {
                a = xor3(a, ld64(pair[0], i), ld64(pair[1], i));
                b = xor3(b, ld64(pair[0], i + 64), ld64(pair[1], i + 64));
            }
            for d in pairs.remainder() {
                a = _mm512_xor_si512(a, ld64(d, i));
                b = _mm512_xor_si512(b, ld64(d, i + 64));
            }
            st64(p, i, a);
            st64(p, i + 64, b);
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
        let end = p.len() / STEP * STEP;
        let poly = _mm512_set1_epi8(0x1d);
        let (top, rest) = data.split_last().expect("at least one data block");
        let mut i = 0;
        while i < end {
            let mut p0 = ld64(top, i);
            let mut p1 = ld64(top, i + 64);
            let mut q0 = p0;
            let mut q1 = p1;
            for d in rest.iter().rev() {
                let d0 = ld64(d, i);
                let d1 = ld64(d, i + 64);
                p0 = _mm512_xor_si512(p0, d0);
                p1 = _mm512_xor_si512(p1, d1);
                q0 = mul2_xor(q0, d0, poly);
                q1 = mul2_xor(q1, d1, poly);
            }
            st64(p, i, p0);
            st64(p, i + 64, p1);
            st64(q, i, q0);
            st64(q, i + 64, q1);
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn xor_into(dst: &mut [u8], src: &[u8]) -> usize {
        let end = dst.len() / STEP * STEP;
        let mut i = 0;
        while i < end {
            let a = _mm512_xor_si512(ld64(dst, i), ld64(src, i));
            let b = _mm512_xor_si512(ld64(dst, i + 64), ld64(src, i + 64));
            st64(dst, i, a);
            st64(dst, i + 64, b);
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn mul(dst: &mut [u8], src: Option<&[u8]>, c: u8) -> usize {
        let end = dst.len() / STEP * STEP;
        let (lo, hi) = gf::nibble_tables(c);
        let mut lo4 = [0u8; 64];
        let mut hi4 = [0u8; 64];
        for k in 0..4 {
            lo4[16 * k..16 * k + 16].copy_from_slice(&lo);
            hi4[16 * k..16 * k + 16].copy_from_slice(&hi);
        }
        let (lo, hi) = (ld64(&lo4, 0), ld64(&hi4, 0));
        let mask = _mm512_set1_epi8(0x0f);
        let mut i = 0;
        while i < end {
            for k in [i, i + 64] {
                let v = match src {
                    Some(s) => ld64(s, k),
                    None => ld64(dst, k),
                };
                let l = _mm512_shuffle_epi8(lo, _mm512_and_si512(v, mask));
                let h = _mm512_shuffle_epi8(hi, _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask));
                let r = match src {
                    Some(_) => xor3(ld64(dst, k), l, h),
                    None => _mm512_xor_si512(l, h),
                };
                st64(dst, k, r);
            }
            i += STEP;
        }
        end
    }
}

mod gfni {
    use super::*;

    /// Bytes per loop step: two 64-byte vectors, two independent Horner chains. Four
    /// (256 bytes, four cache lines of every block per step) ran 1-3 % behind ISA-L
    /// when streaming from memory, two did not; in cache the two are level.
    const STEP: usize = 128;

    /// The matrices of "multiply by c" for every c, built at compile time:
    /// `gf::affine_matrix` is a `const fn` of some 500 steps, and LLVM did not fold
    /// even `affine_matrix(2)`, so every call paid for it.
    static AFFINE: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut c = 0;
        while c < 256 {
            t[c] = gf::affine_matrix(c.to_le_bytes()[0]);
            c += 1;
        }
        t
    };

    /// Q by Horner's rule, two data blocks per step: q = g²·q ^ g·d[hi] ^ d[lo] is two
    /// affines and one three-way XOR where one block at a time (q = g·q ^ d) is one
    /// affine and one XOR per block, and halves the length of the dependency chain
    /// through q. P takes the same two blocks in one three-way XOR. In L1 (4 KiB
    /// chunks) this is worth 10-20 % from four data blocks up; from L2 and memory the
    /// loads and stores set the pace either way.
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    pub(super) fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> usize {
        let end = p.len() / STEP * STEP;
        let times_g = _mm512_set1_epi64(bits64(AFFINE[2]));
        let times_g2 = _mm512_set1_epi64(bits64(AFFINE[4]));
        let (top, rest) = data.split_last().expect("at least one data block");
        let mut i = 0;
        while i < end {
            let mut vp = [ld64(top, i), ld64(top, i + 64)];
            let mut vq = vp;
            // Pairs from the top down; an odd block left over is slot 0, done last.
            let mut pairs = rest.rchunks_exact(2);
            for pair in pairs.by_ref() {
                let (lo, hi) = (pair[0], pair[1]);
                for k in 0..2 {
                    let h = ld64(hi, i + 64 * k);
                    let l = ld64(lo, i + 64 * k);
                    vp[k] = _mm512_ternarylogic_epi32::<0x96>(vp[k], h, l);
                    vq[k] = _mm512_ternarylogic_epi32::<0x96>(
                        _mm512_gf2p8affine_epi64_epi8::<0>(vq[k], times_g2),
                        _mm512_gf2p8affine_epi64_epi8::<0>(h, times_g),
                        l,
                    );
                }
            }
            for d in pairs.remainder() {
                for k in 0..2 {
                    let dv = ld64(d, i + 64 * k);
                    vp[k] = _mm512_xor_si512(vp[k], dv);
                    vq[k] =
                        _mm512_xor_si512(_mm512_gf2p8affine_epi64_epi8::<0>(vq[k], times_g), dv);
                }
            }
            for k in 0..2 {
                st64(p, i + 64 * k, vp[k]);
                st64(q, i + 64 * k, vq[k]);
            }
            i += STEP;
        }
        end
    }

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    pub(super) fn mul(dst: &mut [u8], src: Option<&[u8]>, c: u8) -> usize {
        let end = dst.len() / STEP * STEP;
        let m = _mm512_set1_epi64(bits64(AFFINE[usize::from(c)]));
        let mut i = 0;
        while i < end {
            for k in [i, i + 64] {
                let r = match src {
                    Some(s) => _mm512_xor_si512(
                        ld64(dst, k),
                        _mm512_gf2p8affine_epi64_epi8::<0>(ld64(s, k), m),
                    ),
                    None => _mm512_gf2p8affine_epi64_epi8::<0>(ld64(dst, k), m),
                };
                st64(dst, k, r);
            }
            i += STEP;
        }
        end
    }
}
