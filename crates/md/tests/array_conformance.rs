//! The block layer's conformance suite (`cairn_block::testkit::conformance`) over arrays
//! of every level on MemDisk members, healthy and degraded: read-after-write at chunk and
//! stripe boundaries, odd sizes, write_zeroes, discard where passed down, flush/FUA,
//! concurrent writers sharing stripes, and a random sequence against a model.

mod common;

use std::sync::Arc;

use cairn_block::testkit::conformance::{run_with, Options};
use cairn_block::{BlockDevice, MemDisk};
use cairn_md::{Array, AssembleOptions, Level, ParityAlgorithm, Raid10Layout};
use common::{create, Shape};

fn opts() -> Options {
    Options {
        random_ops: 600,
        ..Options::default()
    }
}

/// Runs the suite on fresh arrays of `shape`, with the roles in `missing` left out.
fn suite(shape: Shape, missing: &'static [usize]) {
    eprintln!("conformance: {} without {missing:?}", shape.name());
    let make = move || -> Box<dyn BlockDevice> {
        let (a, members) = create(&shape);
        a.close().unwrap();
        drop(a);
        if missing.is_empty() {
            let devs: Vec<Arc<dyn BlockDevice>> = members
                .iter()
                .map(|m| m.clone() as Arc<dyn BlockDevice>)
                .collect();
            let names = (0..devs.len()).map(|i| format!("disk{i}.img")).collect();
            return Box::new(Array::assemble(devs, names, AssembleOptions::default()).unwrap());
        }
        let keep: Vec<usize> = (0..members.len())
            .filter(|i| !missing.contains(i))
            .collect();
        let devs = keep
            .iter()
            .map(|&i| members[i].clone() as Arc<dyn BlockDevice>)
            .collect();
        let names = keep.iter().map(|i| format!("disk{i}.img")).collect();
        Box::new(Array::assemble(devs, names, AssembleOptions::default()).unwrap())
    };
    run_with(&make, &opts());
}

fn shape(level: Level, layout: Option<u32>, chunk_kib: u64, n: usize, rows: u64) -> Shape {
    let mut s = Shape::new(level, layout, chunk_kib, n);
    s.rows = rows;
    s
}

#[test]
fn conformance_linear_raid0() {
    let mut s = shape(Level::Linear, None, 64, 3, 8);
    s.unequal = true;
    suite(s, &[]);
    let mut s = shape(Level::Raid0, Some(2), 16, 4, 24);
    s.unequal = true;
    suite(s, &[]);
}

#[test]
fn conformance_raid1() {
    suite(shape(Level::Raid1, None, 64, 2, 32), &[]);
    suite(shape(Level::Raid1, None, 64, 3, 32), &[1]);
}

#[test]
fn conformance_raid10() {
    let n2 = Raid10Layout::parse("n2").unwrap().to_raw();
    let f2 = Raid10Layout::parse("f2").unwrap().to_raw();
    let o2 = Raid10Layout::parse("o2").unwrap().to_raw();
    suite(shape(Level::Raid10, Some(n2), 16, 4, 24), &[]);
    suite(shape(Level::Raid10, Some(f2), 16, 3, 24), &[2]);
    suite(shape(Level::Raid10, Some(o2), 16, 4, 24), &[0, 2]);
}

#[test]
fn conformance_raid4_raid5() {
    suite(shape(Level::Raid4, None, 16, 3, 24), &[]);
    suite(shape(Level::Raid5, None, 16, 4, 24), &[]);
    suite(
        shape(
            Level::Raid5,
            Some(ParityAlgorithm::LeftAsymmetric.to_raw()),
            4,
            5,
            64,
        ),
        &[3],
    );
}

#[test]
fn conformance_raid6() {
    suite(shape(Level::Raid6, None, 16, 5, 24), &[]);
    suite(shape(Level::Raid6, None, 16, 6, 16), &[1]);
    suite(
        shape(
            Level::Raid6,
            Some(ParityAlgorithm::LeftAsymmetric.to_raw()),
            4,
            6,
            64,
        ),
        &[0, 4],
    );
}

/// The array's geometry advertises the chunk and the full stripe.
#[test]
fn geometry_is_chunk_and_stripe() {
    let (a, _) = create(&Shape::new(Level::Raid6, None, 64, 4));
    let g = a.geometry();
    assert_eq!(g.logical_block_size, 512);
    assert_eq!(g.physical_block_size, 64 << 10);
    assert_eq!(g.optimal_io_size, 128 << 10);
    assert!(g.max_io_size >= 32 << 20);
    let (a, _) = create(&Shape::new(Level::Raid5, None, 512, 5));
    assert_eq!(a.geometry().optimal_io_size, (4 * 512) << 10);
    let (a, _) = create(&Shape::new(Level::Raid0, None, 64, 3));
    assert_eq!(a.geometry().optimal_io_size, (3 * 64) << 10);
    let (a, _) = create(&Shape::new(Level::Raid10, None, 64, 4));
    assert_eq!(a.geometry().optimal_io_size, (2 * 64) << 10);
    let (a, _) = create(&Shape::new(Level::Raid1, None, 64, 2));
    assert_eq!(a.geometry().physical_block_size, 4096);
    // Members with 4 KiB logical blocks make a 4 KiB-block array.
    let disks: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|_| {
            let mut g = cairn_block::Geometry::simple(8 << 20);
            g.logical_block_size = 4096;
            Arc::new(MemDisk::with_geometry(g)) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut o = cairn_md::CreateOptions::new(Level::Raid5, "4k");
    o.chunk = Some(cairn_md::Sectors(128));
    let a = Array::create(disks, common::names(4), &o).unwrap();
    assert_eq!(a.geometry().logical_block_size, 4096);
    cairn_block::testkit::conformance::check_read_write_positions(&a, 1);
}
