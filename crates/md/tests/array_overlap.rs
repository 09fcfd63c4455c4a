//! The conformance suite over arrays whose members have latency (testkit's DelayDisk),
//! so that a request's member operations take the overlapped paths (every operation at
//! once on I/O workers): mirrors and parity levels, healthy and degraded. The same over
//! members that complete later (network members: each operation answered from another
//! thread), where the array starts every member operation from one thread and waits
//! once; and member failures seen on that path.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use cairn_block::testkit::conformance::{run_with, Options};
use cairn_block::testkit::gate::Answer;
use cairn_block::testkit::{DelayDisk, FaultyDisk, Gate};
use cairn_block::{
    BlockDevice, Capabilities, ErrorKind, Geometry, MemDisk, ReadDone, Result, WriteDone,
    WriteFlags,
};
use cairn_md::{
    Array, AssembleOptions, CreateOptions, FeaturePolicy, Level, MemberState, Sectors, Superblock,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

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

/// `level` created over `n` zeroed 4 MiB memory members (16-sector chunks) and closed,
/// then assembled over `wrap(role, member)` of each: the array and the plain members.
fn reassembled_over(
    level: Level,
    n: usize,
    name: &str,
    wrap: impl Fn(usize, Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice>,
) -> (Array, Vec<Arc<dyn BlockDevice>>) {
    let mems: Vec<Arc<dyn BlockDevice>> = (0..n)
        .map(|_| Arc::new(MemDisk::new(4 << 20)) as Arc<dyn BlockDevice>)
        .collect();
    let mut o = CreateOptions::new(level, name);
    o.chunk = Some(Sectors(16));
    o.members_zeroed = true;
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let a = Array::create(mems.clone(), names.clone(), &o).unwrap();
    a.close().unwrap();
    drop(a);
    let devs = mems
        .iter()
        .enumerate()
        .map(|(i, m)| wrap(i, m.clone()))
        .collect();
    let a = Array::assemble(devs, names, AssembleOptions::default()).unwrap();
    (a, mems)
}

#[test]
fn a_member_that_never_answers_is_failed_not_waited_for() {
    let (a, _) = reassembled_over(Level::Raid5, 4, "mute", |i, m| -> Arc<dyn BlockDevice> {
        if i == 2 {
            Arc::new(Mute(m))
        } else {
            Arc::new(DelayDisk::completing_later(m))
        }
    });
    let data = pattern(128 << 10, 5);
    a.write_at(&data, 0, WriteFlags::NONE).unwrap();
    let r = a.report();
    assert_eq!(r.members[2].state, MemberState::Faulty, "{}", r.state_text);
    let mut back = vec![0u8; data.len()];
    a.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}

#[test]
fn ppl_over_members_that_complete_later_degraded() {
    // RAID5 keeps its partial-parity log by default (write_journal); healthy above.
    suite_of(Level::Raid5, 4, &[0], true);
}

// ---- how the operations reach members that complete later ----------------------------

/// What [`Counted`] members saw, shared by every member of one array.
#[derive(Default)]
struct Seen {
    /// Synchronous reads and writes (`read_at`, `write_at`) since the last reset.
    sync: AtomicU64,
    /// The reads among them.
    sync_reads: AtomicU64,
    /// `(member, 'r' | 'w' | 'f' | 'd', offset, calling thread)` of each `*_then`, and
    /// `(member, 'W', ..)` of each synchronous write (`write_at`).
    later: Mutex<Vec<(usize, char, u64, ThreadId)>>,
    /// Synchronous discards since the last reset.
    sync_discards: AtomicU64,
    /// Read and discard answers, held back as the test says.
    gate: Arc<Gate>,
    /// Reads sent and not yet answered, and the most of them at once.
    reading: AtomicUsize,
    most_reading: AtomicUsize,
    /// Writes sent through `write_then` and not yet answered, and the most of them at
    /// once: of every member, and of each member (by its number, below 8).
    writing: AtomicUsize,
    most_writing: AtomicUsize,
    member_writing: [AtomicUsize; 8],
    member_most_writing: [AtomicUsize; 8],
}

impl Seen {
    fn reset(&self, expect: usize) {
        self.sync.store(0, Ordering::SeqCst);
        self.sync_discards.store(0, Ordering::SeqCst);
        self.sync_reads.store(0, Ordering::SeqCst);
        self.later.lock().unwrap().clear();
        self.most_reading.store(0, Ordering::SeqCst);
        self.most_writing.store(0, Ordering::SeqCst);
        for most in &self.member_most_writing {
            most.store(0, Ordering::SeqCst);
        }
        self.gate.reset(expect);
    }

    fn delay(&self) -> Duration {
        self.gate.delay()
    }

    fn later_ops(&self, kind: char) -> Vec<(usize, u64, ThreadId)> {
        let later = self.later.lock().unwrap();
        later
            .iter()
            .filter(|c| c.1 == kind)
            .map(|&(m, _, off, t)| (m, off, t))
            .collect()
    }

    fn hold(&self, answer: Answer) {
        self.gate.hold(answer);
    }
}

/// A member that completes later and records how each operation reached it.
struct Counted {
    inner: Arc<dyn BlockDevice>,
    member: usize,
    seen: Arc<Seen>,
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.member)
    }
}

impl Counted {
    fn note(&self, kind: char, off: u64) {
        let me = std::thread::current().id();
        self.seen
            .later
            .lock()
            .unwrap()
            .push((self.member, kind, off, me));
    }
}

