//! Scrub (md's check and repair) over a table of shapes: a clean array reports nothing;
//! bytes corrupted on one member's data area, behind the array's back, are reported
//! exactly (the stripes and pages, and for RAID6 the member at fault); check changes no
//! member; repair makes a second check clean and, where the level can tell which block
//! was wrong, gives the original data back. Also: two bad blocks in one RAID6 page,
//! refusals, stopping part-way, read errors, and a check racing client writes (the
//! locks must keep it from seeing half-done writes as mismatches).
//!
//! The seed is printed; rerun a failure with `CAIRN_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_block::testkit::{test_seed, DelayDisk, Fault, FaultyDisk, Ops};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_md::layout::{ArrayLayout, StripeRole};
use cairn_md::scrub::PAGE;
use cairn_md::{
    Array, AssembleOptions, Finding, Level, ParityAlgorithm, Raid10Layout, ScrubReport, StripeNo,
};
use common::{bases, check_members, create, locations, names, read_all, us, Shape, MIB};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

fn rng(what: &str) -> SmallRng {
    SmallRng::seed_from_u64(test_seed(what))
}

fn shapes() -> Vec<Shape> {
    let r10 = |l: &str| Some(Raid10Layout::parse(l).unwrap().to_raw());
    let alg = |a: ParityAlgorithm| Some(a.to_raw());
    use ParityAlgorithm as A;
    vec![
        Shape::new(Level::Raid1, None, 64, 2).rows(24),
        Shape::new(Level::Raid1, None, 64, 3).rows(4),
        Shape::new(Level::Raid10, r10("n2"), 16, 4).rows(8),
        Shape::new(Level::Raid10, r10("f2"), 4, 3),
        Shape::new(Level::Raid10, r10("o2"), 16, 3).rows(8),
        Shape::new(Level::Raid10, r10("n3"), 4, 4),
        Shape::new(Level::Raid4, None, 16, 3).rows(8),
        Shape::new(Level::Raid5, alg(A::LeftSymmetric), 4, 3),
        Shape::new(Level::Raid5, alg(A::RightAsymmetric), 16, 5).rows(8),
        Shape::new(Level::Raid6, alg(A::LeftSymmetric), 4, 4),
        Shape::new(Level::Raid6, alg(A::LeftAsymmetric), 16, 5).rows(8),
        Shape::new(Level::Raid6, alg(A::ParityFirst), 8, 6).rows(8),
        Shape::new(Level::Raid6, alg(A::DdfZeroRestart), 16, 6).rows(8),
        Shape::new(Level::Raid6, alg(A::RightSymmetric6), 4, 5),
    ]
}

/// The array filled with random data, and that data.
fn filled(a: &Array, r: &mut SmallRng) -> Vec<u8> {
    let size = a.geometry().size;
    let mut data = vec![0u8; us(size)];
    r.fill_bytes(&mut data);
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(MIB);
        a.write_at(&data[us(pos)..us(pos + n)], pos, WriteFlags::NONE)
            .unwrap();
        pos += n;
    }
    data
}

fn images(m: &[Arc<MemDisk>]) -> Vec<Vec<u8>> {
    m.iter().map(|d| d.to_vec()).collect()
}

fn check(a: &Array) -> ScrubReport {
    a.scrub(false, &|_, _| true).unwrap()
}

fn repair(a: &Array) -> ScrubReport {
    a.scrub(true, &|_, _| true).unwrap()
}

/// XORs a random non-zero value into a few random bytes of member `m`'s data area at
/// `[off, off + len)`.
fn corrupt(r: &mut SmallRng, m: &MemDisk, base: u64, off: u64, len: u64) {
    for _ in 0..r.gen_range(1..=4) {
        let at = base + off + r.gen_range(0..len);
        let mut b = [0u8; 1];
        m.read_at(&mut b, at).unwrap();
        b[0] ^= r.gen_range(1..=255u8);
        m.write_at(&b, at, WriteFlags::NONE).unwrap();
    }
}

