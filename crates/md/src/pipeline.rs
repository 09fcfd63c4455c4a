//! Background work, pipelined: while one window of units (parity stripes, or pieces of
//! mirrors) is computed and written, the member reads of the next window run on an I/O
//! worker. The rebuild of a member (a bitmap-guided re-add too), the copy of a member
//! onto its replacement and the resync use it on every redundant level ([`Rebuild`],
//! [`ReplaceCopy`], [`Resync`], [`MirrorRebuild`], [`MirrorResync`]), and so does the
//! scrub (`crate::scrub::ScrubStage`, which compares instead of computing).
//!
//! ```text
//!   run_recovery / run_replace / run_resync ── Pipe::step(first, read_ahead) ───────
//!      window N   : locks held (taken when N was read ahead, or now)
//!      window N+1 : locks tried (never waited for: see below); if all were free
//!                     overlap( [ compute + write N   (this thread)              ,
//!                                read N+1            (an I/O worker) ] )
//!                   else: compute + write N alone; N+1 is locked and read next step
//!      Stage::done(N) under N's locks, N's locks dropped, N+1 becomes "ahead"
//!
//!   every member up completes later (remote members): no worker; from this thread
//!      start every read of N+1 ─► compute N, start every write of N, wait once
//!      ─► wait once for N+1's reads           (Stage::read_jobs / write_jobs)
//! ```
//!
//! Rules kept from the one-window work:
//! - Every stripe is read, computed and written under its lock (a client write to it
//!   waits). A rebuilt member counts as rebuilt past a window (`synced`) only after
//!   every stripe of it is written, before the locks go; the checkpoints
//!   (`recovery_cp`, the resync position) follow the windows written, and reach the
//!   superblocks only after a flush.
//! - Lock order: the table's locks are taken in table order by everyone else. The locks
//!   of the window read ahead are taken while those of the current one are held, which is
//!   out of order (stripes hash far apart, and may share an entry), so they are only
//!   *tried*: when one is busy (a client holds it) or is one already held, the read-ahead
//!   is skipped for that step. Nothing ever waits while holding a lock out of order.
//! - The read-ahead runs only while the work is unpaced (the caller says so), and the
//!   caller gives the window read ahead up before a pause: a pause for md's speed limits
//!   never holds a stripe lock, so clients at the minimum speed see the work as before.
//!
//! The rebuild reads only what the missing member needs: with one member missing, its
//! chunk is the XOR of the other data chunks and P (P itself: the XOR of the data), and
//! a Q chunk is computed from the data; Q is not read for a data or P chunk. A stripe with
//! another member down, or whose read fails, goes through the general path
//! (`read_row`: every member that is up, RAID6's two-failure maths). The resync reads the
//! data chunks and writes P (and Q); a stripe the bitmap says is clean is skipped, one
//! with a data member down takes `resync_stripe`'s degraded path. Buffers are kept from
//! window to window.
//!
//! A bitmap-guided re-add walks the same units, and a unit with no dirty bit (looked at
//! under its locks) costs no I/O; `Array::skip_clean_units` jumps long clean runs between
//! steps. The copy onto a replacement reads the member itself (parity: a chunk whose read
//! fails is rebuilt from the row; mirrors: another copy is read) and moves
//! `replacement_synced` as the rebuild moves `synced`.
//!
//! Mirrors (RAID1/10) walk units of `MIRROR_STEP` (1 MiB; RAID10's rebuild in whole
//! chunks, as `Array::raid10_scan` maps them): a unit's lock keys are the mirror regions
//! writes to its array bytes take ([`Stage::keys`]). The rebuild reads each piece from
//! the first other copy that is up and reads, and writes it to the member rebuilt; the
//! resync reads the first copy that reads (only the bitmap's dirty chunks when it guides
//! the resync, looked at under the unit's locks) and writes the others. A piece no copy
//! could be read for goes through the one-unit path on the writing side, which tries
//! every copy again and raises the error.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use cairn_block::overlap::{fan_out, overlap, Overlap};
use cairn_block::{Error, Result, WriteFlags};

use crate::layout::ParityLayout;
use crate::state::{Array, Bytes, ReadJob};
use crate::units::{small, wide, StripeNo, SECTOR_SIZE};

/// Member bytes a parity rebuild or resync works on at once over members with latency
/// (that many stripes under their locks, their reads at once).
pub(crate) const WINDOW_BYTES: u64 = 4 << 20;

/// A member write: (role, bytes, offset in the member's data area).
pub(crate) type WriteJob<'b> = (usize, Bytes<'b>, u64);