impl BlockDevice for Counted {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.seen.sync_discards.fetch_add(1, Ordering::SeqCst);
        self.inner.discard(offset, len)
    }
    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        self.note('d', offset);
        let r = self.inner.discard(offset, len);
        self.seen.hold(Box::new(move || done(r)));
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.seen.sync.fetch_add(1, Ordering::SeqCst);
        self.seen.sync_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.seen.sync.fetch_add(1, Ordering::SeqCst);
        self.note('W', offset);
        self.inner.write_at(buf, offset, flags)
    }
    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        self.note('r', offset);
        let now = self.seen.reading.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.most_reading.fetch_max(now, Ordering::SeqCst);
        let mut buf = vec![0u8; len];
        let r = self.inner.read_at(&mut buf, offset).map(|()| buf);
        let seen = self.seen.clone();
        self.seen.hold(Box::new(move || {
            seen.reading.fetch_sub(1, Ordering::SeqCst);
            done(r);
        }));
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        self.note('w', offset);
        let (inner, buf) = (self.inner.clone(), buf.to_vec());
        let delay = self.seen.delay();
        let (seen, member) = (self.seen.clone(), self.member);
        let now = seen.writing.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most_writing.fetch_max(now, Ordering::SeqCst);
        let now = seen.member_writing[member].fetch_add(1, Ordering::SeqCst) + 1;
        seen.member_most_writing[member].fetch_max(now, Ordering::SeqCst);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let r = inner.write_at(&buf, offset, flags);
            seen.writing.fetch_sub(1, Ordering::SeqCst);
            seen.member_writing[member].fetch_sub(1, Ordering::SeqCst);
            done(r);
        });
    }
    fn flush_then(&self, done: WriteDone) {
        self.note('f', 0);
        let inner = self.inner.clone();
        std::thread::spawn(move || done(inner.flush()));
    }
    fn completes_later(&self) -> bool {
        true
    }
}

/// An array of `level` created over `n` plain members, then assembled over [`Counted`]
/// wrappers of them sharing one [`Seen`].
fn counted_array(level: Level, n: usize) -> (Array, Arc<Seen>, Vec<Arc<dyn BlockDevice>>) {
    let seen = Arc::new(Seen::default());
    let (a, mems) = reassembled_over(level, n, "counted", |member, inner| {
        Arc::new(Counted {
            inner,
            member,
            seen: seen.clone(),
        })
    });
    (a, seen, mems)
}

/// Asserts that since the last reset exactly `count` member operations of `kind` went
/// out through `*_then`, all from this thread, and that all of them were outstanding
/// together (the gate held them until then; the watchdog never had to answer). Returns
/// them.
fn sent_together(seen: &Seen, kind: char, count: usize, what: &str) -> Vec<(usize, u64, ThreadId)> {
    let sent = seen.later_ops(kind);
    let me = std::thread::current().id();
    assert_eq!(sent.len(), count, "{what}: member operations {sent:?}");
    assert!(
        sent.iter().all(|o| o.2 == me),
        "{what}: a member operation was sent from another thread"
    );
    assert_eq!(
        seen.gate.most(),
        count,
        "{what}: not every member operation was outstanding at once"
    );
    assert!(
        !seen.gate.timed_out(),
        "{what}: waited per member operation"
    );
    sent
}

#[test]
fn a_read_of_several_pieces_sends_every_piece_before_waiting() {
    // (level, members, array offset (from the end when linear), pieces of a 64 KiB
    // read: 8 KiB chunks, or linear's two members)
    for (level, n, pieces) in [
        (Level::Raid0, 4, 8),
        (Level::Raid10, 4, 8),
        (Level::Linear, 2, 2),
        (Level::Raid1, 2, 1),
    ] {
        let (a, seen, _) = counted_array(level, n);
        let size = a.geometry().size;
        // Linear: across the boundary between its two equal members.
        let off = if level == Level::Linear {
            size / 2 - (32 << 10)
        } else {
            64 << 10
        };
        let data = pattern(64 << 10, 11);
        a.write_at(&data, off, WriteFlags::NONE).unwrap();
        seen.reset(pieces);
        let mut back = vec![0u8; data.len()];
        a.read_at(&mut back, off).unwrap();
        assert!(back == data, "{level}: read back differs");
        assert_eq!(
            seen.sync.load(Ordering::SeqCst),
            0,
            "{level}: a member was read synchronously (through the worker pool)"
        );
        sent_together(&seen, 'r', pieces, &format!("{level} read"));
    }
}

/// A member answering reads as `how` says (writes and flushes go through): dropping
/// the answer (a bug below), or refusing as a lost connection does.
#[derive(Debug)]
struct BadReads {
    inner: DelayDisk,
    gone: bool,
}

impl BlockDevice for BadReads {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.inner.write_at(buf, offset, flags)
    }
    fn read_then(&self, _len: usize, _offset: u64, done: ReadDone) {
        if self.gone {
            let e = cairn_block::Error::new(ErrorKind::Gone, "the connection was lost");
            std::thread::spawn(move || done(Err(e)));
        } else {
            std::thread::spawn(move || drop(done));
        }
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        self.inner.write_then(buf, offset, flags, done);
    }
    fn flush_then(&self, done: WriteDone) {
        self.inner.flush_then(done);
    }
    fn completes_later(&self) -> bool {
        true
    }
}

