//! Parity: P (XOR) for RAID4/5/6 and the RAID6 Q syndrome over GF(2^8), plus the
//! recovery maths for any one or two lost blocks (ondisk-formats.md §1.12,
//! `lib/raid6/int.uc`, `lib/raid6/recov.c`).
//!
//! ```text
//!   Parity::new()  ── picks the fastest kernel this CPU runs (once) ──┐
//!     gen_p / gen_pq / xor_into / mul_xor_into / mul_in_place         ├─ scalar (u64 SWAR)
//!     recover_p / recover_pq  (built from the primitives above)       ├─ AVX2 (+PSHUFB)
//!                                                                     ├─ AVX-512BW
//!                                                                     └─ AVX-512 + GFNI
//! ```
//!
//! [`check`] holds the scrub's maths: which single block of a RAID6 row (data, P or Q)
//! explains a parity mismatch.
//!
//! Blocks are passed in **syndrome-slot order**: `data[i]` enters Q multiplied by g^i.
//! [`crate::layout::StripeMap::syndrome_order`] gives that order for a stripe; where a
//! slot contributes nothing (the P/Q positions of DDF layouts) pass a zero block.
//! All blocks of one call have the same length; any length works, SIMD kernels handle
//! the multiple of their vector width and the scalar kernel the tail.

pub mod check;
pub mod gf;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use cairn_block::{Error, ErrorKind, Result};

/// A parity kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Impl {
    /// Portable: eight bytes at a time in a `u64`.
    Scalar,
    /// 32-byte vectors; Q by the compare/add/and multiply-by-g, constants by PSHUFB
    /// nibble tables.
    Avx2,
    /// 64-byte vectors with mask registers and three-way XOR (VPTERNLOG).
    Avx512Bw,
    /// AVX-512 with GF2P8AFFINEQB: any GF(2^8) constant multiply is one instruction.
    Avx512Gfni,
}

impl Impl {
    pub const ALL: [Impl; 4] = [Impl::Scalar, Impl::Avx2, Impl::Avx512Bw, Impl::Avx512Gfni];

    pub const fn name(self) -> &'static str {
        match self {
            Impl::Scalar => "scalar",
            Impl::Avx2 => "avx2",
            Impl::Avx512Bw => "avx512bw",
            Impl::Avx512Gfni => "avx512+gfni",
        }
    }

    /// Whether this CPU runs the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Impl::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Impl::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Impl::Avx512Bw => {
                is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Impl::Avx512Gfni => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The kernels this CPU runs, slowest first.
    pub fn available() -> Vec<Impl> {
        Impl::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The fastest available kernel (detected once). GFNI wins where present: one
    /// instruction per GF multiply; then AVX-512BW, then AVX2.
    pub fn best() -> Impl {
        static BEST: OnceLock<Impl> = OnceLock::new();
        *BEST.get_or_init(|| {
            [Impl::Avx512Gfni, Impl::Avx512Bw, Impl::Avx2]
                .into_iter()
                .find(|i| i.is_available())
                .unwrap_or(Impl::Scalar)
        })
    }
}

/// A parity engine bound to one kernel family, which is known to run on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parity {
    /// Invariant: `imp.is_available()`; the SIMD dispatch below relies on it.
    imp: Impl,
}

impl Default for Parity {
    fn default() -> Parity {
        Parity::new()
    }
}

fn same_len(what: &str, len: usize, blocks: &[&[u8]]) {
    assert!(
        blocks.iter().all(|b| b.len() == len),
        "{what}: every block must be {len} bytes"
    );
}

impl Parity {
    /// The fastest engine for this CPU.
    pub fn new() -> Parity {
        Parity { imp: Impl::best() }
    }

    /// An engine using `imp`, if this CPU runs it.
    pub fn with_impl(imp: Impl) -> Option<Parity> {
        imp.is_available().then_some(Parity { imp })
    }

    pub fn implementation(&self) -> Impl {
        self.imp
    }

    /// `p` = XOR of `data` (zero when `data` is empty).
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        same_len("gen_p", p.len(), data);
        if data.is_empty() {
            p.fill(0);
            return;
        }
        let done = match self.imp {
            Impl::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self.imp` is available (constructor invariant); lengths checked.
            simd => unsafe { x86::gen_p(simd, data, p) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0,
        };
        scalar::gen_p(data, p, done);
    }

    /// `p` = XOR of `data`, `q` = Σ g^i · `data[i]` (the RAID6 syndrome).
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        same_len("gen_pq", p.len(), data);
        assert_eq!(p.len(), q.len(), "gen_pq: P and Q differ in length");
        if data.is_empty() {
            p.fill(0);
            q.fill(0);
            return;
        }
        let done = match self.imp {
            Impl::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self.imp` is available (constructor invariant); lengths checked.
            simd => unsafe { x86::gen_pq(simd, data, p, q) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0,
        };
        scalar::gen_pq(data, p, q, done);
    }