/// What a pipelined job does with each stripe.
pub(crate) trait Stage: Sync {
    /// One stripe's buffers, kept from window to window.
    type Buf: Default + Send + Sync;
    /// Reads what the stripe needs (on an I/O worker when read ahead); a failure is
    /// left for [`Stage::finish`] to deal with.
    fn read(&self, stripe: u64, buf: &mut Self::Buf);
    /// The member reads of [`Stage::read`] for a window whose reads all go out at once
    /// (members that complete later): the buffers made ready and the reads, none when
    /// the unit needs none. `None`: this stage reads its units one by one.
    fn read_jobs<'b>(&self, stripe: u64, buf: &'b mut Self::Buf) -> Option<Vec<ReadJob<'b>>> {
        let _ = (stripe, buf);
        None
    }
    /// What [`Stage::read`] does once the reads of [`Stage::read_jobs`] are in, `failed`
    /// holding each one's error (with what follows from it, as after `read_member`).
    fn read_done(&self, stripe: u64, buf: &mut Self::Buf, failed: Vec<Option<Error>>) {
        let _ = (stripe, buf, failed);
    }
    /// The member writes of [`Stage::finish`] for a window whose writes all go out at
    /// once (members that complete later): the unit computed (and any write it cannot
    /// leave to the batch done), and its writes. `None`: this stage finishes its units
    /// one by one.
    fn write_jobs<'b>(
        &self,
        stripe: u64,
        buf: &'b mut Self::Buf,
    ) -> Option<Result<Vec<WriteJob<'b>>>> {
        let _ = (stripe, buf);
        None
    }
    /// What [`Stage::finish`] does once the writes of [`Stage::write_jobs`] are in,
    /// `failed` holding each one's member and error; returns the bytes of work the
    /// unit counts.
    fn write_done(
        &self,
        stripe: u64,
        buf: &mut Self::Buf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        let _ = (stripe, buf, failed);
        Ok(0)
    }
    /// The role whose replacement takes every write of [`Stage::write_jobs`] (the copy
    /// onto a replacement: [`Array::write_replacement_copies`]); `None`: the writes go
    /// to the members they name.
    fn writes_replacement_of(&self) -> Option<usize> {
        None
    }
    /// Computes and writes the stripe; returns the bytes of work it counts.
    fn finish(&self, stripe: u64, buf: &mut Self::Buf) -> Result<u64>;
    /// Every unit below `end` is written (called with their locks still held, and the
    /// window's buffers in order).
    fn done(&self, end: u64, bufs: &mut [Self::Buf]) {
        let _ = (end, bufs);
    }
    /// The lock table keys of units `[first, first + count)`: by default the units are
    /// parity stripes, each its own key.
    fn keys(&self, first: u64, count: u64) -> Vec<u64> {
        (first..first + count).collect()
    }
}

/// A pipelined walk whatever its stage, for callers that pick the stage at run time.
pub(crate) trait Walk {
    /// See [`Pipe::step`].
    fn step(&mut self, first: u64, read_ahead: bool) -> Result<(u64, u64)>;
    /// See [`Pipe::drop_ahead`].
    fn drop_ahead(&mut self);
    /// See [`Pipe::ahead`].
    fn ahead(&self) -> Option<(u64, u64)>;
}

impl<S: Stage> Walk for Pipe<'_, S> {
    fn step(&mut self, first: u64, read_ahead: bool) -> Result<(u64, u64)> {
        Pipe::step(self, first, read_ahead)
    }
    fn drop_ahead(&mut self) {
        Pipe::drop_ahead(self);
    }
    fn ahead(&self) -> Option<(u64, u64)> {
        Pipe::ahead(self)
    }
}

/// A window of stripes and their buffers (the locks are held beside it: a lock guard
/// stays on the thread that took it, the buffers go to a worker).
struct Window<B> {
    first: u64,
    count: u64,
    bufs: Vec<B>,
}

/// The stripe locks of a window.
type Guards<'a> = Vec<MutexGuard<'a, ()>>;

/// A pipelined walk over stripes.
pub(crate) struct Pipe<'a, S: Stage> {
    array: &'a Array,
    stage: S,
    /// Stripes per window, the end of the walk, and how a window's stripes run.
    window: u64,
    end: u64,
    how: Overlap,
    /// The window read ahead and its locks.
    ahead: Option<(Window<S::Buf>, Guards<'a>)>,
    /// Buffers of finished windows, for the next ones.
    spare: Vec<S::Buf>,
    /// Stripe bytes per member (a chunk).
    chunk: u64,
}

impl<'a, S: Stage> Pipe<'a, S> {
    /// A walk over stripes up to `end` in `chunk`-byte stripes: with members in memory one
    /// stripe per window (the pipeline gives the second core its work), with members that
    /// have latency up to [`WINDOW_BYTES`] of member bytes, their stripes at once.
    pub(crate) fn new(array: &'a Array, stage: S, chunk: u64, end: u64) -> Self {
        let mut pipe = Pipe {
            array,
            stage,
            window: 1,
            end,
            how: Overlap::No,
            ahead: None,
            spare: Vec::new(),
            chunk,
        };
        pipe.adapt(true);
        pipe
    }

    /// Sizes the windows from the member latency as it stands (it is measured as the
    /// work goes, so the first windows may be small). Over members that complete later
    /// the windows are large whatever it says while the work is `unpaced`: their reads
    /// and writes are sent from this thread and waited for once, which costs no more for
    /// many units than for one. Paced, a window is one unit, as over members in memory:
    /// a large one at a low limit is a burst followed by a long pause (16 stripes at
    /// 256 KiB/s are 8 s of nothing), with 16 stripes locked during the burst.
    fn adapt(&mut self, unpaced: bool) {
        let large =
            self.array.members_slow() || (unpaced && self.array.up_members_complete_later());
        (self.window, self.how) = if large {
            (
                (WINDOW_BYTES / self.chunk.max(1)).clamp(1, 16),
                Overlap::Each,
            )
        } else {
            (1, Overlap::No)
        };
    }