/// What a report says, page by page: (stripe or none, array page offset) ->
/// (finding, blamed, rewritten roles sorted).
type Pages = BTreeMap<(Option<u64>, u64), (Finding, Option<usize>, Vec<usize>)>;

fn pages_of(report: &ScrubReport) -> Pages {
    assert_eq!(report.regions_omitted, 0);
    let mut out = Pages::new();
    for m in &report.regions {
        assert_eq!(m.array_offset % PAGE, 0, "{m:?}");
        let mut rewritten = m.rewritten.clone();
        rewritten.sort_unstable();
        for p in 0..m.len.div_ceil(PAGE) {
            let prev = out.insert(
                (m.stripe, m.array_offset + p * PAGE),
                (m.finding, m.blamed, rewritten.clone()),
            );
            assert!(prev.is_none(), "page reported twice: {m:?}");
        }
    }
    out
}

/// Corrupts one block of a random stripe (or one copy of a random page) and returns
/// what a check must report for it, and whether repair gives the original data back.
fn corrupt_one(
    r: &mut SmallRng,
    a: &Array,
    m: &[Arc<MemDisk>],
    b: &[u64],
    want: &mut Pages,
) -> bool {
    match a.layout() {
        ArrayLayout::Parity(pl) => {
            let c = pl.chunk().0 * 512;
            let k = pl.data_disks() as u64;
            let (stripe, page) = loop {
                let s = r.gen_range(0..pl.stripes());
                let p = r.gen_range(0..c / PAGE);
                if !want.contains_key(&(Some(s), s * k * c + p * PAGE)) {
                    break (s, p);
                }
            };
            let map = pl.stripe_map(StripeNo(stripe));
            let victim = r.gen_range(0..pl.raid_disks());
            corrupt(r, &m[victim], b[victim], stripe * c + page * PAGE, PAGE);
            let (finding, blamed, rewritten) = match (map.q, map.role_of(victim)) {
                (None, _) => (Finding::Parity, None, vec![map.p]),
                (Some(_), StripeRole::P) => (Finding::P, Some(victim), vec![victim]),
                (Some(_), StripeRole::Q) => (Finding::Q, Some(victim), vec![victim]),
                (Some(_), StripeRole::Data(_)) => (Finding::Data, Some(victim), vec![victim]),
            };
            want.insert(
                (Some(stripe), stripe * k * c + page * PAGE),
                (finding, blamed, rewritten),
            );
            // RAID4/5 repair rewrites P over corrupted data.
            map.q.is_some() || victim == map.p
        }
        layout => {
            let size = a.geometry().size;
            let page = loop {
                let p = r.gen_range(0..size.div_ceil(PAGE)) * PAGE;
                if !want.contains_key(&(None, p)) {
                    break p;
                }
            };
            let len = PAGE.min(size - page);
            let locs = locations(layout, page / 512);
            let i = r.gen_range(0..locs.len());
            let loc = locs[i];
            corrupt(r, &m[loc.member], b[loc.member], loc.sector.0 * 512, len);
            let mut rewritten: Vec<usize> = if i == 0 {
                locs[1..].iter().map(|l| l.member).collect()
            } else {
                vec![loc.member]
            };
            rewritten.sort_unstable();
            want.insert((None, page), (Finding::Copies, None, rewritten));
            // Repair copies the first copy over the others.
            i != 0
        }
    }
}

