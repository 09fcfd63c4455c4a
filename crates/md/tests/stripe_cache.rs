//! The stripe cache over RAID4/5/6 arrays: the block layer's conformance suite through
//! it; concurrent sub-stripe writers merged into full-stripe writes that read nothing
//! from the members; lone and queue-depth-one writers never held; FLUSH and FUA drain
//! held stripes; reads see held bytes.

mod common;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use cairn_block::testkit::conformance::{run_with, Options};
use cairn_block::testkit::{DelayDisk, FaultyDisk};
use cairn_block::{BlockDevice, Geometry, MemDisk, Result, WriteFlags};
use cairn_md::{Array, AssembleOptions, Level, StripeCache, StripeCacheOptions};
use common::{create, us, Shape, KIB};
use rand::{Rng, SeedableRng};

fn cache_opts(hold_ms: u64) -> StripeCacheOptions {
    StripeCacheOptions {
        size: 256,
        hold: Duration::from_millis(hold_ms),
    }
}

/// The conformance suite on a fresh array of `shape` behind a stripe cache.
fn suite(shape: Shape) {
    eprintln!("conformance through the stripe cache: {}", shape.name());
    let make = move || -> Box<dyn BlockDevice> {
        let (a, members) = create(&shape);
        a.close().unwrap();
        drop(a);
        let devs = common::dyn_members(&members);
        let a = Array::assemble(
            devs,
            common::names(members.len()),
            AssembleOptions::default(),
        )
        .unwrap();
        Box::new(StripeCache::new(Arc::new(a), cache_opts(2)))
    };
    run_with(
        &make,
        &Options {
            random_ops: 600,
            ..Options::default()
        },
    );
}

#[test]
fn conformance_raid4_raid5() {
    suite(Shape::new(Level::Raid4, None, 16, 3).rows(24));
    suite(Shape::new(Level::Raid5, None, 16, 4).rows(24));
}

#[test]
fn conformance_raid6() {
    suite(Shape::new(Level::Raid6, None, 16, 5).rows(24));
}

/// An array of `shape` on counting members (FaultyDisk counts every op).
fn counted(shape: &Shape) -> (Arc<Array>, Vec<Arc<FaultyDisk<MemDisk>>>) {
    let members: Vec<Arc<FaultyDisk<MemDisk>>> = shape
        .member_bytes()
        .into_iter()
        .map(|b| Arc::new(FaultyDisk::new(MemDisk::new(b))))
        .collect();
    let devs = members
        .iter()
        .map(|m| m.clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = Array::create(devs, common::names(members.len()), &shape.create_options()).unwrap();
    (Arc::new(a), members)
}

fn member_reads(members: &[Arc<FaultyDisk<MemDisk>>]) -> u64 {
    members.iter().map(|m| m.handle().stats().reads).sum()
}

fn reset(members: &[Arc<FaultyDisk<MemDisk>>]) {
    for m in members {
        m.handle().reset_stats();
    }
}

/// Four threads each write one 64 KiB quarter of every 256 KiB stripe, in stripe order:
/// the pieces meet in the cache and go out as full-stripe writes, which read nothing
/// from the members. The data reads back as a model says.
#[test]
fn concurrent_quarters_merge_into_full_stripes() {
    for level in [Level::Raid5, Level::Raid6] {
        let members = if level == Level::Raid6 { 6 } else { 5 };
        let shape = Shape::new(level, None, 64, members).rows(32);
        let (array, disks) = counted(&shape);
        // A long hold: the machine may be busy, and the point is the merge, not timing.
        let stripe = u64::from(
            StripeCache::new(array.clone(), cache_opts(200))
                .geometry()
                .optimal_io_size,
        );
        assert_eq!(stripe, 256 * KIB);
        let stripes = array.geometry().size / stripe;
        let piece = stripe / 4;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let model: Vec<u8> = (0..us(stripes * stripe)).map(|_| rng.gen()).collect();
        // Holding needs writers that overlap in time. On a loaded machine (CI runs the
        // other tests beside this one) the four threads may run one after another and
        // rightly merge nothing: up to three rounds, each with a fresh cache, the same
        // data and fresh counters.
        let mut round = 0;
        let (cache, st, reads) = loop {
            let cache = StripeCache::new(array.clone(), cache_opts(200));
            reset(&disks);
            // Started together: a thread that ran alone would rightly not be held.
            let start = Barrier::new(4);
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let (cache, model, start) = (&cache, &model, &start);
                    s.spawn(move || {
                        start.wait();
                        for j in 0..stripes {
                            let off = j * stripe + t * piece;
                            cache
                                .write_at(&model[us(off)..us(off + piece)], off, WriteFlags::NONE)
                                .unwrap();
                        }
                    });
                }
            });
            let st = cache.stats();
            let reads = member_reads(&disks);
            eprintln!("{level}, round {round}: {st:?}, member reads {reads}");
            round += 1;
            if st.merged_stripes >= stripes / 4 || round == 3 {
                break (cache, st, reads);
            }
        };
        // Most merge on a quiet machine (31 of 32: the first stripe has no stream before
        // it); a loaded one lets the threads drift apart for a while.
        assert!(
            st.merged_stripes >= stripes / 4,
            "{level}: only {} of {stripes} stripes merged: {st:?}",
            st.merged_stripes
        );
        // Only the pieces that were not merged may read (a read-modify-write reads at
        // most one piece from each member).
        let unmerged = st.passed_through + st.expired_pieces;
        assert!(
            reads <= unmerged * members as u64,
            "{level}: {reads} member reads for {unmerged} unmerged pieces: {st:?}"
        );
        assert_eq!(st.merged_pieces, 4 * st.merged_stripes);
        cache.flush().unwrap();
        assert_eq!(common::read_all(&cache), model, "{level}: data read back");
        assert_eq!(common::read_all(&*array), model, "{level}: below the cache");
    }
}