    /// Does the window of stripes from `first` on (up to the window's size and the end),
    /// and when `read_ahead` also reads the next window meanwhile. Returns the stripes
    /// done and the work they count.
    pub(crate) fn step(&mut self, first: u64, read_ahead: bool) -> Result<(u64, u64)> {
        self.adapt(read_ahead);
        let (mut cur, cur_guards, count) = match self.ahead.take() {
            Some((w, g)) if w.first == first => {
                let count = w.count;
                (w, g, count)
            }
            other => {
                drop(other);
                let count = self.window.min(self.end.saturating_sub(first));
                if count == 0 {
                    return Ok((0, 0));
                }
                let keys = self.stage.keys(first, count);
                let guards = self.array.lock_stripes(keys.into_iter());
                let mut w = self.window_of(first, count);
                self.read(&mut w);
                (w, guards, count)
            }
        };
        let next_first = first + count;
        let next_count = self.window.min(self.end.saturating_sub(next_first));
        let mut next = None;
        if read_ahead && next_count > 0 {
            let keys = self.stage.keys(next_first, next_count);
            if let Some(g) = self.array.try_lock_stripes(keys.into_iter()) {
                next = Some((self.window_of(next_first, next_count), g));
            }
        }
        let written = match &mut next {
            None => self.finish(&mut cur),
            Some((nw, _)) => {
                // Members that complete later: the next window's reads are sent from
                // here, and this window is written while they are out.
                let mut written = None;
                if self.array.up_members_complete_later() {
                    let mut write = || written = Some(self.finish(&mut cur));
                    self.read_at_once(nw, Some(&mut write));
                }
                match written {
                    Some(written) => written,
                    None => {
                        // The work on this thread, the read-ahead on a worker (or here
                        // after the work when no worker is free).
                        let jobs: Vec<(bool, &mut Window<S::Buf>)> =
                            vec![(true, &mut cur), (false, nw)];
                        let mut out = overlap(jobs, |(is_finish, w)| {
                            if is_finish {
                                self.finish(w)
                            } else {
                                self.read(w);
                                Ok(0)
                            }
                        });
                        out.swap_remove(0)
                    }
                }
            }
        };
        if written.is_ok() {
            self.stage.done(first + count, &mut cur.bufs);
        }
        drop(cur_guards);
        self.spare.append(&mut cur.bufs);
        let worked = written?;
        self.ahead = next;
        Ok((count, worked))
    }

    /// The stage (for what it gathered).
    pub(crate) fn stage(&self) -> &S {
        &self.stage
    }

    /// Gives up the window read ahead (its locks too): before a pause.
    pub(crate) fn drop_ahead(&mut self) {
        if let Some((mut w, g)) = self.ahead.take() {
            drop(g);
            self.spare.append(&mut w.bufs);
        }
    }

    /// The first unit and the count of the window read ahead, if one is.
    pub(crate) fn ahead(&self) -> Option<(u64, u64)> {
        self.ahead.as_ref().map(|(w, _)| (w.first, w.count))
    }

    fn window_of(&mut self, first: u64, count: u64) -> Window<S::Buf> {
        let keep = self.spare.len().saturating_sub(small(count));
        let mut bufs = self.spare.split_off(keep);
        bufs.resize_with(small(count), S::Buf::default);
        Window { first, count, bufs }
    }

    fn read(&self, w: &mut Window<S::Buf>) {
        if self.array.up_members_complete_later() && self.read_at_once(w, None) {
            return;
        }
        let jobs = w
            .bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| (i % 1024, (w.first + wide(i), b)))
            .collect();
        fan_out(jobs, self.how, |(stripe, b)| self.stage.read(stripe, b));
    }

    /// Reads window `w` with every member read of its units sent from this thread and
    /// waited for once ([`Array::read_later_while`], `meanwhile` run while they are
    /// out). False, nothing read and `meanwhile` not run, when the stage reads unit by
    /// unit or a member a read needs is not up or does not complete later.
    fn read_at_once(&self, w: &mut Window<S::Buf>, meanwhile: Option<&mut dyn FnMut()>) -> bool {
        let mut counts = Vec::with_capacity(w.bufs.len());
        let mut jobs = Vec::new();
        for (i, b) in w.bufs.iter_mut().enumerate() {
            let Some(reads) = self.stage.read_jobs(w.first + wide(i), b) else {
                return false;
            };
            counts.push(reads.len());
            jobs.extend(reads);
        }
        let Some(failed) = self.array.read_later_while(&mut jobs, meanwhile) else {
            return false;
        };
        drop(jobs);
        let mut failed = failed.into_iter();
        for (i, (b, n)) in w.bufs.iter_mut().zip(counts).enumerate() {
            let mine = failed.by_ref().take(n).collect();
            self.stage.read_done(w.first + wide(i), b, mine);
        }
        true
    }

    /// Computes window `w` and sends every member write of its units from this thread,
    /// waited for once ([`Array::write_members`]; the copy onto a replacement:
    /// [`Array::write_replacement_copies`]). `None`, nothing done, when the stage
    /// finishes unit by unit.
    fn write_at_once(&self, w: &mut Window<S::Buf>) -> Option<Result<u64>> {
        let mut units = Vec::with_capacity(w.bufs.len());
        let mut jobs = Vec::new();
        for (i, b) in w.bufs.iter_mut().enumerate() {
            match self.stage.write_jobs(w.first + wide(i), b)? {
                Ok(writes) => {
                    units.push(Ok(writes.len()));
                    jobs.extend(writes.into_iter().map(|(m, b, off)| (m, (m, b, off))));
                }
                Err(e) => units.push(Err(e)),
            }
        }
        let failed = match self.stage.writes_replacement_of() {
            Some(role) => {
                let writes = jobs.into_iter().map(|(_, (_, b, off))| (b, off)).collect();
                let failed = self.array.write_replacement_copies(role, writes, self.how);
                failed.into_iter().map(|e| e.map(|e| (role, e))).collect()
            }
            None => self.array.write_members(jobs, WriteFlags::NONE, self.how),
        };
        let mut failed = failed.into_iter();
        let mut worked = Ok(0);
        for (i, (b, unit)) in w.bufs.iter_mut().zip(units).enumerate() {
            let r = unit.and_then(|n| {
                let mine = failed.by_ref().take(n).collect();
                self.stage.write_done(w.first + wide(i), b, mine)
            });
            worked = match (worked, r) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            };
        }
        Some(worked)
    }

    fn finish(&self, w: &mut Window<S::Buf>) -> Result<u64> {
        if self.array.up_members_complete_later() {
            if let Some(worked) = self.write_at_once(w) {
                return worked;
            }
        }
        let jobs = w
            .bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| (i % 1024, (w.first + wide(i), b)))
            .collect();
        let results = fan_out(jobs, self.how, |(stripe, b)| self.stage.finish(stripe, b));
        results.into_iter().sum()
    }
}