/// `level` over `n` members that complete later, member `bad` answering reads badly.
fn bad_reads_array(level: Level, n: usize, bad: usize, gone: bool) -> Array {
    reassembled_over(level, n, "bad-reads", |i, m| -> Arc<dyn BlockDevice> {
        let d = DelayDisk::completing_later(m);
        if i == bad {
            Arc::new(BadReads { inner: d, gone })
        } else {
            Arc::new(d)
        }
    })
    .0
}

#[test]
fn mirror_reads_on_the_later_path_fall_back_to_the_next_copy() {
    // RAID1 alternates its first copy (two reads ask member 1 once); RAID10's first
    // copy of each piece is the even member, so member 0 is asked for half the pieces.
    for (level, n, bad) in [(Level::Raid1, 2, 1), (Level::Raid10, 4, 0)] {
        for gone in [false, true] {
            let a = bad_reads_array(level, n, bad, gone);
            let data = pattern(256 << 10, 13);
            a.write_at(&data, 0, WriteFlags::NONE).unwrap();
            let mut back = vec![0u8; data.len()];
            for _ in 0..2 {
                a.read_at(&mut back, 0).unwrap();
                assert!(back == data, "{level}, gone {gone}: wrong data");
            }
            let r = a.report();
            let faulty = r.members[bad].state == MemberState::Faulty;
            // A lost connection fails the member; an unanswered read is a read error,
            // repaired (the copy rewritten), as on every other read path.
            assert_eq!(faulty, gone, "{level}, gone {gone}: {}", r.state_text);
        }
    }
}

#[test]
fn a_read_error_on_one_copy_of_a_raid10_piece_is_repaired() {
    let (a, bad) = later_array(Level::Raid10, 4, 0);
    let data = pattern(512 << 10, 17);
    a.write_at(&data, 0, WriteFlags::NONE).unwrap();
    bad.reset_stats();
    bad.fail_range(cairn_block::testkit::Op::Read, 0..(8 << 20));
    let mut back = vec![0u8; data.len()];
    a.read_at(&mut back, 0).unwrap();
    assert!(back == data, "a read error reached the caller's data");
    let s = bad.stats();
    assert!(s.failed > 0, "member 0 was never asked: {s:?}");
    assert!(s.writes > 0, "nothing was rewritten on member 0: {s:?}");
    let r = a.report();
    assert_ne!(
        r.members[0].state,
        MemberState::Faulty,
        "a bad sector failed the member: {}",
        r.state_text
    );
    // The rewritten copy reads back once the member reads again.
    bad.heal();
    a.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}

#[test]
fn the_partial_parity_log_writes_on_the_later_path() {
    let (a, seen, mems) = counted_array(Level::Raid5, 4);
    let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
    let header = (8 + u64::try_from(sb.bblog_offset).unwrap() + u64::from(sb.bblog_size)) * 512;
    let header = header.div_ceil(4096) * 4096;
    let data_start = sb.data_offset.0 * 512;
    // The first write marks the superblocks dirty; what follows is the steady state.
    a.write_at(&pattern(4096, 1), 0, WriteFlags::NONE).unwrap();
    seen.reset(0);
    let seed = cairn_block::testkit::test_seed("ppl later");
    let mut rng = SmallRng::seed_from_u64(seed);
    let size = a.geometry().size;
    let mut model = vec![0u8; usize::try_from(size).unwrap()];
    a.read_at(&mut model, 0).unwrap();
    // About 200 KiB of entries per ring per 100 writes: the rings (under 1 MiB) wrap.
    for i in 0..1000u32 {
        let off = rng.gen_range(0..size / 4096) * 4096;
        let data = pattern(4096, u8::try_from(i % 251).unwrap());
        a.write_at(&data, off, WriteFlags::NONE).unwrap();
        let at = usize::try_from(off).unwrap();
        model[at..at + 4096].copy_from_slice(&data);
        if i % 50 == 49 {
            a.flush().unwrap();
        }
    }
    let writes = seen.later_ops('w');
    let entries = writes
        .iter()
        .filter(|w| w.1 > header && w.1 < data_start)
        .count();
    let headers = writes.iter().filter(|w| w.1 == header).count();
    assert!(
        entries >= 1000,
        "seed {seed}: {entries} log entries written"
    );
    assert!(headers > 0, "seed {seed}: the ring was never reclaimed");
    assert_eq!(
        seen.sync.load(Ordering::SeqCst),
        0,
        "seed {seed}: a member was written or read synchronously"
    );
    let mut back = vec![0u8; model.len()];
    a.read_at(&mut back, 0).unwrap();
    assert!(
        back == model,
        "seed {seed}: the array differs from the model"
    );
}

