//! LogWritesDisk: the log reproduces the image at every flush, every generated crash image
//! passes the checker and satisfies the model (re-derived here independently), the checker
//! rejects impossible images, and the shared clock crashes a whole stack consistently.

use std::sync::{Arc, Condvar, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use cairn_block::testkit::{
    random_bytes, test_seed, CrashPoint, DiscardModel, LogClock, LogOp, LogOptions, LogWritesDisk,
    WriteLog,
};
use cairn_block::{BlockDevice, MemDisk, Result, WriteFlags};

const SIZE: u64 = 256 << 10;
const SECTOR: usize = 512;

/// Test sizes are small; a failed conversion is a broken test, not a truncation.
fn us(v: u64) -> usize {
    usize::try_from(v).expect("test sizes fit in usize")
}

/// Applies a random workload to `dev` and to `model`; returns the model after each flush.
fn workload(
    dev: &dyn BlockDevice,
    model: &mut [u8],
    rng: &mut SmallRng,
    ops: usize,
) -> Vec<Vec<u8>> {
    let size = model.len() as u64;
    let mut at_flush = Vec::new();
    for _ in 0..ops {
        // Small ranges in a small space so writes overlap often.
        let blocks = rng.gen_range(1..=16u64);
        let start = rng.gen_range(0..=size / 512 - blocks) * 512;
        let (o, n) = (us(start), us(blocks * 512));
        match rng.gen_range(0..100) {
            0..=59 => {
                let data = random_bytes(rng, n);
                let flags = if rng.gen_bool(0.3) {
                    WriteFlags::FUA
                } else {
                    WriteFlags::NONE
                };
                dev.write_at(&data, start, flags).unwrap();
                model[o..o + n].copy_from_slice(&data);
            }
            60..=69 => {
                let flags = if rng.gen_bool(0.3) {
                    WriteFlags::FUA
                } else {
                    WriteFlags::NONE
                };
                dev.write_zeroes(start, n as u64, flags).unwrap();
                model[o..o + n].fill(0);
            }
            70..=79 => {
                dev.discard(start, n as u64).unwrap();
                model[o..o + n].fill(0); // MemDisk zeroes discarded ranges
            }
            _ => {
                dev.flush().unwrap();
                at_flush.push(model.to_vec());
            }
        }
    }
    at_flush
}

fn log_over_random_memdisk(rng: &mut SmallRng) -> (LogWritesDisk<MemDisk>, Vec<u8>) {
    let initial = random_bytes(rng, us(SIZE));
    let disk = LogWritesDisk::new(MemDisk::from_bytes(&initial)).unwrap();
    (disk, initial)
}

#[test]
fn image_at_flush_matches_the_model_at_every_flush() {
    let seed = test_seed("logwrites image_at_flush");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (disk, initial) = log_over_random_memdisk(&mut rng);
    let mut model = initial.clone();
    let snapshots = workload(&disk, &mut model, &mut rng, 600);
    let log = disk.log();
    assert!(snapshots.len() > 10, "workload should flush often");
    assert_eq!(log.flush_count(), snapshots.len());
    assert_eq!(disk.flush_count(), snapshots.len());
    assert_eq!(disk.log_len(), log.len());
    assert_eq!(log.image_at_flush(0), initial, "k = 0 is the initial image");
    for (k, want) in snapshots.iter().enumerate() {
        assert!(
            log.image_at_flush(k + 1) == *want,
            "image at flush {} (seed {seed})",
            k + 1
        );
    }
    assert!(
        log.image_after(log.len()) == model,
        "full replay = model (seed {seed})"
    );
    assert!(
        disk.inner().to_vec() == model,
        "inner device = model (seed {seed})"
    );
}

#[test]
fn caller_supplied_initial_image() {
    let inner = MemDisk::new(SIZE);
    let wrong = LogWritesDisk::with_options(
        MemDisk::new(SIZE),
        LogOptions {
            initial: Some(vec![0u8; 512]),
            ..LogOptions::default()
        },
    );
    assert!(
        wrong.is_err(),
        "an initial image of the wrong size is refused"
    );
    let disk = LogWritesDisk::with_options(
        inner,
        LogOptions {
            initial: Some(vec![0u8; us(SIZE)]),
            ..LogOptions::default()
        },
    )
    .unwrap();
    assert_eq!(disk.image_at_flush(0), vec![0u8; us(SIZE)]);
}

/// The crash model re-derived the simple way, as properties any crash image must have:
/// untouched sectors hold the flushed value; the last completed FUA write to a sector
/// with nothing after it is present; each sector holds the flushed value or one written
/// since (for a single-threaded log).
fn assert_model_properties(log: &WriteLog, img: &[u8], at: usize) {
    let e = log.entries();
    let flush = e[..at].iter().rposition(|x| x.op.is_flush());
    let base = log.image_after(flush.unwrap_or(0));
    let since = flush.map_or(0, |f| f + 1)..at;
    // Values each sector may hold: the flushed one and any written since.
    let mut allowed: Vec<Vec<Vec<u8>>> = base.chunks(SECTOR).map(|s| vec![s.to_vec()]).collect();
    let mut must: Vec<Option<Vec<u8>>> = vec![None; allowed.len()];
    for i in since {
        let Some((off, len)) = e[i].op.range() else {
            continue;
        };
        for s in us(off) / SECTOR..us(off + len) / SECTOR {
            let val = match &e[i].op {
                LogOp::Write { data, .. } => data[s * SECTOR - us(off)..][..SECTOR].to_vec(),
                _ => vec![0u8; SECTOR],
            };
            allowed[s].push(val.clone());
            // A later op to the sector lifts the requirement (it may have replaced it),
            // a FUA one replaces it.
            must[s] = if e[i].op.fua() { Some(val) } else { None };
        }
    }
    for (s, got) in img.chunks(SECTOR).enumerate() {
        assert!(
            allowed[s].iter().any(|v| v == got),
            "sector {s}: holds a value neither flushed nor written since (crash after {at})"
        );
        if let Some(v) = &must[s] {
            assert!(
                v == got,
                "sector {s}: acknowledged FUA write missing (crash after {at})"
            );
        }
    }
}

#[test]
fn crash_images_always_pass_the_checker_and_the_model() {
    let seed = test_seed("logwrites crash_image");
    let mut rng = SmallRng::seed_from_u64(seed);
    for round in 0..4 {
        let (disk, initial) = log_over_random_memdisk(&mut rng);
        let mut model = initial;
        workload(&disk, &mut model, &mut rng, 300);
        let log = disk.log();
        let mut distinct_somewhere = false;
        for at in 0..=log.len() {
            let point = CrashPoint::AfterEntries(at);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..4 {
                let img = log.crash_image(&mut rng, point);
                if let Err(v) = log.check_crash_state(&img, point) {
                    panic!("round {round}, crash after {at} (seed {seed}): {v}");
                }
                assert_model_properties(&log, &img, at);
                seen.insert(img);
            }
            distinct_somewhere |= seen.len() > 1;
            // Right after a flush nothing is uncertain.
            if at > 0 && log.entries()[at - 1].op.is_flush() {
                let k = log.entries()[..at]
                    .iter()
                    .filter(|e| e.op.is_flush())
                    .count();
                assert_eq!(seen.len(), 1);
                assert!(seen.iter().next() == Some(&log.image_at_flush(k)));
            }
        }
        assert!(distinct_somewhere, "crash images never vary (seed {seed})");
    }
}

/// A hand-built log: W0 = A at sector 0; FLUSH; W2 = B at sector 0 (FUA); W3 = C at sector 8.
fn small_log() -> (LogWritesDisk<MemDisk>, [Vec<u8>; 3]) {
    let disk = LogWritesDisk::new(MemDisk::new(SIZE)).unwrap();
    let (a, b, c) = (vec![0xaa; SECTOR], vec![0xbb; SECTOR], vec![0xcc; SECTOR]);
    disk.write_at(&a, 0, WriteFlags::NONE).unwrap();
    disk.flush().unwrap();
    disk.write_at(&b, 0, WriteFlags::FUA).unwrap();
    disk.write_at(&c, 4096, WriteFlags::NONE).unwrap();
    (disk, [a, b, c])
}

fn with_sector(img: &[u8], off: usize, val: &[u8]) -> Vec<u8> {
    let mut v = img.to_vec();
    v[off..off + val.len()].copy_from_slice(val);
    v
}

#[test]
fn checker_rejects_a_dropped_fua_write() {
    let (disk, [a, b, c]) = small_log();
    let log = disk.log();
    let end = CrashPoint::AfterEntries(4);
    let flushed = log.image_at_flush(1);
    // Allowed: B present, C either way.
    log.check_crash_state(&with_sector(&flushed, 0, &b), end)
        .unwrap();
    log.check_crash_state(&with_sector(&with_sector(&flushed, 0, &b), 4096, &c), end)
        .unwrap();
    // Dropping the FUA write leaves A: impossible.
    let err = log.check_crash_state(&flushed, end).unwrap_err();
    assert_eq!(err.bad_sectors, 1);
    let msg = err.to_string();
    assert!(msg.contains("sector 0"), "{msg}");
    assert!(msg.contains("acknowledged"), "{msg}");
    // Before the FUA write completed, A is fine.
    log.check_crash_state(&flushed, CrashPoint::AfterEntries(2))
        .unwrap();
    let _ = a;
}

#[test]
fn checker_rejects_a_dropped_pre_flush_write() {
    let (disk, [a, ..]) = small_log();
    let log = disk.log();
    let zero = vec![0u8; us(SIZE)];
    // Before the flush the write may be lost…
    log.check_crash_state(&zero, CrashPoint::AfterEntries(1))
        .unwrap();
    log.check_crash_state(&with_sector(&zero, 0, &a), CrashPoint::AfterEntries(1))
        .unwrap();
    // …after it, it may not.
    let err = log
        .check_crash_state(&zero, CrashPoint::AfterEntries(2))
        .unwrap_err();
    assert!(err.to_string().contains("sector 0"), "{err}");
}

#[test]
fn checker_rejects_garbage_future_data_torn_sectors_and_wrong_sizes() {
    let (disk, [a, b, c]) = small_log();
    let log = disk.log();
    let flushed = log.image_at_flush(1);
    let good = with_sector(&flushed, 0, &b);
    let end = CrashPoint::AfterEntries(4);
    // One flipped byte anywhere.
    for off in [0usize, 4096, 100_000, us(SIZE) - 1] {
        let mut bad = good.clone();
        bad[off] ^= 0x40;
        assert!(
            log.check_crash_state(&bad, end).is_err(),
            "flip at {off} accepted"
        );
    }
    // Data from a write that had not happened yet.
    let future = with_sector(&flushed, 4096, &c);
    assert!(log
        .check_crash_state(&future, CrashPoint::AfterEntries(2))
        .is_err());
    // A sector is atomic: half old, half new is not a state.
    let mut half = [a.clone(), b.clone()].concat();
    half.truncate(SECTOR);
    half[SECTOR / 2..].copy_from_slice(&b[SECTOR / 2..]);
    half[..SECTOR / 2].copy_from_slice(&a[..SECTOR / 2]);
    assert!(log
        .check_crash_state(
            &with_sector(&flushed, 0, &half),
            CrashPoint::AfterEntries(3)
        )
        .is_err());
    // Wrong size.
    assert!(log.check_crash_state(&good[..4096], end).is_err());
}

#[test]
fn checker_random_corruption_is_caught() {
    let seed = test_seed("logwrites corruption");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (disk, initial) = log_over_random_memdisk(&mut rng);
    let mut model = initial;
    workload(&disk, &mut model, &mut rng, 200);
    let log = disk.log();
    for _ in 0..200 {
        let at = CrashPoint::AfterEntries(rng.gen_range(0..=log.len()));
        let mut img = log.crash_image(&mut rng, at);
        let byte = rng.gen_range(0..img.len());
        img[byte] ^= 1 << rng.gen_range(0..8);
        // A single flipped bit turns a sector into a value no op wrote (random data).
        assert!(
            log.check_crash_state(&img, at).is_err(),
            "bit flip at {byte} accepted (seed {seed})"
        );
    }
}

#[test]
fn discard_models() {
    for model in [DiscardModel::Zeroes, DiscardModel::Unspecified] {
        let disk = LogWritesDisk::with_options(
            MemDisk::new(SIZE),
            LogOptions {
                discard: model,
                ..LogOptions::default()
            },
        )
        .unwrap();
        let old = vec![0x11u8; 4096];
        disk.write_at(&old, 0, WriteFlags::NONE).unwrap();
        disk.flush().unwrap();
        disk.discard(0, 4096).unwrap();
        let log = disk.log();
        let flushed = log.image_at_flush(1);
        let garbage = with_sector(&flushed, 0, &[0x77u8; 4096]);
        let zeroed = with_sector(&flushed, 0, &[0u8; 4096]);
        // Torn: some sectors discarded, some not.
        let torn = with_sector(&flushed, 1024, &[0u8; SECTOR]);
        {
            let at = CrashPoint::AfterEntries(3);
            log.check_crash_state(&flushed, at)
                .expect("discard not landed");
            log.check_crash_state(&zeroed, at).expect("discard landed");
            log.check_crash_state(&torn, at).expect("discard torn");
            assert_eq!(
                log.check_crash_state(&garbage, at).is_ok(),
                model == DiscardModel::Unspecified,
                "{model:?}: garbage in a discarded sector"
            );
        }
        // Discarded before a flush: zeroes with Zeroes, anything with Unspecified.
        disk.flush().unwrap();
        let log = disk.log();
        let at = CrashPoint::AfterEntries(log.len());
        log.check_crash_state(&zeroed, at).unwrap();
        assert_eq!(
            log.check_crash_state(&flushed, at).is_ok(),
            model == DiscardModel::Unspecified
        );
        assert_eq!(
            log.check_crash_state(&garbage, at).is_ok(),
            model == DiscardModel::Unspecified
        );
    }
}

/// An inner device whose writes to offset 0 wait until released: makes "in flight"
/// deterministic.
#[derive(Debug)]
struct Gate {
    inner: MemDisk,
    state: Mutex<(bool, bool)>, // (a write is waiting, released)
    cv: Condvar,
}

impl BlockDevice for Gate {
    fn geometry(&self) -> cairn_block::Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if offset == 0 {
            let mut st = self.state.lock().unwrap();
            st.0 = true;
            self.cv.notify_all();
            while !st.1 {
                st = self.cv.wait(st).unwrap();
            }
        }
        self.inner.write_at(buf, offset, flags)
    }
}