fn scrub_shape(shape: &Shape, r: &mut SmallRng) {
    let name = shape.name();
    let (a, m) = create(shape);
    let b = bases(&m);
    let data = filled(&a, r);
    let size = a.geometry().size;

    let clean = check(&a);
    assert!(clean.complete, "{name}");
    assert_eq!(clean.bytes_checked, size, "{name}");
    assert_eq!(clean.mismatch_sectors, 0, "{name}: {clean:?}");
    assert!(clean.regions.is_empty(), "{name}: {clean:?}");

    let mut want = Pages::new();
    let mut restores = true;
    for _ in 0..r.gen_range(1..=3) {
        restores &= corrupt_one(r, &a, &m, &b, &mut want);
    }
    let before = images(&m);
    let found = check(&a);
    assert!(images(&m) == before, "{name}: check changed a member");
    assert_eq!(pages_of(&found), want, "{name}: {found:#?}");
    assert_eq!(found.mismatch_sectors, 8 * want.len() as u64, "{name}");
    assert!(found.regions.iter().all(|m| !m.repaired), "{name}");

    let fixed = repair(&a);
    assert_eq!(pages_of(&fixed), want, "{name}: repair: {fixed:#?}");
    assert!(fixed.regions.iter().all(|m| m.repaired), "{name}");
    let again = check(&a);
    assert_eq!(again.mismatch_sectors, 0, "{name}: after repair {again:#?}");
    if restores {
        assert!(read_all(&a) == data, "{name}: data after repair");
        let imgs: Vec<Option<Vec<u8>>> = images(&m).into_iter().map(Some).collect();
        check_members(a.layout(), &imgs, &b, &data)
            .unwrap_or_else(|e| panic!("{name}: members after repair: {e}"));
    }
}

#[test]
fn check_finds_exactly_the_corrupted_blocks_and_repair_fixes_them() {
    let mut r = rng("scrub shapes");
    for shape in shapes() {
        scrub_shape(&shape, &mut r);
    }
}

#[test]
fn two_bad_blocks_in_one_raid6_page_are_unidentifiable() {
    let mut r = rng("scrub two bad blocks");
    use ParityAlgorithm as A;
    for shape in [
        Shape::new(Level::Raid6, Some(A::LeftSymmetric.to_raw()), 4, 4),
        Shape::new(Level::Raid6, Some(A::DdfZeroRestart.to_raw()), 16, 6).rows(8),
    ] {
        let name = shape.name();
        let (a, m) = create(&shape);
        let b = bases(&m);
        filled(&a, &mut r);
        let ArrayLayout::Parity(pl) = a.layout().clone() else {
            unreachable!()
        };
        let c = pl.chunk().0 * 512;
        let k = pl.data_disks() as u64;
        let stripe = r.gen_range(0..pl.stripes());
        let page = r.gen_range(0..c / PAGE);
        let n = pl.raid_disks();
        let first = r.gen_range(0..n);
        let second = (first + r.gen_range(1..n)) % n;
        // Different bytes of the page, so that no byte can pass for a single error.
        let at = stripe * c + page * PAGE;
        for (victim, byte) in [(first, 17), (second, 2000)] {
            let mut v = [0u8; 1];
            m[victim].read_at(&mut v, b[victim] + at + byte).unwrap();
            v[0] ^= r.gen_range(1..=255u8);
            m[victim]
                .write_at(&v, b[victim] + at + byte, WriteFlags::NONE)
                .unwrap();
        }
        let map = pl.stripe_map(StripeNo(stripe));
        let mut pq = vec![map.p, map.q.unwrap()];
        pq.sort_unstable();
        let want: Pages = [(
            (Some(stripe), stripe * k * c + page * PAGE),
            (Finding::Unidentifiable, None, pq),
        )]
        .into();
        let found = check(&a);
        assert_eq!(
            pages_of(&found),
            want,
            "{name} ({first}, {second}): {found:#?}"
        );
        let fixed = repair(&a);
        assert_eq!(pages_of(&fixed), want, "{name}");
        let again = check(&a);
        assert_eq!(again.mismatch_sectors, 0, "{name}: {again:#?}");
    }
}