#[test]
fn a_discard_over_every_member_sends_every_member_discard_before_waiting() {
    // (level, members, member discards: one per member, a member's chunks joined into
    // one range). RAID4/5/6 do not pass discards down (state.rs).
    for (level, n, discards) in [
        (Level::Raid0, 4, 4),
        (Level::Raid10, 4, 4),
        (Level::Linear, 2, 2),
        (Level::Raid1, 2, 2),
    ] {
        let (a, seen, _) = counted_array(level, n);
        let size = a.geometry().size;
        // 256 KiB written, then 160 KiB of it discarded from 12 KiB in (8 KiB chunks:
        // partial chunks at both ends). Linear: across the boundary of its two members.
        let off = if level == Level::Linear {
            size / 2 - (128 << 10)
        } else {
            64 << 10
        };
        let data = pattern(256 << 10, 17);
        a.write_at(&data, off, WriteFlags::NONE).unwrap();
        let (d_at, d_len) = (12usize << 10, 160usize << 10);
        seen.reset(discards);
        a.discard(off + d_at as u64, d_len as u64).unwrap();
        assert_eq!(
            seen.sync_discards.load(Ordering::SeqCst),
            0,
            "{level}: a member discard was synchronous"
        );
        let sent = sent_together(&seen, 'd', discards, &format!("{level} discard"));
        let mut members: Vec<usize> = sent.iter().map(|d| d.0).collect();
        members.sort_unstable();
        assert_eq!(members, (0..n).collect::<Vec<_>>(), "{level}: {sent:?}");
        // Memory members read discarded bytes as zeroes.
        seen.reset(0);
        let mut expect = data.clone();
        expect[d_at..d_at + d_len].fill(0);
        let mut back = vec![0u8; data.len()];
        a.read_at(&mut back, off).unwrap();
        assert!(back == expect, "{level}: read back differs from the model");
        if matches!(level, Level::Raid1 | Level::Raid10) {
            let r = a.scrub(false, &|_, _| true).unwrap();
            assert_eq!(r.mismatch_sectors, 0, "{level}: copies disagree");
        }
    }
}

#[test]
fn a_member_that_fails_discards_on_the_later_path_fails_the_discard_not_the_member() {
    for (level, n) in [(Level::Raid0, 4), (Level::Raid10, 4), (Level::Raid1, 2)] {
        let (a, bad) = later_array(level, n, 1);
        let data = pattern(512 << 10, 23);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        bad.fail_range(cairn_block::testkit::Op::Discard, 0..(8 << 20));
        let e = a.discard(64 << 10, 256 << 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{level}: {e}");
        assert!(e.to_string().contains("(role 1)"), "{level}: {e}");
        let r = a.report();
        assert!(
            r.members.iter().all(|m| m.state != MemberState::Faulty),
            "{level}: a discard error failed a member: {}",
            r.state_text
        );
        assert!(!r.state.degraded, "{level}: {}", r.state_text);
        // Outside the discarded range the data is untouched; inside, unspecified.
        let mut back = vec![0u8; 64 << 10];
        a.read_at(&mut back, 0).unwrap();
        assert!(
            back[..] == data[..64 << 10],
            "{level}: data before the discard"
        );
        a.read_at(&mut back, 320 << 10).unwrap();
        assert!(
            back[..] == data[320 << 10..384 << 10],
            "{level}: data after the discard"
        );
        // Healed, the member takes discards again.
        bad.heal();
        a.discard(0, 512 << 10).unwrap();
    }
}

// ---- the background work and the log's replay over members that complete later -------

/// How long [`Counted`] members take to answer in the background work's tests: long
/// beside sending a window's reads (each starts a thread here), so that every read of a
/// window sent at once is seen outstanding together.
const ANSWER_AFTER_US: u64 = 10_000;

/// A [`Counted`] member of its own 4 MiB (the spare of a rebuild).
fn counted_spare(member: usize, seen: &Arc<Seen>) -> Arc<dyn BlockDevice> {
    Arc::new(Counted {
        inner: Arc::new(MemDisk::new(4 << 20)),
        member,
        seen: seen.clone(),
    })
}

/// Asserts that since the last reset every member read went out through `read_then`
/// from this thread, none through the worker pool, and at least `most` of them were
/// outstanding together.
fn reads_at_once(seen: &Seen, most: usize, what: &str) {
    let me = std::thread::current().id();
    let reads = seen.later_ops('r');
    assert_eq!(
        seen.sync_reads.load(Ordering::SeqCst),
        0,
        "{what}: a member was read synchronously (through the worker pool)"
    );
    assert!(!reads.is_empty(), "{what}: no member read was started");
    assert!(
        reads.iter().all(|r| r.2 == me),
        "{what}: a member read was sent from another thread"
    );
    let at_once = seen.most_reading.load(Ordering::SeqCst);
    assert!(
        at_once >= most,
        "{what}: {at_once} reads outstanding at once, not a whole window ({most})"
    );
}

#[test]
fn a_rebuild_sends_a_windows_reads_at_once_from_its_own_thread() {
    // (level, members, reads outstanding at once: a window of 16 stripes of 8 KiB with
    // three chunks read each; of mirrors up to 4 units of 1 MiB, one read each at least,
    // and RAID1's members hold 3 of them)
    for (level, n, most) in [
        (Level::Raid5, 4, 48),
        (Level::Raid6, 5, 48),
        (Level::Raid1, 2, 3),
        (Level::Raid10, 4, 4),
    ] {
        let (a, seen, mems) = counted_array(level, n);
        let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
        let data_start = sb.data_offset.0 * 512;
        let size = usize::try_from(a.geometry().size).unwrap();
        let data = pattern(size, 21);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        a.fail("d1").unwrap();
        a.add(counted_spare(n, &seen), "spare".into(), false)
            .unwrap();
        seen.gate.set_delay_us(ANSWER_AFTER_US);
        seen.reset(0);
        a.run_pending().unwrap();
        seen.gate.set_delay_us(0);
        let r = a.report();
        assert!(!r.state.degraded, "{level}: {}", r.state_text);
        reads_at_once(&seen, most, &format!("{level} rebuild"));
        // The rebuilt member's writes too: started from this thread, not on workers.
        let me = std::thread::current().id();
        let writes: Vec<_> = seen
            .later_ops('w')
            .into_iter()
            .filter(|w| w.0 == n && w.1 >= data_start)
            .collect();
        assert!(
            writes.len() >= 3,
            "{level}: the spare was written {writes:?}"
        );
        assert!(
            writes.iter().all(|w| w.2 == me),
            "{level}: a write to the spare was sent from another thread"
        );
        // The rebuilt member agrees with the rest, and serves without d0.
        let check = a.scrub(false, &|_, _| true).unwrap();
        assert_eq!(check.mismatch_sectors, 0, "{level}: {check:#?}");
        a.fail("d0").unwrap();
        let mut back = vec![0u8; size];
        a.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{level}: the rebuilt member holds other data");
    }
}

#[test]
fn a_scrub_sends_a_windows_reads_at_once_and_finds_what_plain_members_show() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let (a, seen, mems) = counted_array(level, n);
        let size = usize::try_from(a.geometry().size).unwrap();
        a.write_at(&pattern(size, 31), 0, WriteFlags::NONE).unwrap();
        a.close().unwrap();
        drop(a);
        // Some sectors of member 2 changed behind the array's back.
        for (i, at) in [(2u8, 2u64 << 20), (3, (3 << 20) + 4096)].into_iter() {
            mems[2]
                .write_at(&pattern(4096, i), at, WriteFlags::NONE)
                .unwrap();
        }
        let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
        let copies = mems
            .iter()
            .map(|m| {
                let mut b = vec![0u8; usize::try_from(m.geometry().size).unwrap()];
                m.read_at(&mut b, 0).unwrap();
                Arc::new(MemDisk::from_bytes(&b)) as Arc<dyn BlockDevice>
            })
            .collect();
        let plain = Array::assemble(copies, names.clone(), AssembleOptions::default()).unwrap();
        let want = plain.scrub(false, &|_, _| true).unwrap();
        drop(plain);
        let counted = mems
            .iter()
            .enumerate()
            .map(|(member, inner)| -> Arc<dyn BlockDevice> {
                Arc::new(Counted {
                    inner: inner.clone(),
                    member,
                    seen: seen.clone(),
                })
            })
            .collect();
        let a = Array::assemble(counted, names, AssembleOptions::default()).unwrap();
        seen.gate.set_delay_us(ANSWER_AFTER_US);
        seen.reset(0);
        let got = a.scrub(false, &|_, _| true).unwrap();
        assert!(want.mismatch_sectors > 0, "{level}: {want:#?}");
        assert_eq!(
            got, want,
            "{level}: the check over members completing later"
        );
        // Stripes: a window of 16, every member read; mirrors: every copy of 4 units.
        let most = if level == Level::Raid10 {
            4 * n
        } else {
            16 * n
        };
        reads_at_once(&seen, most, &format!("{level} check"));
    }
}