#[test]
fn in_flight_fua_writes_are_not_durable() {
    let clock = LogClock::new();
    let disk = LogWritesDisk::with_options(
        Gate {
            inner: MemDisk::new(SIZE),
            state: Mutex::new((false, false)),
            cv: Condvar::new(),
        },
        LogOptions::with_clock(&clock),
    )
    .unwrap();
    let b = vec![0xbbu8; SECTOR];
    std::thread::scope(|s| {
        s.spawn(|| disk.write_at(&[0xaa; SECTOR], 0, WriteFlags::NONE).unwrap());
        {
            let mut st = disk.inner().state.lock().unwrap();
            while !st.0 {
                st = disk.inner().cv.wait(st).unwrap();
            }
        }
        // W1 is inside the inner device. Start the FUA write W2; it waits for the log lock.
        s.spawn(|| disk.write_at(&b, 4096, WriteFlags::FUA).unwrap());
        while clock.now() < 2 {
            std::thread::yield_now();
        }
        let mut st = disk.inner().state.lock().unwrap();
        st.1 = true;
        disk.inner().cv.notify_all();
    });
    let log = disk.log();
    let e = log.entries();
    assert_eq!(
        (e[0].started, e[0].completed, e[1].started, e[1].completed),
        (0, 2, 1, 3)
    );
    let zero = vec![0u8; us(SIZE)];
    let w1 = with_sector(&zero, 0, &[0xaa; SECTOR]);
    let both = with_sector(&w1, 4096, &b);
    // At T = 3 W1 completed and W2 (FUA) was in flight: with or without it is fine.
    log.check_crash_state(&w1, CrashPoint::AtTime(3)).unwrap();
    log.check_crash_state(&both, CrashPoint::AtTime(3)).unwrap();
    // After both completed, the FUA write is required.
    assert!(log
        .check_crash_state(&w1, CrashPoint::AfterEntries(2))
        .is_err());
    // AfterEntries(1) is just after W1 completed: W2 had started, so it is in flight.
    log.check_crash_state(&both, CrashPoint::AfterEntries(1))
        .unwrap();
    // At T = 1 only W1 had started.
    log.check_crash_state(&zero, CrashPoint::AtTime(1)).unwrap();
    log.check_crash_state(&w1, CrashPoint::AtTime(1)).unwrap();
    assert!(log.check_crash_state(&both, CrashPoint::AtTime(1)).is_err());
    for t in 0..=clock.now() {
        for _ in 0..8 {
            let img = log.crash_image(&mut rand::thread_rng(), CrashPoint::AtTime(t));
            log.check_crash_state(&img, CrashPoint::AtTime(t)).unwrap();
        }
    }
}