    /// `dst ^= src`.
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn xor_into(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "xor_into: blocks differ in length");
        let done = match self.imp {
            Impl::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self.imp` is available (constructor invariant); lengths checked.
            simd => unsafe { x86::xor_into(simd, dst, src) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0,
        };
        scalar::xor_into(dst, src, done);
    }

    /// `dst ^= c · src`: how a partial-stripe write folds a data delta into Q
    /// (c = g^slot), and a step of the recovery maths.
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn mul_xor_into(&self, dst: &mut [u8], src: &[u8], c: u8) {
        assert_eq!(
            dst.len(),
            src.len(),
            "mul_xor_into: blocks differ in length"
        );
        let done = match self.imp {
            Impl::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self.imp` is available (constructor invariant); lengths checked.
            simd => unsafe { x86::mul_xor_into(simd, dst, src, c) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0,
        };
        scalar::mul_xor_into(dst, src, c, done);
    }

    /// `buf = c · buf`.
    pub fn mul_in_place(&self, buf: &mut [u8], c: u8) {
        let done = match self.imp {
            Impl::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `self.imp` is available (constructor invariant).
            simd => unsafe { x86::mul_in_place(simd, buf, c) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => 0,
        };
        scalar::mul_in_place(buf, c, done);
    }

    /// RAID4/5: rebuilds block `failed` of `blocks` = data blocks followed by P, as the
    /// XOR of all the others.
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn recover_p(&self, blocks: &mut [&mut [u8]], failed: usize) -> Result<()> {
        if failed >= blocks.len() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("recover: block {failed} of {}", blocks.len()),
            ));
        }
        let (out, others) = split_out(blocks, failed);
        let others: Vec<&[u8]> = others.iter().map(|b| &**b).collect();
        self.gen_p(&others, out);
        Ok(())
    }

    /// RAID6: rebuilds the blocks listed in `failed` (at most two, any of data, P, Q)
    /// in `blocks` = data blocks in syndrome-slot order, then P, then Q. The failed
    /// blocks' contents on entry are ignored.
    ///
    /// Returns `Degraded` for more than two failures, `InvalidArgument` for an index
    /// out of range or repeated.
    ///
    /// # Panics
    /// If the blocks differ in length.
    pub fn recover_pq(&self, blocks: &mut [&mut [u8]], failed: &[usize]) -> Result<()> {
        let n = blocks.len();
        if n < 3 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("recover: {n} blocks, need data, P and Q"),
            ));
        }
        let (pi, qi) = (n - 2, n - 1);
        let mut f = failed.to_vec();
        f.sort_unstable();
        if f.windows(2).any(|w| w[0] == w[1]) || f.iter().any(|&i| i >= n) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("recover: failed blocks {failed:?} of {n}"),
            ));
        }
        let len = blocks[0].len();
        assert!(
            blocks.iter().all(|b| b.len() == len),
            "recover: blocks differ in length"
        );
        match *f.as_slice() {
            [] => Ok(()),
            // Only parity lost: recompute what was lost from the data.
            [i] if i == pi => {
                let (p, rest) = split_out(blocks, pi);
                let data: Vec<&[u8]> = rest[..pi].iter().map(|b| &**b).collect();
                self.gen_p(&data, p);
                Ok(())
            }
            [i] if i == qi => {
                let (q, rest) = split_out(blocks, qi);
                let data: Vec<&[u8]> = rest[..pi].iter().map(|b| &**b).collect();
                let mut scratch = vec![0u8; len];
                self.gen_pq(&data, &mut scratch, q);
                Ok(())
            }
            [a, b] if a == pi && b == qi => {
                let (data, pq) = blocks.split_at_mut(pi);
                let [p, q] = pq else {
                    unreachable!("two parity blocks")
                };
                let data: Vec<&[u8]> = data.iter().map(|b| &**b).collect();
                self.gen_pq(&data, p, q);
                Ok(())
            }
            // One data block, P intact: D = P ^ XOR(other data).
            [x] => {
                let (out, rest) = split_out(blocks, x);
                let srcs: Vec<&[u8]> = rest[..pi].iter().map(|b| &**b).collect();
                self.gen_p(&srcs, out);
                Ok(())
            }
            [x, q] if q == qi => {
                {
                    let (out, rest) = split_out(blocks, x);
                    let srcs: Vec<&[u8]> = rest[..pi].iter().map(|b| &**b).collect();
                    self.gen_p(&srcs, out);
                }
                let (data, pq) = blocks.split_at_mut(pi);
                let [_, q] = pq else {
                    unreachable!("two parity blocks")
                };
                let data: Vec<&[u8]> = data.iter().map(|b| &**b).collect();
                let mut scratch = vec![0u8; len];
                self.gen_pq(&data, &mut scratch, q);
                Ok(())
            }
            [x, p] if p == pi => {
                // Q' = Q ^ Qr with D_x taken as zero; D_x = Q' · g^-x; then P = Pr ^ D_x.
                let zero = vec![0u8; len];
                let (data, pq) = blocks.split_at_mut(pi);
                let [p, q] = pq else {
                    unreachable!("two parity blocks")
                };
                let (dx, srcs) = zeroed_view(data, &[x], &zero);
                let dx = dx.into_iter().next().expect("one failed block");
                self.gen_pq(&srcs, p, dx);
                self.xor_into(dx, q);
                self.mul_in_place(dx, gf::inv(gf::exp(slot_exp(x))));
                self.xor_into(p, dx);
                Ok(())
            }
            [a, b] => {
                // recov.c raid6_2data_recov, slots a < b:
                //   P' = P ^ Pr, Q' = Q ^ Qr (a, b taken as zero)
                //   D_b = P'·(g^(b-a) ^ 1)^-1 ^ Q'·(g^a ^ g^b)^-1,  D_a = D_b ^ P'
                let zero = vec![0u8; len];
                let (data, pq) = blocks.split_at_mut(pi);
                let [p, q] = pq else {
                    unreachable!("two parity blocks")
                };
                let (mut outs, srcs) = zeroed_view(data, &[a, b], &zero);
                let db = outs.pop().expect("two failed blocks");
                let da = outs.pop().expect("two failed blocks");
                self.gen_pq(&srcs, da, db);
                self.xor_into(da, p); // da = P'
                self.xor_into(db, q); // db = Q'
                let ea = slot_exp(a);
                let eb = slot_exp(b);
                let pbmul = gf::inv(gf::exp(eb - ea) ^ 1);
                let qmul = gf::inv(gf::exp(ea) ^ gf::exp(eb));
                self.mul_in_place(db, qmul);
                self.mul_xor_into(db, da, pbmul); // db = D_b
                self.xor_into(da, db); // da = D_b ^ P' = D_a
                Ok(())
            }
            _ => Err(Error::new(
                ErrorKind::Degraded,
                format!(
                    "recover: {} blocks lost, RAID6 rebuilds at most two",
                    f.len()
                ),
            )),
        }
    }
}

