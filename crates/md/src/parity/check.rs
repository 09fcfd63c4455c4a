//! RAID6 single-error location: which one block of a row (a data chunk, P or Q), if any,
//! explains why the stored P and Q disagree with the data (H. Peter Anvin, "The
//! mathematics of RAID-6", §4; mdadm's `raid6check.c`, `raid6_collect`).
//!
//! ```text
//!   dP = P ⊕ P'   dQ = Q ⊕ Q'     (stored ⊕ recomputed from the data), per byte:
//!     dP = 0, dQ = 0   nothing wrong here
//!     dP ≠ 0, dQ = 0   P is wrong
//!     dP = 0, dQ ≠ 0   Q is wrong
//!     dP ≠ 0, dQ ≠ 0   data slot z is wrong, g^z = dQ / dP, and its right value is D_z ⊕ dP
//! ```
//!
//! Why: an error E in the data of slot z adds E to P' and g^z·E to Q', so dP = E and
//! dQ = g^z·E; an error in P or Q shows in that syndrome alone. A row has one culprit
//! only when every byte that disagrees names the same one; otherwise at least two
//! blocks are wrong and the row is unidentifiable (two errors can also masquerade as
//! one, byte by byte, which no parity scheme with two syndromes can tell apart).

use super::gf;

/// What the syndromes of a row say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorLocation {
    /// P and Q agree with the data.
    Consistent,
    /// P alone is wrong.
    P,
    /// Q alone is wrong.
    Q,
    /// The data in this syndrome slot (the block multiplied by g^slot) alone is wrong.
    Data(u8),
    /// More than one block is wrong.
    Unidentifiable,
}

