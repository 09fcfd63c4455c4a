//! The stripe cache: partial-stripe writes from concurrent writers merged into
//! full-stripe writes, so that parity is computed from the new data with no reads.
//!
//! ```text
//!   NBD workers (concurrent writes) ──► StripeCache ──► Array (stripe.rs)
//!     piece covers a whole stripe ───────── straight on ──► full-stripe write, no reads
//!     partial piece, lone (no stream) ───── straight on ──► read-modify-write
//!     partial piece, a stream is running ── held: its caller blocks ──┐
//!         held pieces cover the stripe ──── one merged write ─────────┼► full-stripe write
//!         hold time / size limit / FLUSH / FUA / discard ─ pieces as they are ─► RMW per run
//!     every caller returns the result of the write that carried its bytes
//! ```
//!
//! Nothing is acknowledged before it has been written below: a held write's caller waits
//! until the write that carries its bytes returns. That keeps the project's durability
//! contract (an acknowledged write survives a kill of the process) while still turning
//! two half-stripe writes that arrive together into one full-stripe write, which is what
//! md's `stripe_cache_size` buys a sequential writer on Linux.
//!
//! Holding only pays when a neighbour is coming, so a piece is held only when
//! * no part of this stripe went below unheld lately (it would never be completed), and
//! * a stream runs into it: the stripe before is held or a write reached its end within
//!   the hold time (or, for a piece that starts the stripe, it was written at all), and
//! * another write is inside the cache at that moment, or (for the stronger signs of a
//!   stream) holding has been paying off lately: a confidence that merged stripes raise
//!   and timed-out holds cut, since an NBD server's workers spend most of their time
//!   reading requests, not inside the device.
//!
//! A lone random write, and a writer at queue depth one once holds stop paying, go
//! straight through with no added latency.
//!
//! The size limit is md's unit: `size` stripe heads of one 4 KiB page per member, so a
//! held stripe of chunk `C` costs `C / 4 KiB` of them and at most `size × 4 KiB / C`
//! stripes are held at once (256 and a 64 KiB chunk: 16 stripes). When that is reached,
//! the oldest held stripe is written out and new pieces pass straight on.
//!
//! Reads see held bytes: they read below and lay the held pieces over the result.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, Capabilities, Error, Extent, Geometry, Result, WriteFlags};

use crate::units::{small, wide};

/// md's default `stripe_cache_size`, in stripe heads (one 4 KiB page per member each).
pub const DEFAULT_STRIPE_CACHE_SIZE: u32 = 256;
/// How long a partial-stripe write waits for its neighbours by default.
pub const DEFAULT_HOLD: Duration = Duration::from_millis(2);
/// md's page per member per stripe head.
const STRIPE_HEAD_BYTES: u64 = 4096;
/// Writes that arrived longer ago than this (or the hold time, if longer) start no
/// stream.
const MIN_STREAM_WINDOW: Duration = Duration::from_millis(1);
/// Confidence gained per merged stripe, its ceiling, and what a hold that ran out of
/// time costs: after two such holds in a row only concurrency starts a hold again.
const CONFIDENCE_GAIN: u32 = 1;
const CONFIDENCE_MAX: u32 = 16;
const CONFIDENCE_LOSS: u32 = 8;
/// The stream window is at least this many writes' time below.
const STREAM_WRITES: u32 = 4;
/// The arrival table is pruned of old entries when it grows past this.
const RECENT_PRUNE: usize = 1024;

/// Tunables of a [`StripeCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeCacheOptions {
    /// md's `stripe_cache_size`: stripe heads of one 4 KiB page per member. 0 disables
    /// holding (every write passes straight on).
    pub size: u32,
    /// The longest a partial-stripe write is held waiting for its neighbours.
    pub hold: Duration,
}

impl Default for StripeCacheOptions {
    fn default() -> Self {
        StripeCacheOptions {
            size: DEFAULT_STRIPE_CACHE_SIZE,
            hold: DEFAULT_HOLD,
        }
    }
}

