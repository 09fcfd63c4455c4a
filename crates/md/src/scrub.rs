//! Scrub: md's `check` and `repair` sync actions. Every block of every stripe, or every
//! copy of every region, is read and compared with what the redundancy says it should
//! be; `check` reports where they disagree, `repair` also makes them agree.
//!
//! ```text
//!   Array::scrub(repair, progress) ── i in 0..scrub_units().count ──> scrub_unit(i, ..)
//!   scrub_unit, under the locks writes take for that unit (clients keep going):
//!     RAID4/5   a stripe: P against the XOR of the data, per 4 KiB page
//!                           repair: rewrite P (which member is wrong cannot be told)
//!     RAID6     a stripe: dP, dQ per page -> parity::check::locate_error
//!                 P | Q | data chunk z      repair: rewrite that block (D_z ⊕ dP)
//!                 unidentifiable            repair: rewrite P and Q from the data (md)
//!     RAID1/10  1 MiB of array bytes: every copy against the first, per page
//!                           repair: the first copy over the others (md)
//!     a member read error: the bytes are rebuilt from redundancy and written back, as
//!     reads do, in both modes
//!   ──> ScrubReport { mismatch_sectors (md's mismatch_cnt), regions, .. }
//!
//!   Array::scrub / the background check, pipelined (pipeline.rs, ScrubStage):
//!     window N (its units' locks held): compare + repair   (this thread)
//!     window N+1 (locks tried, taken):  read every member  (an I/O worker)
//!     N done: its findings go into the report in unit order, N's locks dropped
//!     (every member up completes later: N's units compared, then all their writes
//!      sent from this thread and waited for once: scrub_plan, scrub_settle)
//! ```
//!
//! Each unit is still read, compared and repaired under its locks, and a unit's findings
//! reach the report in unit order after its window, so the report is the one the unit by
//! unit walk (`scrub_unit`) gives. The read-ahead follows the pipeline's rules: tried
//! locks only, only while unpaced, given up before a pause.
//!
//! The page (4 KiB, md's `STRIPE_SIZE`) is the unit of comparison and of counting:
//! like md's RAID4/5/6, every page row that disagrees adds 8 sectors to
//! `mismatch_sectors`. (md's RAID1/10 count whole 64 KiB resync blocks instead; cairn
//! counts pages there too, which is finer.) RAID6 locates the wrong block per page, as
//! mdadm's `raid6check` does, so two bad members in different pages of one stripe are
//! both found; two in the same page are unidentifiable.
//!
//! Unlike md's in-kernel `repair`, which only ever rewrites P and Q, a RAID6 repair
//! rewrites the data chunk it has identified (what `raid6check ... autorepair` does):
//! rewriting parity over a silently corrupted data chunk would make the corruption
//! permanent.

use std::borrow::Cow;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

pub(crate) mod report;

pub use report::{Finding, Mismatch, ScrubReport, ScrubUnits, PAGE, REGION_LIMIT};

use std::sync::{Mutex, PoisonError};

use crate::layout::{ArrayLayout, Location, ParityLayout};
use crate::parity::check::{locate_error, ErrorLocation};
use crate::pipeline::{Pipe, Stage, WriteJob};
use crate::state::{Array, Bytes, ReadJob};
use crate::units::{small, wide, StripeNo, SECTOR_SIZE};

/// The RAID1/10 scrub unit in array bytes (RAID10: at least one chunk).
const MIRROR_UNIT: u64 = 1 << 20;

fn action(repair: bool) -> &'static str {
    if repair {
        "repair"
    } else {
        "check"
    }
}

