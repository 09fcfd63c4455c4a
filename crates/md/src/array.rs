//! The array: md's data layout served as one [`BlockDevice`].
//!
//! ```text
//!   read_at / write_at / flush / discard          (array byte offsets)
//!     ├─ linear, raid0         one member per piece
//!     ├─ raid1, raid10         every copy on write (range-locked), one copy on read
//!     └─ raid4/5/6 (stripe.rs) per stripe, under a striped lock: full-stripe write,
//!                              read-modify-write or reconstruct-write, degraded rows
//!   Slot[role] ── Member { dev, name, data_offset }   + failed flag
//!   Meta ── superblock state: events, dirty/clean, faulty roles  (metadata updates)
//! ```
//!
//! Members are indexed by role (slot). A member is *up* when it is present and has not
//! failed. A member fails when a write or flush to it fails while the array still has
//! redundancy: the array marks it faulty in the other members' superblocks (events + 1)
//! before the request completes, so that it is never reassembled as current. A read
//! error is repaired instead: the data comes from another copy or from parity, and is
//! written back to the member that could not read it.
//!
//! Like md, redundant levels mark the superblocks dirty (`resync_offset` 0, events + 1)
//! before the first write and clean again on [`Array::close`] (also run on drop). There
//! is no idle timer ("safemode") yet, so an array that is written to stays dirty until
//! it is closed. An array assembled with a resync pending stays so until
//! [`Array::resync`] or the background resync ([`Array::start_resync`],
//! background.rs) has run to the end; a clean stop part-way records a checkpoint.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;

use cairn_block::overlap::{fan_out, start_all};
use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteFlags,
};

use crate::state::unanswered;
pub use crate::state::Array;

use crate::layout::{ArrayLayout, Location};
use crate::state::MIRROR_REGION;
use crate::units::{small, wide, Sectors, SECTOR_SIZE};

impl Array {
    // ---- the simple levels ---------------------------------------------------------