#[test]
fn concurrent_writers_get_a_consistent_log() {
    let seed = test_seed("logwrites concurrent");
    let disk = LogWritesDisk::new(MemDisk::new(SIZE)).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let disk = &disk;
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ t);
                for _ in 0..300 {
                    // Overlapping ranges in a small window: order matters.
                    let blocks = rng.gen_range(1..=8u64);
                    let off = rng.gen_range(0..=64 - blocks) * 512;
                    match rng.gen_range(0..10) {
                        0 => disk.flush().unwrap(),
                        1 => disk
                            .write_zeroes(off, blocks * 512, WriteFlags::NONE)
                            .unwrap(),
                        _ => {
                            let data = random_bytes(&mut rng, us(blocks * 512));
                            let f = if rng.gen_bool(0.3) {
                                WriteFlags::FUA
                            } else {
                                WriteFlags::NONE
                            };
                            disk.write_at(&data, off, f).unwrap();
                        }
                    }
                }
            });
        }
    });
    let log = disk.log();
    assert_eq!(log.len(), 1200);
    assert!(
        log.image_after(log.len()) == disk.inner().to_vec(),
        "log order = applied order"
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..200 {
        let at = CrashPoint::AtTime(rng.gen_range(0..=disk.clock().now()));
        let img = log.crash_image(&mut rng, at);
        if let Err(v) = log.check_crash_state(&img, at) {
            panic!("seed {seed}: {v}");
        }
    }
}