impl Array {
    /// Whether a check (or repair) can run now: the level has redundancy, every member
    /// is up, no resync is pending, and for a repair the members are writable.
    pub fn check_scrub_possible(&self, repair: bool) -> Result<()> {
        self.scrub_units()?;
        self.refuse_degraded(repair)?;
        if self.meta_lock().resync_pending {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{}: cannot {} while a resync is pending (after an unclean stop, or a \
                     create over old data): until it has run, parity and mirrors may rightly \
                     disagree with the data; let the resync finish first",
                    self.array_label(),
                    action(repair)
                ),
            ));
        }
        if repair && self.capabilities().read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{}: cannot repair: a member is read-only",
                    self.array_label()
                ),
            ));
        }
        Ok(())
    }

    fn refuse_degraded(&self, repair: bool) -> Result<()> {
        let down = self.down_roles();
        if down.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = down.iter().map(|&r| self.describe_role(r)).collect();
        Err(Error::new(
            ErrorKind::Degraded,
            format!(
                "{}: cannot {} while {} {} not available: cairn compares only complete \
                 arrays",
                self.array_label(),
                action(repair),
                names.join(", "),
                if names.len() == 1 { "is" } else { "are" }
            ),
        ))
    }

    /// The units a scrub walks: a stripe for RAID4/5/6, 1 MiB (at least a chunk) of
    /// array bytes for RAID1/10. Linear and RAID0 have nothing to check.
    pub fn scrub_units(&self) -> Result<ScrubUnits> {
        let total_bytes = self.size_bytes();
        let unit_bytes = match &self.layout {
            ArrayLayout::Parity(pl) => pl.chunk().0 * SECTOR_SIZE * wide(pl.data_disks()),
            ArrayLayout::Raid1(_) => MIRROR_UNIT,
            ArrayLayout::Raid10(l) => MIRROR_UNIT.max(l.chunk().0 * SECTOR_SIZE),
            ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: {} keeps no redundancy, so there is nothing to check",
                        self.array_label(),
                        self.level()
                    ),
                ))
            }
        };
        let count = match &self.layout {
            ArrayLayout::Parity(pl) => pl.stripes(),
            _ => total_bytes.div_ceil(unit_bytes),
        };
        Ok(ScrubUnits {
            count,
            unit_bytes,
            total_bytes,
        })
    }

    /// Checks (and with `repair`, repairs) unit `i` of [`Array::scrub_units`] under the
    /// locks writes take, adding what it finds to `report`. Returns the array bytes the
    /// unit covers. Fails with `Degraded` once a member is down (also when a repair
    /// write failed it): there is nothing left to compare.
    ///
    /// A caller walking the units itself runs [`Array::check_scrub_possible`] first, and
    /// flushes after a repair, as [`Array::scrub`] does.
    pub fn scrub_unit(&self, i: u64, repair: bool, report: &mut ScrubReport) -> Result<u64> {
        let units = self.scrub_units()?;
        debug_assert!(i < units.count);
        let _guards = self.lock_stripes(self.scrub_keys(&units, i, 1).into_iter());
        let mut read = self.scrub_read(&units, i, repair)?;
        let mut found = Vec::new();
        let bytes = self.scrub_compare(&units, i, &mut read, repair, &mut found)?;
        for m in found {
            report.record(m);
        }
        report.bytes_checked += bytes;
        Ok(bytes)
    }

    /// The lock table keys of units `[first, first + count)`: the stripes, or the mirror
    /// regions writes to those array bytes take.
    fn scrub_keys(&self, units: &ScrubUnits, first: u64, count: u64) -> Vec<u64> {
        match &self.layout {
            ArrayLayout::Parity(_) => (first..first + count).collect(),
            _ => (first..first + count)
                .map(|i| mirror_unit(units, i))
                .filter(|&(_, n)| n > 0)
                .flat_map(|(pos, n)| self.mirror_keys(pos, n))
                .collect(),
        }
    }

    /// Reads unit `i` for a scrub, its locks held by the caller: refused once a member
    /// is down.
    fn scrub_read(&self, units: &ScrubUnits, i: u64, repair: bool) -> Result<ScrubRead> {
        self.refuse_degraded(repair)?;
        match &self.layout {
            ArrayLayout::Parity(pl) => {
                let c = pl.chunk().0 * SECTOR_SIZE;
                let map = pl.stripe_map(StripeNo(i));
                let mut down = self.down_mask();
                let mut read_errors = Vec::new();
                let rows = self.read_row(pl, &map, i, 0, c, &mut down, &mut read_errors)?;
                Ok(ScrubRead::Stripe { rows, read_errors })
            }
            _ => {
                let (pos, n) = mirror_unit(units, i);
                Ok(ScrubRead::Mirrors(self.scrub_mirrors_read(pos, n)))
            }
        }
    }

    /// Compares (and with `repair`, repairs) unit `i` as read by [`Array::scrub_read`],
    /// its locks still held; what it finds goes to `found`, in order. Returns the array
    /// bytes the unit covers. The unit's writes go out together
    /// ([`Array::write_members`]), then [`Array::scrub_settle`] says what their
    /// failures mean.
    fn scrub_compare(
        &self,
        units: &ScrubUnits,
        i: u64,
        read: &mut ScrubRead,
        repair: bool,
        found: &mut Vec<Mismatch>,
    ) -> Result<u64> {
        let mut plan = RepairPlan::default();
        let (bytes, writes) = self.scrub_plan(units, i, read, repair, found, &mut plan);
        let jobs = writes
            .into_iter()
            .map(|(m, off, data)| (m, (m, Cow::Borrowed(data), off)))
            .collect();
        let failed = self.write_members(jobs, WriteFlags::NONE, self.overlap_pays(0));
        self.scrub_settle(&mut plan, failed, repair, found)?;
        Ok(bytes)
    }

    /// Compares unit `i` as [`Array::scrub_compare`] does, writing nothing: returns the
    /// array bytes the unit covers and the writes it asks for, `(member, member byte,
    /// bytes)` (with `repair` the repairs; in both modes the rewrites of what did not
    /// read), `plan` keeping what their failures mean.
    fn scrub_plan<'r>(
        &self,
        units: &ScrubUnits,
        i: u64,
        read: &'r mut ScrubRead,
        repair: bool,
        found: &mut Vec<Mismatch>,
        plan: &mut RepairPlan,
    ) -> (u64, Vec<RepairWrite<'r>>) {
        plan.read_error.clear();
        plan.error = None;
        let mut writes = Vec::new();
        let bytes = match (&self.layout, read) {
            (ArrayLayout::Parity(pl), ScrubRead::Stripe { rows, read_errors }) => {
                self.scrub_stripe(pl, i, rows, read_errors, repair, found, &mut writes, plan)
            }
            (_, ScrubRead::Mirrors(pieces)) => {
                let (_, n) = mirror_unit(units, i);
                self.scrub_mirrors(pieces, repair, found, &mut writes, plan);
                n
            }
            _ => unreachable!("a unit is read as its layout says"),
        };
        (bytes, writes)
    }

    /// What follows the writes of [`Array::scrub_plan`], `failed` holding each one's
    /// member and error: a rewrite of what did not read that fails fails its member
    /// (that finding is not repaired); a failed repair fails its member too, and on a
    /// parity level fails the scrub as `execute_writes` fails a request (the array can
    /// no longer rebuild what was written). A finding is repaired when every member it
    /// rewrites is still up. Then the error of a piece no copy of could be read.
    fn scrub_settle(
        &self,
        plan: &mut RepairPlan,
        failed: Vec<Option<(usize, Error)>>,
        repair: bool,
        found: &mut [Mismatch],
    ) -> Result<()> {
        let mut repairs_failed = Vec::new();
        for (read_error, f) in plan.read_error.drain(..).zip(failed) {
            let Some((m, e)) = f else { continue };
            match read_error {
                Some(i) => {
                    self.fail_member(m, &e);
                    found[i].repaired = false;
                }
                None => repairs_failed.push((m, e)),
            }
        }
        match &self.layout {
            ArrayLayout::Parity(pl) => self.writes_failed(pl, repairs_failed)?,
            _ => {
                for (m, e) in repairs_failed {
                    self.fail_member(m, &e);
                }
            }
        }
        for m in found.iter_mut() {
            if m.finding != Finding::ReadError {
                m.repaired = repair && m.rewritten.iter().all(|&r| self.is_up(r));
            }
        }
        plan.error.take().map_or(Ok(()), Err)
    }

    /// Checks (or repairs) the whole array, unit by unit, calling `progress(done,
    /// total)` in array bytes after each; it returns false to stop (the report then
    /// says `complete: false`). A repair flushes the members at the end.
    pub fn scrub(&self, repair: bool, progress: &dyn Fn(u64, u64) -> bool) -> Result<ScrubReport> {
        self.check_scrub_possible(repair)?;
        let units = self.scrub_units()?;
        let stage = ScrubStage::new(self, repair, units);
        let unit = stage.member_unit();
        // Windows of units, the next one read while the current one is compared
        // (pipeline.rs); progress is told after each window.
        let mut pipe = Pipe::new(self, stage, unit, units.count);
        let mut done = 0;
        let mut i = 0;
        while i < units.count {
            let (count, bytes) = pipe.step(i, true)?;
            i += count;
            done += bytes;
            if !progress(done, units.total_bytes) {
                pipe.drop_ahead();
                return Ok(pipe.stage().report());
            }
        }
        let mut report = pipe.stage().report();
        drop(pipe);
        if repair {
            self.flush()?;
        }
        report.complete = true;
        tracing::info!(
            "{}: {} done: {} mismatched sectors in {} regions, {} read errors",
            self.array_label(),
            action(repair),
            report.mismatch_sectors,
            wide(report.regions.len()) + report.regions_omitted,
            report.read_errors
        );
        Ok(report)
    }

    /// One RAID4/5/6 stripe, read under its lock (which is still held): compares, and
    /// with `repair` plans the rewrites into `writes` ([`Array::scrub_plan`]).
    #[allow(clippy::too_many_arguments)]
    fn scrub_stripe<'r>(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        rows: &'r mut [Vec<u8>],
        read_errors: &[usize],
        repair: bool,
        report: &mut Vec<Mismatch>,
        writes: &mut Vec<RepairWrite<'r>>,
        plan: &mut RepairPlan,
    ) -> u64 {
        let c = pl.chunk().0 * SECTOR_SIZE;
        let k = wide(pl.data_disks());
        let unit = c * k;
        let base = stripe * c;
        let array_base = stripe * unit;
        let map = pl.stripe_map(StripeNo(stripe));
        if !read_errors.is_empty() {
            // The failed chunks were rebuilt from the others, so the row is consistent
            // by construction: write them back as a read would, and compare nothing.
            let rows: &'r [Vec<u8>] = rows;
            for &m in read_errors {
                let ok = self.is_up(m);
                if ok {
                    writes.push((m, base, rows[m].as_slice()));
                    plan.read_error.push(Some(report.len()));
                }
                report.push(Mismatch {
                    finding: Finding::ReadError,
                    stripe: Some(stripe),
                    array_offset: array_base,
                    member_offset: base,
                    len: c,
                    blamed: Some(m),
                    rewritten: vec![m],
                    repaired: ok,
                });
            }
            return unit;
        }
        let (p, q) = {
            let data: Vec<&[u8]> = map.data.iter().map(|&m| rows[m].as_slice()).collect();
            self.gen_parity(&map, &data)
        };
        let parity_ok = rows[map.p] == p
            && match (map.q, &q) {
                (Some(qm), Some(q)) => rows[qm] == *q,
                _ => true,
            };
        if parity_ok {
            return unit;
        }
        let order = map.syndrome_order();
        let data_slots: Vec<bool> = order.iter().map(Option::is_some).collect();
        let mut found = Vec::new();
        // Per member, the span of its row that repair changed.
        let mut changed: Vec<Option<(usize, usize)>> = vec![None; rows.len()];
        let mut touch = |m: usize, r: &std::ops::Range<usize>| {
            let span = changed[m].get_or_insert((r.start, r.end));
            *span = (span.0.min(r.start), span.1.max(r.end));
        };
        let mut x = 0;
        while x < c {
            let r = small(x)..small((x + PAGE).min(c));
            x += PAGE;
            let p_ok = rows[map.p][r.clone()] == p[r.clone()];
            let (finding, blamed, rewritten) = match (map.q, &q) {
                (Some(qm), Some(q)) => {
                    if p_ok && rows[qm][r.clone()] == q[r.clone()] {
                        continue;
                    }
                    let mut dp = rows[map.p][r.clone()].to_vec();
                    self.parity.xor_into(&mut dp, &p[r.clone()]);
                    let mut dq = rows[qm][r.clone()].to_vec();
                    self.parity.xor_into(&mut dq, &q[r.clone()]);
                    let (finding, blamed, rewritten) = match locate_error(&dp, &dq, &data_slots) {
                        ErrorLocation::Consistent => unreachable!("the page differs"),
                        ErrorLocation::P => (Finding::P, Some(map.p), vec![map.p]),
                        ErrorLocation::Q => (Finding::Q, Some(qm), vec![qm]),
                        ErrorLocation::Data(z) => {
                            let m = order[usize::from(z)].expect("locate_error names data slots");
                            (Finding::Data, Some(m), vec![m])
                        }
                        ErrorLocation::Unidentifiable => {
                            (Finding::Unidentifiable, None, vec![map.p, qm])
                        }
                    };
                    if repair {
                        match finding {
                            Finding::Data => {
                                let m = blamed.expect("data is blamed");
                                self.parity.xor_into(&mut rows[m][r.clone()], &dp);
                            }
                            _ => {
                                if rewritten.contains(&map.p) {
                                    rows[map.p][r.clone()].copy_from_slice(&p[r.clone()]);
                                }
                                if rewritten.contains(&qm) {
                                    rows[qm][r.clone()].copy_from_slice(&q[r.clone()]);
                                }
                            }
                        }
                    }
                    (finding, blamed, rewritten)
                }
                _ => {
                    if p_ok {
                        continue;
                    }
                    if repair {
                        rows[map.p][r.clone()].copy_from_slice(&p[r.clone()]);
                    }
                    (Finding::Parity, None, vec![map.p])
                }
            };
            if repair {
                for &m in &rewritten {
                    touch(m, &r);
                }
            }
            found.push(Mismatch {
                finding,
                stripe: Some(stripe),
                array_offset: array_base + wide(r.start),
                member_offset: base + wide(r.start),
                len: wide(r.len()),
                blamed,
                rewritten,
                repaired: false,
            });
        }
        if repair {
            let rows: &'r [Vec<u8>] = rows;
            for (m, span) in changed.iter().enumerate() {
                if let Some((a, b)) = *span {
                    writes.push((m, base + wide(a), &rows[m][a..b]));
                    plan.read_error.push(None);
                }
            }
        }
        // `repaired` is settled once the writes are done.
        report.extend(found);
        unit
    }

    /// Reads every copy of RAID1/10 array bytes `[pos, pos + n)`, under the locks
    /// mirrored writes take (held by the caller).
    fn scrub_mirrors_read(&self, pos: u64, n: u64) -> Vec<MirrorCopies> {
        self.pieces(pos, n)
            .into_iter()
            .map(|(at, len, locs)| {
                let mut copies = Vec::with_capacity(locs.len());
                let mut failed = Vec::new();
                for loc in &locs {
                    let mut buf = vec![0u8; small(len)];
                    match self.read_member(loc.member, &mut buf, loc.sector.0 * SECTOR_SIZE) {
                        Ok(()) => copies.push((*loc, buf)),
                        Err(e) => failed.push((*loc, e)),
                    }
                }
                MirrorCopies {
                    at,
                    len,
                    copies,
                    failed,
                }
            })
            .collect()
    }

    /// Compares (and with `repair`, plans the repairs of) RAID1/10 array bytes as
    /// [`Array::scrub_mirrors_read`] read them, the locks still held
    /// ([`Array::scrub_plan`]). A piece no copy of could be read ends the unit: its
    /// error is kept in `plan`, raised once the writes before it are done.
    fn scrub_mirrors<'r>(
        &self,
        pieces: &'r mut [MirrorCopies],
        repair: bool,
        report: &mut Vec<Mismatch>,
        writes: &mut Vec<RepairWrite<'r>>,
        plan: &mut RepairPlan,
    ) {
        for piece in pieces.iter_mut() {
            let MirrorCopies {
                at,
                len,
                copies,
                failed,
            } = piece;
            let (at, len) = (*at, *len);
            let failed = std::mem::take(failed);
            let copies: &'r [CopyRead] = copies;
            let Some(((first, reference), others)) = copies.split_first() else {
                let (_, e) = failed.into_iter().last().expect("a copy per member");
                plan.error = Some(e.context(format!(
                    "{}: no copy of array bytes {at}..{} could be read",
                    self.array_label(),
                    at + len
                )));
                return;
            };
            for (loc, e) in failed {
                tracing::warn!(
                    "{}: read error corrected from {}: {e}",
                    self.array_label(),
                    self.describe_role(first.member)
                );
                let off = loc.sector.0 * SECTOR_SIZE;
                let ok = self.is_up(loc.member);
                if ok {
                    writes.push((loc.member, off, reference.as_slice()));
                    plan.read_error.push(Some(report.len()));
                }
                report.push(Mismatch {
                    finding: Finding::ReadError,
                    stripe: None,
                    array_offset: at,
                    member_offset: off,
                    len,
                    blamed: Some(loc.member),
                    rewritten: vec![loc.member],
                    repaired: ok,
                });
            }
            if others.iter().all(|(_, b)| b == reference) {
                continue;
            }
            // Per page, the copies that differ from the first.
            let pages = small(len.div_ceil(PAGE));
            let page = |i: usize| small(wide(i) * PAGE)..small((wide(i + 1) * PAGE).min(len));
            let differing: Vec<Vec<usize>> = (0..pages)
                .map(|i| {
                    others
                        .iter()
                        .filter(|(_, b)| b[page(i)] != reference[page(i)])
                        .map(|(l, _)| l.member)
                        .collect()
                })
                .collect();
            if repair {
                for (loc, _) in others {
                    // Rewrite each run of differing pages in one write.
                    let mut i = 0;
                    while i < pages {
                        if !differing[i].contains(&loc.member) {
                            i += 1;
                            continue;
                        }
                        let start = i;
                        while i < pages && differing[i].contains(&loc.member) {
                            i += 1;
                        }
                        let bytes = page(start).start..page(i - 1).end;
                        let off = loc.sector.0 * SECTOR_SIZE + wide(bytes.start);
                        if self.is_up(loc.member) {
                            writes.push((loc.member, off, &reference[bytes]));
                            plan.read_error.push(None);
                        }
                    }
                }
            }
            for (i, members) in differing.into_iter().enumerate() {
                if members.is_empty() {
                    continue;
                }
                let r = page(i);
                report.push(Mismatch {
                    finding: Finding::Copies,
                    stripe: None,
                    array_offset: at + wide(r.start),
                    member_offset: first.sector.0 * SECTOR_SIZE + wide(r.start),
                    len: wide(r.len()),
                    blamed: None,
                    // Settled once the writes are done.
                    repaired: false,
                    rewritten: members,
                });
            }
        }
    }
}