/// One writer at queue depth one (sequential, sub-stripe) and a lone random 4 KiB write
/// are never held: nothing could join them.
#[test]
fn lone_writes_go_straight_through() {
    let (array, _disks) = counted(&Shape::new(Level::Raid5, None, 64, 5).rows(16));
    let hold = Duration::from_millis(400);
    let cache = StripeCache::new(array, StripeCacheOptions { size: 256, hold });
    let data = vec![0xa5u8; 64 << 10];
    let started = Instant::now();
    for i in 0..16u64 {
        cache
            .write_at(&data, i * (64 << 10), WriteFlags::NONE)
            .unwrap();
    }
    let t = Instant::now();
    cache
        .write_at(&data[..4096], 3 << 20, WriteFlags::NONE)
        .unwrap();
    let lone = t.elapsed();
    let st = cache.stats();
    assert_eq!(st.held_pieces, 0, "{st:?}");
    assert!(lone < hold / 2, "a lone 4 KiB write took {lone:?}");
    assert!(
        started.elapsed() < hold,
        "16 sequential writes took {:?}",
        started.elapsed()
    );
    assert_eq!(st.passed_through, 17);
}

/// Lets writes into `range` through only when opened: keeps one writer inside the cache
/// for as long as a test needs.
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn BlockDevice>,
    range: Range<u64>,
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl BlockDevice for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if self.range.contains(&offset) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.cv.wait(open).unwrap();
            }
        }
        self.inner.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

/// Holds a 64 KiB piece at the start of stripe `s` on another thread: a writer is kept
/// inside the cache (blocked below it at the last stripe) and stripe `s - 1` was just
/// written, which is a stream. Returns when the piece is held.
fn hold_piece<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    cache: &'s StripeCache,
    s: u64,
    data: &'s [u8],
) -> std::thread::ScopedJoinHandle<'s, (Result<()>, Instant)> {
    let stripe = u64::from(cache.geometry().optimal_io_size);
    let before = cache.stats().held_pieces;
    cache
        .write_at(&data[..4096], s * stripe - 4096, WriteFlags::NONE)
        .unwrap();
    let h = scope.spawn(move || {
        let r = cache.write_at(data, s * stripe, WriteFlags::NONE);
        (r, Instant::now())
    });
    let t = Instant::now();
    while cache.stats().held_pieces == before {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the piece was not held"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    h
}

