//! The RAID4/5/6 write hole, closed by the partial-parity log (docs/write-hole.md).
//!
//! Every member runs under a `LogWritesDisk` sharing one clock, the array under a top-level
//! log. A random workload of mostly partial-stripe writes (with flushes and FUA) runs; then,
//! at every flush point and at random instants, several crash images per instant (each
//! member's unflushed writes landed or not, reordered and torn per sector) are assembled:
//!
//! (a) with every member: the array starts, and every block holds its last flushed value
//!     or a later one (the top-level log's check);
//! (b) with one member left out (each in turn), and for RAID6 also every pair: the array
//!     starts without force (dirty and degraded is safe with the log), and every sector
//!     that no unflushed or in-flight write covered holds its last flushed value.
//!
//! (c) now and then, a crash in the middle of that replay (its own crash images): the
//!     next assembly replays again and (b) still holds.
//!
//! Without the log the same workload must show the hole: assembly without force is
//! refused, and with force some sector nobody was writing comes back wrong.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{
    test_seed, CrashPoint, DelayDisk, LogClock, LogOptions, LogWritesDisk, WriteLog,
};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_md::{Array, AssembleOptions, FeaturePolicy, Level, Superblock};
use common::{dyn_members, mem_members, names, read_all, us, Shape};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Crash images per crash instant.
const IMAGES_PER_INSTANT: usize = 3;

#[derive(Debug, Default)]
struct Tally {
    /// Crash images assembled whole.
    states: usize,
    /// Assemblies with members left out.
    degraded: usize,
    /// Sectors nobody was writing that came back wrong (degraded).
    corrupt: u64,
    /// Degraded assemblies refused for want of force.
    refused: usize,
    /// Ring header writes while the workload ran (ring reclaims).
    reclaims: usize,
    /// Crashes during replay, replayed again and checked.
    replay_crashes: usize,
}

/// What a crash at `t` may have left in the array: the image as of the last flush, and
/// which sectors an unflushed or in-flight write covered.
fn flushed_and_written(log: &WriteLog, t: u64, size: u64) -> (Vec<u8>, Vec<bool>) {
    let entries = log.entries();
    let after_flush = entries
        .iter()
        .rposition(|e| e.op.is_flush() && e.completed < t)
        .map_or(0, |i| i + 1);
    let base = log.image_after(after_flush);
    let mut written = vec![false; us(size / 512)];
    for e in &entries[after_flush..] {
        if e.started < t {
            if let Some((off, len)) = e.op.range() {
                for s in off / 512..(off + len).div_ceil(512) {
                    written[us(s)] = true;
                }
            }
        }
    }
    (base, written)
}

/// Sets of members to leave out: each one, and for RAID6 each pair too.
fn drop_sets(level: Level, n: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    if level == Level::Raid6 {
        for i in 0..n {
            for j in i + 1..n {
                out.push(vec![i, j]);
            }
        }
    }
    out
}