#[test]
fn the_log_is_replayed_at_assembly_with_each_batch_of_reads_at_once() {
    let n = 4;
    let (a, _, mems) = counted_array(Level::Raid5, n);
    // Partial-stripe writes leave live entries; the images are taken while the array
    // is open (dirty), and member 1's parity of one written row is then lost, as if the
    // crash came between the data write and the parity write.
    for i in 0..8u8 {
        let off = u64::from(i) * (96 << 10) + 4096;
        a.write_at(&pattern(4096, i), off, WriteFlags::NONE)
            .unwrap();
    }
    let mut images: Vec<Vec<u8>> = mems
        .iter()
        .map(|m| {
            let mut b = vec![0u8; usize::try_from(m.geometry().size).unwrap()];
            m.read_at(&mut b, 0).unwrap();
            b
        })
        .collect();
    drop(a);
    // Stripe 0's parity (member 3, left-symmetric) of the row written.
    let sb = Superblock::read_from(&*mems[3], "d3", FeaturePolicy::Supported).unwrap();
    let row = usize::try_from(sb.data_offset.0 * 512).unwrap() + 4096;
    let lost = pattern(4096, 99);
    images[3][row..row + 4096].copy_from_slice(&lost);
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let fresh = || -> Vec<Arc<MemDisk>> {
        images
            .iter()
            .map(|b| Arc::new(MemDisk::from_bytes(b)))
            .collect()
    };
    let read_all = |a: &Array| {
        let mut b = vec![0u8; usize::try_from(a.geometry().size).unwrap()];
        a.read_at(&mut b, 0).unwrap();
        b
    };
    // Over plain members, and over members that complete later: the same array after
    // the replay, the same member images.
    let plain_disks = fresh();
    let plain = Array::assemble(
        plain_disks
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect(),
        names.clone(),
        AssembleOptions::default(),
    )
    .unwrap();
    let want = read_all(&plain);
    drop(plain);
    let seen = Arc::new(Seen::default());
    // Every read held until all `n` of its batch are out (the ring headers, the rings,
    // then each replayed row).
    seen.reset(n);
    let later_disks = fresh();
    let counted = later_disks
        .iter()
        .enumerate()
        .map(|(member, inner)| -> Arc<dyn BlockDevice> {
            Arc::new(Counted {
                inner: inner.clone(),
                member,
                seen: seen.clone(),
            })
        })
        .collect();
    let a = Array::assemble(counted, names, AssembleOptions::default()).unwrap();
    let reads = seen.later_ops('r');
    let me = std::thread::current().id();
    assert!(
        reads.len() >= 3 * n,
        "the replay's reads did not go through read_then: {reads:?}"
    );
    assert!(
        reads.iter().all(|r| r.2 == me),
        "a read was sent from another thread"
    );
    assert_eq!(seen.gate.most(), n, "not a whole batch at once");
    assert!(!seen.gate.timed_out(), "waited per read");
    seen.reset(0);
    assert!(read_all(&a) == want, "the arrays differ after the replay");
    drop(a);
    let parity = |d: &MemDisk| {
        let mut b = vec![0u8; 4096];
        d.read_at(&mut b, u64::try_from(row).unwrap()).unwrap();
        b
    };
    assert!(
        parity(&plain_disks[3]) != lost,
        "the replay left the parity lost"
    );
    assert!(
        parity(&plain_disks[3]) == parity(&later_disks[3]),
        "the replays wrote different parity"
    );
}

