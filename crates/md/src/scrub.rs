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
//! ```
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

use crate::layout::{ArrayLayout, ParityLayout};
use crate::parity::check::{locate_error, ErrorLocation};
use crate::state::{Array, Bytes};
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
        let bytes = match &self.layout {
            ArrayLayout::Parity(pl) => self.scrub_stripe(pl, i, repair, report)?,
            _ => {
                let pos = i * units.unit_bytes;
                let n = units.unit_bytes.min(units.total_bytes - pos);
                self.scrub_mirrors(pos, n, repair, report)?
            }
        };
        report.bytes_checked += bytes;
        Ok(bytes)
    }

    /// Checks (or repairs) the whole array, unit by unit, calling `progress(done,
    /// total)` in array bytes after each; it returns false to stop (the report then
    /// says `complete: false`). A repair flushes the members at the end.
    pub fn scrub(&self, repair: bool, progress: &dyn Fn(u64, u64) -> bool) -> Result<ScrubReport> {
        self.check_scrub_possible(repair)?;
        let units = self.scrub_units()?;
        let mut report = ScrubReport::new(repair);
        let mut done = 0;
        for i in 0..units.count {
            done += self.scrub_unit(i, repair, &mut report)?;
            if !progress(done, units.total_bytes) {
                return Ok(report);
            }
        }
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

    /// One RAID4/5/6 stripe, under its lock.
    fn scrub_stripe(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<u64> {
        let c = pl.chunk().0 * SECTOR_SIZE;
        let k = wide(pl.data_disks());
        let unit = c * k;
        let base = stripe * c;
        let array_base = stripe * unit;
        let _guard = self.lock_stripe(stripe);
        self.refuse_degraded(repair)?;
        let map = pl.stripe_map(StripeNo(stripe));
        let mut down = self.down_mask();
        let mut read_errors = Vec::new();
        let mut rows = self.read_row(pl, &map, stripe, 0, c, &mut down, &mut read_errors)?;
        if !read_errors.is_empty() {
            // The failed chunks were rebuilt from the others, so the row is consistent
            // by construction: write them back as a read would, and compare nothing.
            for m in read_errors {
                let ok = self.rewrite(m, &rows[m], base);
                report.record(Mismatch {
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
            return Ok(unit);
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
            return Ok(unit);
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
            let writes: Vec<(usize, u64, Bytes<'_>)> = changed
                .iter()
                .enumerate()
                .filter_map(|(m, span)| {
                    span.map(|(a, b)| (m, base + wide(a), Cow::Borrowed(&rows[m][a..b])))
                })
                .collect();
            self.execute_writes(pl, writes, WriteFlags::NONE, self.overlap_pays(0))?;
        }
        for mut m in found {
            m.repaired = repair && m.rewritten.iter().all(|&r| self.is_up(r));
            report.record(m);
        }
        Ok(unit)
    }

    /// Writes a rebuilt `buf` back to `role` at member byte `off`; a member that cannot
    /// take it fails. Returns whether it was written.
    fn rewrite(&self, role: usize, buf: &[u8], off: u64) -> bool {
        if !self.is_up(role) {
            return false;
        }
        match self.write_member(role, buf, off, WriteFlags::NONE) {
            Ok(()) => true,
            Err(e) => {
                self.fail_member(role, &e);
                false
            }
        }
    }

    /// RAID1/10 array bytes `[pos, pos + n)`, under the locks mirrored writes take.
    fn scrub_mirrors(
        &self,
        pos: u64,
        n: u64,
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<u64> {
        let _guards = self.lock_stripes(self.mirror_keys(pos, n));
        self.refuse_degraded(repair)?;
        for (at, len, locs) in self.pieces(pos, n) {
            let mut copies = Vec::with_capacity(locs.len());
            let mut failed = Vec::new();
            for loc in &locs {
                let mut buf = vec![0u8; small(len)];
                match self.read_member(loc.member, &mut buf, loc.sector.0 * SECTOR_SIZE) {
                    Ok(()) => copies.push((*loc, buf)),
                    Err(e) => failed.push((*loc, e)),
                }
            }
            let Some(((first, reference), others)) = copies.split_first() else {
                let (_, e) = failed.pop().expect("a copy per member");
                return Err(e.context(format!(
                    "{}: no copy of array bytes {at}..{} could be read",
                    self.array_label(),
                    at + len
                )));
            };
            for (loc, e) in failed {
                tracing::warn!(
                    "{}: read error corrected from {}: {e}",
                    self.array_label(),
                    self.describe_role(first.member)
                );
                let off = loc.sector.0 * SECTOR_SIZE;
                let ok = self.rewrite(loc.member, reference, off);
                report.record(Mismatch {
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
                        if !self.rewrite(loc.member, &reference[bytes], off) {
                            break;
                        }
                    }
                }
            }
            for (i, members) in differing.into_iter().enumerate() {
                if members.is_empty() {
                    continue;
                }
                let r = page(i);
                report.record(Mismatch {
                    finding: Finding::Copies,
                    stripe: None,
                    array_offset: at + wide(r.start),
                    member_offset: first.sector.0 * SECTOR_SIZE + wide(r.start),
                    len: wide(r.len()),
                    blamed: None,
                    repaired: repair && members.iter().all(|&m| self.is_up(m)),
                    rewritten: members,
                });
            }
        }
        Ok(n)
    }
}