fn run(
    shape: &Shape,
    log: bool,
    later: bool,
    (ops, instants): (usize, usize),
    rng: &mut SmallRng,
    seed: u64,
) -> Tally {
    let name = format!(
        "{} {}{}",
        shape.name(),
        if log { "log" } else { "no log" },
        if later {
            ", members completing later"
        } else {
            ""
        }
    );
    let m = mem_members(shape);
    let mut o = shape.create_options();
    o.write_journal = log;
    // Members this small leave no room for a bitmap (tests/bitmap.rs covers it).
    o.bitmap = cairn_md::BitmapChoice::None;
    let a = Array::create(dyn_members(&m), names(m.len()), &o).unwrap();
    a.close().unwrap();
    drop(a);
    let clock = LogClock::new();
    let (logged, mut devs) = common::logged_members(m.iter().map(|d| d.to_vec()), &clock);
    if later {
        // As remote members: every member operation answered from another thread.
        devs = devs
            .into_iter()
            .map(|d| Arc::new(DelayDisk::completing_later(d)) as Arc<dyn BlockDevice>)
            .collect();
    }
    let array = Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap();
    let top = LogWritesDisk::with_options(array, LogOptions::with_clock(&clock)).unwrap();
    let size = top.geometry().size;
    let chunk = shape.chunk_kib * 1024;
    let width = u64::from(top.geometry().optimal_io_size);
    // Mostly small writes inside one stripe, some across two, some whole stripes, a few
    // rewriting the rows just written (the overlap rule), flushes every few writes.
    let mut last = (0u64, 512u64);
    for i in 0..ops {
        if rng.gen_ratio(1, 5) {
            top.flush().unwrap();
            continue;
        }
        let (off, len) = match rng.gen_range(0..10) {
            0 => {
                let s = rng.gen_range(0..size / width);
                (s * width, width)
            }
            1 if i > 0 => last,
            2 => (
                rng.gen_range(0..size / 512) * 512,
                rng.gen_range(1..=2 * chunk / 512) * 512,
            ),
            _ => (
                rng.gen_range(0..size / 512) * 512,
                rng.gen_range(1..=chunk / 512) * 512,
            ),
        };
        let len = len.min(size - off);
        last = (off, len);
        let mut data = vec![0u8; us(len)];
        rng.fill(&mut data[..]);
        let flags = if rng.gen_ratio(1, 8) {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        top.write_at(&data, off, flags).unwrap();
    }
    let end = clock.now();
    let top_log = top.log();
    // Ring headers written while the array ran: the ring filled and was reclaimed.
    let sb = Superblock::read_from(&*m[0], "m0", FeaturePolicy::Supported).unwrap();
    let header = (8 + u64::try_from(sb.bblog_offset).unwrap() + u64::from(sb.bblog_size)) * 512;
    let header = header.div_ceil(4096) * 4096;
    let reclaims = logged
        .iter()
        .flat_map(|d| d.log().entries().to_vec())
        .filter(|e| e.op.range().is_some_and(|(off, _)| off == header))
        .count();
    // Every flush point (just after it), then random instants.
    let mut times: Vec<u64> = top_log
        .entries()
        .iter()
        .filter(|e| e.op.is_flush())
        .map(|e| e.completed + 1)
        .collect();
    // Long runs: a random half of the budget from the flush points.
    while times.len() > instants / 2 && times.len() > 16 {
        times.swap_remove(rng.gen_range(0..times.len()));
    }
    while times.len() < instants {
        times.push(rng.gen_range(0..=end));
    }
    let mut tally = Tally::default();
    for t in times {
        let (base, written) = flushed_and_written(&top_log, t, size);
        for _ in 0..IMAGES_PER_INSTANT {
            let images: Vec<Vec<u8>> = logged
                .iter()
                .map(|d| d.crash_image(rng, CrashPoint::AtTime(t)))
                .collect();
            // Fresh disks for each assembly: replay and superblock updates write to them.
            let disks = |keep: &[usize]| -> Vec<Arc<dyn BlockDevice>> {
                keep.iter()
                    .map(|&i| Arc::new(MemDisk::from_bytes(&images[i])) as Arc<dyn BlockDevice>)
                    .collect()
            };
            let ctx =
                |what: &str| format!("{name} (seed {seed}): crash at tick {t} of {end}: {what}");
            // Over members that complete later the same images are also assembled over
            // such members (the log's replay starts its reads and writes at once there):
            // the array must read back as over plain members.
            let same_later = |keep: &[usize], nm: Vec<String>, got: &[u8]| {
                if !later {
                    return;
                }
                let devs = disks(keep)
                    .into_iter()
                    .map(|d| Arc::new(DelayDisk::completing_later(d)) as Arc<dyn BlockDevice>)
                    .collect();
                let a = Array::assemble(devs, nm, AssembleOptions::default())
                    .unwrap_or_else(|e| panic!("{}", ctx(&format!("later: {e}"))));
                assert!(
                    read_all(&a) == got,
                    "{}",
                    ctx(&format!(
                        "members {keep:?}: the replay over members completing later differs"
                    ))
                );
            };
            // (a) Every member.
            let all: Vec<usize> = (0..images.len()).collect();
            let whole =
                Array::assemble(disks(&all), names(images.len()), AssembleOptions::default())
                    .unwrap_or_else(|e| panic!("{}", ctx(&e.to_string())));
            let got = read_all(&whole);
            if let Err(v) = top_log.check_crash_state(&got, CrashPoint::AtTime(t)) {
                panic!("{}", ctx(&v.to_string()));
            }
            drop(whole);
            same_later(&all, names(images.len()), &got);
            tally.states += 1;
            // (b) Members lost after the crash.
            for out in drop_sets(shape.level, images.len()) {
                let keep: Vec<usize> = (0..images.len()).filter(|i| !out.contains(i)).collect();
                let nm: Vec<String> = keep.iter().map(|i| format!("disk{i}.img")).collect();
                let devs = disks(&keep);
                let a = match Array::assemble(devs, nm.clone(), AssembleOptions::default()) {
                    Ok(a) => a,
                    Err(e) if !log && e.kind() == ErrorKind::Degraded => {
                        tally.refused += 1;
                        Array::assemble(disks(&keep), nm.clone(), AssembleOptions { force: true })
                            .unwrap_or_else(|e| panic!("{}", ctx(&format!("forced: {e}"))))
                    }
                    Err(e) => panic!("{}", ctx(&format!("without {out:?}: {e}"))),
                };
                let untouched_bad = |got: &[u8]| -> Vec<u64> {
                    (0..size / 512)
                        .filter(|&s| {
                            let r = us(s * 512)..us(s * 512 + 512);
                            !written[us(s)] && got[r.clone()] != base[r]
                        })
                        .collect()
                };
                let report = |bad: &[u64], when: &str| {
                    format!(
                        "without member(s) {out:?}{when}, {} sector(s) nobody was writing came \
                         back wrong, the first at array sector {} (chunk {})",
                        bad.len(),
                        bad[0],
                        bad[0] * 512 / chunk
                    )
                };
                let got = read_all(&a);
                let bad = untouched_bad(&got);
                drop(a);
                if log {
                    same_later(&keep, nm.clone(), &got);
                }
                tally.degraded += 1;
                if log && !bad.is_empty() {
                    panic!("{}", ctx(&report(&bad, "")));
                }
                tally.corrupt += bad.len() as u64;
                // A crash during the replay itself: replaying again must give the same.
                if log && rng.gen_ratio(1, 10) {
                    let clock = LogClock::new();
                    let (under, devs) =
                        common::logged_members(keep.iter().map(|&i| images[i].clone()), &clock);
                    let a = Array::assemble(devs, nm.clone(), AssembleOptions::default()).unwrap();
                    // Up to the end of assembly (replay, flush, log emptied); the close's
                    // superblock update after it is not the log's business.
                    let replay_end = clock.now();
                    drop(a);
                    for _ in 0..2 {
                        let t2 = rng.gen_range(0..=replay_end);
                        let devs: Vec<Arc<dyn BlockDevice>> = under
                            .iter()
                            .map(|d| {
                                Arc::new(MemDisk::from_bytes(
                                    &d.crash_image(rng, CrashPoint::AtTime(t2)),
                                )) as Arc<dyn BlockDevice>
                            })
                            .collect();
                        let a = Array::assemble(devs, nm.clone(), AssembleOptions::default())
                            .unwrap_or_else(|e| {
                                panic!("{}", ctx(&format!("after a crash in replay: {e}")))
                            });
                        let bad = untouched_bad(&read_all(&a));
                        if !bad.is_empty() {
                            let when = format!(" and a crash at tick {t2} of the replay");
                            panic!("{}", ctx(&report(&bad, &when)));
                        }
                        tally.replay_crashes += 1;
                    }
                }
            }
        }
    }
    tally.reclaims = reclaims;
    eprintln!("{name}: {tally:?}");
    tally
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape::new(Level::Raid5, None, 4, 3).rows(8),
        Shape::new(Level::Raid5, None, 8, 4).rows(6),
        Shape::new(Level::Raid4, None, 4, 4).rows(6),
        Shape::new(Level::Raid6, None, 4, 4).rows(6),
        Shape::new(Level::Raid6, None, 8, 5).rows(4),
    ]
}

