//! md's internal write-intent bitmap at run time: the write-intent protocol the array
//! follows so that a crash or a returning member needs only the dirty chunks resynced.
//! The on-disk format (ondisk-formats.md §1.8) and what `mdadm --create
//! --bitmap=internal` writes are in `bitmap/format.rs`; this file holds the in-memory
//! state and its I/O.
//!
//! ```text
//!   member: 4096 superblock │ 8192 bitmap_super_t (256 B) + bits, 4 KiB blocks │ bblog │ data
//!
//!   write_at ─► bitmap_start: chunk bits clear? set them, write their blocks FUA on
//!   │           every up member (durable before any data is issued); in-flight + 1
//!   ├─► data to the members (the level's own path)
//!   └─► bitmap_end: in-flight - 1; at 0 the chunk waits for a flush that starts later
//!   flush ─► members flushed ─► sweep: chunks flushed and idle for daemon_sleep whose
//!            array is neither degraded nor resyncing get their bits cleared (no FUA)
//!   write_superblocks ─► bitmap events = superblock events (written first, as md does)
//!   close ─► flush, clear every clearable bit (FUA), then the clean superblocks
//!   assemble ─► load (union of the up members' bits; stale events: every bit set)
//!   resync ─► only stripes / mirror ranges whose bits are set (background.rs hooks)
//! ```
//!
//! Bits cover member (component) bytes from `data_offset` for RAID1/4/5/6, and array
//! bytes for RAID10 ([`Coverage`]). A parity write dirties the whole stripe row it
//! touches, since parity is rewritten for all of it.
//!
//! The kernel rules followed (`drivers/md/md-bitmap.c`): a bit is set and persisted
//! before the data write is issued; it is cleared only after the writes have completed,
//! been flushed and the region was idle, never while the array is degraded (those bits
//! are what a re-add needs); `events` follows the superblock's; `events_cleared` records
//! the events when bits were last cleared, and a returning member with fewer events than
//! that cannot use the bitmap (it may have missed writes whose bits are gone). A bitmap
//! whose `events` is older than the array's is out of date: every bit counts as set.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::layout::{ArrayLayout, ParityLayout};
use crate::state::Array;
use crate::units::{small, wide, SECTOR_SIZE};

pub(crate) mod format;
pub(crate) mod live;

pub(crate) use format::block_of;
pub use format::{
    plan, state, sync_size_for, BitmapChoice, BitmapSuper, RawBitmapSuper, BITMAP_MAGIC,
    BITMAP_OFFSET_1_2, BITMAP_VERSION, BITMAP_VERSION_LO, BLOCK, DEFAULT_DAEMON_SLEEP,
    DEFAULT_MIN_CHUNK, HEADER_SIZE, MAX_WRITE_BEHIND,
};
pub(crate) use live::{load_bitmap, load_own_bitmap, Bitmap};
pub use live::{BitmapInfo, Coverage};
use live::{Done, State};

impl Array {
    /// Installs the bitmap [`load_bitmap`] read into a freshly built array; an out of
    /// date one is written back whole (every bit set, events current), as md does.
    pub(crate) fn install_bitmap(&mut self, loaded: Option<(Bitmap, bool)>) {
        let Some((bm, stale)) = loaded else { return };
        self.bitmap = Some(bm);
        // Read-only: every bit is set in memory; the owner writes it back.
        if !stale || cairn_block::BlockDevice::capabilities(self).read_only {
            return;
        }
        let bm = self.bitmap.as_ref().expect("just set");
        let st = bm.lock();
        let all: BTreeSet<u64> = (0..wide(st.area.len()) / BLOCK).collect();
        let r = self.write_bitmap_blocks(bm, &st, &all, WriteFlags::FUA);
        drop(st);
        match r {
            Ok(failed) => {
                for (role, e) in failed {
                    self.fail_member(role, &e);
                }
            }
            Err(e) => tracing::warn!("{}: {e}", self.array_label()),
        }
    }