// ---- the rebuild of one member ----------------------------------------------------------

/// The buffers of one stripe of a rebuild.
#[derive(Default)]
pub(crate) struct RebuildBuf {
    /// The members read, and their chunks.
    sources: Vec<usize>,
    bufs: Vec<Vec<u8>>,
    /// The rebuilt chunk, and room for the P computed beside a Q.
    out: Vec<u8>,
    scratch: Vec<u8>,
    /// Whether the sources were read (false: the general path rebuilds this stripe).
    read: bool,
    /// A bitmap-guided re-add, and the bitmap says the member holds this stripe.
    skip: bool,
}

/// Rebuilds the member of `role` stripe by stripe; for a bitmap-guided re-add
/// (`guided`) only the stripes with a dirty bit, looked at under the stripe's lock (a
/// write sets its bits before it takes that lock, so none slips past unseen; the bits
/// are not cleared while a member is rebuilt).
pub(crate) struct Rebuild<'a> {
    pub(crate) array: &'a Array,
    pub(crate) pl: &'a ParityLayout,
    pub(crate) role: usize,
    pub(crate) guided: bool,
}

impl Rebuild<'_> {
    fn chunk(&self) -> u64 {
        self.pl.chunk().0 * SECTOR_SIZE
    }

    /// Decides what the stripe's rebuild reads and sizes its buffers for it: false when
    /// it reads nothing now (skipped, or left to the general path).
    fn sources(&self, stripe: u64, st: &mut RebuildBuf) -> bool {
        let c = self.chunk();
        st.sources.clear();
        st.skip = self.guided && !self.array.bitmap_range_dirty(stripe * c, (stripe + 1) * c);
        if st.skip {
            return false;
        }
        let map = self.pl.stripe_map(StripeNo(stripe));
        let mut down = self.array.down_mask_at(stripe * c);
        down[self.role] = false;
        st.read = !down.iter().any(|&d| d);
        if !st.read {
            return false;
        }
        if map.q == Some(self.role) {
            st.sources.extend_from_slice(&map.data);
        } else {
            st.sources.extend(
                map.data
                    .iter()
                    .copied()
                    .chain([map.p])
                    .filter(|&m| m != self.role),
            );
        }
        st.bufs.resize_with(st.sources.len(), Vec::new);
        for b in &mut st.bufs {
            b.resize(small(c), 0);
        }
        true
    }

    /// Computes the stripe's chunk of the member into `st.out`: from the sources read,
    /// or by the general path (`read_row`) when they were not.
    fn compute(&self, stripe: u64, st: &mut RebuildBuf) -> Result<()> {
        let a = self.array;
        let c = self.chunk();
        let at = stripe * c;
        let map = self.pl.stripe_map(StripeNo(stripe));
        if st.read {
            let srcs: Vec<&[u8]> = st.bufs.iter().map(Vec::as_slice).collect();
            if map.q == Some(self.role) {
                let order = map.syndrome_order();
                if order.iter().any(Option::is_none) {
                    let (_, q) = a.gen_parity(&map, &srcs);
                    st.out = q.unwrap_or_default();
                } else {
                    // The data in syndrome order; P is computed on the way and dropped.
                    let by_slot: Vec<&[u8]> = order
                        .iter()
                        .flatten()
                        .filter_map(|m| map.data.iter().position(|x| x == m))
                        .map(|d| srcs[d])
                        .collect();
                    st.out.resize(small(c), 0);
                    st.scratch.resize(small(c), 0);
                    a.parity.gen_pq(&by_slot, &mut st.scratch, &mut st.out);
                }
            } else {
                st.out.resize(small(c), 0);
                a.parity.gen_p(&srcs, &mut st.out);
            }
        } else {
            let mut down = a.down_mask_at(at);
            down[self.role] = true;
            let mut errs = Vec::new();
            let mut rows = a.read_row(self.pl, &map, stripe, 0, c, &mut down, &mut errs)?;
            st.out = std::mem::take(&mut rows[self.role]);
        }
        Ok(())
    }
}

impl Stage for Rebuild<'_> {
    type Buf = RebuildBuf;

    fn read(&self, stripe: u64, st: &mut RebuildBuf) {
        let c = self.chunk();
        if !self.sources(stripe, st) {
            return;
        }
        let how = if self.array.members_slow() {
            Overlap::Each
        } else {
            Overlap::No
        };
        let jobs = st
            .sources
            .iter()
            .copied()
            .zip(st.bufs.iter_mut())
            .map(|(m, b)| (m, (m, b)))
            .collect();
        let failed = fan_out(jobs, how, |(m, b)| {
            self.array.read_member(m, b, stripe * c).is_err()
        });
        // A stripe whose read failed goes through the general path, which reads it
        // again and deals with the failure.
        if failed.into_iter().any(|f| f) {
            st.read = false;
        }
    }

    fn read_jobs<'b>(&self, stripe: u64, st: &'b mut RebuildBuf) -> Option<Vec<ReadJob<'b>>> {
        if !self.sources(stripe, st) {
            return Some(Vec::new());
        }
        let at = stripe * self.chunk();
        let reads = st.sources.iter().zip(st.bufs.iter_mut());
        Some(reads.map(|(&m, b)| (m, b.as_mut_slice(), at)).collect())
    }

    fn read_done(&self, _: u64, st: &mut RebuildBuf, failed: Vec<Option<Error>>) {
        // As above: the general path reads a stripe whose read failed again.
        if failed.iter().any(Option::is_some) {
            st.read = false;
        }
    }

    fn finish(&self, stripe: u64, st: &mut RebuildBuf) -> Result<u64> {
        if st.skip {
            return Ok(0);
        }
        let a = self.array;
        let c = self.chunk();
        self.compute(stripe, st)?;
        a.write_member(self.role, &st.out, stripe * c, WriteFlags::NONE)
            .inspect_err(|e| a.fail_member(self.role, e))?;
        Ok(c)
    }

    fn write_jobs<'b>(
        &self,
        stripe: u64,
        st: &'b mut RebuildBuf,
    ) -> Option<Result<Vec<WriteJob<'b>>>> {
        if st.skip {
            return Some(Ok(Vec::new()));
        }
        let at = stripe * self.chunk();
        Some(
            self.compute(stripe, st)
                .map(|()| vec![(self.role, Bytes::Borrowed(st.out.as_slice()), at)]),
        )
    }

    fn write_done(
        &self,
        _: u64,
        st: &mut RebuildBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        if st.skip {
            return Ok(0);
        }
        if let Some((_, e)) = failed.into_iter().flatten().next() {
            self.array.fail_member(self.role, &e);
            return Err(e);
        }
        Ok(self.chunk())
    }

    fn done(&self, end: u64, _: &mut [RebuildBuf]) {
        // Before the locks go: a client write to these stripes from now on must reach
        // the member.
        self.array.slots[self.role]
            .synced
            .store(end * self.chunk(), Ordering::Release);
    }
}