#[test]
fn the_log_closes_the_write_hole() {
    let seed = test_seed("write hole");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut total = Tally::default();
    for shape in shapes() {
        let t = run(&shape, true, false, (64, 120), &mut rng, seed);
        total.states += t.states;
        total.degraded += t.degraded;
    }
    eprintln!(
        "write hole (seed {seed}): {} crash states, {} degraded assemblies checked",
        total.states, total.degraded
    );
    assert!(total.states >= 1000, "{total:?}");
}

#[test]
fn without_the_log_the_hole_is_real() {
    let seed = test_seed("write hole without log");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut total = Tally::default();
    for shape in [
        Shape::new(Level::Raid5, None, 4, 3).rows(8),
        Shape::new(Level::Raid6, None, 4, 4).rows(6),
    ] {
        let t = run(&shape, false, false, (64, 150), &mut rng, seed);
        total.refused += t.refused;
        total.degraded += t.degraded;
        total.corrupt += t.corrupt;
    }
    assert!(
        total.refused > 0,
        "a dirty degraded start without the log needs force (seed {seed}): {total:?}"
    );
    assert!(
        total.corrupt > 0,
        "no crash state lost data nobody was writing (seed {seed}): {total:?}"
    );
}

#[test]
fn the_ring_wraps_and_stays_correct() {
    // Long enough that each ring fills, is reclaimed and wraps several times.
    let seed = test_seed("write hole ring");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid5, None, 4, 3).rows(8),
        Shape::new(Level::Raid6, None, 8, 4).rows(6),
    ] {
        let t = run(&shape, true, false, (1500, 80), &mut rng, seed);
        assert!(
            t.reclaims > 0,
            "{}: the ring never filled: {t:?}",
            shape.name()
        );
    }
}

#[test]
fn the_log_closes_the_write_hole_over_members_that_complete_later() {
    // The log entries, data and parity writes, flushes and ring headers all take the
    // path that starts every member operation at once (array_overlap.rs counts that);
    // the crash states must hold as they do over plain members, the ring wrapping too.
    let seed = test_seed("write hole later");
    let mut rng = SmallRng::seed_from_u64(seed);
    for (shape, budget) in [
        (Shape::new(Level::Raid5, None, 4, 3).rows(8), (64, 80)),
        (Shape::new(Level::Raid6, None, 4, 4).rows(6), (64, 60)),
        (Shape::new(Level::Raid5, None, 4, 3).rows(8), (1000, 40)),
    ] {
        let t = run(&shape, true, true, budget, &mut rng, seed);
        assert!(t.states > 0 && t.degraded > 0, "{}: {t:?}", shape.name());
        if budget.0 > 500 {
            assert!(
                t.reclaims > 0,
                "{}: the ring never filled: {t:?}",
                shape.name()
            );
        }
    }
}
