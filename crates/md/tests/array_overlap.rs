//! The conformance suite over arrays whose members have latency (testkit's DelayDisk),
//! so that a request's member operations take the overlapped paths (every operation at
//! once on I/O workers): mirrors and parity levels, healthy and degraded. The same over
//! members that complete later (network members: each operation answered from another
//! thread), where the array starts every member operation from one thread and waits
//! once; and member failures seen on that path.

use std::sync::Arc;
use std::time::Duration;

use cairn_block::testkit::conformance::{run_with, Options};
use cairn_block::testkit::{DelayDisk, FaultyDisk};
use cairn_block::{BlockDevice, Geometry, MemDisk, ReadDone, Result, WriteDone, WriteFlags};
use cairn_md::{Array, AssembleOptions, CreateOptions, Level, MemberState, Sectors};

/// Runs the suite on fresh arrays of `level` over `n` slow members, roles in `missing`
/// left out at assembly.
fn suite(level: Level, n: usize, missing: &'static [usize]) {
    suite_of(level, n, missing, false);
}

/// [`suite`] over members that are slow or, with `later`, complete later.
fn suite_of(level: Level, n: usize, missing: &'static [usize], later: bool) {
    eprintln!("overlap conformance: {level} x{n} without {missing:?}, later: {later}");
    let make = move || -> Box<dyn BlockDevice> {
        let members: Vec<Arc<DelayDisk>> = (0..n)
            .map(|_| {
                let mem: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(4 << 20));
                Arc::new(if later {
                    DelayDisk::completing_later(mem)
                } else {
                    DelayDisk::new(mem)
                })
            })
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

#[test]
fn members_that_complete_later_every_level() {
    suite_of(Level::Raid1, 2, &[], true);
    suite_of(Level::Raid10, 4, &[1], true);
    suite_of(Level::Raid5, 4, &[], true);
    suite_of(Level::Raid6, 5, &[2], true);
}

/// An array of `level` over `n` members that complete later, member `bad` behind a
/// FaultyDisk; created, closed and assembled again over the same devices.
fn later_array(level: Level, n: usize, bad: usize) -> (Array, cairn_block::testkit::FaultHandle) {
    let mut faults = None;
    let devs: Vec<Arc<dyn BlockDevice>> = (0..n)
        .map(|i| {
            let mem: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(4 << 20));
            let mem: Arc<dyn BlockDevice> = if i == bad {
                let f = FaultyDisk::new(mem);
                faults = Some(f.handle());
                Arc::new(f)
            } else {
                mem
            };
            Arc::new(DelayDisk::completing_later(mem)) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut o = CreateOptions::new(level, "later");
    o.chunk = Some(Sectors(16));
    o.members_zeroed = true;
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let a = Array::create(devs.clone(), names.clone(), &o).unwrap();
    a.close().unwrap();
    drop(a);
    let a = Array::assemble(devs, names, AssembleOptions::default()).unwrap();
    (a, faults.expect("the bad member"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).unwrap().wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_member_that_fails_writes_on_the_later_path_is_failed_and_data_survives() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let (a, bad) = later_array(level, n, 1);
        let data = pattern(256 << 10, 7);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        bad.fail_always();
        // Partial-stripe and full-stripe writes, then a flush, with member 1 refusing.
        let more = pattern(4096, 9);
        a.write_at(&more, 8192, WriteFlags::NONE).unwrap();
        a.write_at(&data, 512 << 10, WriteFlags::FUA).unwrap();
        a.flush().unwrap();
        let r = a.report();
        assert_eq!(
            r.members[1].state,
            MemberState::Faulty,
            "{level}: {}",
            r.state_text
        );
        assert!(r.state.degraded, "{level}: {}", r.state_text);
        let mut expect = data.clone();
        expect[8192..8192 + 4096].copy_from_slice(&more);
        let mut back = vec![0u8; expect.len()];
        a.read_at(&mut back, 0).unwrap();
        assert!(
            back == expect,
            "{level}: first 256 KiB differ after the failure"
        );
        a.read_at(&mut back, 512 << 10).unwrap();
        assert!(
            back == data,
            "{level}: second 256 KiB differ after the failure"
        );
    }
}

#[test]
fn a_read_error_on_the_later_path_is_repaired_from_redundancy() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid1, 2)] {
        let (a, bad) = later_array(level, n, 1);
        let data = pattern(512 << 10, 3);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        bad.fail_range(cairn_block::testkit::Op::Read, 0..(8 << 20));
        let mut back = vec![0u8; data.len()];
        for _ in 0..2 {
            // RAID1 reads rotate between copies: twice, so member 1 is asked.
            a.read_at(&mut back, 0).unwrap();
            assert!(
                back == data,
                "{level}: a read error reached the caller's data"
            );
        }
        let r = a.report();
        assert_ne!(
            r.members[1].state,
            MemberState::Faulty,
            "{level}: a bad sector failed the member"
        );
    }
}

/// A member whose every operation is dropped without an answer (a bug below): the
/// array's request fails or degrades; it never waits forever.
#[derive(Debug)]
struct Mute(Arc<dyn BlockDevice>);

impl BlockDevice for Mute {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.0.write_at(buf, offset, flags)
    }
    fn read_then(&self, _len: usize, _offset: u64, done: ReadDone) {
        std::thread::spawn(move || drop(done));
    }
    fn write_then(&self, _buf: &[u8], _offset: u64, _flags: WriteFlags, done: WriteDone) {
        drop(done);
    }
    fn completes_later(&self) -> bool {
        true
    }
}

#[test]
fn a_member_that_never_answers_is_failed_not_waited_for() {
    let mems: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|_| Arc::new(MemDisk::new(4 << 20)) as Arc<dyn BlockDevice>)
        .collect();
    let mut o = CreateOptions::new(Level::Raid5, "mute");
    o.chunk = Some(Sectors(16));
    o.members_zeroed = true;
    let names: Vec<String> = (0..4).map(|i| format!("d{i}")).collect();
    let a = Array::create(mems.clone(), names.clone(), &o).unwrap();
    a.close().unwrap();
    drop(a);
    let devs: Vec<Arc<dyn BlockDevice>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| -> Arc<dyn BlockDevice> {
            if i == 2 {
                Arc::new(Mute(m.clone()))
            } else {
                Arc::new(DelayDisk::completing_later(m.clone()))
            }
        })
        .collect();
    let a = Array::assemble(devs, names, AssembleOptions::default()).unwrap();
    let data = pattern(128 << 10, 5);
    a.write_at(&data, 0, WriteFlags::NONE).unwrap();
    let r = a.report();
    assert_eq!(r.members[2].state, MemberState::Faulty, "{}", r.state_text);
    let mut back = vec![0u8; data.len()];
    a.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}
