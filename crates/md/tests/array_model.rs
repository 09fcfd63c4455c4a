//! One test body, many shapes: every level × member count × chunk × layout gets random
//! reads and writes (512-byte granular, unaligned to chunks and stripes, crossing them,
//! some whole stripes) checked against a plain `Vec<u8>`; then every member's bytes are
//! checked against the kernel's layout maths for the final data (data chunks and every
//! copy in place, P the XOR, Q the syndrome in slot order), by `common::check_members`,
//! which computes with the scalar parity kernel and never with the array's code.
//!
//! Prints the seed; replay with `CAIRN_SEED=N`.

mod common;

use cairn_block::testkit::test_seed;
use cairn_block::{BlockDevice, WriteFlags};
use cairn_md::{Level, ParityAlgorithm, Raid10Layout};
use common::{bases, check_members, create, read_all, us, Shape, KIB};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CHUNKS: [u64; 3] = [4, 64, 512];

/// A request: offset and length in bytes, 512-aligned, inside `size`.
fn pick(rng: &mut SmallRng, size: u64, chunk: u64, stripe: u64) -> (u64, u64) {
    let sectors = size / 512;
    let (off, len) = match rng.gen_range(0..6) {
        // Small, anywhere.
        0 | 1 => (rng.gen_range(0..sectors) * 512, rng.gen_range(1..=16) * 512),
        // Across a chunk boundary.
        2 => {
            let b = rng.gen_range(1..=size / chunk) * chunk;
            (
                b.saturating_sub(rng.gen_range(0..=16) * 512),
                rng.gen_range(1..=48) * 512,
            )
        }
        // Whole stripes.
        3 => {
            let stripes = size / stripe;
            let first = rng.gen_range(0..stripes.max(1));
            (first * stripe, rng.gen_range(1..=2) * stripe)
        }
        // Large and unaligned, crossing stripes.
        4 => (
            rng.gen_range(0..sectors) * 512,
            rng.gen_range(1..=2 * stripe / 512) * 512,
        ),
        // Across a stripe boundary.
        _ => {
            let b = rng.gen_range(1..=(size / stripe).max(1)) * stripe;
            (
                b.saturating_sub(rng.gen_range(0..=stripe / 512) * 512),
                rng.gen_range(1..=stripe / 512 + 8) * 512,
            )
        }
    };
    let off = off.min(size - 512);
    (off, len.min(size - off))
}

fn run(shapes: &[Shape], what: &str) {
    let seed = test_seed(what);
    let mut rng = SmallRng::seed_from_u64(seed);
    // Written data comes from random offsets of one random pool: as unlikely to land in
    // the right place by accident as fresh random bytes, and cheap in debug builds.
    let mut pool = vec![0u8; 16 << 20];
    rng.fill(&mut pool[..]);
    for shape in shapes {
        let name = shape.name();
        let (array, members) = create(shape);
        let g = array.geometry();
        let size = g.size;
        let mut model = vec![0u8; us(size)];
        let stripe = u64::from(g.optimal_io_size);
        let chunk = (shape.chunk_kib * KIB).min(stripe);
        let ops = 20 + 2 * shape.members;
        for i in 0..ops {
            let (off, len) = pick(&mut rng, size, chunk, stripe);
            let (o, n) = (us(off), us(len));
            if i % 5 < 3 {
                let from = rng.gen_range(0..pool.len() - n);
                let data = &pool[from..from + n];
                let flags = if rng.gen_bool(0.1) {
                    WriteFlags::FUA
                } else {
                    WriteFlags::NONE
                };
                array
                    .write_at(data, off, flags)
                    .unwrap_or_else(|e| panic!("{name} (seed {seed}): write {len} at {off}: {e}"));
                model[o..o + n].copy_from_slice(data);
            } else {
                let mut buf = vec![0u8; n];
                array
                    .read_at(&mut buf, off)
                    .unwrap_or_else(|e| panic!("{name} (seed {seed}): read {len} at {off}: {e}"));
                if buf != model[o..o + n] {
                    let i = buf
                        .iter()
                        .zip(&model[o..])
                        .position(|(a, b)| a != b)
                        .unwrap();
                    panic!(
                        "{name} (seed {seed}): read {len} at {off} disagrees with the model at array byte {}",
                        off + i as u64
                    );
                }
            }
        }
        assert!(
            read_all(&array) == model,
            "{name} (seed {seed}): final read disagrees with the model"
        );
        array.close().unwrap();
        let images: Vec<Option<Vec<u8>>> = members.iter().map(|m| Some(m.to_vec())).collect();
        if let Err(e) = check_members(array.layout(), &images, &bases(&members), &model) {
            panic!("{name} (seed {seed}): member images: {e}");
        }
        let report = array.report();
        assert!(report.state.clean, "{name}: {}", report.state_text);
    }
    eprintln!("{what}: {} shapes", shapes.len());
}

fn each_chunk(
    level: Level,
    layout: Option<u32>,
    members: impl Iterator<Item = usize> + Clone,
) -> Vec<Shape> {
    CHUNKS
        .iter()
        .flat_map(|&c| {
            members
                .clone()
                .map(move |n| Shape::new(level, layout, c, n))
        })
        .collect()
}

#[test]
fn model_linear_raid0() {
    let mut shapes = Vec::new();
    for n in 1..=8 {
        let mut s = Shape::new(Level::Linear, None, 64, n);
        s.unequal = true;
        shapes.push(s);
    }
    for layout in [1, 2] {
        for mut s in each_chunk(Level::Raid0, Some(layout), 1..=8) {
            s.unequal = layout == 2 || s.members % 2 == 0;
            shapes.push(s);
        }
    }
    run(&shapes, "model linear/raid0");
}

#[test]
fn model_raid1_raid10() {
    let mut shapes: Vec<Shape> = (1..=8)
        .map(|n| Shape::new(Level::Raid1, None, 64, n))
        .collect();
    for l in ["n2", "f2", "o2", "n3"] {
        let layout = Raid10Layout::parse(l).unwrap();
        let min = usize::try_from(layout.copies()).unwrap();
        shapes.extend(each_chunk(Level::Raid10, Some(layout.to_raw()), min..=8));
    }
    run(&shapes, "model raid1/raid10");
}

#[test]
fn model_raid4_raid5() {
    let mut shapes = each_chunk(Level::Raid4, None, 2..=8);
    for alg in ParityAlgorithm::ALL
        .into_iter()
        .filter(|a| a.raid5_allowed())
    {
        shapes.extend(each_chunk(Level::Raid5, Some(alg.to_raw()), 2..=8));
    }
    run(&shapes, "model raid4/raid5");
}

#[test]
fn model_raid6() {
    use ParityAlgorithm as A;
    let mut shapes = Vec::new();
    // The default, an asymmetric one (Q slots not in data order), parity first and
    // last, a DDF one (Q slots with zero blocks) and a "-6" one (Q fixed on the last).
    for alg in [
        A::LeftSymmetric,
        A::LeftAsymmetric,
        A::ParityFirst,
        A::ParityLast,
        A::DdfZeroRestart,
        A::RightSymmetric6,
    ] {
        shapes.extend(each_chunk(Level::Raid6, Some(alg.to_raw()), 4..=8));
    }
    run(&shapes, "model raid6");
}