/// `level` over `n` 4 MiB memory members (16-sector chunks, an internal bitmap of 64 KiB
/// chunks, `garbage` on the members before: a resync pending), closed and assembled over
/// [`Counted`] wrappers of them sharing one [`Seen`].
fn counted_with_bitmap(level: Level, n: usize, garbage: bool) -> (Array, Arc<Seen>) {
    let mems: Vec<Arc<dyn BlockDevice>> = (0..n)
        .map(|i| {
            let fill = if garbage {
                pattern(4 << 20, u8::try_from(40 + i).unwrap())
            } else {
                vec![0u8; 4 << 20]
            };
            Arc::new(MemDisk::from_bytes(&fill)) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut o = CreateOptions::new(level, "counted");
    o.chunk = Some(Sectors(16));
    o.members_zeroed = !garbage;
    o.force = true;
    o.bitmap = cairn_md::BitmapChoice::Internal {
        chunk_bytes: Some(64 << 10),
    };
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    Array::create(mems.clone(), names.clone(), &o)
        .unwrap()
        .close()
        .unwrap();
    let seen = Arc::new(Seen::default());
    let devs = mems
        .into_iter()
        .enumerate()
        .map(|(member, inner)| -> Arc<dyn BlockDevice> {
            Arc::new(Counted {
                inner,
                member,
                seen: seen.clone(),
            })
        })
        .collect();
    let a = Array::assemble(devs, names, AssembleOptions::default()).unwrap();
    a.set_bitmap_daemon_sleep(Duration::ZERO);
    (a, seen)
}

/// Runs the pending background work with every member read counted: none may be
/// synchronous (the worker pool), each sent from this thread, at least `most` at once.
/// Then the array must check clean and read back `model`.
fn run_counted(a: &Array, seen: &Seen, model: &[u8], most: usize, what: &str) {
    seen.gate.set_delay_us(ANSWER_AFTER_US);
    seen.reset(0);
    a.run_pending().unwrap();
    let r = a.report();
    assert!(
        !r.state.degraded && !r.state.resync_pending,
        "{what}: {}",
        r.state_text
    );
    reads_at_once(seen, most, what);
    seen.gate.set_delay_us(0);
    let check = a.scrub(false, &|_, _| true).unwrap();
    assert_eq!(check.mismatch_sectors, 0, "{what}: {check:#?}");
    let mut back = vec![0u8; model.len()];
    a.read_at(&mut back, 0).unwrap();
    assert!(
        back == model,
        "{what}: the array differs from what was written"
    );
}

#[test]
fn resync_replace_and_re_add_over_members_that_complete_later() {
    // (level, members, reads at once of a window: parity 16 stripes, mirrors 3 units or
    // more; a resync reads the data chunks, a copy onto a replacement the member, a
    // re-add only the dirty stripes or chunks)
    for (level, n, resync, replace) in [
        (Level::Raid5, 4, 48, 16),
        (Level::Raid6, 5, 48, 16),
        (Level::Raid1, 2, 3, 3),
        (Level::Raid10, 4, 3, 3),
    ] {
        let (a, seen) = counted_with_bitmap(level, n, true);
        assert!(a.report().state.resync_pending, "{level}");
        let size = usize::try_from(a.geometry().size).unwrap();
        let mut model = pattern(size, 51);
        a.write_at(&model[..64 << 10], 0, WriteFlags::NONE).unwrap();
        // The rest as the members hold it (a resync keeps the data, makes copies agree).
        let mut rest = vec![0u8; size - (64 << 10)];
        a.read_at(&mut rest, 64 << 10).unwrap();
        model[64 << 10..].copy_from_slice(&rest);
        run_counted(&a, &seen, &model, resync, &format!("{level} resync"));

        // The copy onto a replacement.
        a.replace("d0", Some((counted_spare(n, &seen), "new".into())), false)
            .unwrap();
        run_counted(&a, &seen, &model, replace, &format!("{level} replace"));
        a.remove("d0").unwrap();

        // A member out for a while, re-added: only what was written meanwhile.
        let victim = a.member(1).unwrap();
        a.fail("d1").unwrap();
        a.remove("d1").unwrap();
        for i in 0..4usize {
            let at = i * (size / 4) + 4096;
            let data = pattern(4096, u8::try_from(60 + i).unwrap());
            a.write_at(&data, u64::try_from(at).unwrap(), WriteFlags::NONE)
                .unwrap();
            model[at..at + 4096].copy_from_slice(&data);
        }
        a.flush().unwrap();
        let msg = a.add(victim, "d1".into(), false).unwrap();
        assert!(
            msg.message.contains("only the"),
            "{level}: not guided: {msg}"
        );
        run_counted(&a, &seen, &model, 1, &format!("{level} re-add"));
        // The re-added member serves without the one beside it.
        a.fail("new").unwrap();
        let mut back = vec![0u8; size];
        a.read_at(&mut back, 0).unwrap();
        assert!(back == model, "{level}: the re-added member differs");
    }
}

#[test]
fn a_rebuild_over_members_that_complete_later_gets_past_a_source_whose_reads_fail() {
    // Member 0 drops its read answers, or refuses them as a lost connection, while d1
    // is rebuilt: a stripe whose source read failed goes through the general path
    // (RAID6 rebuilds it without member 0), a mirror piece on to its next copy.
    for (level, n, gone) in [
        (Level::Raid6, 5, false),
        (Level::Raid6, 5, true),
        (Level::Raid1, 3, false),
        (Level::Raid1, 3, true),
    ] {
        let what = format!(
            "{level} x{n}, reads {}",
            if gone { "gone" } else { "dropped" }
        );
        let a = bad_reads_array(level, n, 0, gone);
        let size = usize::try_from(a.geometry().size).unwrap();
        let data = pattern(size, 71);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        a.fail("d1").unwrap();
        let spare = Arc::new(DelayDisk::completing_later(Arc::new(MemDisk::new(4 << 20))));
        a.add(spare, "spare".into(), false).unwrap();
        a.run_pending().unwrap();
        let r = a.report();
        assert_eq!(
            r.members[0].state == MemberState::Faulty,
            gone,
            "{what}: {}",
            r.state_text
        );
        // The rebuilt member serves without d2 (and, for RAID1, without d0's reads).
        a.fail("d2").unwrap();
        let mut back = vec![0u8; size];
        a.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{what}: the rebuilt member holds other data");
    }
}

/// The writes of `member` at member byte `from` and beyond (its data area) since the
/// last reset: asserts that each went through `write_then` from this thread, none
/// through `write_at` (the worker pool, or a write one at a time); returns them.
fn data_writes_from_here(seen: &Seen, member: Option<usize>, from: u64, what: &str) -> usize {
    let me = std::thread::current().id();
    let of = |ops: Vec<(usize, u64, ThreadId)>| -> Vec<(usize, u64, ThreadId)> {
        ops.into_iter()
            .filter(|o| member.is_none_or(|m| o.0 == m) && o.1 >= from)
            .collect()
    };
    let sync = of(seen.later_ops('W'));
    assert!(
        sync.is_empty(),
        "{what}: {} writes synchronously (through the worker pool), the first {:?}",
        sync.len(),
        &sync[..sync.len().min(4)]
    );
    let writes = of(seen.later_ops('w'));
    assert!(
        writes.iter().all(|w| w.2 == me),
        "{what}: a write was sent from another thread: {writes:?}"
    );
    writes.len()
}

#[test]
fn a_replace_over_members_that_complete_later_sends_a_windows_copies_at_once() {
    // (level, members, the replacement's writes outstanding at once: a window of 16
    // stripes, one chunk each; of mirrors up to 4 units of 1 MiB, RAID1's member
    // holding 3 of them)
    for (level, n, most) in [
        (Level::Raid5, 4, 16),
        (Level::Raid6, 5, 16),
        (Level::Raid1, 2, 3),
        (Level::Raid10, 4, 3),
    ] {
        let what = format!("{level} replace");
        let (a, seen, mems) = counted_array(level, n);
        let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
        let data_start = sb.data_offset.0 * 512;
        let used = usize::try_from(sb.size.0 * 512).unwrap();
        let size = usize::try_from(a.geometry().size).unwrap();
        a.write_at(&pattern(size, 81), 0, WriteFlags::NONE).unwrap();
        let new = Arc::new(MemDisk::new(4 << 20));
        let counted: Arc<dyn BlockDevice> = Arc::new(Counted {
            inner: new.clone(),
            member: n,
            seen: seen.clone(),
        });
        a.replace("d0", Some((counted, "new".into())), false)
            .unwrap();
        seen.gate.set_delay_us(ANSWER_AFTER_US);
        seen.reset(0);
        a.run_pending().unwrap();
        seen.gate.set_delay_us(0);
        let r = a.report();
        assert!(!r.state.degraded, "{what}: {}", r.state_text);
        assert!(
            r.members
                .iter()
                .any(|m| m.name.as_deref() == Some("new") && m.state == MemberState::ActiveSync),
            "{what}: the replacement did not take the role: {}",
            r.state_text
        );
        let copies = data_writes_from_here(&seen, Some(n), data_start, &what);
        assert!(copies >= most, "{what}: {copies} writes to the replacement");
        let at_once = seen.member_most_writing[n].load(Ordering::SeqCst);
        assert!(
            at_once >= most,
            "{what}: {at_once} writes to the replacement outstanding at once, not a window"
        );
        // The replacement holds what the member replaced held.
        let nsb = Superblock::read_from(&*new, "new", FeaturePolicy::Supported).unwrap();
        let new_start = nsb.data_offset.0 * 512;
        let (mut want, mut got) = (vec![0u8; used], vec![0u8; used]);
        mems[0].read_at(&mut want, data_start).unwrap();
        new.read_at(&mut got, new_start).unwrap();
        assert!(want == got, "{what}: the replacement differs from d0");
        let check = a.scrub(false, &|_, _| true).unwrap();
        assert_eq!(check.mismatch_sectors, 0, "{what}: {check:#?}");
    }
}

#[test]
fn a_repair_over_members_that_complete_later_sends_a_windows_rewrites_at_once() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let what = format!("{level} repair");
        let (a, seen, mems) = counted_array(level, n);
        let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
        let data_start = sb.data_offset.0 * 512;
        let size = usize::try_from(a.geometry().size).unwrap();
        a.write_at(&pattern(size, 91), 0, WriteFlags::NONE).unwrap();
        // Member 2 changed behind the array's back in 4 stripes of the first window
        // (8 KiB chunks; RAID10: 2 of its first 4 units of 1 MiB).
        for k in [1u64, 3, 5, 7] {
            let at = data_start
                + k * if level == Level::Raid10 {
                    96 << 10
                } else {
                    8 << 10
                };
            mems[2]
                .write_at(
                    &pattern(4096, 200 + u8::try_from(k).unwrap()),
                    at,
                    WriteFlags::NONE,
                )
                .unwrap();
        }
        seen.gate.set_delay_us(ANSWER_AFTER_US);
        seen.reset(0);
        let report = a.scrub(true, &|_, _| true).unwrap();
        seen.gate.set_delay_us(0);
        assert!(report.mismatch_sectors >= 4 * 8, "{what}: {report:#?}");
        assert!(
            report.regions.iter().all(|m| m.repaired),
            "{what}: {report:#?}"
        );
        let rewrites = data_writes_from_here(&seen, None, data_start, &what);
        assert!(rewrites >= 4, "{what}: {rewrites} repair writes");
        let at_once = seen.most_writing.load(Ordering::SeqCst);
        assert!(
            at_once >= 4,
            "{what}: {at_once} repair writes outstanding at once, not a window's"
        );
        let check = a.scrub(false, &|_, _| true).unwrap();
        assert_eq!(check.mismatch_sectors, 0, "{what}: {check:#?}");
        assert!(!a.report().state.degraded, "{what}");
    }
}