/// A held write is seen by reads, and FLUSH or a FUA write to its stripe writes it out
/// at once (long before its hold time).
#[test]
fn flush_and_fua_drain_and_reads_see_held_bytes() {
    let (array, _disks) = counted(&Shape::new(Level::Raid6, None, 64, 6).rows(16));
    let size = array.geometry().size;
    let gate = Arc::new(Gate {
        inner: array.clone(),
        range: size - 4096..size,
        open: Mutex::new(false),
        cv: Condvar::new(),
    });
    let hold = Duration::from_secs(30);
    let cache = StripeCache::new(gate.clone(), StripeCacheOptions { size: 256, hold });
    let stripe = u64::from(cache.geometry().optimal_io_size);
    let new = vec![0x5au8; 64 << 10];
    let fua_piece = vec![0x3cu8; 64 << 10];
    let blocked_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The writer kept inside the cache: a lone piece, passed straight on, blocked.
        let blocked = s.spawn(|| {
            let r = cache.write_at(&[1u8; 4096], size - 4096, WriteFlags::NONE);
            blocked_done.store(true, Ordering::SeqCst);
            r
        });
        let t = Instant::now();
        while cache.stats().passed_through == 0 {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }

        // FLUSH.
        let h = hold_piece(s, &cache, 2, &new);
        let mut got = vec![0u8; 64 << 10];
        cache.read_at(&mut got, 2 * stripe).unwrap();
        assert_eq!(got, new, "a read of a held range sees the held bytes");
        let mut below = vec![0u8; 64 << 10];
        array.read_at(&mut below, 2 * stripe).unwrap();
        assert_ne!(below, new, "held, so not yet written below");
        let flushed = Instant::now();
        cache.flush().unwrap();
        let (r, done) = h.join().unwrap();
        r.unwrap();
        assert!(done.duration_since(flushed) < hold / 10);
        array.read_at(&mut below, 2 * stripe).unwrap();
        assert_eq!(below, new, "written below by the flush");
        assert_eq!(cache.stats().expired_pieces, 1);

        // FUA to the same stripe.
        let h = hold_piece(s, &cache, 5, &new);
        let t = Instant::now();
        cache
            .write_at(&fua_piece, 5 * stripe + (128 << 10), WriteFlags::FUA)
            .unwrap();
        let (r, _) = h.join().unwrap();
        r.unwrap();
        assert!(t.elapsed() < hold / 10);
        let mut got = vec![0u8; 192 << 10];
        array.read_at(&mut got, 5 * stripe).unwrap();
        assert_eq!(&got[..64 << 10], &new[..]);
        assert_eq!(&got[128 << 10..], &fua_piece[..]);

        assert!(!blocked_done.load(Ordering::SeqCst));
        gate.release();
        blocked.join().unwrap().unwrap();
    });
    let st = cache.stats();
    assert_eq!(st.held_pieces, 3, "{st:?}");
    assert_eq!(st.merged_stripes, 0, "{st:?}");
}

/// Two concurrent halves of one stripe, with another writer present: one full-stripe
/// write, no member reads, and the waiter that arrived first gets the merged result.
#[test]
fn halves_of_a_stripe_meet() {
    let shape = Shape::new(Level::Raid5, None, 64, 3).rows(16);
    let (array, disks) = counted(&shape);
    let cache = StripeCache::new(array.clone(), cache_opts(1000));
    let stripe = u64::from(cache.geometry().optimal_io_size);
    assert_eq!(stripe, 128 * KIB);
    let a = vec![0x11u8; 64 << 10];
    let b = vec![0x22u8; 64 << 10];
    let barrier = Barrier::new(2);
    // Stripe 3 after 2: a stream, and both halves in flight together.
    cache
        .write_at(&a, 2 * stripe + (64 << 10), WriteFlags::NONE)
        .unwrap();
    reset(&disks);
    let t = Instant::now();
    std::thread::scope(|s| {
        for (k, d) in [&a, &b].into_iter().enumerate() {
            let (cache, barrier) = (&cache, &barrier);
            s.spawn(move || {
                barrier.wait();
                cache
                    .write_at(d, 3 * stripe + k as u64 * (64 << 10), WriteFlags::NONE)
                    .unwrap();
            });
        }
    });
    let st = cache.stats();
    // Both threads might not be inside the cache together (the first may pass on
    // before the second arrives); then the stripe is not merged. Either way the data
    // is right, and a merge reads nothing and waits for no timer.
    eprintln!("{st:?} in {:?}", t.elapsed());
    if st.merged_stripes == 1 {
        assert_eq!(st.merged_pieces, 2, "{st:?}");
        assert_eq!(
            member_reads(&disks),
            0,
            "a merged full stripe reads nothing"
        );
        assert!(t.elapsed() < Duration::from_millis(900));
    }
    let mut got = vec![0u8; us(stripe)];
    array.read_at(&mut got, 3 * stripe).unwrap();
    assert_eq!(&got[..64 << 10], &a[..]);
    assert_eq!(&got[64 << 10..], &b[..]);
}