/// A slot index as a Q exponent. Slots are below 255 because RAID6 layouts are limited
/// to 255 members; a larger index cannot come from a layout.
fn slot_exp(slot: usize) -> u8 {
    u8::try_from(slot).expect("RAID6 syndrome slots are below 255")
}

/// Splits `blocks` into the block at `i` (mutable) and the others in order.
fn split_out<'a>(blocks: &'a mut [&mut [u8]], i: usize) -> (&'a mut [u8], Vec<&'a mut [u8]>) {
    let mut out = None;
    let mut rest = Vec::with_capacity(blocks.len().saturating_sub(1));
    for (k, b) in blocks.iter_mut().enumerate() {
        if k == i {
            out = Some(&mut **b);
        } else {
            rest.push(&mut **b);
        }
    }
    (out.expect("index checked by caller"), rest)
}

/// The blocks at `failed` (mutable, in order) and a read view of all blocks with those
/// replaced by `zero`.
fn zeroed_view<'a>(
    data: &'a mut [&mut [u8]],
    failed: &[usize],
    zero: &'a [u8],
) -> (Vec<&'a mut [u8]>, Vec<&'a [u8]>) {
    let mut outs = Vec::with_capacity(failed.len());
    let mut view = Vec::with_capacity(data.len());
    for (k, b) in data.iter_mut().enumerate() {
        if failed.contains(&k) {
            outs.push(&mut **b);
            view.push(zero);
        } else {
            view.push(&**b);
        }
    }
    (outs, view)
}