#[test]
fn a_replacement_completing_later_that_fails_writes_is_dropped() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid1, 2)] {
        let what = format!("{level} replacement failing writes");
        let (a, _, mems) = counted_array(level, n);
        let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
        let data_start = sb.data_offset.0 * 512;
        let size = usize::try_from(a.geometry().size).unwrap();
        let data = pattern(size, 13);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        let faulty = FaultyDisk::new(MemDisk::new(4 << 20));
        let bad_at = data_start + (2 << 20);
        faulty
            .handle()
            .fail_range(cairn_block::testkit::Op::Write, bad_at..bad_at + (64 << 10));
        let new = Arc::new(DelayDisk::completing_later(Arc::new(faulty)));
        a.replace("d0", Some((new, "new".into())), false).unwrap();
        let e = a.run_pending().unwrap_err();
        eprintln!("{what}: {e}");
        let r = a.report();
        assert!(
            !r.members
                .iter()
                .any(|m| m.state == MemberState::Replacement || m.name.as_deref() == Some("new")),
            "{what}: {}",
            r.state_text
        );
        assert!(!r.state.degraded, "{what}: {}", r.state_text);
        let mut back = vec![0u8; size];
        a.read_at(&mut back, 0).unwrap();
        assert!(back == data, "{what}: the array differs");
    }
}