/// What the cache has done since it was made, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StripeCacheStats {
    /// Full-stripe writes made of held pieces (no reads below).
    pub merged_stripes: u64,
    /// Pieces of writes that went out inside those merged full-stripe writes.
    pub merged_pieces: u64,
    /// Partial-stripe pieces sent straight on without being held.
    pub passed_through: u64,
    /// Held pieces written as they were (hold time, size limit, FLUSH, FUA, discard).
    pub expired_pieces: u64,
    /// Pieces that were held at all.
    pub held_pieces: u64,
    /// Total time pieces spent held before their write started, in nanoseconds.
    pub held_ns: u64,
}

#[derive(Debug, Default)]
struct Counters {
    merged_stripes: AtomicU64,
    merged_pieces: AtomicU64,
    passed_through: AtomicU64,
    expired_pieces: AtomicU64,
    held_pieces: AtomicU64,
    held_ns: AtomicU64,
}

/// One stripe's held pieces, merged into a stripe-sized buffer.
struct Held {
    id: u64,
    created: Instant,
    deadline: Instant,
    buf: Vec<u8>,
    /// Covered in-stripe byte ranges, sorted and merged.
    runs: Vec<(u64, u64)>,
    fua: bool,
    /// Pieces (one caller each) waiting for this stripe's write.
    pieces: u64,
    /// Sum over pieces of (arrival - created), for the held-time counter.
    arrivals_ns: u64,
}

/// The result of a held stripe's write(s), kept until every piece's caller has taken it.
struct Outcome {
    runs: Vec<(u64, u64, Option<Arc<Error>>)>,
    left: u64,
}

#[derive(Default)]
struct State {
    held: HashMap<u64, Held>,
    outcomes: HashMap<u64, Outcome>,
    /// Recent writes, by stripe: the stream detector.
    recent: HashMap<u64, Recent>,
    next_id: u64,
    /// How well holding has paid lately: up on each merged stripe, down sharply on each
    /// hold that ran out of time. While it is above zero, a stream is held even when no
    /// other write is inside the cache at that instant (an NBD server's workers spend
    /// most of their time reading requests, not inside the device).
    confidence: u32,
}

/// What the stream detector remembers of a stripe.
#[derive(Debug, Clone, Copy)]
struct Recent {
    /// The last write that touched it (for pruning).
    seen: Instant,
    /// When a write last reached its end: the next stripe's pieces are then a stream's.
    reached_end: Option<Instant>,
    /// When part of it last went below without being held (passed on, or a held stripe
    /// written partially): holding its other pieces cannot make a full stripe.
    broken: Option<Instant>,
}

/// A piece a caller waits for: held as entry `id` of `stripe`, in-stripe bytes `[a, b)`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    stripe: u64,
    a: u64,
    b: u64,
}

/// A [`BlockDevice`] over a RAID4/5/6 array (any device whose `optimal_io_size` is the
/// full data stripe) that merges concurrent partial-stripe writes into full-stripe
/// writes. See the module documentation.
pub struct StripeCache {
    inner: Arc<dyn BlockDevice>,
    geometry: Geometry,
    stripe: u64,
    max_held: usize,
    hold: Duration,
    state: Mutex<State>,
    cond: Condvar,
    /// `state.held.len()`, readable without the lock (reads skip the overlay when 0).
    held_count: AtomicUsize,
    /// Writes inside `write_at` now (held or not): the "a neighbour may come" signal.
    writers: AtomicUsize,
    /// Moving average of a write below, in nanoseconds.
    write_ns: AtomicU64,
    counters: Counters,
}

impl fmt::Debug for StripeCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripeCache")
            .field("inner", &self.inner)
            .field("stripe", &self.stripe)
            .field("max_held", &self.max_held)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

/// Decrements the writer count however `write_at` ends.
struct WriterGuard<'a>(&'a StripeCache);

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.0.writers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Carries a shared error to each caller whose bytes were in the failed write.
#[derive(Debug)]
struct Shared(Arc<Error>);

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Shared {}