/// The array bytes of mirror scrub unit `i`.
fn mirror_unit(units: &ScrubUnits, i: u64) -> (u64, u64) {
    let pos = i * units.unit_bytes;
    (
        pos,
        units.unit_bytes.min(units.total_bytes.saturating_sub(pos)),
    )
}

/// The error of a scrub unit compared before it was read (a bug).
fn not_read(i: u64) -> Error {
    Error::new(ErrorKind::Io, format!("scrub unit {i} was not read"))
}

/// A write a scrub's compare asks for: `(member, member byte, bytes)`.
type RepairWrite<'r> = (usize, u64, &'r [u8]);

/// What the failures of a unit's [`RepairWrite`]s mean ([`Array::scrub_settle`]).
#[derive(Default)]
pub(crate) struct RepairPlan {
    /// Per write, in order: the finding (index in the unit's findings) of the read
    /// error it rewrites, or `None` for a repair of a mismatch.
    read_error: Vec<Option<usize>>,
    /// A mirror piece no copy of could be read: the unit's error.
    error: Option<Error>,
}

/// Every copy of a piece of mirrored array bytes, as a scrub read them.
pub(crate) struct MirrorCopies {
    at: u64,
    len: u64,
    copies: Vec<(Location, Vec<u8>)>,
    failed: Vec<(Location, Error)>,
}