#[test]
fn a_repair_write_that_fails_on_the_later_path_fails_its_member() {
    // RAID6 rewrites the member blamed (2); RAID10 the copy that differs from the
    // first (member 3, beside member 2).
    for (level, n, bad) in [(Level::Raid6, 5, 2), (Level::Raid10, 4, 3)] {
        let what = format!("{level} repair onto a member failing writes");
        let handle = Mutex::new(None);
        let (a, mems) = reassembled_over(level, n, "fails", |i, inner| {
            let inner: Arc<dyn BlockDevice> = if i == bad {
                let f = FaultyDisk::new(inner);
                *handle.lock().unwrap() = Some(f.handle());
                Arc::new(f)
            } else {
                inner
            };
            Arc::new(DelayDisk::completing_later(inner))
        });
        let sb = Superblock::read_from(&*mems[0], "d0", FeaturePolicy::Supported).unwrap();
        let data_start = sb.data_offset.0 * 512;
        let size = usize::try_from(a.geometry().size).unwrap();
        let data = pattern(size, 17);
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        let step = if level == Level::Raid10 {
            96 << 10
        } else {
            8 << 10
        };
        for k in [1u64, 3] {
            mems[bad]
                .write_at(&pattern(4096, 150), data_start + k * step, WriteFlags::NONE)
                .unwrap();
        }
        handle
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .fail_range(cairn_block::testkit::Op::Write, 0..(8 << 20));
        let e = a.scrub(true, &|_, _| true).unwrap_err();
        eprintln!("{what}: {e}");
        assert_eq!(e.kind(), ErrorKind::Degraded, "{what}: {e}");
        let r = a.report();
        assert_eq!(
            r.members[bad].state,
            MemberState::Faulty,
            "{what}: {}",
            r.state_text
        );
        if level == Level::Raid6 {
            // The blamed member is out: the data comes from the rest.
            let mut back = vec![0u8; size];
            a.read_at(&mut back, 0).unwrap();
            assert!(back == data, "{what}: the array differs");
        }
    }
}