#[test]
fn levels_without_redundancy_and_degraded_arrays_are_refused() {
    for level in [Level::Linear, Level::Raid0] {
        let (a, _) = create(&Shape::new(level, None, 64, 2));
        let e = a.scrub(false, &|_, _| true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("nothing to check"), "{e}");
    }
    for shape in [
        Shape::new(Level::Raid5, None, 16, 3),
        Shape::new(Level::Raid6, None, 16, 5),
        Shape::new(Level::Raid1, None, 64, 3),
    ] {
        let (a, m) = create(&shape);
        a.close().unwrap();
        drop(a);
        let devs = m[1..]
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let a = Array::assemble(
            devs,
            names(m.len())[1..].to_vec(),
            AssembleOptions::default(),
        )
        .unwrap();
        for repair in [false, true] {
            let e = a.scrub(repair, &|_, _| true).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Degraded, "{}: {e}", shape.name());
            assert!(e.to_string().contains("role 0 (missing)"), "{e}");
        }
    }
}

#[test]
fn a_scrub_stops_when_progress_says_so() {
    let (a, _) = create(&Shape::new(Level::Raid6, None, 16, 5).rows(8));
    let units = a.scrub_units().unwrap();
    assert_eq!(units.count, 8);
    assert_eq!(units.unit_bytes, 3 * 16 * 1024);
    assert_eq!(units.total_bytes, a.geometry().size);
    let calls = std::sync::Mutex::new(Vec::new());
    let report = a
        .scrub(false, &|done, total| {
            calls.lock().unwrap().push((done, total));
            done < 2 * units.unit_bytes
        })
        .unwrap();
    assert!(!report.complete);
    assert_eq!(report.bytes_checked, 2 * units.unit_bytes);
    assert_eq!(
        *calls.lock().unwrap(),
        [
            (units.unit_bytes, units.total_bytes),
            (2 * units.unit_bytes, units.total_bytes)
        ]
    );
}

#[test]
fn read_errors_during_a_check_are_rebuilt_and_written_back() {
    let mut r = rng("scrub read errors");
    for shape in [
        Shape::new(Level::Raid5, None, 16, 4).rows(8),
        Shape::new(Level::Raid6, None, 16, 5).rows(8),
        Shape::new(Level::Raid1, None, 64, 2).rows(8),
    ] {
        let name = shape.name();
        let (a, m) = create(&shape);
        a.close().unwrap();
        drop(a);
        let f: Vec<Arc<FaultyDisk<Arc<MemDisk>>>> = m
            .iter()
            .map(|d| Arc::new(FaultyDisk::new(d.clone())))
            .collect();
        let devs = f
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let a = Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap();
        let data = filled(&a, &mut r);
        let b = bases(&m);
        // One read of member 1's data area fails, somewhere past its start.
        let at = b[1] + 20 * 1024;
        f[1].handle()
            .inject(Fault::new(Ops::READ).in_range(at..at + 1).times(1));
        let report = check(&a);
        assert_eq!(report.read_errors, 1, "{name}: {report:#?}");
        assert_eq!(report.mismatch_sectors, 0, "{name}");
        let [e] = &report.regions[..] else {
            panic!("{name}: {report:#?}")
        };
        assert_eq!(e.finding, Finding::ReadError);
        assert_eq!((e.blamed, e.repaired), (Some(1), true), "{name}");
        assert!(a.down_roles().is_empty(), "{name}");
        assert!(read_all(&a) == data, "{name}");
        assert_eq!(check(&a).read_errors, 0, "{name}");
    }
}

/// Client writes go on while a check runs: with the scrub taking the write locks it
/// never sees a stripe or a mirror half-written, so it finds nothing.
#[test]
fn a_check_racing_writes_sees_no_mismatch() {
    let seed = test_seed("scrub racing writes");
    let r10 = Raid10Layout::parse("n2").unwrap().to_raw();
    for shape in [
        Shape::new(Level::Raid5, None, 4, 4),
        Shape::new(Level::Raid6, None, 4, 5),
        Shape::new(Level::Raid1, None, 64, 2).rows(32),
        Shape::new(Level::Raid10, Some(r10), 4, 4),
    ] {
        let name = shape.name();
        let (a, _) = create(&shape);
        let a = Arc::new(a);
        let size = a.geometry().size;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = SmallRng::seed_from_u64(seed);
                let mut writes = 0u64;
                while !stop.load(Ordering::Relaxed) || writes < 50 {
                    let len = r.gen_range(1..=24u64) * 512;
                    let off = r.gen_range(0..(size - len) / 512) * 512;
                    let mut buf = vec![0u8; us(len)];
                    r.fill_bytes(&mut buf);
                    a.write_at(&buf, off, WriteFlags::NONE).unwrap();
                    writes += 1;
                }
                writes
            })
        };
        let mut reports = Vec::new();
        for _ in 0..3 {
            reports.push(check(&a));
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        for rep in reports {
            assert_eq!(
                rep.mismatch_sectors, 0,
                "{name} ({writes} writes): {rep:#?}"
            );
        }
    }
}