// ---- crashing a stack -----------------------------------------------------------------

/// A two-way mirror, the smallest layer with members: writes go to both, reads to `a`.
/// `fua_to_a` false is a bug: FUA is not passed to the member reads are served from.
#[derive(Debug)]
struct Mirror {
    a: Box<dyn BlockDevice>,
    b: Box<dyn BlockDevice>,
    fua_to_a: bool,
}

impl BlockDevice for Mirror {
    fn geometry(&self) -> cairn_block::Geometry {
        self.a.geometry()
    }
    fn capabilities(&self) -> cairn_block::Capabilities {
        self.a.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.a.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let fa = if self.fua_to_a {
            flags
        } else {
            flags.without(WriteFlags::FUA)
        };
        self.a.write_at(buf, offset, fa)?;
        self.b.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.a.flush()?;
        self.b.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.a.discard(offset, len)?;
        self.b.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.a.write_zeroes(offset, len, flags)?;
        self.b.write_zeroes(offset, len, flags)
    }
}

/// Runs the recipe from the logwrites module docs; returns how many crash points failed
/// the top-level check.
fn crash_a_mirror(seed: u64, fua_to_a: bool) -> usize {
    let mut rng = SmallRng::seed_from_u64(seed);
    let clock = LogClock::new();
    let member = || {
        Arc::new(
            LogWritesDisk::with_options(MemDisk::new(SIZE), LogOptions::with_clock(&clock))
                .unwrap(),
        )
    };
    let (a, b) = (member(), member());
    let top = LogWritesDisk::with_options(
        Mirror {
            a: Box::new(a.clone()),
            b: Box::new(b.clone()),
            fua_to_a,
        },
        LogOptions {
            clock: Some(clock.clone()),
            discard: DiscardModel::Unspecified,
            initial: None,
        },
    )
    .unwrap();
    let mut model = vec![0u8; us(SIZE)];
    workload(&top, &mut model, &mut rng, 300);
    let (top_log, a_log, b_log) = (top.log(), a.log(), b.log());
    let mut failures = 0;
    for _ in 0..300 {
        let at = CrashPoint::AtTime(rng.gen_range(0..=clock.now()));
        let img_a = a_log.crash_image(&mut rng, at);
        let img_b = b_log.crash_image(&mut rng, at);
        a_log.check_crash_state(&img_a, at).unwrap();
        b_log.check_crash_state(&img_b, at).unwrap();
        let reopened = Mirror {
            a: Box::new(MemDisk::from_bytes(&img_a)),
            b: Box::new(MemDisk::from_bytes(&img_b)),
            fua_to_a,
        };
        let mut recovered = vec![0u8; us(SIZE)];
        reopened.read_at(&mut recovered, 0).unwrap();
        if top_log.check_crash_state(&recovered, at).is_err() {
            failures += 1;
        }
    }
    failures
}

