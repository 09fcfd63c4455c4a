//! Crashes: every member under a `LogWritesDisk` sharing one clock, the array under a
//! top-level log. At random instants the members' crash images (each member's own
//! unflushed writes landed or not, per sector) are assembled again, and everything the
//! array reads must be a state the top-level log allows: each block holds its last
//! flushed value or a later one, and nothing older than a completed FUA write. This is
//! what makes FUA and flush mean the same through the array as on a disk. The
//! superblocks must survive too: the crashed members always assemble, marked dirty when
//! a write may have been cut short.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{
    test_seed, CrashPoint, DiscardModel, LogClock, LogOptions, LogWritesDisk,
};
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::{Array, AssembleOptions, Level, Raid10Layout};
use common::{create, names, read_all, us, Shape};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn crash_shape(shape: &Shape, rng: &mut SmallRng, seed: u64) {
    let name = shape.name();
    let (a, m) = create(shape);
    a.close().unwrap();
    drop(a);
    let clock = LogClock::new();
    let (logged, devs) = common::logged_members(m.iter().map(|d| d.to_vec()), &clock);
    let array = Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap();
    let top = LogWritesDisk::with_options(
        array,
        LogOptions {
            clock: Some(clock.clone()),
            initial: None,
            discard: DiscardModel::Unspecified,
        },
    )
    .unwrap();
    let size = top.geometry().size;
    let stripe = u64::from(top.geometry().optimal_io_size);
    for i in 0..48 {
        if i % 9 == 8 {
            top.flush().unwrap();
            continue;
        }
        let (off, len) = if i % 4 == 0 {
            let s = rng.gen_range(0..size / stripe);
            (s * stripe, stripe)
        } else {
            (
                rng.gen_range(0..size / 512) * 512,
                rng.gen_range(1..=40) * 512,
            )
        };
        let len = len.min(size - off);
        let mut data = vec![0u8; us(len)];
        rng.fill(&mut data[..]);
        let flags = if rng.gen_bool(0.2) {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        top.write_at(&data, off, flags).unwrap();
    }
    let end = clock.now();
    let mut times: Vec<u64> = (0..10).map(|_| rng.gen_range(0..=end)).collect();
    times.push(end);
    for t in times {
        let images: Vec<Arc<MemDisk>> = logged
            .iter()
            .map(|d| {
                Arc::new(MemDisk::from_bytes(
                    &d.crash_image(rng, CrashPoint::AtTime(t)),
                ))
            })
            .collect();
        let devs = images
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let back = Array::assemble(devs, names(images.len()), AssembleOptions::default())
            .unwrap_or_else(|e| panic!("{name} (seed {seed}): crash at tick {t} of {end}: {e}"));
        let got = read_all(&back);
        if let Err(v) = top.check_crash_state(&got, CrashPoint::AtTime(t)) {
            panic!("{name} (seed {seed}): crash at tick {t} of {end}: {v:?}");
        }
        // Data was written since the last clean close: the array knows it may be dirty.
        if t > 0 && t == end && shape.level != Level::Raid0 {
            assert!(
                !back.report().state.clean,
                "{name}: crashed array claims to be clean"
            );
        }
        drop(back);
    }
}

#[test]
fn crash_states_are_ones_a_disk_could_leave() {
    let seed = test_seed("array crash");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid0, None, 16, 3).rows(8),
        Shape::new(Level::Raid1, None, 64, 2).rows(4),
        Shape::new(Level::Raid5, None, 16, 4).rows(8),
        Shape::new(Level::Raid6, None, 16, 5).rows(8),
        Shape::new(Level::Raid10, Some(Raid10Layout::DEFAULT.to_raw()), 16, 4).rows(8),
    ] {
        crash_shape(&shape, &mut rng, seed);
    }
}