// ---- the copy of a member onto its replacement -------------------------------------

/// The buffers of one stripe of a replacement copy.
#[derive(Default)]
pub(crate) struct ReplaceBuf {
    chunk: Vec<u8>,
    /// The member's chunk was read (false: it is rebuilt from the rest of the row).
    read: bool,
}

/// Copies the member of `role` onto its replacement stripe by stripe: the member's own
/// chunk, or where that read fails the chunk rebuilt from the others (`read_row`).
pub(crate) struct ReplaceCopy<'a> {
    pub(crate) array: &'a Array,
    pub(crate) pl: &'a ParityLayout,
    pub(crate) role: usize,
}

impl ReplaceCopy<'_> {
    fn chunk(&self) -> u64 {
        self.pl.chunk().0 * SECTOR_SIZE
    }

    /// Makes `b.chunk` the stripe's chunk of the member: as read, or where that read
    /// failed rebuilt from the rest of the row.
    fn chunk_of(&self, stripe: u64, b: &mut ReplaceBuf) -> Result<()> {
        if b.read {
            return Ok(());
        }
        let a = self.array;
        let c = self.chunk();
        let map = self.pl.stripe_map(StripeNo(stripe));
        let mut down = a.down_mask_at(stripe * c);
        down[self.role] = true;
        let mut errs = Vec::new();
        let rows = a.read_row(self.pl, &map, stripe, 0, c, &mut down, &mut errs)?;
        b.chunk.clone_from(&rows[self.role]);
        Ok(())
    }
}

impl Stage for ReplaceCopy<'_> {
    type Buf = ReplaceBuf;

    fn read(&self, stripe: u64, b: &mut ReplaceBuf) {
        let c = self.chunk();
        b.chunk.resize(small(c), 0);
        b.read = self
            .array
            .read_member(self.role, &mut b.chunk, stripe * c)
            .is_ok();
    }

    fn read_jobs<'b>(&self, stripe: u64, b: &'b mut ReplaceBuf) -> Option<Vec<ReadJob<'b>>> {
        let c = self.chunk();
        b.chunk.resize(small(c), 0);
        Some(vec![(self.role, b.chunk.as_mut_slice(), stripe * c)])
    }

    fn read_done(&self, _: u64, b: &mut ReplaceBuf, failed: Vec<Option<Error>>) {
        b.read = failed.iter().all(Option::is_none);
    }

    fn finish(&self, stripe: u64, b: &mut ReplaceBuf) -> Result<u64> {
        let c = self.chunk();
        self.chunk_of(stripe, b)?;
        self.array
            .write_replacement_copy(self.role, &b.chunk, stripe * c)?;
        Ok(c)
    }

    fn writes_replacement_of(&self) -> Option<usize> {
        Some(self.role)
    }

    fn write_jobs<'b>(
        &self,
        stripe: u64,
        b: &'b mut ReplaceBuf,
    ) -> Option<Result<Vec<WriteJob<'b>>>> {
        let at = stripe * self.chunk();
        Some(
            self.chunk_of(stripe, b)
                .map(|()| vec![(self.role, Bytes::Borrowed(b.chunk.as_slice()), at)]),
        )
    }

    fn write_done(
        &self,
        _: u64,
        _: &mut ReplaceBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        // The replacement that failed is dropped already; the copy ends with the error.
        match failed.into_iter().flatten().next() {
            Some((_, e)) => Err(e),
            None => Ok(self.chunk()),
        }
    }

    fn done(&self, end: u64, _: &mut [ReplaceBuf]) {
        // Before the locks go: a client write to these stripes from now on must reach
        // the replacement too.
        self.array.slots[self.role]
            .replacement_synced
            .store(end * self.chunk(), Ordering::Release);
    }
}

// ---- the resync -------------------------------------------------------------------------

/// The buffers of one stripe of a resync.
#[derive(Default)]
pub(crate) struct ResyncBuf {
    /// The data chunks.
    rows: Vec<Vec<u8>>,
    /// The bitmap says the stripe is clean: nothing to do.
    skip: bool,
    /// The data chunks were read (false: `resync_stripe`'s degraded path).
    read: bool,
}

/// Recomputes P (and Q) of every stripe the resync covers.
pub(crate) struct Resync<'a> {
    pub(crate) array: &'a Array,
    pub(crate) pl: &'a ParityLayout,
}