/// After concurrent writers taught the cache to hold streams, one writer at queue depth
/// one (whose next write only comes after this one returns) costs at most two timed-out
/// holds before the cache stops holding for it.
#[test]
fn holding_stops_when_it_stops_paying() {
    let shape = Shape::new(Level::Raid5, None, 64, 5).rows(64);
    let (array, _disks) = counted(&shape);
    let hold = Duration::from_millis(50);
    // Teaching needs writers that overlap in time; on a loaded machine the four threads
    // may run one after another and merge nothing, so up to three rounds, each with a
    // fresh cache.
    let mut round = 0;
    let (cache, stripe, piece, data, taught) = loop {
        let cache = StripeCache::new(array.clone(), StripeCacheOptions { size: 256, hold });
        let stripe = u64::from(cache.geometry().optimal_io_size);
        let piece = stripe / 4;
        let data = vec![0x77u8; us(piece)];
        let start = Barrier::new(4);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (cache, data, start) = (&cache, &data, &start);
                s.spawn(move || {
                    start.wait();
                    for j in 0..48 {
                        let off = j * stripe + t * piece;
                        cache.write_at(data, off, WriteFlags::NONE).unwrap();
                    }
                });
            }
        });
        let taught = cache.stats();
        round += 1;
        if taught.merged_stripes >= 1 || round == 3 {
            break (cache, stripe, piece, data, taught);
        }
    };
    assert!(taught.merged_stripes >= 1, "{taught:?}");
    let t = Instant::now();
    for i in 0..4 * 16 {
        let off = 48 * stripe + i * piece;
        cache.write_at(&data, off, WriteFlags::NONE).unwrap();
    }
    let st = cache.stats();
    let expired = st.expired_pieces - taught.expired_pieces;
    assert!(expired <= 2, "{expired} timed-out holds: {st:?}");
    assert!(
        t.elapsed() < hold * 2 + Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

/// Random 4 KiB writes from several threads at once are seldom held: they rarely start a
/// stripe or end the one before, which is what a stream looks like.
///
/// How many random writes fall inside the stream window is what decides it, so the
/// members take 1 ms per operation: the window (at least four writes' time below, which
/// is then longer than the 2 ms hold) spans the same few writes per writer in any build,
/// rather than a count of writes that depends on how fast memory is copied (a release
/// build on memory members fits some hundred writes into the hold time).
#[test]
fn concurrent_random_writes_are_seldom_held() {
    let shape = Shape::new(Level::Raid5, None, 64, 3).rows(256);
    let members: Vec<Arc<DelayDisk>> = shape
        .member_bytes()
        .into_iter()
        .map(|b| Arc::new(DelayDisk::new(Arc::new(MemDisk::new(b)))))
        .collect();
    let devs = members
        .iter()
        .map(|m| m.clone() as Arc<dyn BlockDevice>)
        .collect();
    let array = Array::create(devs, common::names(members.len()), &shape.create_options()).unwrap();
    for m in &members {
        m.set_delay(Duration::from_millis(1));
    }
    let cache = StripeCache::new(Arc::new(array), cache_opts(2));
    let blocks = cache.geometry().size / 4096;
    let start = Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (cache, start) = (&cache, &start);
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let data = vec![u8::try_from(t).unwrap(); 4096];
                start.wait();
                for _ in 0..500 {
                    let off = rng.gen_range(0..blocks) * 4096;
                    cache.write_at(&data, off, WriteFlags::NONE).unwrap();
                }
            });
        }
    });
    let st = cache.stats();
    eprintln!("{st:?}");
    assert!(st.held_pieces <= 40, "{st:?}");
    assert_eq!(st.held_pieces + st.passed_through, 2000, "{st:?}");
}