    /// Splits `[off, off + len)` (bytes) into pieces that each map contiguously onto
    /// every copy: `(array offset, length, copies)`.
    pub(crate) fn pieces(&self, off: u64, len: u64) -> Vec<(u64, u64, Vec<Location>)> {
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let s = Sectors(pos / SECTOR_SIZE);
            let (stop, locs) = match &self.layout {
                ArrayLayout::Linear(l) => {
                    let loc = l.map(s).expect("inside the array");
                    (l.ends()[loc.member].0 * SECTOR_SIZE, vec![loc])
                }
                ArrayLayout::Raid0(l) => {
                    let c = l.chunk().0;
                    (
                        (s.0 / c + 1) * c * SECTOR_SIZE,
                        vec![l.map(s).expect("inside the array")],
                    )
                }
                ArrayLayout::Raid1(l) => (end, l.map(s).collect()),
                ArrayLayout::Raid10(l) => {
                    let c = l.chunk().0;
                    ((s.0 / c + 1) * c * SECTOR_SIZE, l.map(s).collect())
                }
                ArrayLayout::Parity(_) => unreachable!("parity levels use the stripe path"),
            };
            let n = stop.min(end) - pos;
            out.push((pos, n, locs));
            pos += n;
        }
        out
    }

    fn simple_read(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let rotate = matches!(self.layout, ArrayLayout::Raid1(_));
        let parallel = self.read_overlap_pays(buf.len());
        // Every piece is read at once, each from its first copy that is up; a copy
        // that fails to read hands its piece to the next copy.
        let mut jobs = Vec::new();
        let mut rest: &mut [u8] = &mut *buf;
        for (pos, n, mut locs) in self.pieces(off, wide(rest.len())) {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(small(n));
            rest = tail;
            if rotate && locs.len() > 1 {
                let k = self.next_read.fetch_add(1, Ordering::Relaxed) % locs.len();
                locs.rotate_left(k);
            }
            let first = locs
                .iter()
                .find(|l| self.is_up(l.member))
                .map_or(usize::MAX, |l| l.member);
            jobs.push((first, (pos, n, locs, piece)));
        }
        let results = match self.read_first_copies_later(jobs) {
            Ok(results) => results,
            Err(jobs) => fan_out(jobs, parallel, |(pos, n, locs, piece)| {
                let (good, bad) = self.read_copies(&locs, 0, piece, Vec::new());
                (pos, n, locs, good, bad)
            }),
        };
        for (pos, n, locs, good, bad) in results {
            match good {
                Some(src) if !bad.is_empty() => self.repair_copies(pos, n, src, &locs, bad),
                Some(_) => {}
                None => return Err(self.no_copy_error(pos, n, &locs, bad)),
            }
        }
        Ok(())
    }

    /// [`Array::simple_read`]'s pieces when every piece's first copy that is up
    /// completes later (remote members): every first read is sent from this thread and
    /// all are waited for once ([`Array::read_later`]); a piece whose first copy failed
    /// then goes on to its next copies here, one after another, as on the pool path.
    /// Gives the pieces back, nothing read, when some first copy does not complete later
    /// or a piece has no copy up.
    fn read_first_copies_later<'b>(
        &self,
        jobs: Vec<(usize, Piece<'b>)>,
    ) -> std::result::Result<Vec<PieceRead>, Vec<(usize, Piece<'b>)>> {
        if jobs.iter().any(|(first, _)| *first == usize::MAX) {
            return Err(jobs);
        }
        // Where each piece's first copy is, and the reads themselves.
        let mut firsts = Vec::with_capacity(jobs.len());
        let mut pieces = Vec::with_capacity(jobs.len());
        let mut reads = Vec::with_capacity(jobs.len());
        for (first, (pos, n, locs, piece)) in jobs {
            let i = locs
                .iter()
                .position(|l| l.member == first)
                .expect("the first copy is one of the piece's");
            reads.push((first, piece, locs[i].sector.0 * SECTOR_SIZE));
            firsts.push(i);
            pieces.push((pos, n, locs));
        }
        let Some(failed) = self.read_later(&mut reads) else {
            let back = pieces.into_iter().zip(reads);
            return Err(back
                .map(|((pos, n, locs), (first, piece, _))| (first, (pos, n, locs, piece)))
                .collect());
        };
        Ok(pieces
            .into_iter()
            .zip(reads)
            .zip(firsts.into_iter().zip(failed))
            .map(|(((pos, n, locs), (first, piece, _)), (i, failed))| {
                let (good, bad) = match failed {
                    None => (Some(locs[i]), Vec::new()),
                    Some(e) => self.read_copies(&locs, i + 1, piece, vec![(first, e)]),
                };
                (pos, n, locs, good, bad)
            })
            .collect())
    }

    /// Reads `piece` from the first copy of `locs[from..]` that is up and can read it,
    /// one after another; `bad` holds the copies that failed before. Returns the copy
    /// read and every copy that failed.
    fn read_copies(
        &self,
        locs: &[Location],
        from: usize,
        piece: &mut [u8],
        mut bad: Vec<(usize, Error)>,
    ) -> (Option<Location>, Vec<(usize, Error)>) {
        for loc in &locs[from..] {
            if !self.is_up(loc.member) {
                continue;
            }
            match self.read_member(loc.member, piece, loc.sector.0 * SECTOR_SIZE) {
                Ok(()) => return (Some(*loc), bad),
                Err(e) => bad.push((loc.member, e)),
            }
        }
        (None, bad)
    }

    /// After a read error on some copies of `[pos, pos + n)`: rewrite them from the good
    /// copy `src` (md's read-error correction). A copy that cannot be rewritten fails.
    fn repair_copies(
        &self,
        pos: u64,
        n: u64,
        src: Location,
        locs: &[Location],
        bad: Vec<(usize, Error)>,
    ) {
        let _guards = self.locks.lock_many(self.mirror_keys(pos, n));
        let mut data = vec![0u8; small(n)];
        if let Err(e) = self.read_member(src.member, &mut data, src.sector.0 * SECTOR_SIZE) {
            tracing::warn!("{}: re-reading for repair: {e}", self.array_label());
            return;
        }
        for (member, err) in bad {
            tracing::warn!(
                "{}: read error corrected from {}: {err}",
                self.array_label(),
                self.describe_role(src.member)
            );
            let Some(loc) = locs.iter().find(|l| l.member == member) else {
                continue;
            };
            if self.caps.read_only {
                continue;
            }
            if let Err(e) =
                self.write_member(member, &data, loc.sector.0 * SECTOR_SIZE, WriteFlags::NONE)
            {
                self.fail_member(member, &e);
            }
        }
    }

    fn no_copy_error(
        &self,
        pos: u64,
        n: u64,
        locs: &[Location],
        bad: Vec<(usize, Error)>,
    ) -> Error {
        let names: Vec<String> = locs.iter().map(|l| self.describe_role(l.member)).collect();
        match bad.into_iter().last() {
            Some((_, e)) if locs.len() == 1 => e,
            Some((_, e)) => e.context(format!(
                "{}: no copy of array bytes {pos}..{} could be read (copies on {})",
                self.array_label(),
                pos + n,
                names.join(", ")
            )),
            None => Error::new(
                ErrorKind::Degraded,
                format!(
                    "{}: array bytes {pos}..{} live only on {}, which {} not available",
                    self.array_label(),
                    pos + n,
                    names.join(", "),
                    if names.len() == 1 { "is" } else { "are" }
                ),
            ),
        }
    }

    /// Lock keys that serialise writes to mirrored `[off, off + len)`.
    pub(crate) fn mirror_keys(&self, off: u64, len: u64) -> impl Iterator<Item = u64> {
        let unit = match &self.layout {
            ArrayLayout::Raid10(l) => l.chunk().0 * SECTOR_SIZE,
            _ => MIRROR_REGION,
        };
        (off / unit)..=((off + len.max(1) - 1) / unit)
    }

    fn simple_write(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let mirrored = self.layout_is_redundant();
        let _guards = if mirrored {
            self.locks.lock_many(self.mirror_keys(off, wide(buf.len())))
        } else {
            Vec::new()
        };
        // Every copy of every piece is written at once; then each piece counts its
        // copies.
        let pieces = self.pieces(off, wide(buf.len()));
        let mut jobs = Vec::new();
        let mut whose = Vec::new();
        for (i, (pos, n, locs)) in pieces.iter().enumerate() {
            let piece = &buf[small(pos - off)..small(pos - off + n)];
            for loc in locs {
                if self.is_writable(loc.member) {
                    let at = loc.sector.0 * SECTOR_SIZE;
                    jobs.push((loc.member, (loc.member, Cow::Borrowed(piece), at)));
                    whose.push((i, loc.member));
                }
            }
        }
        let results = self.write_members(jobs, flags, self.overlap_pays(buf.len()));
        let mut written = vec![0usize; pieces.len()];
        let mut bad: Vec<Vec<(usize, Error)>> = pieces.iter().map(|_| Vec::new()).collect();
        for (failed, (i, member)) in results.into_iter().zip(whose) {
            match failed {
                // A copy being rebuilt does not count: it cannot be read yet.
                None if self.is_up(member) => written[i] += 1,
                None => {}
                Some((_, e)) => bad[i].push((member, e)),
            }
        }
        for (i, ((pos, n, locs), mut bad)) in pieces.into_iter().zip(bad).enumerate() {
            if !mirrored {
                if let Some((_, e)) = bad.pop() {
                    return Err(e);
                }
            }
            if written[i] == 0 {
                return Err(self.no_copy_error(pos, n, &locs, bad));
            }
            for (member, e) in bad {
                self.fail_member(member, &e);
            }
        }
        Ok(())
    }

    fn simple_discard(&self, off: u64, len: u64) -> Result<()> {
        let _guards = if self.layout_is_redundant() {
            self.locks.lock_many(self.mirror_keys(off, len))
        } else {
            Vec::new()
        };
        let jobs = self.discard_jobs(off, len);
        let Some(members) = self.later_members(jobs.iter().map(|j| j.role)) else {
            for j in &jobs {
                let m = self.up_member(j.role)?;
                m.dev
                    .discard(m.base + j.member_off, j.len)
                    .map_err(|e| self.member_discard_failed(j, e))?;
            }
            return Ok(());
        };
        // Members that complete later: every discard sent from here, one wait. The first
        // error in job order is the answer, as on the path above, where it stops the
        // discards after it; here those have been sent, which a discard allows.
        let answers = start_all(jobs.iter().zip(&members).collect(), |(j, m), answer| {
            m.dev.discard_then(m.base + j.member_off, j.len, answer)
        });
        for (j, answer) in jobs.iter().zip(answers) {
            answer
                .unwrap_or_else(|| Err(unanswered()))
                .map_err(|e| self.member_discard_failed(j, e))?;
        }
        Ok(())
    }

    /// The member discards of `[off, off + len)`, in the order of the array bytes they
    /// cover: one per piece and copy that takes writes, a piece that continues its
    /// member's previous discard on that member joining it. A discard spanning many
    /// chunks is then one request per member (RAID0, near RAID10), not one per chunk:
    /// over members that complete later, every one is outstanding at once.
    fn discard_jobs(&self, off: u64, len: u64) -> Vec<DiscardJob> {
        let mut jobs: Vec<DiscardJob> = Vec::new();
        let mut last: HashMap<usize, usize> = HashMap::new();
        for (pos, n, locs) in self.pieces(off, len) {
            for loc in &locs {
                if !self.is_writable(loc.member) {
                    continue;
                }
                let member_off = loc.sector.0 * SECTOR_SIZE;
                if let Some(&i) = last.get(&loc.member) {
                    let j = &mut jobs[i];
                    if j.member_off + j.len == member_off {
                        j.len += n;
                        j.array_end = pos + n;
                        continue;
                    }
                }
                last.insert(loc.member, jobs.len());
                jobs.push(DiscardJob {
                    role: loc.member,
                    member_off,
                    len: n,
                    array_start: pos,
                    array_end: pos + n,
                });
            }
        }
        jobs
    }

    fn member_discard_failed(&self, j: &DiscardJob, e: Error) -> Error {
        e.context(format!(
            "{}: discard of {} bytes at member offset {} (array bytes {}..{})",
            self.describe_role(j.role),
            j.len,
            j.member_off,
            j.array_start,
            j.array_end
        ))
    }
}