#[test]
fn a_report_serialises_with_its_regions() {
    let (a, m) = create(&Shape::new(Level::Raid6, None, 4, 4));
    let b = bases(&m);
    let mut r = rng("scrub json");
    filled(&a, &mut r);
    let ArrayLayout::Parity(pl) = a.layout().clone() else {
        unreachable!()
    };
    let q = pl.stripe_map(StripeNo(0)).q.unwrap();
    m[q].write_at(&[0x55; 512], b[q] + 512, WriteFlags::NONE)
        .unwrap();
    let v = serde_json::to_value(check(&a)).unwrap();
    assert_eq!(v["mismatch_sectors"], 8);
    assert_eq!(v["regions"][0]["finding"], "q");
    assert_eq!(v["regions"][0]["blamed"], q);
    assert_eq!(v["regions"][0]["stripe"], 0);
    assert_eq!(v["regions"][0]["len"], 4096);
    assert_eq!(v["regions"][0]["repaired"], false);
}

/// Created over old data: the parity and mirrors disagree until the resync has run, so
/// a scrub is refused until then; afterwards a check finds nothing.
#[test]
fn a_scrub_waits_for_a_pending_resync() {
    let mut r = rng("scrub resync pending");
    for shape in [
        Shape::new(Level::Raid6, None, 16, 5).rows(8),
        Shape::new(Level::Raid1, None, 64, 2).rows(4),
    ] {
        let name = shape.name();
        let m: Vec<Arc<MemDisk>> = shape
            .member_bytes()
            .into_iter()
            .map(|b| {
                let mut old = vec![0u8; us(b)];
                r.fill_bytes(&mut old);
                Arc::new(MemDisk::from_bytes(&old))
            })
            .collect();
        let mut o = shape.create_options();
        o.members_zeroed = false;
        o.force = true;
        let devs = m
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let a = Array::create(devs, names(m.len()), &o).unwrap();
        let e = a.scrub(false, &|_, _| true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name}: {e}");
        assert!(e.to_string().contains("resync is pending"), "{name}: {e}");
        a.resync().unwrap();
        let report = check(&a);
        assert_eq!(report.mismatch_sectors, 0, "{name}: {report:#?}");
    }
}

#[test]
fn a_report_keeps_the_first_regions_and_counts_the_rest() {
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2).rows(128));
    let b = bases(&m);
    let pages = a.geometry().size / PAGE;
    assert_eq!(pages, 2048);
    // Every other page of the second copy differs: no two regions merge.
    for p in (0..pages).step_by(2) {
        m[1].write_at(&[1u8; 512], b[1] + p * PAGE, WriteFlags::NONE)
            .unwrap();
    }
    let report = check(&a);
    assert_eq!(report.mismatch_sectors, 8 * pages / 2);
    assert_eq!(report.regions.len(), cairn_md::scrub::REGION_LIMIT);
    assert_eq!(
        report.regions_omitted,
        pages / 2 - cairn_md::scrub::REGION_LIMIT as u64
    );
    assert!(report
        .regions
        .iter()
        .enumerate()
        .all(|(i, r)| r.array_offset == 2 * i as u64 * PAGE && r.len == PAGE));
    // Contiguous pages merge into one region.
    let fixed = repair(&a);
    assert_eq!(fixed.regions_omitted, report.regions_omitted);
    m[0].write_at(&vec![7u8; 3 * 4096], b[0] + 8192, WriteFlags::NONE)
        .unwrap();
    let report = check(&a);
    let [r] = &report.regions[..] else {
        panic!("{report:#?}")
    };
    assert_eq!(
        (r.array_offset, r.len, &r.rewritten),
        (8192, 3 * PAGE, &vec![1])
    );
}