/// Locates the single wrong block of a row from `dp` = P ⊕ P' and `dq` = Q ⊕ Q' (equal
/// lengths). `data_slots[z]` says whether syndrome slot z holds data (false for the
/// zero slots of DDF layouts, and past the end); an answer naming any other slot is
/// [`ErrorLocation::Unidentifiable`].
///
/// # Panics
/// If `dp` and `dq` differ in length.
pub fn locate_error(dp: &[u8], dq: &[u8], data_slots: &[bool]) -> ErrorLocation {
    assert_eq!(
        dp.len(),
        dq.len(),
        "locate_error: dP and dQ differ in length"
    );
    let mut found = ErrorLocation::Consistent;
    for (&p, &q) in dp.iter().zip(dq) {
        let here = match (p, q) {
            (0, 0) => continue,
            (_, 0) => ErrorLocation::P,
            (0, _) => ErrorLocation::Q,
            (p, q) => {
                let (lp, lq) = (gf::LOG[usize::from(p)], gf::LOG[usize::from(q)]);
                let z = (255 + u16::from(lq) - u16::from(lp)) % 255;
                ErrorLocation::Data(u8::try_from(z).expect("below 255"))
            }
        };
        if found == ErrorLocation::Consistent {
            found = here;
        } else if found != here {
            return ErrorLocation::Unidentifiable;
        }
    }
    match found {
        ErrorLocation::Data(z) if !data_slots.get(usize::from(z)).copied().unwrap_or(false) => {
            ErrorLocation::Unidentifiable
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, RngCore, SeedableRng};

    use super::*;
    use crate::parity::{Impl, Parity};

    /// The blocks of a row: data slots, then P, then Q.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Block {
        Data(usize),
        P,
        Q,
    }

    /// By search, without the logarithm trick: the blocks that could alone be changed, at
    /// every byte, to make the row consistent; one block, or none when no single block
    /// can (`Some(None)`); `None` when the row is consistent already.
    fn brute_force(
        data: &[Vec<u8>],
        p: &[u8],
        q: &[u8],
        data_slots: &[bool],
    ) -> Option<Option<Block>> {
        let len = p.len();
        let mut blocks: Vec<Block> = (0..data.len())
            .filter(|&z| data_slots[z])
            .map(Block::Data)
            .collect();
        blocks.extend([Block::P, Block::Q]);
        let mut candidates = blocks.clone();
        let mut consistent = true;
        for i in 0..len {
            let pcalc = data.iter().fold(0u8, |a, d| a ^ d[i]);
            let qcalc = data.iter().enumerate().fold(0u8, |a, (z, d)| {
                a ^ gf::mul(gf::exp(u8::try_from(z).unwrap()), d[i])
            });
            if pcalc == p[i] && qcalc == q[i] {
                continue;
            }
            consistent = false;
            let fixes = |b: Block| {
                (0..=255u8).any(|v| match b {
                    Block::P => v == pcalc && qcalc == q[i],
                    Block::Q => v == qcalc && pcalc == p[i],
                    Block::Data(z) => {
                        let g = gf::exp(u8::try_from(z).unwrap());
                        pcalc ^ data[z][i] ^ v == p[i]
                            && qcalc ^ gf::mul(g, data[z][i]) ^ gf::mul(g, v) == q[i]
                    }
                })
            };
            candidates.retain(|&b| fixes(b));
        }
        if consistent {
            return None;
        }
        assert!(candidates.len() <= 1, "{candidates:?} all fix the row");
        Some(candidates.first().copied())
    }

    #[test]
    fn locating_agrees_with_a_brute_force_search() {
        let seed = cairn_block::testkit::test_seed("locate_error");
        let mut r = SmallRng::seed_from_u64(seed);
        let scalar = Parity::with_impl(Impl::Scalar).unwrap();
        let mut seen = std::collections::HashMap::new();
        for case in 0..400 {
            let slots = r.gen_range(2..=10usize);
            let len = r.gen_range(1..=24usize);
            // Some slots hold no data (DDF layouts): their blocks stay zero.
            let data_slots: Vec<bool> = (0..slots).map(|_| r.gen_ratio(5, 6)).collect();
            let mut data: Vec<Vec<u8>> = (0..slots)
                .map(|z| {
                    let mut v = vec![0u8; len];
                    if data_slots[z] {
                        r.fill_bytes(&mut v);
                    }
                    v
                })
                .collect();
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            scalar.gen_pq(&refs, &mut p, &mut q);
            // Corrupt nothing, one block or two (data, P or Q), one byte or several.
            let mut victims: Vec<Block> = (0..slots)
                .filter(|&z| data_slots[z])
                .map(Block::Data)
                .collect();
            victims.extend([Block::P, Block::Q]);
            let wrong = r.gen_range(0..=2usize).min(victims.len());
            let mut corrupted = Vec::new();
            for _ in 0..wrong {
                let b = victims.remove(r.gen_range(0..victims.len()));
                let block = match b {
                    Block::Data(z) => &mut data[z],
                    Block::P => &mut p,
                    Block::Q => &mut q,
                };
                // Distinct bytes: two flips of one byte could cancel out.
                let k = r.gen_range(1..=3usize).min(len);
                for i in rand::seq::index::sample(&mut r, len, k) {
                    block[i] ^= r.gen_range(1..=255u8);
                }
                corrupted.push(b);
            }
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let (mut p2, mut q2) = (vec![0u8; len], vec![0u8; len]);
            scalar.gen_pq(&refs, &mut p2, &mut q2);
            let dp: Vec<u8> = p.iter().zip(&p2).map(|(a, b)| a ^ b).collect();
            let dq: Vec<u8> = q.iter().zip(&q2).map(|(a, b)| a ^ b).collect();
            let got = locate_error(&dp, &dq, &data_slots);
            let want = match brute_force(&data, &p, &q, &data_slots) {
                None => ErrorLocation::Consistent,
                Some(None) => ErrorLocation::Unidentifiable,
                Some(Some(Block::P)) => ErrorLocation::P,
                Some(Some(Block::Q)) => ErrorLocation::Q,
                Some(Some(Block::Data(z))) => ErrorLocation::Data(u8::try_from(z).unwrap()),
            };
            assert_eq!(
                got, want,
                "seed {seed} case {case}: {corrupted:?} corrupted, slots {data_slots:?}"
            );
            // A single corrupted block is always found.
            if let [b] = corrupted[..] {
                let named = match b {
                    Block::Data(z) => ErrorLocation::Data(u8::try_from(z).unwrap()),
                    Block::P => ErrorLocation::P,
                    Block::Q => ErrorLocation::Q,
                };
                assert_eq!(got, named, "seed {seed} case {case}");
            }
            *seen.entry(std::mem::discriminant(&got)).or_insert(0) += 1;
        }
        // Every answer came up (two corrupted blocks rarely look like one).
        assert_eq!(seen.len(), 5, "seed {seed}: answers seen {seen:?}");
    }

    #[test]
    fn a_slot_without_data_is_not_an_answer() {
        // dQ / dP = g^3 names slot 3.
        let dp = [0x11u8, 0, 0x5a];
        let dq = [gf::mul(gf::exp(3), 0x11), 0, gf::mul(gf::exp(3), 0x5a)];
        assert_eq!(locate_error(&dp, &dq, &[true; 4]), ErrorLocation::Data(3));
        assert_eq!(
            locate_error(&dp, &dq, &[true, true, true, false]),
            ErrorLocation::Unidentifiable
        );
        assert_eq!(
            locate_error(&dp, &dq, &[true; 3]),
            ErrorLocation::Unidentifiable
        );
        assert_eq!(
            locate_error(&[0; 3], &[0; 3], &[]),
            ErrorLocation::Consistent
        );
        assert_eq!(locate_error(&[0, 1], &[0, 0], &[]), ErrorLocation::P);
        assert_eq!(
            locate_error(&[0, 1], &[1, 0], &[]),
            ErrorLocation::Unidentifiable
        );
    }
}