impl Resync<'_> {
    /// Counts a stripe resynced; its bytes of work.
    fn resynced(&self) -> u64 {
        let c = self.pl.chunk().0 * SECTOR_SIZE;
        self.array.resynced.fetch_add(c, Ordering::Relaxed);
        c * crate::units::wide(self.pl.data_disks())
    }
}

impl Stage for Resync<'_> {
    type Buf = ResyncBuf;

    fn read(&self, stripe: u64, b: &mut ResyncBuf) {
        b.skip = !self.array.resync_stripe_needed(self.pl, stripe);
        b.read = !b.skip && self.array.resync_read(self.pl, stripe, &mut b.rows);
    }

    fn read_jobs<'b>(&self, stripe: u64, b: &'b mut ResyncBuf) -> Option<Vec<ReadJob<'b>>> {
        b.skip = !self.array.resync_stripe_needed(self.pl, stripe);
        b.read = false;
        if b.skip {
            return Some(Vec::new());
        }
        let reads = self.array.resync_reads(self.pl, stripe, &mut b.rows);
        b.read = reads.is_some();
        Some(reads.unwrap_or_default())
    }

    fn read_done(&self, _: u64, b: &mut ResyncBuf, failed: Vec<Option<Error>>) {
        b.read = b.read && self.array.resync_read_done(failed.into_iter().flatten());
    }

    fn finish(&self, stripe: u64, b: &mut ResyncBuf) -> Result<u64> {
        if b.skip {
            return Ok(0);
        }
        self.array
            .resync_stripe_locked(self.pl, stripe, &mut b.rows, b.read)?;
        Ok(self.resynced())
    }

    fn write_jobs<'b>(
        &self,
        stripe: u64,
        b: &'b mut ResyncBuf,
    ) -> Option<Result<Vec<WriteJob<'b>>>> {
        if b.skip {
            return Some(Ok(Vec::new()));
        }
        let writes = self
            .array
            .resync_writes(self.pl, stripe, &mut b.rows, b.read);
        Some(writes.map(|w| w.into_iter().map(|(m, off, b)| (m, b, off)).collect()))
    }

    fn write_done(
        &self,
        stripe: u64,
        b: &mut ResyncBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        if b.skip {
            return Ok(0);
        }
        // `execute_writes`'s rules and `resync_stripe_locked`'s check, for this stripe.
        let failed = failed.into_iter().flatten().collect();
        self.array.writes_failed(self.pl, failed)?;
        self.array
            .check_resync_possible()
            .map_err(|e| e.context(format!("resync of stripe {stripe}")))?;
        Ok(self.resynced())
    }
}

// ---- mirrors (RAID1/10): the rebuild and the resync ------------------------------------

/// One piece of mirrored array bytes read for a copy: where it goes and what was read
/// (`None`: no source could be read, the writing side tries again and raises the error).
struct CopyPiece {
    at: u64,
    len: u64,
    data: Option<Vec<u8>>,
    /// The member the data came from (the resync writes every other copy).
    src: usize,
    /// The rebuild: the member byte the piece goes to.
    dst: u64,
    /// The copies to read it from, in order (kept for a window read at once: the first
    /// is read with the window's other reads, the rest after it fails).
    sources: Vec<crate::layout::Location>,
}

/// The buffers of one unit of a mirror rebuild or resync.
#[derive(Default)]
pub(crate) struct MirrorBuf {
    pieces: Vec<CopyPiece>,
    /// The bytes of work the unit counts (a rebuild; the resync counts its pieces).
    worked: u64,
    /// Spare piece buffers from earlier units.
    spare: Vec<Vec<u8>>,
}

impl MirrorBuf {
    fn recycle(&mut self) {
        let pieces = std::mem::take(&mut self.pieces);
        self.spare.extend(pieces.into_iter().filter_map(|p| p.data));
    }

    fn buffer(&mut self, len: u64) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.resize(small(len), 0);
        b
    }

    /// Adds the piece `[at, at + len)` (going to member byte `dst`), read from the
    /// first of `sources` that reads: now, or when `later` by the window's reads at once
    /// ([`MirrorBuf::first_reads`], then [`MirrorBuf::other_reads`]).
    fn add(
        &mut self,
        array: &Array,
        (at, len, dst): (u64, u64, u64),
        sources: Vec<crate::layout::Location>,
        later: bool,
    ) {
        let mut data = self.buffer(len);
        let src = match sources.first() {
            Some(first) if later => Some(first.member),
            _ => read_first(array, sources.iter().copied(), &mut data),
        };
        self.pieces.push(CopyPiece {
            at,
            len,
            data: src.is_some().then_some(data),
            src: src.unwrap_or(usize::MAX),
            dst,
            sources,
        });
    }

    /// The read of each piece's first source.
    fn first_reads(&mut self) -> Vec<ReadJob<'_>> {
        let pieces = self.pieces.iter_mut();
        pieces
            .filter_map(|p| {
                let first = p.sources.first()?;
                let data = p.data.as_mut()?;
                Some((
                    first.member,
                    data.as_mut_slice(),
                    first.sector.0 * SECTOR_SIZE,
                ))
            })
            .collect()
    }

    /// After [`MirrorBuf::first_reads`] (`failed`, in their order): a piece whose first
    /// source failed goes on to the others, one after another.
    fn other_reads(&mut self, array: &Array, failed: Vec<Option<Error>>) {
        let mut failed = failed.into_iter();
        for p in &mut self.pieces {
            let Some(data) = p.data.as_mut() else {
                continue;
            };
            if failed.next().flatten().is_none() {
                continue;
            }
            match read_first(array, p.sources.iter().skip(1).copied(), data) {
                Some(src) => p.src = src,
                None => {
                    p.src = usize::MAX;
                    self.spare.extend(p.data.take());
                }
            }
        }
    }
}