/// Shapes for the scrub over slow members: enough units that the pipeline works in
/// windows of several (16 stripes, or 4 MiB of mirrors) with more than one window.
fn slow_shapes() -> Vec<Shape> {
    let r10 = Raid10Layout::parse("n2").unwrap().to_raw();
    vec![
        Shape::new(Level::Raid1, None, 64, 2).rows(160),
        Shape::new(Level::Raid10, Some(r10), 64, 4).rows(96),
        Shape::new(Level::Raid5, None, 16, 4).rows(128),
        Shape::new(Level::Raid6, None, 16, 5).rows(128),
    ]
}

/// `members` behind DelayDisks with `delay`, assembled.
fn assemble_slow(members: &[Arc<MemDisk>], delay: std::time::Duration) -> Array {
    let devs = members
        .iter()
        .map(|d| {
            let s = DelayDisk::new(d.clone() as Arc<dyn BlockDevice>);
            s.set_delay(delay);
            Arc::new(s) as Arc<dyn BlockDevice>
        })
        .collect();
    Array::assemble(devs, names(members.len()), AssembleOptions::default()).unwrap()
}

/// The unit-by-unit walk (`scrub_unit`), as the scrub ran before it was pipelined.
fn walk(a: &Array, repair: bool) -> ScrubReport {
    a.check_scrub_possible(repair).unwrap();
    let mut report = ScrubReport::new(repair);
    for i in 0..a.scrub_units().unwrap().count {
        a.scrub_unit(i, repair, &mut report).unwrap();
    }
    a.flush().unwrap();
    report.complete = true;
    report
}

fn data_areas(m: &[Arc<MemDisk>], b: &[u64]) -> Vec<Vec<u8>> {
    m.iter()
        .zip(b)
        .map(|(d, &base)| d.to_vec()[us(base)..].to_vec())
        .collect()
}

/// Over members with latency the check and the repair read the next window of units
/// while the current one is compared: their reports (mismatch counts, regions, what was
/// rewritten) and the members after the repair are those of the unit-by-unit walk over
/// the same corrupted images.
#[test]
fn a_pipelined_scrub_over_slow_members_matches_the_unit_walk() {
    let mut r = rng("scrub pipelined");
    for shape in slow_shapes() {
        let name = shape.name();
        let (a, m) = create(&shape);
        let b = bases(&m);
        filled(&a, &mut r);
        let mut want = Pages::new();
        for _ in 0..8 {
            corrupt_one(&mut r, &a, &m, &b, &mut want);
        }
        a.close().unwrap();
        drop(a);
        let copy: Vec<Arc<MemDisk>> = m
            .iter()
            .map(|d| Arc::new(MemDisk::from_bytes(&d.to_vec())))
            .collect();

        let slow = assemble_slow(&m, std::time::Duration::from_micros(200));
        let found = check(&slow);
        assert_eq!(pages_of(&found), want, "{name}: {found:#?}");
        let fixed = repair(&slow);
        let after = check(&slow);
        slow.close().unwrap();
        drop(slow);

        let fast = Array::assemble(
            copy.iter()
                .map(|d| d.clone() as Arc<dyn BlockDevice>)
                .collect(),
            names(copy.len()),
            AssembleOptions::default(),
        )
        .unwrap();
        let found_then = walk(&fast, false);
        let fixed_then = walk(&fast, true);
        fast.close().unwrap();
        drop(fast);

        assert_eq!(found, found_then, "{name}: check");
        assert_eq!(found.mismatch_sectors, 8 * want.len() as u64, "{name}");
        assert_eq!(fixed, fixed_then, "{name}: repair");
        assert_eq!(after.mismatch_sectors, 0, "{name}: after repair {after:#?}");
        assert!(
            data_areas(&m, &b) == data_areas(&copy, &b),
            "{name}: the members after the pipelined repair differ from the walk's"
        );
        println!("{name}: {} mismatched sectors", found.mismatch_sectors);
    }
}

