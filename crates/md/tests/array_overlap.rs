//! The conformance suite over arrays whose members have latency (testkit's DelayDisk),
//! so that a request's member operations take the overlapped paths (every operation at
//! once on I/O workers): mirrors and parity levels, healthy and degraded.

use std::sync::Arc;
use std::time::Duration;

use cairn_block::testkit::conformance::{run_with, Options};
use cairn_block::testkit::DelayDisk;
use cairn_block::{BlockDevice, MemDisk};
use cairn_md::{Array, AssembleOptions, CreateOptions, Level, Sectors};

/// Runs the suite on fresh arrays of `level` over `n` slow members, roles in `missing`
/// left out at assembly.
fn suite(level: Level, n: usize, missing: &'static [usize]) {
    eprintln!("overlap conformance: {level} x{n} without {missing:?}");
    let make = move || -> Box<dyn BlockDevice> {
        let members: Vec<Arc<DelayDisk>> = (0..n)
            .map(|_| Arc::new(DelayDisk::new(Arc::new(MemDisk::new(4 << 20)))))
            .collect();
        let mut o = CreateOptions::new(level, "overlap");
        o.chunk = Some(Sectors(16));
        o.members_zeroed = true;
        let devs = members
            .iter()
            .map(|m| m.clone() as Arc<dyn BlockDevice>)
            .collect();
        let names = (0..n).map(|i| format!("d{i}")).collect();
        let a = Array::create(devs, names, &o).unwrap();
        a.close().unwrap();
        drop(a);
        // Slow enough that the array's latency estimate says "overlap".
        for m in &members {
            m.set_delay(Duration::from_micros(60));
        }
        let keep: Vec<usize> = (0..n).filter(|i| !missing.contains(i)).collect();
        let devs = keep
            .iter()
            .map(|&i| members[i].clone() as Arc<dyn BlockDevice>)
            .collect();
        let names = keep.iter().map(|i| format!("d{i}")).collect();
        Box::new(Array::assemble(devs, names, AssembleOptions::default()).unwrap())
    };
    run_with(
        &make,
        &Options {
            random_ops: 150,
            ..Options::default()
        },
    );
}

#[test]
fn overlap_raid1_raid10() {
    suite(Level::Raid1, 2, &[]);
    suite(Level::Raid10, 4, &[]);
    suite(Level::Raid10, 4, &[1]);
}

#[test]
fn overlap_raid5_raid6() {
    suite(Level::Raid5, 4, &[]);
    suite(Level::Raid6, 5, &[]);
    suite(Level::Raid6, 5, &[2]);
    suite(Level::Raid5, 4, &[0]);
}