/// What a scrub read of one unit holds until it is compared.
pub(crate) enum ScrubRead {
    /// A stripe's rows by member, and the members whose read failed (their rows
    /// rebuilt from the others).
    Stripe {
        rows: Vec<Vec<u8>>,
        read_errors: Vec<usize>,
    },
    Mirrors(Vec<MirrorCopies>),
}

/// One copy of a mirror piece and the buffer it is read into.
type CopyRead = (Location, Vec<u8>);

/// The buffers of one scrub unit in the pipeline.
#[derive(Default)]
pub(crate) struct ScrubBuf {
    read: Option<Result<ScrubRead>>,
    /// A unit read at once with the window's others: a stripe's rows and the members
    /// read; a mirror unit's pieces, each with a buffer per copy.
    rows: Vec<Vec<u8>>,
    down: Vec<bool>,
    pieces: Vec<(u64, u64, Vec<CopyRead>)>,
    found: Vec<Mismatch>,
    bytes: u64,
    /// The unit's writes sent with the window's others: what their failures mean.
    plan: RepairPlan,
}

/// A check or repair, pipelined (pipeline.rs): the next window of units is read while
/// the current one is compared and repaired; what each unit finds is added to the
/// report in unit order once its window is done, so the report is the one the unit by
/// unit walk gives.
pub(crate) struct ScrubStage<'a> {
    array: &'a Array,
    repair: bool,
    units: ScrubUnits,
    report: Mutex<ScrubReport>,
}