/// One member discard of [`Array::discard`]: `len` bytes at `member_off` of `role`'s
/// data area, for array bytes within `array_start..array_end`.
struct DiscardJob {
    role: usize,
    member_off: u64,
    len: u64,
    array_start: u64,
    array_end: u64,
}

impl BlockDevice for Array {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        debug_assert!(offset + wide(buf.len()) <= self.geometry.size);
        debug_assert_eq!(offset % u64::from(self.geometry.logical_block_size), 0);
        if buf.is_empty() {
            return Ok(());
        }
        // A fenced array's members may hold a new owner's writes by now.
        self.check_fenced()?;
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        let _in = InFlight::enter(&self.in_flight);
        match &self.layout {
            ArrayLayout::Parity(pl) => self.parity_read(pl, buf, offset),
            _ => self.simple_read(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        debug_assert!(offset + wide(buf.len()) <= self.geometry.size);
        debug_assert_eq!(offset % u64::from(self.geometry.logical_block_size), 0);
        if buf.is_empty() {
            return Ok(());
        }
        if self.caps.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{}: a member is read-only", self.array_label()),
            ));
        }
        self.check_fenced()?;
        let _pending = self.start_write()?;
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        let _in = InFlight::enter(&self.in_flight);
        self.bitmap_start(offset, wide(buf.len()))?;
        let r = match &self.layout {
            ArrayLayout::Parity(pl) => self.parity_write(pl, buf, offset, flags),
            _ => self.simple_write(buf, offset, flags),
        };
        self.bitmap_end(offset, wide(buf.len()));
        r
    }

    fn flush(&self) -> Result<()> {
        self.check_fenced()?;
        let gen = self.bitmap_flush_start();
        let generation = self.ppl.as_ref().map(|log| log.begin_flush());
        // Every member (and replacement) at once.
        // (role, (role, is the replacement, device))
        type Flush = (usize, (usize, bool, Arc<dyn BlockDevice>));
        let mut devs: Vec<Flush> = Vec::new();
        for (role, slot) in self.slots.iter().enumerate() {
            if let Some(r) = slot.replacement() {
                devs.push((role, (role, true, r.dev.clone())));
            }
            if let Some(m) = slot.member().filter(|_| self.is_writable(role)) {
                devs.push((role, (role, false, m.dev.clone())));
            }
        }
        let later = !devs.is_empty() && devs.iter().all(|(_, (_, _, d))| d.completes_later());
        let errors: Vec<Option<Error>> = if later {
            // Members that complete later: every flush sent from here, one wait.
            let t = std::time::Instant::now();
            let answers = start_all(devs.iter().map(|(_, (_, _, d))| d).collect(), |d, a| {
                d.flush_then(a)
            });
            self.flush_latency.sample(0, t.elapsed());
            answers
                .into_iter()
                .map(|a| a.unwrap_or_else(|| Err(unanswered())).err())
                .collect()
        } else {
            let jobs = devs.iter().map(|(role, (_, _, d))| (*role, d)).collect();
            fan_out(jobs, self.flush_overlap_pays(), |d| {
                self.flush_dev(&**d).err()
            })
        };
        let mut last = None;
        for ((_, (role, replacement, _)), e) in devs.into_iter().zip(errors) {
            let Some(e) = e else { continue };
            if replacement {
                self.drop_replacement(role, &e);
                continue;
            }
            let e = e.context(format!("{}: flush", self.describe_role(role)));
            if self.layout_is_redundant() {
                self.fail_member(role, &e);
            }
            last = Some(e);
        }
        if let (Some(log), Some(g), None) = (&self.ppl, generation, &last) {
            log.end_flush(g);
        }
        match last {
            Some(e) if !self.layout.tolerates(&self.down_mask()) || !self.layout_is_redundant() => {
                Err(e)
            }
            _ => {
                self.bitmap_flushed(gen);
                Ok(())
            }
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if self.caps.discard == Support::None {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("discard on {}", self.array_label()),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.check_fenced()?;
        let _pending = self.start_write()?;
        self.bitmap_start(offset, len)?;
        let r = self.simple_discard(offset, len);
        self.bitmap_end(offset, len);
        r
    }
}

/// A piece of a read of the simple levels: (array offset, length, copies, its buffer).
type Piece<'b> = (u64, u64, Vec<Location>, &'b mut [u8]);

/// A piece read: (array offset, length, copies, the copy read, the copies that failed).
type PieceRead = (
    u64,
    u64,
    Vec<Location>,
    Option<Location>,
    Vec<(usize, Error)>,
);

/// Counts a client request as in flight on the array until dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> InFlight<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
