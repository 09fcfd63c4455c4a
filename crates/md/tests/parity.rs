//! Randomized parity checks: every SIMD kernel gives the scalar kernel's bytes, and every
//! loss of one or two blocks is rebuilt exactly. The seed is printed; rerun a failure
//! with `CAIRN_SEED=<seed>`.

use cairn_block::ErrorKind;
use cairn_md::parity::{gf, Impl, Parity};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

fn rng(test: &str) -> SmallRng {
    SmallRng::seed_from_u64(cairn_block::testkit::test_seed(test))
}

fn random_block(r: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    r.fill_bytes(&mut v);
    v
}

/// Lengths around every kernel's step (64, 128, 256) plus 0, 1 and page-sized ones.
fn lengths(r: &mut SmallRng) -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        7,
        8,
        31,
        63,
        64,
        65,
        127,
        128,
        129,
        255,
        256,
        257,
        511,
        4096,
        4096 + 37,
        65536,
    ];
    for _ in 0..8 {
        v.push(r.gen_range(0..20_000));
    }
    v
}

fn simd_engines() -> Vec<Parity> {
    let v: Vec<Parity> = Impl::available()
        .into_iter()
        .filter(|&i| i != Impl::Scalar)
        .filter_map(Parity::with_impl)
        .collect();
    if v.is_empty() {
        eprintln!("SKIP: no SIMD parity kernel runs on this CPU; only the scalar kernel is tested");
    }
    v
}

#[test]
fn simd_kernels_equal_scalar() {
    let mut r = rng("simd_kernels_equal_scalar");
    let scalar = Parity::with_impl(Impl::Scalar).unwrap();
    let engines = simd_engines();
    for len in lengths(&mut r) {
        for ndata in [1, 2, 3, 4, 5, 8, 13, 30] {
            let data: Vec<Vec<u8>> = (0..ndata).map(|_| random_block(&mut r, len)).collect();
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let (mut p0, mut q0) = (vec![0; len], vec![0; len]);
            scalar.gen_pq(&refs, &mut p0, &mut q0);
            let mut px = vec![0; len];
            scalar.gen_p(&refs, &mut px);
            assert_eq!(px, p0);
            // Q by the definition, bytewise: Σ g^i·D_i.
            if len > 0 {
                let j = r.gen_range(0..len);
                let want = refs.iter().enumerate().fold(0u8, |acc, (i, d)| {
                    acc ^ gf::mul(gf::exp(u8::try_from(i).unwrap()), d[j])
                });
                assert_eq!(q0[j], want, "scalar Q byte {j}");
            }
            let c: u8 = r.gen();
            let (mut mx0, mut mi0, mut x0) = (data[0].clone(), data[0].clone(), data[0].clone());
            scalar.mul_xor_into(&mut mx0, refs[ndata - 1], c);
            scalar.mul_in_place(&mut mi0, c);
            scalar.xor_into(&mut x0, refs[ndata - 1]);
            for e in &engines {
                let name = e.implementation().name();
                let (mut p, mut q) = (random_block(&mut r, len), random_block(&mut r, len));
                e.gen_pq(&refs, &mut p, &mut q);
                assert_eq!(p, p0, "{name} P, {ndata} x {len}");
                assert_eq!(q, q0, "{name} Q, {ndata} x {len}");
                let mut pp = random_block(&mut r, len);
                e.gen_p(&refs, &mut pp);
                assert_eq!(pp, p0, "{name} gen_p, {ndata} x {len}");
                let (mut mx, mut mi, mut x) = (data[0].clone(), data[0].clone(), data[0].clone());
                e.mul_xor_into(&mut mx, refs[ndata - 1], c);
                e.mul_in_place(&mut mi, c);
                e.xor_into(&mut x, refs[ndata - 1]);
                assert_eq!(mx, mx0, "{name} mul_xor_into c={c:#x}, {len}");
                assert_eq!(mi, mi0, "{name} mul_in_place c={c:#x}, {len}");
                assert_eq!(x, x0, "{name} xor_into, {len}");
            }
        }
    }
}

#[test]
fn every_constant_multiplies_alike() {
    let mut r = rng("every_constant_multiplies_alike");
    let src = random_block(&mut r, 1000);
    let want_for = |c: u8| -> Vec<u8> { src.iter().map(|&x| gf::mul(c, x)).collect() };
    for imp in Impl::available() {
        let e = Parity::with_impl(imp).unwrap();
        for c in 0..=255u8 {
            let want = want_for(c);
            let mut b = src.clone();
            e.mul_in_place(&mut b, c);
            assert_eq!(b, want, "{} ×{c:#x}", imp.name());
            let mut z = vec![0; src.len()];
            e.mul_xor_into(&mut z, &src, c);
            assert_eq!(z, want, "{} ^= ×{c:#x}", imp.name());
        }
    }
}