impl<'a> ScrubStage<'a> {
    pub(crate) fn new(array: &'a Array, repair: bool, units: ScrubUnits) -> Self {
        ScrubStage {
            array,
            repair,
            units,
            report: Mutex::new(ScrubReport::new(repair)),
        }
    }

    /// Member bytes per unit (for the window size): a chunk, or the mirror unit.
    pub(crate) fn member_unit(&self) -> u64 {
        match &self.array.layout {
            ArrayLayout::Parity(pl) => pl.chunk().0 * SECTOR_SIZE,
            _ => self.units.unit_bytes,
        }
    }

    /// The report of the units done so far.
    pub(crate) fn report(&self) -> ScrubReport {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Stage for ScrubStage<'_> {
    type Buf = ScrubBuf;

    fn keys(&self, first: u64, count: u64) -> Vec<u64> {
        self.array.scrub_keys(&self.units, first, count)
    }

    fn read(&self, i: u64, b: &mut ScrubBuf) {
        b.found.clear();
        b.bytes = 0;
        b.read = Some(self.array.scrub_read(&self.units, i, self.repair));
    }

    fn read_jobs<'b>(&self, i: u64, b: &'b mut ScrubBuf) -> Option<Vec<ReadJob<'b>>> {
        // `scrub_read`'s reads: those of `read_row`, or every copy of every piece.
        b.found.clear();
        b.bytes = 0;
        b.read = None;
        if let Err(e) = self.array.refuse_degraded(self.repair) {
            b.read = Some(Err(e));
            return Some(Vec::new());
        }
        let ArrayLayout::Parity(pl) = &self.array.layout else {
            let (pos, n) = mirror_unit(&self.units, i);
            b.pieces = self
                .array
                .pieces(pos, n)
                .into_iter()
                .map(|(at, len, locs)| {
                    let copies = locs.into_iter().map(|l| (l, vec![0u8; small(len)]));
                    (at, len, copies.collect())
                })
                .collect();
            let copies = b.pieces.iter_mut().flat_map(|(_, _, copies)| copies);
            let reads =
                copies.map(|(l, buf)| (l.member, buf.as_mut_slice(), l.sector.0 * SECTOR_SIZE));
            return Some(reads.collect());
        };
        let c = pl.chunk().0 * SECTOR_SIZE;
        b.down = self.array.down_mask();
        b.rows.resize_with(pl.raid_disks(), Vec::new);
        for r in &mut b.rows {
            r.clear();
            r.resize(small(c), 0);
        }
        let down = &b.down;
        let reads = b.rows.iter_mut().enumerate().filter(|(m, _)| !down[*m]);
        Some(reads.map(|(m, r)| (m, r.as_mut_slice(), i * c)).collect())
    }

    fn read_done(&self, i: u64, b: &mut ScrubBuf, failed: Vec<Option<Error>>) {
        if b.read.is_some() {
            return; // refused
        }
        let ArrayLayout::Parity(pl) = &self.array.layout else {
            let mut failed = failed.into_iter();
            let pieces = std::mem::take(&mut b.pieces)
                .into_iter()
                .map(|(at, len, read)| {
                    let mut copies = Vec::with_capacity(read.len());
                    let mut bad = Vec::new();
                    for (loc, buf) in read {
                        match failed.next().flatten() {
                            None => copies.push((loc, buf)),
                            Some(e) => bad.push((loc, e)),
                        }
                    }
                    MirrorCopies {
                        at,
                        len,
                        copies,
                        failed: bad,
                    }
                });
            b.read = Some(Ok(ScrubRead::Mirrors(pieces.collect())));
            return;
        };
        let map = pl.stripe_map(StripeNo(i));
        let read: Vec<usize> = (0..b.down.len()).filter(|&m| !b.down[m]).collect();
        let failed = read
            .into_iter()
            .zip(failed)
            .filter_map(|(m, e)| Some((m, e?)));
        let mut read_errors = Vec::new();
        let rows = std::mem::take(&mut b.rows);
        let rows = self
            .array
            .rebuild_row(pl, &map, i, rows, failed, &mut b.down, &mut read_errors);
        b.read = Some(rows.map(|rows| ScrubRead::Stripe { rows, read_errors }));
    }

    fn finish(&self, i: u64, b: &mut ScrubBuf) -> Result<u64> {
        let mut read = b.read.take().unwrap_or_else(|| Err(not_read(i)))?;
        b.bytes = self
            .array
            .scrub_compare(&self.units, i, &mut read, self.repair, &mut b.found)?;
        Ok(b.bytes)
    }

    fn write_jobs<'b>(&self, i: u64, b: &'b mut ScrubBuf) -> Option<Result<Vec<WriteJob<'b>>>> {
        // The unit compared, its writes sent with the window's others.
        if !matches!(b.read, Some(Ok(_))) {
            return Some(Err(b
                .read
                .take()
                .map_or_else(|| not_read(i), |r| r.err().expect("not Ok"))));
        }
        let ScrubBuf {
            read,
            found,
            bytes,
            plan,
            ..
        } = b;
        let Some(Ok(read)) = read.as_mut() else {
            unreachable!("looked at above")
        };
        let (n, writes) = self
            .array
            .scrub_plan(&self.units, i, read, self.repair, found, plan);
        *bytes = n;
        let writes = writes
            .into_iter()
            .map(|(m, off, data)| (m, Bytes::Borrowed(data), off));
        Some(Ok(writes.collect()))
    }

    fn write_done(
        &self,
        _: u64,
        b: &mut ScrubBuf,
        failed: Vec<Option<(usize, Error)>>,
    ) -> Result<u64> {
        if let Some(Ok(ScrubRead::Stripe { rows, .. })) = b.read.take() {
            b.rows = rows; // kept for the next unit
        }
        self.array
            .scrub_settle(&mut b.plan, failed, self.repair, &mut b.found)?;
        Ok(b.bytes)
    }

    fn done(&self, _: u64, bufs: &mut [ScrubBuf]) {
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        for b in bufs {
            report.bytes_checked += std::mem::take(&mut b.bytes);
            for m in b.found.drain(..) {
                report.record(m);
            }
        }
    }
}