    /// Gives an array built without superblocks ([`Array::from_layout`]) md's
    /// write-intent bitmap kept apart from the members, as dm-raid keeps it: role `i`'s
    /// copy at byte `at` of `devs[i]` (a RAID LV's metadata sub-LV, `at` 4096). The copies
    /// of the roles in sync are read and OR-ed; `events` is the array's (a copy with
    /// fewer is out of date: every bit set). From now on writes set the bits of the
    /// regions they touch before the data goes out and flushes clear idle ones, as for
    /// md's own bitmap. When bits are set, a resync is pending and covers only those
    /// regions ([`Array::resync`], or the background work). Returns the bits set; `None`
    /// when no device holds a bitmap (nothing changes then).
    pub fn attach_own_bitmap(
        &mut self,
        devs: Vec<Option<Arc<dyn BlockDevice>>>,
        at: u64,
        events: u64,
    ) -> Result<Option<u64>> {
        if devs.len() != self.slots.len() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} bitmap devices for {} roles",
                    devs.len(),
                    self.slots.len()
                ),
            ));
        }
        let loaded = load_own_bitmap(&self.slots, &self.layout, devs, at, events, &self.label)?;
        let Some((bm, stale)) = loaded else {
            return Ok(None);
        };
        let dirty = bm.lock().dirty(bm.chunks);
        {
            let mut meta = self.meta_lock();
            meta.events = meta.events.max(events);
            if dirty > 0 {
                meta.resync_pending = true;
                meta.resync_from = crate::units::Sectors::ZERO;
            }
        }
        self.install_bitmap(Some((bm, stale)));
        Ok(Some(dirty))
    }

    /// For an array without superblocks whose owner keeps its own record of events
    /// (dm-raid's superblocks): the array's events become at least `events`, and a
    /// bitmap kept apart records them, as md's bitmap follows every superblock update.
    pub fn record_events(&self, events: u64) -> Result<()> {
        let mut meta = self.meta_lock();
        meta.events = meta.events.max(events);
        self.write_superblocks(&mut meta)
    }

    /// Writes the whole bitmap area, as it is now, to `m` (FUA): a member taking a role
    /// (a spare, a re-added member, a replacement) must carry the array's bitmap.
    pub(crate) fn bitmap_init_member(&self, m: &crate::slot::Member) -> Result<()> {
        let Some(bm) = &self.bitmap else {
            return Ok(());
        };
        let st = bm.lock();
        m.dev
            .write_at(&st.area, bm.at, WriteFlags::FUA)
            .map_err(|e| e.context(format!("{}: writing the bitmap", m.name)))
    }

    /// Writes `blocks` of the area to every up member. Returns the members that failed
    /// (to be failed by the caller once the bitmap lock is released); an error when
    /// none took it.
    fn write_bitmap_blocks(
        &self,
        bm: &Bitmap,
        st: &State,
        blocks: &BTreeSet<u64>,
        flags: WriteFlags,
    ) -> Result<Vec<(usize, Error)>> {
        self.check_fenced()?;
        // Every member's copy at once (the write that follows waits for all of them).
        let jobs = (0..self.slots.len())
            // Members being rebuilt too: they must hold the bitmap once in sync.
            .filter(|&role| self.is_writable(role))
            .filter_map(|role| {
                // Kept apart from the members (dm-raid): on the role's own device.
                let dev = if bm.own.is_empty() {
                    self.slots[role].member().map(|m| m.dev.clone())
                } else {
                    bm.own_device(role)
                };
                dev.map(|d| (role, (role, d)))
            })
            .collect();
        // (role, (role, the device that holds its copy of the bitmap))
        type Job = (usize, (usize, Arc<dyn BlockDevice>));
        let jobs: Vec<Job> = jobs;
        let piece = |b: u64| &st.area[small(b * BLOCK)..small((b + 1) * BLOCK)];
        let results: Vec<(usize, Result<()>)> =
            if !jobs.is_empty() && jobs.iter().all(|(_, (_, d))| d.completes_later()) {
                // Members that complete later: every block to every member sent from
                // here, one wait (overlap::start_all).
                let writes: Vec<(usize, &Arc<dyn BlockDevice>, u64)> = jobs
                    .iter()
                    .flat_map(|(_, (role, d))| blocks.iter().map(move |&b| (*role, d, b)))
                    .collect();
                let answers = cairn_block::overlap::start_all(writes.clone(), |(_, d, b), a| {
                    d.write_then(piece(b), bm.at + b * BLOCK, flags, a)
                });
                let mut out: Vec<(usize, Result<()>)> =
                    jobs.iter().map(|(_, (role, _))| (*role, Ok(()))).collect();
                for ((role, _, _), a) in writes.into_iter().zip(answers) {
                    let r = a.unwrap_or_else(|| Err(crate::state::unanswered()));
                    if let (Err(e), Some(slot)) = (r, out.iter_mut().find(|(x, _)| *x == role)) {
                        if slot.1.is_ok() {
                            slot.1 = Err(e);
                        }
                    }
                }
                out
            } else {
                cairn_block::overlap::fan_out(jobs, self.flush_overlap_pays(), |(role, dev)| {
                    let r = blocks
                        .iter()
                        .try_for_each(|&b| dev.write_at(piece(b), bm.at + b * BLOCK, flags));
                    (role, r)
                })
            };
        let mut failed = Vec::new();
        let mut written = 0;
        for (role, r) in results {
            match r {
                Ok(()) => written += 1,
                Err(e) => failed.push((
                    role,
                    e.context(format!("{}: writing the bitmap", self.describe_role(role))),
                )),
            }
        }
        if written == 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: no member took the bitmap update{}",
                    self.array_label(),
                    failed
                        .last()
                        .map(|(_, e)| format!(": {e}"))
                        .unwrap_or_default()
                ),
            ));
        }
        Ok(failed)
    }

    /// The bits `[first, last]` a write of array bytes `[off, off + len)` dirties.
    fn bitmap_span(&self, bm: &Bitmap, off: u64, len: u64) -> (u64, u64) {
        let (start, end) = match (&self.layout, bm.coverage) {
            (ArrayLayout::Parity(pl), _) => {
                let c = pl.chunk().0 * SECTOR_SIZE;
                let row = c * wide(pl.data_disks());
                ((off / row) * c, (off + len - 1) / row * c + c)
            }
            _ => (off, off + len),
        };
        let last = ((end - 1) / bm.chunk).min(bm.chunks - 1);
        ((start / bm.chunk).min(last), last)
    }

    /// Before a write or discard of array bytes `[off, off + len)`: set and persist the
    /// bits it dirties (md's `bitmap_startwrite`).
    pub(crate) fn bitmap_start(&self, off: u64, len: u64) -> Result<()> {
        let Some(bm) = &self.bitmap else {
            return Ok(());
        };
        let (first, last) = self.bitmap_span(bm, off, len);
        let mut st = bm.lock();
        let mut blocks = BTreeSet::new();
        for c in first..=last {
            let i = small(c);
            if st.inflight[i] == 0 {
                st.done.remove(&c);
            }
            st.inflight[i] += 1;
            if !st.test(c) {
                st.set(c, true);
                blocks.insert(block_of(c));
            }
        }
        if blocks.is_empty() {
            return Ok(());
        }
        match self.write_bitmap_blocks(bm, &st, &blocks, WriteFlags::FUA) {
            Ok(failed) => {
                drop(st);
                for (role, e) in failed {
                    self.fail_member(role, &e);
                }
                Ok(())
            }
            Err(e) => {
                drop(st);
                self.bitmap_end(off, len);
                Err(e.context("setting write-intent bits before a write"))
            }
        }
    }

    /// After the write started by [`Array::bitmap_start`] (whatever its outcome).
    pub(crate) fn bitmap_end(&self, off: u64, len: u64) {
        let Some(bm) = &self.bitmap else { return };
        let (first, last) = self.bitmap_span(bm, off, len);
        let mut st = bm.lock();
        let gen = st.flushes_started + 1;
        let now = Instant::now();
        for c in first..=last {
            let i = small(c);
            debug_assert!(st.inflight[i] > 0);
            st.inflight[i] = st.inflight[i].saturating_sub(1);
            if st.inflight[i] == 0 && st.test(c) {
                st.done.insert(c, Done { gen, at: now });
            }
        }
    }

    /// Before the members are flushed: the flush's number.
    pub(crate) fn bitmap_flush_start(&self) -> u64 {
        let Some(bm) = &self.bitmap else { return 0 };
        let mut st = bm.lock();
        st.flushes_started += 1;
        st.flushes_started
    }

    /// After flush `gen` succeeded: writes completed before it are durable, so their
    /// chunks may be cleared once idle (md's bitmap daemon, run here).
    pub(crate) fn bitmap_flushed(&self, gen: u64) {
        let Some(bm) = &self.bitmap else { return };
        {
            let mut st = bm.lock();
            st.flushed = st.flushed.max(gen);
        }
        if let Err(e) = self.bitmap_sweep(false, WriteFlags::NONE) {
            tracing::warn!("{}: clearing bitmap bits: {e}", self.array_label());
        }
    }

    /// Whether bits may be cleared now: not degraded (the bits are what a re-add
    /// needs) and no resync pending (they say what it must cover).
    fn bitmap_may_clear(&self) -> bool {
        self.down_roles().is_empty() && !self.meta_lock().resync_pending
    }

    /// Clears the bits of chunks that are flushed and idle (all of those when
    /// `force`), and writes the blocks that changed. Returns how many were cleared.
    fn bitmap_sweep(&self, force: bool, flags: WriteFlags) -> Result<u64> {
        let Some(bm) = &self.bitmap else {
            return Ok(0);
        };
        if !self.bitmap_may_clear() {
            return Ok(0);
        }
        let idle = Duration::from_millis(bm.daemon_sleep_ms.load(Ordering::Relaxed));
        let mut st = bm.lock();
        let now = Instant::now();
        let flushed = st.flushed;
        let ready: Vec<u64> = st
            .done
            .iter()
            .filter(|(_, d)| flushed >= d.gen && (force || now.duration_since(d.at) >= idle))
            .map(|(&c, _)| c)
            .collect();
        if ready.is_empty() {
            return Ok(0);
        }
        let mut blocks = BTreeSet::from([0]);
        for &c in &ready {
            st.done.remove(&c);
            st.set(c, false);
            blocks.insert(block_of(c));
        }
        st.sb.events_cleared = st.sb.events;
        st.sync_header();
        let failed = self.write_bitmap_blocks(bm, &st, &blocks, flags)?;
        drop(st);
        for (role, e) in failed {
            self.fail_member(role, &e);
        }
        Ok(wide(ready.len()))
    }

    /// Superblock events changed to `events` (hook in `write_superblocks`, which holds
    /// the metadata lock): the bitmap header follows, written first as md does
    /// (`md_bitmap_update_sb`). A member that cannot take it is marked failed here; the
    /// superblocks written next record it faulty.
    pub(crate) fn bitmap_write_events(&self, events: u64) {
        let Some(bm) = &self.bitmap else { return };
        let mut st = bm.lock();
        st.sb.events = events;
        st.events_cleared_not_ahead();
        st.sync_header();
        let all = BTreeSet::from([0]);
        match self.write_bitmap_blocks(bm, &st, &all, WriteFlags::FUA) {
            Ok(failed) => {
                for (role, e) in failed {
                    self.slots[role].failed.store(true, Ordering::Release);
                    tracing::warn!(
                        "{}: {} failed writing the bitmap and is now out of the array: {e}",
                        self.array_label(),
                        self.describe_role(role)
                    );
                }
            }
            Err(e) => tracing::warn!("{}: {e}", self.array_label()),
        }
    }

    /// On a clean close, after the flush: clear every clearable bit and write them
    /// durably, so a clean stop leaves no dirty bits unless degraded.
    pub(crate) fn bitmap_close(&self) -> Result<()> {
        self.bitmap_sweep(true, WriteFlags::FUA).map(|_| ())
    }

    // ---- resync (background.rs hooks) -------------------------------------------------

    /// Whether a pending resync may skip what the bitmap says is clean.
    pub(crate) fn bitmap_guides_resync(&self) -> bool {
        self.bitmap.is_some() && self.meta_lock().resync_pending
    }

    /// Bytes one bit covers, if the array has a bitmap.
    pub(crate) fn bitmap_chunk(&self) -> Option<u64> {
        self.bitmap.as_ref().map(|b| b.chunk)
    }

    /// Whether any bit over `[start, end)` (member bytes; array bytes for RAID10) is set;
    /// true without a bitmap.
    pub(crate) fn bitmap_range_dirty(&self, start: u64, end: u64) -> bool {
        match &self.bitmap {
            Some(bm) if end > start => self.any_dirty(bm, start, end),
            Some(_) => false,
            None => true,
        }
    }

    fn any_dirty(&self, bm: &Bitmap, start: u64, end: u64) -> bool {
        let st = bm.lock();
        let last = ((end - 1) / bm.chunk).min(bm.chunks - 1);
        ((start / bm.chunk).min(last)..=last).any(|c| st.test(c))
    }

    /// Whether a pending resync must do stripe `i` (the bitmap, when it guides the
    /// resync, says one of its chunks is dirty).
    pub(crate) fn resync_stripe_needed(&self, pl: &ParityLayout, i: u64) -> bool {
        let c = pl.chunk().0 * SECTOR_SIZE;
        match (&self.bitmap, self.bitmap_guides_resync()) {
            (Some(bm), true) => self.any_dirty(bm, i * c, (i + 1) * c),
            _ => true,
        }
    }

    /// Resyncs stripe `i` unless the bitmap says it is clean (a pending resync with a
    /// bitmap covers only dirty chunks). Returns whether it did.
    pub(crate) fn resync_stripe_if_dirty(&self, pl: &ParityLayout, i: u64) -> Result<bool> {
        if !self.resync_stripe_needed(pl, i) {
            return Ok(false);
        }
        self.resync_stripe(pl, i)?;
        let c = pl.chunk().0 * SECTOR_SIZE;
        self.resynced.fetch_add(c, Ordering::Relaxed);
        Ok(true)
    }

    /// The dirty pieces of the mirrored array bytes `[pos, pos + n)`: the whole range
    /// unless the bitmap guides a pending resync, else its dirty bitmap chunks.
    pub(crate) fn mirror_resync_pieces(&self, pos: u64, n: u64) -> Vec<(u64, u64)> {
        let Some(bm) = self.bitmap.as_ref().filter(|_| self.bitmap_guides_resync()) else {
            return vec![(pos, n)];
        };
        // RAID1 bits count member bytes, which are array bytes; RAID10's count array
        // bytes: either way the range maps one to one.
        let end = pos + n;
        let mut at = pos;
        let mut out = Vec::new();
        while at < end {
            let stop = ((at / bm.chunk + 1) * bm.chunk).min(end);
            if self.any_dirty(bm, at, stop) {
                out.push((at, stop - at));
            }
            at = stop;
        }
        out
    }

    /// Resyncs the mirrored array bytes `[pos, pos + n)`, only their dirty chunks when
    /// the bitmap guides a pending resync. Returns the bytes resynced.
    pub(crate) fn resync_mirrors_if_dirty(&self, pos: u64, n: u64) -> Result<u64> {
        let mut worked = 0;
        for (at, len) in self.mirror_resync_pieces(pos, n) {
            self.resync_mirrors(at, len)?;
            self.resynced.fetch_add(len, Ordering::Relaxed);
            worked += len;
        }
        Ok(worked)
    }

    // ---- for tests, reports and the re-add path ------------------------------------------

    /// Bytes resynced since assembly: member bytes per member for RAID1/4/5/6 (one
    /// stripe counts its chunk), array bytes for RAID10 — the units bitmap chunks count.
    pub fn resynced_bytes(&self) -> u64 {
        self.resynced.load(Ordering::Relaxed)
    }

    /// The bitmap's state, if the array has one.
    pub fn bitmap_info(&self) -> Option<BitmapInfo> {
        let bm = self.bitmap.as_ref()?;
        let st = bm.lock();
        Some(BitmapInfo {
            chunk_bytes: bm.chunk,
            chunks: bm.chunks,
            dirty: st.dirty(bm.chunks),
            events: st.sb.events,
            events_cleared: st.sb.events_cleared,
            sync_size: st.sb.sync_size.0,
            offset: bm.at,
            coverage: match bm.coverage {
                Coverage::Member => "member",
                Coverage::Array => "array",
            },
        })
    }

    /// How long a chunk must be idle before its bit is cleared (md's `daemon_sleep`;
    /// from the bitmap header, 5 s as mdadm writes it).
    pub fn set_bitmap_daemon_sleep(&self, d: Duration) {
        if let Some(bm) = &self.bitmap {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            bm.daemon_sleep_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// md's bitmap daemon pass, for a caller with a timer: flushes when idle chunks
    /// wait for one, then clears what may be cleared. Returns the bits cleared (less
    /// any set meanwhile by concurrent writes).
    pub fn bitmap_daemon_work(&self) -> Result<u64> {
        let Some(bm) = &self.bitmap else {
            return Ok(0);
        };
        let (waiting, before) = {
            let st = bm.lock();
            (
                st.done.values().any(|d| d.gen > st.flushed),
                st.dirty(bm.chunks),
            )
        };
        if waiting {
            // The flush runs a pass of its own.
            cairn_block::BlockDevice::flush(self)?;
        }
        self.bitmap_sweep(false, WriteFlags::NONE)?;
        Ok(before.saturating_sub(bm.lock().dirty(bm.chunks)))
    }

    /// The dirty regions as `(start, len)` byte ranges, merged: member data-area bytes
    /// (from `data_offset`) for RAID1/4/5/6, array bytes for RAID10 (see
    /// [`BitmapInfo::coverage`]). A member re-added with a usable bitmap needs only
    /// these. Empty without a bitmap.
    pub(crate) fn bitmap_dirty_ranges(&self) -> Vec<(u64, u64)> {
        let Some(bm) = &self.bitmap else {
            return Vec::new();
        };
        let st = bm.lock();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for c in (0..bm.chunks).filter(|&c| st.test(c)) {
            let start = c * bm.chunk;
            match out.last_mut() {
                Some((s, l)) if *s + *l == start => *l += bm.chunk,
                _ => out.push((start, bm.chunk)),
            }
        }
        out
    }

    /// md's re-add rule (`super_1_validate`): a returning member whose superblock has
    /// `member_events` can be brought back by resyncing only the dirty ranges when it
    /// has seen every clearing of bits (`member_events >= events_cleared`). Without a
    /// bitmap, never.
    pub(crate) fn bitmap_allows_readd(&self, member_events: u64) -> bool {
        self.bitmap
            .as_ref()
            .is_some_and(|bm| member_events >= bm.lock().sb.events_cleared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_ranges_and_the_readd_rule() {
        use cairn_block::{BlockDevice, MemDisk};
        use std::sync::Arc;
        let members: Vec<Arc<dyn BlockDevice>> = (0..2)
            .map(|_| Arc::new(MemDisk::new(8 << 20)) as Arc<dyn BlockDevice>)
            .collect();
        let mut o = crate::CreateOptions::new(crate::Level::Raid1, "t");
        o.members_zeroed = true;
        o.bitmap = BitmapChoice::Internal {
            chunk_bytes: Some(64 << 10),
        };
        let a = Array::create(members, vec!["a".into(), "b".into()], &o).unwrap();
        a.set_bitmap_daemon_sleep(Duration::from_secs(3600));
        for off in [0, (64 << 10) + 4096, 5 << 20] {
            cairn_block::BlockDevice::write_at(&a, &[1u8; 4096], off, WriteFlags::NONE).unwrap();
        }
        assert_eq!(
            a.bitmap_dirty_ranges(),
            vec![(0, 128 << 10), (5 << 20, 64 << 10)]
        );
        // Clearing records the events; a member that left before then cannot use the
        // bitmap.
        a.set_bitmap_daemon_sleep(Duration::ZERO);
        assert_eq!(a.bitmap_daemon_work().unwrap(), 3);
        assert!(a.bitmap_dirty_ranges().is_empty());
        let cleared = a.bitmap_info().unwrap().events_cleared;
        assert!(cleared >= 2);
        assert!(a.bitmap_allows_readd(cleared));
        assert!(!a.bitmap_allows_readd(cleared - 1));
        a.close().unwrap();
    }
}