/// Reads `len` bytes into `buf` from the first of `sources` that reads; returns it.
fn read_first(
    array: &Array,
    sources: impl Iterator<Item = crate::layout::Location>,
    buf: &mut [u8],
) -> Option<usize> {
    for loc in sources {
        if array
            .read_member(loc.member, buf, loc.sector.0 * SECTOR_SIZE)
            .is_ok()
        {
            return Some(loc.member);
        }
    }
    None
}

/// Rebuilds the member of `role` of a RAID1/10 array in units of `step` member bytes,
/// as `run_recovery` walks it: unit `k` is member bytes `[k·step, (k + 1)·step)`, which
/// for RAID10 stand for the array bytes `Array::raid10_scan` gives. A bitmap-guided
/// re-add (`guided`) copies only the bitmap chunks with a dirty bit (mirror writes reach
/// a member being rebuilt anyway, so a clean chunk stays right) and counts those bytes.
/// With `to_replacement` it copies the member itself (the first source tried, the
/// other copies after it) onto its replacement instead.
pub(crate) struct MirrorRebuild<'a> {
    pub(crate) array: &'a Array,
    pub(crate) role: usize,
    pub(crate) step: u64,
    pub(crate) end: u64,
    pub(crate) guided: bool,
    pub(crate) to_replacement: bool,
}

impl MirrorRebuild<'_> {
    /// The array bytes of unit `k`.
    fn range(&self, k: u64) -> (u64, u64) {
        let pos = k * self.step;
        let n = self.step.min(self.end.saturating_sub(pos));
        match self.array.layout {
            crate::layout::ArrayLayout::Raid10(_) => self.array.raid10_scan(pos, n),
            _ => (pos, n),
        }
    }
}

/// The lock-table keys of mirror units `units`, unit `k` being array bytes `range(k)`.
fn mirror_unit_keys(
    array: &Array,
    units: std::ops::Range<u64>,
    range: impl Fn(u64) -> (u64, u64),
) -> Vec<u64> {
    units
        .map(range)
        .filter(|&(_, n)| n > 0)
        .flat_map(|(at, n)| array.mirror_keys(at, n))
        .collect()
}

impl MirrorRebuild<'_> {
    /// Reads the piece of array bytes `[at, at + len)` whose copies are `locs`, if one
    /// of them is on the member rebuilt.
    fn read_piece(
        &self,
        b: &mut MirrorBuf,
        (at, len): (u64, u64),
        locs: &[crate::layout::Location],
        later: bool,
    ) {
        let Some(dst) = locs.iter().find(|l| l.member == self.role) else {
            return;
        };
        let dst = dst.sector.0 * SECTOR_SIZE;
        let mut sources: Vec<_> = locs
            .iter()
            .copied()
            .filter(|l| self.array.is_up(l.member))
            .collect();
        if self.to_replacement {
            // The member itself first (it is the natural source).
            sources.sort_by_key(|l| l.member != self.role);
        } else {
            sources.retain(|l| l.member != self.role);
        }
        b.add(self.array, (at, len, dst), sources, later);
    }

    /// [`Stage::read`], the reads done now or (`later`) left to the window's reads at
    /// once.
    fn read_unit(&self, k: u64, b: &mut MirrorBuf, later: bool) {
        b.recycle();
        let (pos, n) = self.range(k);
        b.worked = if self.guided {
            0
        } else {
            self.step.min(self.end.saturating_sub(k * self.step))
        };
        if n == 0 {
            return;
        }
        let guide = self.array.bitmap_chunk().filter(|_| self.guided);
        let Some(bitmap_chunk) = guide else {
            for (at, len, locs) in self.array.mirror_pieces(pos, n) {
                self.read_piece(b, (at, len), &locs, later);
            }
            return;
        };
        // Bitmap chunk by bitmap chunk, the dirty ones only.
        let mut from = pos;
        while from < pos + n {
            let stop = ((from / bitmap_chunk + 1) * bitmap_chunk).min(pos + n);
            if self.array.bitmap_range_dirty(from, stop) {
                b.worked += stop - from;
                for (at, len, locs) in self.array.mirror_pieces(from, stop - from) {
                    self.read_piece(b, (at, len), &locs, later);
                }
            }
            from = stop;
        }
    }
}

impl Stage for MirrorRebuild<'_> {
    type Buf = MirrorBuf;

    fn keys(&self, first: u64, count: u64) -> Vec<u64> {
        mirror_unit_keys(self.array, first..first + count, |k| self.range(k))
    }

    fn read(&self, k: u64, b: &mut MirrorBuf) {
        self.read_unit(k, b, false);
    }

    fn read_jobs<'b>(&self, k: u64, b: &'b mut MirrorBuf) -> Option<Vec<ReadJob<'b>>> {
        self.read_unit(k, b, true);
        Some(b.first_reads())
    }

    fn read_done(&self, _: u64, b: &mut MirrorBuf, failed: Vec<Option<Error>>) {
        b.other_reads(self.array, failed);
    }

    fn finish(&self, _: u64, b: &mut MirrorBuf) -> Result<u64> {
        let a = self.array;
        for p in &b.pieces {
            match &p.data {
                Some(data) if self.to_replacement => {
                    a.write_replacement_copy(self.role, data, p.dst)?;
                }
                Some(data) => {
                    a.write_member(self.role, data, p.dst, WriteFlags::NONE)
                        .inspect_err(|e| a.fail_member(self.role, e))?;
                }
                // No source read: the one-unit path tries every copy again and says why
                // none could be read.
                None => a.copy_mirror_range_locked(self.role, p.at, p.len, self.to_replacement)?,
            }
        }
        Ok(b.worked)
    }

    fn writes_replacement_of(&self) -> Option<usize> {
        self.to_replacement.then_some(self.role)
    }

    fn write_jobs<'b>(&self, _: u64, b: &'b mut MirrorBuf) -> Option<Result<Vec<WriteJob<'b>>>> {
        for p in b.pieces.iter().filter(|p| p.data.is_none()) {
            if let Err(e) =
                self.array
                    .copy_mirror_range_locked(self.role, p.at, p.len, self.to_replacement)
            {
                return Some(Err(e));
            }
        }
        let writes = b.pieces.iter().filter_map(|p| {
            let data = p.data.as_deref()?;
            Some((self.role, Bytes::Borrowed(data), p.dst))
        });
        Some(Ok(writes.collect()))
    }

    fn write_done(
        &self,
        _: u64,
        b: &mut MirrorBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        if let Some((_, e)) = failed.into_iter().flatten().next() {
            // A replacement that failed is dropped already; a member rebuilt fails.
            if !self.to_replacement {
                self.array.fail_member(self.role, &e);
            }
            return Err(e);
        }
        Ok(b.worked)
    }
}