/// A repair over slow members, pipelined, while a client writes and reads back: the
/// repair rewrites only redundancy here (non-first copies, P and Q), so the array must
/// read back exactly what was written, and a check afterwards must find nothing (a
/// stale rewrite over a newer write would show in one or the other).
#[test]
fn a_pipelined_repair_racing_writes_keeps_them() {
    let seed = test_seed("scrub pipelined racing writes");
    println!("seed {seed}");
    for shape in slow_shapes() {
        let name = shape.name();
        let mut r = SmallRng::seed_from_u64(seed);
        let (a, m) = create(&shape);
        let b = bases(&m);
        let data = filled(&a, &mut r);
        let layout = a.layout().clone();
        let size = a.geometry().size;
        // Redundancy corrupted all over (no data member, no first copy).
        for _ in 0..64 {
            match &layout {
                ArrayLayout::Parity(pl) => {
                    let c = pl.chunk().0 * 512;
                    let s = r.gen_range(0..pl.stripes());
                    let map = pl.stripe_map(StripeNo(s));
                    let v = if r.gen() {
                        map.p
                    } else {
                        map.q.unwrap_or(map.p)
                    };
                    corrupt(&mut r, &m[v], b[v], s * c, c);
                }
                layout => {
                    let page = r.gen_range(0..size / PAGE) * PAGE;
                    let locs = locations(layout, page / 512);
                    let loc = locs[r.gen_range(1..locs.len())];
                    corrupt(
                        &mut r,
                        &m[loc.member],
                        b[loc.member],
                        loc.sector.0 * 512,
                        PAGE,
                    );
                }
            }
        }
        a.close().unwrap();
        drop(a);
        let a = Arc::new(assemble_slow(&m, std::time::Duration::from_millis(1)));
        let model = Arc::new(std::sync::Mutex::new(data));
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = {
            let (a, model, stop, count) = (a.clone(), model.clone(), stop.clone(), count.clone());
            let mut r = SmallRng::seed_from_u64(seed ^ 0x5c7b);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) || n < 20 {
                    let len = r.gen_range(1..=32u64) * 512;
                    let off = r.gen_range(0..(size - len) / 512) * 512;
                    let mut buf = vec![0u8; us(len)];
                    r.fill_bytes(&mut buf);
                    let mut model = model.lock().unwrap();
                    a.write_at(&buf, off, WriteFlags::NONE).unwrap();
                    model[us(off)..us(off + len)].copy_from_slice(&buf);
                    drop(model);
                    let mut back = vec![0u8; us(len)];
                    a.read_at(&mut back, off).unwrap();
                    assert!(back == buf, "a write read back");
                    n += 1;
                    count.store(n, Ordering::Release);
                }
                n
            })
        };
        while count.load(Ordering::Acquire) < 2 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let before = count.load(Ordering::Acquire);
        let fixed = repair(&a);
        let during = count.load(Ordering::Acquire) - before;
        stop.store(true, Ordering::Release);
        let writes = writer.join().unwrap();
        assert!(fixed.mismatch_sectors > 0, "{name}: nothing to repair");
        assert!(during > 0, "{name}: no write overlapped the repair");
        let model = model.lock().unwrap().clone();
        assert!(
            read_all(&*a) == model,
            "{name}: data after the repair under writes"
        );
        let after = check(&a);
        assert_eq!(after.mismatch_sectors, 0, "{name}: after repair {after:#?}");
        let imgs: Vec<Option<Vec<u8>>> = images(&m).into_iter().map(Some).collect();
        check_members(a.layout(), &imgs, &b, &model)
            .unwrap_or_else(|e| panic!("{name}: members after the repair: {e}"));
        println!("{name}: {writes} writes, {during} during the repair");
    }
}