#[test]
fn crashing_a_correct_stack_passes() {
    let seed = test_seed("logwrites stack");
    assert_eq!(
        crash_a_mirror(seed, true),
        0,
        "a correct mirror failed (seed {seed})"
    );
}

#[test]
fn crashing_a_buggy_stack_is_caught() {
    let seed = test_seed("logwrites buggy stack");
    assert!(
        crash_a_mirror(seed, false) > 0,
        "a mirror that drops FUA passed (seed {seed})"
    );
}

/// A layer that implements only read and write, so `write_zeroes` is the trait's
/// emulation (zero buffers written in chunks).
#[derive(Debug)]
struct ReadWriteOnly<D>(D);

impl<D: BlockDevice> BlockDevice for ReadWriteOnly<D> {
    fn geometry(&self) -> cairn_block::Geometry {
        self.0.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.0.write_at(buf, offset, flags)
    }
}

#[test]
fn emulated_fua_write_zeroes_is_durable_in_full() {
    let seed = test_seed("logwrites emulated write_zeroes");
    let mut rng = SmallRng::seed_from_u64(seed);
    let clock = LogClock::new();
    let size = 4u64 << 20;
    let member = Arc::new(
        LogWritesDisk::with_options(
            MemDisk::from_bytes(&random_bytes(&mut rng, us(size))),
            LogOptions::with_clock(&clock),
        )
        .unwrap(),
    );
    let top = LogWritesDisk::with_options(
        ReadWriteOnly(member.clone()),
        LogOptions::with_clock(&clock),
    )
    .unwrap();
    // More than one emulation chunk (1 MiB), acknowledged with FUA, no flush after.
    top.write_zeroes(0, 3 << 20, WriteFlags::FUA).unwrap();
    let at = CrashPoint::AtTime(clock.now());
    let (top_log, member_log) = (top.log(), member.log());
    assert!(
        member_log.len() > 1,
        "the emulation should write in several chunks"
    );
    for _ in 0..16 {
        let img = member_log.crash_image(&mut rng, at);
        if let Err(v) = top_log.check_crash_state(&img, at) {
            panic!("a FUA write_zeroes was not durable (seed {seed}): {v}");
        }
    }
}