impl StripeCache {
    /// Wraps `inner`. Its geometry gives the stripe (`optimal_io_size`, the full data
    /// stripe) and the chunk (`physical_block_size`), which turns `opts.size` (md's
    /// stripe heads) into a number of held stripes.
    pub fn new(inner: Arc<dyn BlockDevice>, opts: StripeCacheOptions) -> StripeCache {
        let geometry = inner.geometry();
        let stripe = u64::from(geometry.optimal_io_size);
        let chunk = u64::from(geometry.physical_block_size).max(STRIPE_HEAD_BYTES);
        let lbs = u64::from(geometry.logical_block_size);
        // A stripe that no single request may cover, or one block long, has nothing to
        // merge: hold nothing.
        let usable = stripe > lbs && stripe <= u64::from(geometry.max_io_size);
        let max_held = if opts.size == 0 || !usable {
            0
        } else {
            usize::try_from((u64::from(opts.size) * STRIPE_HEAD_BYTES / chunk).max(1))
                .unwrap_or(usize::MAX)
        };
        StripeCache {
            inner,
            geometry,
            stripe,
            max_held,
            hold: opts.hold,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            held_count: AtomicUsize::new(0),
            writers: AtomicUsize::new(0),
            write_ns: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    /// The device below.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// How many stripes may be held at once (0: the cache holds nothing).
    pub fn max_held_stripes(&self) -> usize {
        self.max_held
    }

    pub fn stats(&self) -> StripeCacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StripeCacheStats {
            merged_stripes: get(&c.merged_stripes),
            merged_pieces: get(&c.merged_pieces),
            passed_through: get(&c.passed_through),
            expired_pieces: get(&c.expired_pieces),
            held_pieces: get(&c.held_pieces),
            held_ns: get(&c.held_ns),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How recent a write to the stripe before must be to count as a stream: the hold
    /// time, but at least a few writes' time below, since on slow members a stream's
    /// writes arrive that far apart.
    fn stream_window(&self) -> Duration {
        let below = Duration::from_nanos(self.write_ns.load(Ordering::Relaxed))
            .saturating_mul(STREAM_WRITES);
        self.hold.max(MIN_STREAM_WINDOW).max(below)
    }

    /// Writes below, keeping a moving average of how long that takes.
    fn write_below(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let t = Instant::now();
        let r = self.inner.write_at(buf, offset, flags);
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // A lost update between two writers only skews the average a little.
        let old = self.write_ns.load(Ordering::Relaxed);
        self.write_ns
            .store(old - old / 8 + ns / 8, Ordering::Relaxed);
        r
    }

    /// Whether a new partial piece in `stripe` is worth holding. Never when part of
    /// this stripe went below unheld lately (that part would not come again). Otherwise
    /// when a stream runs into it: the stripe before is held or a write reached its end
    /// within the hold time, and another write is in the cache now or holding has been
    /// paying off; or, more weakly, the piece starts the stripe, the stripe before was
    /// written within the hold time and another write is in the cache now (random
    /// writes seldom start a stripe, so they are seldom held).
    fn should_hold(&self, st: &State, stripe: u64, a: u64, now: Instant) -> bool {
        let window = self.stream_window();
        let fresh = |t: Instant| now.saturating_duration_since(t) <= window;
        if st
            .recent
            .get(&stripe)
            .and_then(|r| r.broken)
            .is_some_and(fresh)
        {
            return false;
        }
        let Some(prev) = stripe.checked_sub(1) else {
            return false;
        };
        let recent = st.recent.get(&prev);
        let strong =
            st.held.contains_key(&prev) || recent.and_then(|r| r.reached_end).is_some_and(fresh);
        let weak = a == 0 && recent.is_some_and(|r| fresh(r.seen));
        let others = self.writers.load(Ordering::Relaxed) > 1;
        (strong && (others || st.confidence > 0)) || (weak && others)
    }

    /// Records a write touching `stripe` up to in-stripe byte `end`; `broken` when part
    /// of it went below unheld.
    fn note(&self, st: &mut State, stripe: u64, end: u64, now: Instant, broken: bool) {
        let r = st.recent.entry(stripe).or_insert(Recent {
            seen: now,
            reached_end: None,
            broken: None,
        });
        r.seen = now;
        if end == self.stripe {
            r.reached_end = Some(now);
        }
        if broken {
            r.broken = Some(now);
        }
        if st.recent.len() > RECENT_PRUNE {
            let window = self.stream_window();
            st.recent
                .retain(|_, r| now.saturating_duration_since(r.seen) <= window);
        }
    }

    /// Writes a held stripe below (one full-stripe write when it is covered, else one
    /// write per run) and publishes the outcome to its waiters.
    fn issue(&self, stripe: u64, h: Held) {
        let base = stripe * self.stripe;
        let flags = if h.fua {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        let started = Instant::now();
        let held_ns = u64::try_from(started.saturating_duration_since(h.created).as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(h.pieces)
            .saturating_sub(h.arrivals_ns);
        self.counters.held_ns.fetch_add(held_ns, Ordering::Relaxed);
        let full = h.runs == [(0, self.stripe)];
        if !full {
            // Before writing: pieces arriving meanwhile must not wait for the rest.
            self.note(&mut self.lock(), stripe, 0, started, true);
        }
        if full {
            self.counters.merged_stripes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .merged_pieces
                .fetch_add(h.pieces, Ordering::Relaxed);
        } else {
            self.counters
                .expired_pieces
                .fetch_add(h.pieces, Ordering::Relaxed);
        }
        let runs = h
            .runs
            .iter()
            .map(|&(a, b)| {
                let r = self.write_below(&h.buf[small(a)..small(b)], base + a, flags);
                (a, b, r.err().map(Arc::new))
            })
            .collect();
        let mut st = self.lock();
        if full {
            st.confidence = (st.confidence + CONFIDENCE_GAIN).min(CONFIDENCE_MAX);
        }
        st.outcomes.insert(
            h.id,
            Outcome {
                runs,
                left: h.pieces,
            },
        );
        drop(st);
        self.cond.notify_all();
    }

    /// Takes the held stripes in `stripes` out of the table (they are written by the
    /// caller with [`StripeCache::issue`]).
    fn take(&self, st: &mut State, stripes: impl Iterator<Item = u64>) -> Vec<(u64, Held)> {
        let out: Vec<(u64, Held)> = stripes
            .filter_map(|s| st.held.remove(&s).map(|h| (s, h)))
            .collect();
        self.held_count.store(st.held.len(), Ordering::Release);
        out
    }

    /// Writes out every held stripe that overlaps `[off, off + len)`.
    fn drain_range(&self, off: u64, len: u64) {
        if self.held_count.load(Ordering::Acquire) == 0 || len == 0 {
            return;
        }
        let (first, last) = (off / self.stripe, (off + len - 1) / self.stripe);
        let taken = {
            let mut st = self.lock();
            if (last - first) < wide(st.held.len()) {
                self.take(&mut st, first..=last)
            } else {
                let keys: Vec<u64> = st
                    .held
                    .keys()
                    .copied()
                    .filter(|s| (first..=last).contains(s))
                    .collect();
                self.take(&mut st, keys.into_iter())
            }
        };
        for (s, h) in taken {
            self.issue(s, h);
        }
    }

    /// The result for piece `p` from its stripe's outcome.
    fn result_of(o: &Outcome, p: &Pending, stripe_bytes: u64) -> Result<()> {
        let run = o
            .runs
            .iter()
            .find(|&&(a, b, _)| a <= p.a && p.b <= b)
            .expect("a held piece lies inside one written run");
        match &run.2 {
            None => Ok(()),
            Some(e) => Err(Error::new(
                e.kind(),
                format!(
                    "stripe cache: write of {} bytes at {}",
                    p.b - p.a,
                    p.stripe * stripe_bytes + p.a
                ),
            )
            .with_source(Shared(e.clone()))),
        }
    }

    /// Waits until every piece in `pending` has been written, writing out any held
    /// stripe whose hold time has passed; returns the first error among them.
    fn wait_all(&self, mut pending: Vec<Pending>) -> Result<()> {
        let mut first_err = None;
        let mut st = self.lock();
        while !pending.is_empty() {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            let mut expired = None;
            let mut i = 0;
            while i < pending.len() {
                let p = pending[i];
                if let Some(o) = st.outcomes.get_mut(&p.id) {
                    let r = Self::result_of(o, &p, self.stripe);
                    o.left -= 1;
                    if o.left == 0 {
                        st.outcomes.remove(&p.id);
                    }
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                    pending.swap_remove(i);
                    continue;
                }
                if let Some(h) = st.held.get(&p.stripe).filter(|h| h.id == p.id) {
                    if h.deadline <= now {
                        expired.get_or_insert(p.stripe);
                    } else {
                        next = Some(next.map_or(h.deadline, |n| n.min(h.deadline)));
                    }
                }
                // Otherwise another thread is writing it; its outcome wakes us.
                i += 1;
            }
            if let Some(s) = expired {
                st.confidence = st.confidence.saturating_sub(CONFIDENCE_LOSS);
                let taken = self.take(&mut st, std::iter::once(s));
                drop(st);
                for (s, h) in taken {
                    self.issue(s, h);
                }
                st = self.lock();
                continue;
            }
            if pending.is_empty() {
                break;
            }
            st = match next {
                Some(d) => {
                    self.cond
                        .wait_timeout(st, d.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self.cond.wait(st).unwrap_or_else(PoisonError::into_inner),
            };
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl BlockDevice for StripeCache {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        if self.held_count.load(Ordering::Acquire) == 0 || buf.is_empty() {
            return Ok(());
        }
        // Held bytes are newer than anything below: lay them over what was read. They
        // are still held now, so they have not reached the device since the read.
        let end = offset + wide(buf.len());
        let st = self.lock();
        for s in offset / self.stripe..=(end - 1) / self.stripe {
            let Some(h) = st.held.get(&s) else { continue };
            let base = s * self.stripe;
            for &(a, b) in &h.runs {
                let (lo, hi) = ((base + a).max(offset), (base + b).min(end));
                if lo < hi {
                    buf[small(lo - offset)..small(hi - offset)]
                        .copy_from_slice(&h.buf[small(lo - base)..small(hi - base)]);
                }
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if self.max_held == 0 || buf.is_empty() {
            return self.inner.write_at(buf, offset, flags);
        }
        let fua = flags.fua();
        let now = Instant::now();
        let mut pending = Vec::new();
        let mut issue_now = Vec::new();
        // Runs of the buffer that go straight on: (buffer start, buffer end).
        let mut direct: Vec<(usize, usize)> = Vec::new();
        self.writers.fetch_add(1, Ordering::Relaxed);
        let _writer = WriterGuard(self);
        let mut st = self.lock();
        let end = offset + wide(buf.len());
        let mut pos = offset;
        while pos < end {
            let s = pos / self.stripe;
            let base = s * self.stripe;
            let (a, b) = (pos - base, (end - base).min(self.stripe));
            let piece = &buf[small(pos - offset)..small(base + b - offset)];
            pos = base + b;
            let partial = b - a < self.stripe;
            let joined = st.held.contains_key(&s);
            let create = !joined && partial && !fua && self.should_hold(&st, s, a, now) && {
                if st.held.len() < self.max_held {
                    true
                } else {
                    // Full: the oldest held stripe goes out now (its waiters write it)
                    // and this piece passes on.
                    if let Some(h) = st.held.values_mut().min_by_key(|h| h.created) {
                        h.deadline = now;
                    }
                    self.cond.notify_all();
                    false
                }
            };
            self.note(&mut st, s, b, now, partial && !joined && !create);
            if !joined && !create {
                // Straight on: whole stripes, FUA pieces with nothing held, lone pieces.
                if partial {
                    self.counters.passed_through.fetch_add(1, Ordering::Relaxed);
                }
                let (lo, hi) = (small(base + a - offset), small(base + b - offset));
                match direct.last_mut() {
                    Some(last) if last.1 == lo => last.1 = hi,
                    _ => direct.push((lo, hi)),
                }
                continue;
            }
            self.counters.held_pieces.fetch_add(1, Ordering::Relaxed);
            if create {
                let id = st.next_id;
                st.next_id += 1;
                st.held.insert(
                    s,
                    Held {
                        id,
                        created: now,
                        deadline: now + self.hold,
                        buf: vec![0u8; small(self.stripe)],
                        runs: Vec::new(),
                        fua: false,
                        pieces: 0,
                        arrivals_ns: 0,
                    },
                );
                self.held_count.store(st.held.len(), Ordering::Release);
            }
            let h = st.held.get_mut(&s).expect("just inserted or found");
            h.buf[small(a)..small(b)].copy_from_slice(piece);
            add_run(&mut h.runs, a, b);
            h.pieces += 1;
            h.arrivals_ns = h.arrivals_ns.saturating_add(
                u64::try_from(now.saturating_duration_since(h.created).as_nanos())
                    .unwrap_or(u64::MAX),
            );
            h.fua |= fua;
            pending.push(Pending {
                id: h.id,
                stripe: s,
                a,
                b,
            });
            // Covered, or a FUA piece that must not wait: write it now.
            if h.runs == [(0, self.stripe)] || fua {
                issue_now.extend(self.take(&mut st, std::iter::once(s)));
            }
        }
        drop(st);
        for (s, h) in issue_now {
            self.issue(s, h);
        }
        let mut first_err = None;
        for (lo, hi) in direct {
            if let Err(e) = self.write_below(&buf[lo..hi], offset + wide(lo), flags) {
                first_err.get_or_insert(e);
            }
        }
        let waited = self.wait_all(pending);
        match (first_err, waited) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        if self.held_count.load(Ordering::Acquire) > 0 {
            let taken = {
                let mut st = self.lock();
                let keys: Vec<u64> = st.held.keys().copied().collect();
                self.take(&mut st, keys.into_iter())
            };
            for (s, h) in taken {
                self.issue(s, h);
            }
        }
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.drain_range(offset, len);
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.drain_range(offset, len);
        self.inner.write_zeroes(offset, len, flags)
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.drain_range(offset, len);
        self.inner.extents(offset, len)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.cache(offset, len)
    }
}

impl Drop for StripeCache {
    /// Says what the cache did, once, when the export closes.
    fn drop(&mut self) {
        let st = self.stats();
        if st.held_pieces + st.passed_through > 0 {
            tracing::info!(
                "stripe cache: {} full-stripe writes merged from {} pieces; {} partial-stripe \
                 pieces passed straight on, {} written partially after holding; {:.1} ms held \
                 in all",
                st.merged_stripes,
                st.merged_pieces,
                st.passed_through,
                st.expired_pieces,
                Duration::from_nanos(st.held_ns).as_secs_f64() * 1e3
            );
        }
    }
}

/// Adds `[a, b)` to sorted, merged `runs`, merging what it touches.
fn add_run(runs: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    let (mut lo, mut hi) = (a, b);
    runs.retain(|&(x, y)| {
        if y < lo || x > hi {
            true
        } else {
            lo = lo.min(x);
            hi = hi.max(y);
            false
        }
    });
    let at = runs.partition_point(|&(x, _)| x < lo);
    runs.insert(at, (lo, hi));
}

#[cfg(test)]
mod tests {
    use super::add_run;

    #[test]
    fn runs_merge_when_they_touch_or_overlap() {
        let mut r = Vec::new();
        add_run(&mut r, 8, 16);
        add_run(&mut r, 0, 4);
        assert_eq!(r, [(0, 4), (8, 16)]);
        add_run(&mut r, 4, 8);
        assert_eq!(r, [(0, 16)]);
        add_run(&mut r, 20, 24);
        add_run(&mut r, 2, 22);
        assert_eq!(r, [(0, 24)]);
    }
}
