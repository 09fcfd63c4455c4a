//! Degraded integrity and the known-answer arrays.
//!
//! For each redundant shape: fill the array with random data, close it, then assemble it
//! without each single member (and each pair for RAID6, each surviving pair for wider
//! RAID1/RAID10) and check that it reads back the same bytes. Then write while degraded,
//! recompute the missing members' images from the others (a rebuild, done by the test's
//! own maths), and check that the whole array reads the new data and that every member
//! holds what the layout says. Reassembling with the stale members leaves them out.
//!
//! The known answers: `../shared/vectors/raid/raid6_pq_kat.json` `stripe_kats` (16-byte
//! chunks, data offset 0) written through `Array` and compared member by member. md's
//! chunks are at least 4 KiB, so each 16-byte chunk is tiled 256 times into a 4 KiB one:
//! parity is byte-wise, so the member images are the known ones tiled the same way.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use cairn_block::testkit::test_seed;
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::layout::{ArrayLayout, ParityLayout};
use cairn_md::report::MemberState;
use cairn_md::{Array, AssembleOptions, Level, ParityAlgorithm, Raid10Layout, Sectors};
use common::{
    bases, check_members, create, dyn_members, names, read_all, recompute_members, us, Shape,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Assembles the array from `members` leaving out the roles in `without`.
fn assemble_without(members: &[Arc<MemDisk>], without: &[usize]) -> cairn_block::Result<Array> {
    let keep: Vec<usize> = (0..members.len())
        .filter(|i| !without.contains(i))
        .collect();
    let devs = keep
        .iter()
        .map(|&i| members[i].clone() as Arc<dyn BlockDevice>)
        .collect();
    let nm = keep.iter().map(|&i| format!("disk{i}.img")).collect();
    Array::assemble(devs, nm, AssembleOptions::default())
}

/// Every set of one or two roles the layout survives without (pairs only when the
/// level keeps more than one redundant copy of something).
fn missing_sets(layout: &ArrayLayout, n: usize) -> Vec<Vec<usize>> {
    let mut sets: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for a in 0..n {
        for b in a + 1..n {
            let mut down = vec![false; n];
            down[a] = true;
            down[b] = true;
            if layout.tolerates(&down) {
                sets.push(vec![a, b]);
            }
        }
    }
    sets
}

fn degraded_shape(shape: &Shape, rng: &mut SmallRng, pool: &[u8], seed: u64) {
    let name = shape.name();
    let (array, members) = create(shape);
    let size = array.geometry().size;
    let stripe = u64::from(array.geometry().optimal_io_size);
    let mut model = vec![0u8; us(size)];
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(1 << 20);
        let from = rng.gen_range(0..pool.len() - us(n));
        let data = &pool[from..from + us(n)];
        array.write_at(data, pos, WriteFlags::NONE).unwrap();
        model[us(pos)..us(pos + n)].copy_from_slice(data);
        pos += n;
    }
    let layout = array.layout().clone();
    array.close().unwrap();
    drop(array);
    let n = shape.members;
    let sets = missing_sets(&layout, n);
    for set in &sets {
        let a = assemble_without(&members, set)
            .unwrap_or_else(|e| panic!("{name}: assemble without {set:?}: {e}"));
        let r = a.report();
        assert!(
            r.state.degraded && r.state.clean,
            "{name} without {set:?}: {}",
            r.state_text
        );
        for &m in set {
            assert_eq!(r.members[m].state, MemberState::Missing, "{name}");
        }
        assert!(
            read_all(&a) == model,
            "{name} (seed {seed}): without {set:?} the array reads back different data"
        );
    }

    // Write while degraded: the widest set that is tolerated.
    let widest: Vec<Vec<usize>> = {
        let w = sets.iter().map(Vec::len).max().unwrap();
        sets.iter().filter(|s| s.len() == w).cloned().collect()
    };
    let set = widest[rng.gen_range(0..widest.len())].clone();
    let a = assemble_without(&members, &set).unwrap();
    for i in 0..24 {
        let (off, len) = match i % 4 {
            0 => (
                rng.gen_range(0..size / 512) * 512,
                rng.gen_range(1..=24) * 512,
            ),
            1 => {
                let s = rng.gen_range(0..size / stripe);
                (s * stripe, stripe)
            }
            2 => (
                rng.gen_range(0..size / 512) * 512,
                rng.gen_range(1..=2 * stripe / 512) * 512,
            ),
            _ => {
                let c = shape.chunk_kib * 1024;
                let b = rng.gen_range(1..=size / c) * c;
                (b - rng.gen_range(1..=8) * 512, rng.gen_range(2..=32) * 512)
            }
        };
        let len = len.min(size - off);
        let from = rng.gen_range(0..pool.len() - us(len));
        let data = &pool[from..from + us(len)];
        a.write_at(data, off, WriteFlags::NONE)
            .unwrap_or_else(|e| panic!("{name}: degraded write without {set:?}: {e}"));
        model[us(off)..us(off + len)].copy_from_slice(data);
    }
    assert!(
        read_all(&a) == model,
        "{name} (seed {seed}): degraded writes without {set:?} read back wrong"
    );
    a.close().unwrap();
    drop(a);

    // Rebuild the missing members' images from the others and check the full array.
    let b = bases(&members);
    let mut images: Vec<Vec<u8>> = members.iter().map(|m| m.to_vec()).collect();
    recompute_members(&layout, &mut images, &b, &set);
    let all: Vec<Option<Vec<u8>>> = images.iter().cloned().map(Some).collect();
    if let Err(e) = check_members(&layout, &all, &b, &model) {
        panic!("{name} (seed {seed}): after degraded writes without {set:?} and a rebuild: {e}");
    }
    let full = Array::from_layout(
        layout.clone(),
        images
            .iter()
            .map(|i| Some(Arc::new(MemDisk::from_bytes(i)) as Arc<dyn BlockDevice>))
            .collect(),
        &b.iter().map(|&x| Sectors(x / 512)).collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(
        read_all(&full) == model,
        "{name} (seed {seed}): rebuilt array reads back wrong"
    );

    // The members that missed the writes are stale now: assembling with them leaves
    // them out, and the array still reads the new data.
    let a = Array::assemble(dyn_members(&members), names(n), AssembleOptions::default())
        .unwrap_or_else(|e| panic!("{name}: reassembling with stale members: {e}"));
    let r = a.report();
    for &m in &set {
        assert!(
            r.members.iter().any(|x| x.state == MemberState::LeftOut
                && x.name.as_deref() == Some(format!("disk{m}.img").as_str())),
            "{name}: disk{m}.img should be left out:\n{r}"
        );
    }
    assert!(
        read_all(&a) == model,
        "{name}: reassembled array reads back wrong"
    );
}

fn pool(rng: &mut SmallRng) -> Vec<u8> {
    let mut p = vec![0u8; 8 << 20];
    rng.fill(&mut p[..]);
    p
}

fn run(shapes: &[Shape], what: &str) {
    let seed = test_seed(what);
    let mut rng = SmallRng::seed_from_u64(seed);
    let p = pool(&mut rng);
    for s in shapes {
        degraded_shape(s, &mut rng, &p, seed);
    }
}

#[test]
fn degraded_raid4_raid5() {
    let mut shapes = vec![
        Shape::new(Level::Raid4, None, 4, 3),
        Shape::new(Level::Raid5, None, 4, 2),
    ];
    for alg in ParityAlgorithm::ALL
        .into_iter()
        .filter(|a| a.raid5_allowed())
    {
        for (n, chunk) in [(3, 64), (4, 4), (5, 16)] {
            shapes.push(Shape::new(Level::Raid5, Some(alg.to_raw()), chunk, n));
        }
    }
    run(&shapes, "degraded raid4/raid5");
}

#[test]
fn degraded_raid6() {
    use ParityAlgorithm as A;
    let mut shapes = Vec::new();
    for alg in [
        A::LeftSymmetric,
        A::LeftAsymmetric,
        A::RightAsymmetric,
        A::ParityFirst,
        A::ParityLast,
        A::DdfNRestart,
        A::LeftSymmetric6,
    ] {
        for (n, chunk) in [(4, 4), (6, 16)] {
            shapes.push(Shape::new(Level::Raid6, Some(alg.to_raw()), chunk, n));
        }
    }
    shapes.push(Shape::new(Level::Raid6, None, 64, 5));
    run(&shapes, "degraded raid6");
}

#[test]
fn degraded_raid1_raid10() {
    let mut shapes = vec![
        Shape::new(Level::Raid1, None, 64, 2),
        Shape::new(Level::Raid1, None, 64, 3),
    ];
    for (l, n) in [
        ("n2", 2),
        ("n2", 3),
        ("n2", 4),
        ("f2", 3),
        ("f2", 4),
        ("o2", 4),
        ("o2", 5),
        ("n3", 3),
        ("f3", 4),
    ] {
        let layout = Raid10Layout::parse(l).unwrap().to_raw();
        shapes.push(Shape::new(Level::Raid10, Some(layout), 4, n));
    }
    shapes.push(Shape::new(Level::Raid10, None, 64, 4));
    run(&shapes, "degraded raid1/raid10");
}

// ---- known answers ---------------------------------------------------------------------

fn vectors() -> serde_json::Value {
    let dir = std::env::var_os("CAIRN_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
        });
    let path = dir.join("raid/raid6_pq_kat.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (set CAIRN_VECTORS)", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn hex(v: &serde_json::Value) -> Vec<u8> {
    let s = v.as_str().unwrap();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A 16-byte chunk tiled to 4 KiB.
fn tile(b: &[u8]) -> Vec<u8> {
    assert_eq!(b.len(), 16);
    b.repeat(256)
}

#[test]
fn stripe_kats_through_the_array() {
    let seed = test_seed("stripe kats");
    let mut rng = SmallRng::seed_from_u64(seed);
    let doc = vectors();
    for kat in doc["stripe_kats"].as_array().unwrap() {
        let level =
            Level::from_raw(i32::try_from(kat["level"].as_i64().unwrap()).unwrap()).unwrap();
        let layout_word = u32::try_from(kat["layout"].as_u64().unwrap()).unwrap();
        let n = usize::try_from(kat["raid_disks"].as_u64().unwrap()).unwrap();
        let stripes = kat["stripes"].as_u64().unwrap();
        assert_eq!(kat["chunk_bytes"].as_u64(), Some(16));
        assert_eq!(kat["data_offset_bytes"].as_u64(), Some(0));
        let what = format!("{level} layout {layout_word} x{n}");
        let array_data: Vec<u8> = kat["array_data_hex"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| tile(&hex(c)))
            .collect();
        let want: Vec<Vec<u8>> = kat["member_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m.as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|c| tile(&hex(c)))
                    .collect()
            })
            .collect();
        let layout = ArrayLayout::Parity(
            ParityLayout::new(level, layout_word, n, Sectors(8), Sectors(8 * stripes)).unwrap(),
        );
        let make = |present: &[bool]| -> (Array, Vec<Arc<MemDisk>>) {
            let disks: Vec<Arc<MemDisk>> = (0..n)
                .map(|_| Arc::new(MemDisk::new(4096 * stripes)))
                .collect();
            let devs = disks
                .iter()
                .zip(present)
                .map(|(d, &p)| p.then(|| d.clone() as Arc<dyn BlockDevice>))
                .collect();
            (
                Array::from_layout(layout.clone(), devs, &vec![Sectors(0); n]).unwrap(),
                disks,
            )
        };
        // Whole stripes in one write: the full-stripe path.
        let (a, disks) = make(&vec![true; n]);
        assert_eq!(a.geometry().size, wide(array_data.len()));
        a.write_at(&array_data, 0, WriteFlags::NONE).unwrap();
        for (m, d) in disks.iter().enumerate() {
            assert!(
                d.to_vec() == want[m],
                "{what}: member {m} after a full-stripe write"
            );
        }
        // In 512-byte pieces, in random order: the read-modify-write and
        // reconstruct-write paths build the same members.
        let (a, disks) = make(&vec![true; n]);
        let mut order: Vec<usize> = (0..array_data.len() / 512).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for i in order {
            a.write_at(
                &array_data[i * 512..(i + 1) * 512],
                wide(i * 512),
                WriteFlags::NONE,
            )
            .unwrap();
        }
        for (m, d) in disks.iter().enumerate() {
            assert!(
                d.to_vec() == want[m],
                "{what} (seed {seed}): member {m} after 512-byte writes"
            );
        }
        // The known members, any one (RAID6: any two) missing, read back the array data.
        let known: Vec<Arc<MemDisk>> = want
            .iter()
            .map(|w| Arc::new(MemDisk::from_bytes(w)))
            .collect();
        let red = level.parity_members();
        for a_ in 0..n {
            for b_ in a_..n {
                if (b_ != a_ && red < 2) || (b_ == a_ && red == 0) {
                    continue;
                }
                let devs = (0..n)
                    .map(|m| (m != a_ && m != b_).then(|| known[m].clone() as Arc<dyn BlockDevice>))
                    .collect();
                let arr = Array::from_layout(layout.clone(), devs, &vec![Sectors(0); n]).unwrap();
                assert!(
                    read_all(&arr) == array_data,
                    "{what}: members {a_} and {b_} missing"
                );
            }
        }
    }
}

fn wide(v: usize) -> u64 {
    u64::try_from(v).unwrap()
}