/// Resyncs a RAID1/10 array: unit `k` is array bytes `[from + k·step, ...)` up to `to`;
/// only the bitmap's dirty chunks of it when the bitmap guides the resync (looked at
/// under the unit's locks, when it is read).
pub(crate) struct MirrorResync<'a> {
    pub(crate) array: &'a Array,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) step: u64,
}

impl MirrorResync<'_> {
    fn range(&self, k: u64) -> (u64, u64) {
        let at = self.from + k * self.step;
        (at, self.step.min(self.to.saturating_sub(at)))
    }

    /// [`Stage::read`], the reads done now or (`later`) left to the window's reads at
    /// once.
    fn read_unit(&self, k: u64, b: &mut MirrorBuf, later: bool) {
        b.recycle();
        let (pos, n) = self.range(k);
        if n == 0 {
            return;
        }
        for (dirty_at, dirty_len) in self.array.mirror_resync_pieces(pos, n) {
            for (at, len, locs) in self.array.mirror_pieces(dirty_at, dirty_len) {
                let sources = locs.iter().copied().filter(|l| self.array.is_up(l.member));
                b.add(self.array, (at, len, 0), sources.collect(), later);
            }
        }
    }
}

impl Stage for MirrorResync<'_> {
    type Buf = MirrorBuf;

    fn keys(&self, first: u64, count: u64) -> Vec<u64> {
        mirror_unit_keys(self.array, first..first + count, |k| self.range(k))
    }

    fn read(&self, k: u64, b: &mut MirrorBuf) {
        self.read_unit(k, b, false);
    }

    fn read_jobs<'b>(&self, k: u64, b: &'b mut MirrorBuf) -> Option<Vec<ReadJob<'b>>> {
        self.read_unit(k, b, true);
        Some(b.first_reads())
    }

    fn read_done(&self, _: u64, b: &mut MirrorBuf, failed: Vec<Option<Error>>) {
        b.other_reads(self.array, failed);
    }

    fn finish(&self, _: u64, b: &mut MirrorBuf) -> Result<u64> {
        let a = self.array;
        let mut worked = 0;
        for p in &b.pieces {
            match &p.data {
                Some(data) if a.is_up(p.src) => {
                    for (_, _, locs) in a.mirror_pieces(p.at, p.len) {
                        for loc in locs
                            .iter()
                            .filter(|l| l.member != p.src && a.is_up(l.member))
                        {
                            if let Err(e) = a.write_member(
                                loc.member,
                                data,
                                loc.sector.0 * SECTOR_SIZE,
                                WriteFlags::NONE,
                            ) {
                                a.fail_member(loc.member, &e);
                            }
                        }
                    }
                    a.check_resync_possible()
                        .map_err(|e| e.context(format!("resync at array byte {}", p.at)))?;
                }
                // No copy read (or its source left since): the one-unit path reads
                // again and raises what is wrong.
                _ => a.resync_mirrors_locked(p.at, p.len)?,
            }
            a.resynced.fetch_add(p.len, Ordering::Relaxed);
            worked += p.len;
        }
        Ok(worked)
    }

    fn write_jobs<'b>(&self, _: u64, b: &'b mut MirrorBuf) -> Option<Result<Vec<WriteJob<'b>>>> {
        let a = self.array;
        let mut writes = Vec::new();
        for p in &mut b.pieces {
            match &p.data {
                Some(data) if a.is_up(p.src) => {
                    for (_, _, locs) in a.mirror_pieces(p.at, p.len) {
                        let others = locs
                            .iter()
                            .filter(|l| l.member != p.src && a.is_up(l.member));
                        writes.extend(others.map(|l| {
                            (
                                l.member,
                                Bytes::Borrowed(data.as_slice()),
                                l.sector.0 * SECTOR_SIZE,
                            )
                        }));
                    }
                }
                // As in `finish`, done here; counted as written (no write left).
                _ => {
                    if let Err(e) = a.resync_mirrors_locked(p.at, p.len) {
                        return Some(Err(e));
                    }
                    p.src = usize::MAX;
                }
            }
        }
        Some(Ok(writes))
    }

    fn write_done(
        &self,
        _: u64,
        b: &mut MirrorBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        let a = self.array;
        for (m, e) in failed.into_iter().flatten() {
            a.fail_member(m, &e);
        }
        let mut worked = 0;
        for p in &b.pieces {
            if p.src != usize::MAX {
                a.check_resync_possible()
                    .map_err(|e| e.context(format!("resync at array byte {}", p.at)))?;
            }
            a.resynced.fetch_add(p.len, Ordering::Relaxed);
            worked += p.len;
        }
        Ok(worked)
    }
}