/// Every set of one or two lost blocks among data (in slot order), P and Q is rebuilt,
/// with each kernel, for several data counts and lengths.
#[test]
fn raid6_recovers_every_one_and_two_block_loss() {
    let mut r = rng("raid6_recovers_every_one_and_two_block_loss");
    for imp in Impl::available() {
        let e = Parity::with_impl(imp).unwrap();
        for ndata in [1usize, 2, 3, 5, 8, 14] {
            let len = [1, 64, 300, 4096 + 17][r.gen_range(0..4)];
            let mut good: Vec<Vec<u8>> = (0..ndata).map(|_| random_block(&mut r, len)).collect();
            let (mut p, mut q) = (vec![0; len], vec![0; len]);
            {
                let refs: Vec<&[u8]> = good.iter().map(Vec::as_slice).collect();
                e.gen_pq(&refs, &mut p, &mut q);
            }
            good.push(p);
            good.push(q);
            let n = ndata + 2;
            let mut sets: Vec<Vec<usize>> = vec![vec![]];
            for a in 0..n {
                sets.push(vec![a]);
                for b in a + 1..n {
                    sets.push(vec![b, a]); // unsorted on purpose
                }
            }
            for lost in sets {
                let mut blocks = good.clone();
                for &x in &lost {
                    r.fill_bytes(&mut blocks[x]);
                }
                let mut refs: Vec<&mut [u8]> = blocks.iter_mut().map(Vec::as_mut_slice).collect();
                e.recover_pq(&mut refs, &lost).unwrap();
                assert_eq!(
                    blocks,
                    good,
                    "{}: {ndata} data, len {len}, lost {lost:?}",
                    imp.name()
                );
            }
        }
    }
}

#[test]
fn raid5_recovers_every_single_loss() {
    let mut r = rng("raid5_recovers_every_single_loss");
    for imp in Impl::available() {
        let e = Parity::with_impl(imp).unwrap();
        for ndata in [1usize, 2, 4, 9] {
            let len = 4096 + 100;
            let mut good: Vec<Vec<u8>> = (0..ndata).map(|_| random_block(&mut r, len)).collect();
            let mut p = vec![0; len];
            {
                let refs: Vec<&[u8]> = good.iter().map(Vec::as_slice).collect();
                e.gen_p(&refs, &mut p);
            }
            good.push(p);
            for x in 0..=ndata {
                let mut blocks = good.clone();
                r.fill_bytes(&mut blocks[x]);
                let mut refs: Vec<&mut [u8]> = blocks.iter_mut().map(Vec::as_mut_slice).collect();
                e.recover_p(&mut refs, x).unwrap();
                assert_eq!(blocks, good, "{}: {ndata} data, lost {x}", imp.name());
            }
        }
    }
}

#[test]
fn recovery_refuses_what_it_cannot_do() {
    let e = Parity::new();
    let mut bufs = vec![vec![0u8; 64]; 5];
    let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(
        e.recover_pq(&mut refs, &[0, 1, 2]).unwrap_err().kind(),
        ErrorKind::Degraded
    );
    assert_eq!(
        e.recover_pq(&mut refs, &[1, 1]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        e.recover_pq(&mut refs, &[5]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        e.recover_p(&mut refs, 9).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

/// A partial-stripe update folds the data delta into P and Q: P ^= Δ, Q ^= g^slot·Δ.
#[test]
fn delta_update_matches_full_recompute() {
    let mut r = rng("delta_update_matches_full_recompute");
    let e = Parity::new();
    let len = 8192;
    let mut data: Vec<Vec<u8>> = (0..6).map(|_| random_block(&mut r, len)).collect();
    let (mut p, mut q) = (vec![0; len], vec![0; len]);
    e.gen_pq(
        &data.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        &mut p,
        &mut q,
    );
    let slot = 4;
    let new = random_block(&mut r, len);
    let mut delta = data[slot].clone();
    e.xor_into(&mut delta, &new);
    e.xor_into(&mut p, &delta);
    e.mul_xor_into(&mut q, &delta, gf::exp(u8::try_from(slot).unwrap()));
    data[slot] = new;
    let (mut p2, mut q2) = (vec![0; len], vec![0; len]);
    e.gen_pq(
        &data.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        &mut p2,
        &mut q2,
    );
    assert_eq!((p, q), (p2, q2));
}
