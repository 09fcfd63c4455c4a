//! RAID4/5/6 I/O: one stripe at a time, under that stripe's lock for anything that
//! reads parity or writes.
//!
//! ```text
//!   write of array bytes ─► per stripe: the touched data chunks, each [a, b) in-chunk,
//!                           and the row [lo, hi) = union of those ranges
//!     whole stripe, all up             ─► P/Q from the new data; no reads
//!     parity members all down          ─► write the data; nothing to keep in step
//!     read-modify-write (RMW)          ─► read old data [a, b) + P/Q [lo, hi);
//!                                         P ^= Δ, Q ^= g^slot·Δ
//!     reconstruct-write (RCW)          ─► read the rest of the row; P/Q from scratch
//!       (RMW or RCW, whichever reads fewer bytes; a read error falls through to ...)
//!     degraded                         ─► read the row from every up member, rebuild the
//!                                         missing ones, overlay, P/Q from scratch
//!   with a partial-parity log (ppl.rs), a partial stripe's plan is logged (PP/PQ on
//!   its parity members, FUA) before any of its writes is issued
//!   read ─► each chunk piece from its member; pieces whose member is down or fails to
//!           read are rebuilt from the rest of the row (and written back if it failed)
//! ```
//!
//! Stripe offsets: stripe `s` occupies member bytes `[s·C, (s+1)·C)` on every member
//! (`C` the chunk in bytes, after the member's data offset), and array bytes
//! `[s·k·C, (s+1)·k·C)` for `k` data members.

use std::borrow::Cow;

use cairn_block::{Error, ErrorKind, Result, WriteFlags};

use cairn_block::overlap::{fan_out, Overlap};

use crate::layout::{ParityLayout, StripeMap};
use crate::parity::gf;
use crate::state::{Array, Bytes, ReadJob};
use crate::units::{small, wide, StripeNo, SECTOR_SIZE};

/// One data chunk touched by a request: data index `d`, in-chunk bytes `[a, b)`, and
/// where those bytes are in the caller's buffer.
#[derive(Debug, Clone, Copy)]
struct Touch {
    d: usize,
    a: u64,
    b: u64,
    buf: usize,
}

/// A piece of a read to rebuild: its stripe, what it covers, and the member read error
/// that sent it here (none when the member is simply down).
type Rebuild = (u64, Touch, Option<(usize, Error)>);

/// Why a write plan could not be made.
enum Fail {
    /// A member read failed: the member counts as down for this stripe and the plan is
    /// made again around it.
    Read(usize, Error),
    /// Nothing can be done (too many members down).
    Fatal(Error),
}

type Plan<'a> = std::result::Result<Vec<(usize, u64, Bytes<'a>)>, Fail>;

/// The caller's bytes for `t`.
fn src<'a>(data: &'a [u8], t: &Touch) -> &'a [u8] {
    &data[t.buf..t.buf + small(t.b - t.a)]
}

impl Array {
    fn chunk_bytes(pl: &ParityLayout) -> u64 {
        pl.chunk().0 * SECTOR_SIZE
    }

    pub(crate) fn parity_read(&self, pl: &ParityLayout, buf: &mut [u8], off: u64) -> Result<()> {
        let c = Self::chunk_bytes(pl);
        let k = wide(pl.data_disks());
        // Fast path: inside one chunk of a member that is up (small random reads).
        if off % c + wide(buf.len()) <= c {
            let chunk_no = off / c;
            let stripe = chunk_no / k;
            let member = pl.data_member(StripeNo(stripe), small(chunk_no % k));
            if self.is_up_at(member, stripe * c)
                && self.read_member(member, buf, stripe * c + off % c).is_ok()
            {
                return Ok(());
            }
        }
        let parallel = self.read_overlap_pays(buf.len());
        // Pieces to rebuild, grouped by stripe below: (stripe, touch, failed member).
        let mut rebuild: Vec<Rebuild> = Vec::new();
        let mut jobs = Vec::new();
        let mut whose = Vec::new();
        let mut rest: &mut [u8] = &mut *buf;
        let mut pos = 0usize;
        while !rest.is_empty() {
            let aoff = off + wide(pos);
            let chunk_no = aoff / c;
            let a = aoff % c;
            let n = small((c - a).min(wide(rest.len())));
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            let stripe = chunk_no / k;
            let d = small(chunk_no % k);
            let member = pl.data_member(StripeNo(stripe), d);
            let touch = Touch {
                d,
                a,
                b: a + wide(n),
                buf: pos,
            };
            if self.is_up_at(member, stripe * c) {
                jobs.push((member, (member, piece, stripe * c + touch.a)));
                whose.push((stripe, touch));
            } else {
                rebuild.push((stripe, touch, None));
            }
            pos += n;
        }
        let results = self.read_members(jobs, parallel);
        rebuild.extend(
            results
                .into_iter()
                .zip(whose)
                .filter_map(|(failed, (stripe, touch))| Some((stripe, touch, Some(failed?)))),
        );
        rebuild.sort_by_key(|r| (r.0, r.1.buf));
        let mut i = 0;
        while i < rebuild.len() {
            let stripe = rebuild[i].0;
            let mut j = i;
            while j < rebuild.len() && rebuild[j].0 == stripe {
                j += 1;
            }
            self.rebuild_read(pl, stripe, &mut rebuild[i..j], buf)?;
            i = j;
        }
        Ok(())
    }

    /// Serves the pieces of one stripe whose members are down or failed to read.
    fn rebuild_read(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        pieces: &mut [Rebuild],
        buf: &mut [u8],
    ) -> Result<()> {
        let c = Self::chunk_bytes(pl);
        let _guard = self.lock_stripe(stripe);
        let map = pl.stripe_map(StripeNo(stripe));
        let lo = pieces.iter().map(|p| p.1.a).min().expect("non-empty");
        let hi = pieces.iter().map(|p| p.1.b).max().expect("non-empty");
        let mut down = self.down_mask_at(stripe * c);
        let mut read_errors = Vec::new();
        for (_, _, failed) in pieces.iter_mut() {
            if let Some((member, e)) = failed.take() {
                tracing::warn!(
                    "{}: rebuilding from parity after a read error: {e}",
                    self.array_label()
                );
                down[member] = true;
                read_errors.push(member);
            }
        }
        let rows = self.read_row(pl, &map, stripe, lo, hi, &mut down, &mut read_errors)?;
        for (_, t, _) in pieces.iter() {
            let row = &rows[map.data[t.d]];
            let n = small(t.b - t.a);
            buf[t.buf..t.buf + n].copy_from_slice(&row[small(t.a - lo)..small(t.b - lo)]);
        }
        // md's read-error correction: write the rebuilt bytes back; a member that
        // cannot take them fails.
        for member in read_errors {
            if !self.is_up(member) || cairn_block::BlockDevice::capabilities(self).read_only {
                continue;
            }
            if let Err(e) =
                self.write_member(member, &rows[member], stripe * c + lo, WriteFlags::NONE)
            {
                self.fail_member(member, &e);
            }
        }
        Ok(())
    }

    /// Reads `[lo, hi)` of every member of `stripe` not marked in `down` and rebuilds
    /// the rows of the down ones (data, P and Q). Returns the rows by member. Members
    /// whose read fails are added to `down` and `read_errors`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_row(
        &self,
        pl: &ParityLayout,
        map: &StripeMap,
        stripe: u64,
        lo: u64,
        hi: u64,
        down: &mut [bool],
        read_errors: &mut Vec<usize>,
    ) -> Result<Vec<Vec<u8>>> {
        let c = Self::chunk_bytes(pl);
        let len = small(hi - lo);
        let n = pl.raid_disks();
        let mut rows: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
        let jobs = rows
            .iter_mut()
            .enumerate()
            .filter(|(m, _)| !down[*m])
            .map(|(m, row)| (m, (m, row.as_mut_slice(), stripe * c + lo)))
            .collect();
        let failed = self.read_members(jobs, self.read_overlap_pays(len * n));
        self.rebuild_row(
            pl,
            map,
            stripe,
            rows,
            failed.into_iter().flatten(),
            down,
            read_errors,
        )
    }

    /// The rest of [`Array::read_row`] once the members not marked in `down` were read
    /// into `rows`, `failed` the members whose read failed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rebuild_row(
        &self,
        pl: &ParityLayout,
        map: &StripeMap,
        stripe: u64,
        mut rows: Vec<Vec<u8>>,
        failed: impl Iterator<Item = (usize, Error)>,
        down: &mut [bool],
        read_errors: &mut Vec<usize>,
    ) -> Result<Vec<Vec<u8>>> {
        let n = pl.raid_disks();
        for (m, e) in failed {
            tracing::warn!("{}: {e}", self.array_label());
            down[m] = true;
            read_errors.push(m);
        }
        let missing: Vec<usize> = (0..n).filter(|&m| down[m]).collect();
        if missing.len() > pl.level().parity_members() {
            let names: Vec<String> = missing.iter().map(|&m| self.describe_role(m)).collect();
            return Err(Error::new(
                ErrorKind::Degraded,
                format!(
                    "{}: stripe {stripe} cannot be rebuilt: {} unavailable, {} rebuilds at most {}",
                    self.array_label(),
                    names.join(", "),
                    pl.level(),
                    pl.level().parity_members()
                ),
            ));
        }
        if !missing.is_empty() {
            self.recover(map, &mut rows, &missing)?;
        }
        Ok(rows)
    }

    /// Rebuilds the rows of `missing` members from the others.
    pub(crate) fn recover(
        &self,
        map: &StripeMap,
        rows: &mut [Vec<u8>],
        missing: &[usize],
    ) -> Result<()> {
        let len = rows[0].len();
        match map.q {
            None => {
                let order: Vec<Option<usize>> = map
                    .data
                    .iter()
                    .map(|&m| Some(m))
                    .chain([Some(map.p)])
                    .collect();
                let failed = order
                    .iter()
                    .position(|&o| o == Some(missing[0]))
                    .expect("every member is data or P");
                let mut zeros = Vec::new();
                let mut blocks = borrow_in_order(rows, &order, &mut zeros);
                self.parity.recover_p(&mut blocks, failed)
            }
            Some(q) => {
                let mut order = map.syndrome_order();
                order.push(Some(map.p));
                order.push(Some(q));
                let failed: Vec<usize> = missing
                    .iter()
                    .map(|&m| order.iter().position(|&o| o == Some(m)).expect("in order"))
                    .collect();
                let mut zeros: Vec<Vec<u8>> = order
                    .iter()
                    .filter(|o| o.is_none())
                    .map(|_| vec![0u8; len])
                    .collect();
                let mut blocks = borrow_in_order(rows, &order, &mut zeros);
                self.parity.recover_pq(&mut blocks, &failed)
            }
        }
    }

    /// P (and Q) of `data`, the data rows by data index, all of one length.
    pub(crate) fn gen_parity(&self, map: &StripeMap, data: &[&[u8]]) -> (Vec<u8>, Option<Vec<u8>>) {
        let len = data[0].len();
        let mut p = vec![0u8; len];
        match map.q {
            None => {
                self.parity.gen_p(data, &mut p);
                (p, None)
            }
            Some(_) => {
                let mut q = vec![0u8; len];
                let order = map.syndrome_order();
                let zero = vec![
                    0u8;
                    if order.iter().any(Option::is_none) {
                        len
                    } else {
                        0
                    }
                ];
                let by_slot: Vec<&[u8]> = order
                    .iter()
                    .map(|o| match o {
                        Some(m) => {
                            let d = map.data.iter().position(|x| x == m).expect("data member");
                            data[d]
                        }
                        None => zero.as_slice(),
                    })
                    .collect();
                self.parity.gen_pq(&by_slot, &mut p, &mut q);
                (p, Some(q))
            }
        }
    }

    pub(crate) fn parity_write(
        &self,
        pl: &ParityLayout,
        buf: &[u8],
        off: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let c = Self::chunk_bytes(pl);
        let width = c * wide(pl.data_disks());
        let end = off + wide(buf.len());
        // Stripes are planned in batches of about BATCH bytes, under all their locks,
        // and each batch's member writes go out together (in parallel when large).
        const BATCH: u64 = 4 << 20;
        let mut pos = off;
        while pos < end {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while pos < end && (batch.is_empty() || bytes + width <= BATCH) {
                let stripe = pos / width;
                let x = pos - stripe * width;
                let y = (end - stripe * width).min(width);
                // With a partial-parity log a partial stripe is a batch of its own, so
                // one batch's entries always fit the ring (ppl::ring_needed).
                if self.ppl.is_some() && !batch.is_empty() && (x, y) != (0, width) {
                    break;
                }
                batch.push((
                    stripe,
                    x,
                    y,
                    &buf[small(pos - off)..small(pos - off + (y - x))],
                ));
                bytes += y - x;
                pos += y - x;
                if self.ppl.is_some() && (x, y) != (0, width) {
                    break;
                }
            }
            let _guards = if batch.len() == 1 {
                vec![self.lock_stripe(batch[0].0)]
            } else {
                self.lock_stripes(batch.iter().map(|b| b.0))
            };
            // The stripes' plans (and the reads they need) at once: only the first and
            // the last stripe of a request can be partial.
            let jobs = batch.iter().map(|&b| (small(b.0 % 1024), b)).collect();
            let plans = fan_out(
                jobs,
                self.overlap_pays(small(bytes)),
                |(stripe, x, y, data)| self.plan_stripe(pl, stripe, x, y, data),
            )
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
            // The write hole: partial parity on the log, durable before any write.
            let ticket = match &self.ppl {
                Some(log) => {
                    let items: Vec<crate::ppl::LogItem<'_>> = batch
                        .iter()
                        .map(|&(stripe, x, y, data)| crate::ppl::LogItem { stripe, x, y, data })
                        .collect();
                    Some(log.log_batch(self, pl, &items, &plans)?)
                }
                None => None,
            };
            let writes = plans.into_iter().flatten().collect();
            let done = self.execute_writes(pl, writes, flags, self.overlap_pays(small(bytes)));
            if let (Some(log), Some(ticket)) = (&self.ppl, ticket) {
                log.complete(ticket);
            }
            done?;
        }
        Ok(())
    }

    /// Recomputes P (and Q) of one stripe from its data (resync).
    pub(crate) fn resync_stripe(&self, pl: &ParityLayout, stripe: u64) -> Result<()> {
        let _guard = self.lock_stripe(stripe);
        let mut rows = Vec::new();
        let read = self.resync_read(pl, stripe, &mut rows);
        self.resync_stripe_locked(pl, stripe, &mut rows, read)
    }

    /// Reads the data chunks of `stripe` into `rows` (kept buffers, one per data chunk)
    /// when every data member is up; returns whether they were all read. The caller
    /// holds the stripe's lock.
    pub(crate) fn resync_read(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        rows: &mut Vec<Vec<u8>>,
    ) -> bool {
        let c = Self::chunk_bytes(pl);
        let Some(reads) = self.resync_reads(pl, stripe, rows) else {
            return false;
        };
        let how = self.read_overlap_pays(small(c) * reads.len());
        let failed = fan_out(
            reads
                .into_iter()
                .map(|(m, r, off)| (m, (m, r, off)))
                .collect(),
            how,
            |(m, r, off)| self.read_member(m, r, off).err(),
        );
        self.resync_read_done(failed.into_iter().flatten())
    }

    /// The member reads of [`Array::resync_read`] into `rows`, sized for them; `None`
    /// when a data member of the stripe is down.
    pub(crate) fn resync_reads<'b>(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        rows: &'b mut Vec<Vec<u8>>,
    ) -> Option<Vec<ReadJob<'b>>> {
        let c = Self::chunk_bytes(pl);
        let map = pl.stripe_map(StripeNo(stripe));
        let down = self.down_mask_at(stripe * c);
        if !map.data.iter().all(|&m| !down[m]) {
            return None;
        }
        rows.resize_with(map.data.len(), Vec::new);
        for r in rows.iter_mut() {
            r.resize(small(c), 0);
        }
        Some(
            map.data
                .iter()
                .zip(rows.iter_mut())
                .map(|(&m, r)| (m, r.as_mut_slice(), stripe * c))
                .collect(),
        )
    }

    /// Whether [`Array::resync_reads`] read everything, given their `failed` ones.
    pub(crate) fn resync_read_done(&self, mut failed: impl Iterator<Item = Error>) -> bool {
        if let Some(e) = failed.next() {
            tracing::warn!("{}: {e}", self.array_label());
            return false;
        }
        true
    }

    /// The rest of [`Array::resync_stripe`] under the stripe's lock: P (and Q) from the
    /// data chunks in `rows` when `read`, else from a degraded read of the row.
    pub(crate) fn resync_stripe_locked(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        rows: &mut Vec<Vec<u8>>,
        read: bool,
    ) -> Result<()> {
        let c = Self::chunk_bytes(pl);
        let writes = self.resync_writes(pl, stripe, rows, read)?;
        self.execute_writes(pl, writes, WriteFlags::NONE, self.overlap_pays(small(c)))?;
        self.check_resync_possible()
            .map_err(|e| e.context(format!("resync of stripe {stripe}")))
    }

    /// The member writes of [`Array::resync_stripe_locked`]: P and Q computed, and the
    /// data chunks a degraded read rebuilt.
    pub(crate) fn resync_writes(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        rows: &mut Vec<Vec<u8>>,
        read: bool,
    ) -> Result<Vec<(usize, u64, Bytes<'static>)>> {
        let c = Self::chunk_bytes(pl);
        let map = pl.stripe_map(StripeNo(stripe));
        let mut down = self.down_mask_at(stripe * c);
        let direct = read;
        let mut corrections = Vec::new();
        if !direct {
            // A data member is down (a RAID6 resyncing degraded, as md does) or did not
            // read: its row is rebuilt from the others and the parity made to match.
            let mut read_errors = Vec::new();
            let all = self.read_row(pl, &map, stripe, 0, c, &mut down, &mut read_errors)?;
            *rows = map.data.iter().map(|&m| all[m].clone()).collect();
            corrections = read_errors
                .into_iter()
                .filter(|m| map.data.contains(m))
                .map(|m| (m, stripe * c, Cow::Owned(all[m].clone())))
                .collect();
        }
        let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let (p, q) = self.gen_parity(&map, &refs);
        let mut writes: Vec<(usize, u64, Bytes<'static>)> =
            vec![(map.p, stripe * c, Cow::Owned(p))];
        if let (Some(qm), Some(q)) = (map.q, q) {
            writes.push((qm, stripe * c, Cow::Owned(q)));
        }
        writes.retain(|(m, off, _)| self.is_up_at(*m, *off));
        writes.extend(corrections);
        Ok(writes)
    }

    /// Issues a batch of member writes; a member whose write fails is failed, and the
    /// request fails only when the array can no longer rebuild what was written.
    pub(crate) fn execute_writes(
        &self,
        pl: &ParityLayout,
        writes: Vec<(usize, u64, Bytes<'_>)>,
        flags: WriteFlags,
        parallel: Overlap,
    ) -> Result<()> {
        let jobs = writes
            .into_iter()
            .map(|(m, moff, b)| (m, (m, b, moff)))
            .collect();
        let failed = self.write_members(jobs, flags, parallel);
        self.writes_failed(pl, failed.into_iter().flatten().collect())
    }

    /// The rest of [`Array::execute_writes`] once its writes are done, `failed` those
    /// that failed.
    pub(crate) fn writes_failed(
        &self,
        pl: &ParityLayout,
        failed: Vec<(usize, Error)>,
    ) -> Result<()> {
        if failed.is_empty() {
            return Ok(());
        }
        let last = failed
            .last()
            .map(|(_, e)| e.to_string())
            .unwrap_or_default();
        for (m, e) in failed {
            self.fail_member(m, &e);
        }
        let down = self.down_mask().iter().filter(|&&d| d).count();
        if down > pl.level().parity_members() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: a write failed and {} cannot rebuild it with {down} members down: {last}",
                    self.array_label(),
                    pl.level()
                ),
            ));
        }
        Ok(())
    }

    /// The member writes that put stripe-relative bytes `[x, y)` of `stripe` from
    /// `data` in place, parity included (reading what the chosen strategy needs).
    fn plan_stripe<'a>(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        x: u64,
        y: u64,
        data: &'a [u8],
    ) -> Result<Vec<(usize, u64, Bytes<'a>)>> {
        let c = Self::chunk_bytes(pl);
        let k = pl.data_disks();
        let map = pl.stripe_map(StripeNo(stripe));
        let touches: Vec<Touch> = (small(x / c)..=small((y - 1) / c))
            .map(|d| {
                let start = wide(d) * c;
                let a = x.max(start) - start;
                let b = y.min(start + c) - start;
                Touch {
                    d,
                    a,
                    b,
                    buf: small(start + a - x),
                }
            })
            .collect();
        let lo = touches.iter().map(|t| t.a).min().expect("non-empty write");
        let hi = touches.iter().map(|t| t.b).max().expect("non-empty write");
        // `absent`: members that take no I/O (missing or failed). `down`: members that
        // cannot be read for this stripe, which adds those whose read just failed; they
        // are still written (their new bytes are computed, not read), which also repairs
        // what they could not read.
        let absent = self.down_mask_at(stripe * c);
        let mut down = absent.clone();
        let parity_members: Vec<usize> = [Some(map.p), map.q].into_iter().flatten().collect();
        let parity_present: Vec<usize> = parity_members
            .iter()
            .copied()
            .filter(|&m| !absent[m])
            .collect();
        let base = stripe * c;
        let full = x == 0 && y == c * wide(k);

        let writes: Vec<(usize, u64, Bytes<'a>)> = loop {
            let stripe_down: Vec<usize> = (0..pl.raid_disks()).filter(|&m| down[m]).collect();
            if stripe_down.len() > parity_members.len() {
                let names: Vec<String> =
                    stripe_down.iter().map(|&m| self.describe_role(m)).collect();
                return Err(Error::new(
                    ErrorKind::Degraded,
                    format!(
                        "{}: cannot write stripe {stripe}: {} unavailable, {} survives at most {}",
                        self.array_label(),
                        names.join(", "),
                        pl.level(),
                        parity_members.len()
                    ),
                ));
            }
            let data_up = |d: usize| !down[map.data[d]];
            let touched_up = touches.iter().all(|t| data_up(t.d));
            // Read-modify-write needs the old parity of every parity member it updates.
            let parity_readable = parity_present.iter().all(|&m| !down[m]);
            let plan: Plan<'a> = if parity_present.is_empty() {
                // Nothing to keep in step: parity is gone anyway.
                Ok(touches
                    .iter()
                    .filter(|t| !absent[map.data[t.d]])
                    .map(|t| (map.data[t.d], base + t.a, Cow::Borrowed(src(data, t))))
                    .collect())
            } else if full {
                // P/Q from the new data alone; members that are down are skipped.
                let chunks: Vec<&[u8]> = (0..k)
                    .map(|d| &data[small(wide(d) * c)..small(wide(d + 1) * c)])
                    .collect();
                let (p, q) = self.gen_parity(&map, &chunks);
                let mut w: Vec<(usize, u64, Bytes<'a>)> = chunks
                    .iter()
                    .enumerate()
                    .map(|(d, ch)| (map.data[d], base, Cow::Borrowed(*ch)))
                    .collect();
                w.push((map.p, base, Cow::Owned(p)));
                if let (Some(qm), Some(q)) = (map.q, q) {
                    w.push((qm, base, Cow::Owned(q)));
                }
                w.retain(|(m, _, _)| !absent[*m]);
                Ok(w)
            } else {
                let row = hi - lo;
                // Bytes each strategy reads; None where it needs a member that is down.
                let rmw = (touched_up && parity_readable).then(|| {
                    touches.iter().map(|t| t.b - t.a).sum::<u64>()
                        + wide(parity_present.len()) * row
                });
                let rcw_ok = (0..k).all(|d| {
                    data_up(d) || touches.iter().any(|t| t.d == d && t.a == lo && t.b == hi)
                });
                let rcw = rcw_ok.then(|| {
                    (0..k)
                        .map(|d| match touches.iter().find(|t| t.d == d) {
                            Some(t) => row - (t.b - t.a),
                            None => row,
                        })
                        .sum::<u64>()
                });
                let rows = Rows {
                    map: &map,
                    base,
                    lo,
                    hi,
                    touches: &touches,
                    data,
                };
                match (rmw, rcw) {
                    (Some(r), Some(w)) if r < w => self.plan_rmw(&rows, &parity_present),
                    (_, Some(_)) => self.plan_rcw(&rows, &absent),
                    (Some(_), None) => self.plan_rmw(&rows, &parity_present),
                    (None, None) => self.plan_degraded(pl, stripe, &rows, &mut down, &absent),
                }
            };
            match plan {
                Ok(w) => break w,
                Err(Fail::Fatal(e)) => return Err(e),
                Err(Fail::Read(m, e)) => {
                    tracing::warn!("{}: {e}; writing around it", self.array_label());
                    down[m] = true;
                }
            }
        };

        Ok(writes)
    }

    fn plan_rmw<'a>(&self, r: &Rows<'_, 'a>, parity_up: &[usize]) -> Plan<'a> {
        let (map, base, lo) = (r.map, r.base, r.lo);
        let row = small(r.hi - lo);
        // The old parity rows and the old data under the touched ranges, read at once.
        let mut prows: Vec<(usize, Vec<u8>)> =
            parity_up.iter().map(|&pm| (pm, vec![0u8; row])).collect();
        let mut deltas: Vec<Vec<u8>> = r
            .touches
            .iter()
            .map(|t| vec![0u8; small(t.b - t.a)])
            .collect();
        let mut jobs: Vec<(usize, ReadJob<'_>)> = Vec::new();
        for (pm, buf) in prows.iter_mut() {
            jobs.push((*pm, (*pm, buf.as_mut_slice(), base + lo)));
        }
        for (t, buf) in r.touches.iter().zip(deltas.iter_mut()) {
            let m = map.data[t.d];
            jobs.push((m, (m, buf.as_mut_slice(), base + t.a)));
        }
        let bytes = jobs.iter().map(|(_, (_, b, _))| b.len()).sum::<usize>();
        let failed = self.read_members(jobs, self.overlap_pays(bytes));
        if let Some((m, e)) = failed.into_iter().flatten().next() {
            return Err(Fail::Read(m, e));
        }
        let mut writes: Vec<(usize, u64, Bytes<'a>)> = Vec::with_capacity(r.touches.len() + 2);
        for (t, mut delta) in r.touches.iter().zip(deltas) {
            let m = map.data[t.d];
            let new = src(r.data, t);
            self.parity.xor_into(&mut delta, new);
            let at = small(t.a - lo)..small(t.b - lo);
            for (pm, prow) in prows.iter_mut() {
                if *pm == map.p {
                    self.parity.xor_into(&mut prow[at.clone()], &delta);
                } else {
                    let coef = gf::exp(map.q_exponent[t.d]);
                    self.parity
                        .mul_xor_into(&mut prow[at.clone()], &delta, coef);
                }
            }
            writes.push((m, base + t.a, Cow::Borrowed(new)));
        }
        writes.extend(
            prows
                .into_iter()
                .map(|(pm, b)| (pm, base + lo, Cow::Owned(b))),
        );
        Ok(writes)
    }

    /// Writes go to every member not `absent`.
    fn plan_rcw<'a>(&self, r: &Rows<'_, 'a>, absent: &[bool]) -> Plan<'a> {
        let (map, base, lo, hi) = (r.map, r.base, r.lo, r.hi);
        let row = small(hi - lo);
        // The rest of the row on every data member, read at once.
        let mut owned: Vec<Option<Vec<u8>>> = map
            .data
            .iter()
            .enumerate()
            .map(|(d, _)| match r.touches.iter().find(|t| t.d == d) {
                Some(t) if t.a == lo && t.b == hi => None,
                _ => Some(vec![0u8; row]),
            })
            .collect();
        let mut jobs: Vec<(usize, ReadJob<'_>)> = Vec::new();
        for (d, buf) in owned.iter_mut().enumerate() {
            let Some(buf) = buf else { continue };
            let m = map.data[d];
            match r.touches.iter().find(|t| t.d == d) {
                Some(t) => {
                    let (head, rest) = buf.split_at_mut(small(t.a - lo));
                    let (_, tail) = rest.split_at_mut(small(t.b - t.a));
                    if !head.is_empty() {
                        jobs.push((m, (m, head, base + lo)));
                    }
                    if !tail.is_empty() {
                        jobs.push((m, (m, tail, base + t.b)));
                    }
                }
                None => jobs.push((m, (m, buf.as_mut_slice(), base + lo))),
            }
        }
        let bytes = jobs.iter().map(|(_, (_, b, _))| b.len()).sum::<usize>();
        let failed = self.read_members(jobs, self.overlap_pays(bytes));
        if let Some((m, e)) = failed.into_iter().flatten().next() {
            return Err(Fail::Read(m, e));
        }
        let rows: Vec<Bytes<'a>> = owned
            .into_iter()
            .enumerate()
            .map(|(d, buf)| {
                let t = r.touches.iter().find(|t| t.d == d);
                match (buf, t) {
                    (None, Some(t)) => Cow::Borrowed(src(r.data, t)),
                    (Some(mut buf), Some(t)) => {
                        buf[small(t.a - lo)..small(t.b - lo)].copy_from_slice(src(r.data, t));
                        Cow::Owned(buf)
                    }
                    (Some(buf), None) => Cow::Owned(buf),
                    (None, None) => unreachable!("an untouched chunk is always read"),
                }
            })
            .collect();
        let refs: Vec<&[u8]> = rows.iter().map(|b| &**b).collect();
        let (p, q) = self.gen_parity(map, &refs);
        Ok(row_writes(r, p, q, absent))
    }

    fn plan_degraded<'a>(
        &self,
        pl: &ParityLayout,
        stripe: u64,
        r: &Rows<'_, 'a>,
        down: &mut [bool],
        absent: &[bool],
    ) -> Plan<'a> {
        let (map, lo) = (r.map, r.lo);
        let mut read_errors = Vec::new();
        let mut rows = self
            .read_row(pl, map, stripe, lo, r.hi, down, &mut read_errors)
            .map_err(Fail::Fatal)?;
        for t in r.touches {
            rows[map.data[t.d]][small(t.a - lo)..small(t.b - lo)].copy_from_slice(src(r.data, t));
        }
        let (p, q) = {
            let refs: Vec<&[u8]> = map.data.iter().map(|&m| rows[m].as_slice()).collect();
            self.gen_parity(map, &refs)
        };
        Ok(row_writes(r, p, q, absent))
    }
}

/// The member writes that finish a row: the caller's data chunks, then P (and Q) over the
/// whole row, leaving out members that are absent.
fn row_writes<'a>(
    r: &Rows<'_, 'a>,
    p: Vec<u8>,
    q: Option<Vec<u8>>,
    absent: &[bool],
) -> Vec<(usize, u64, Bytes<'a>)> {
    let (map, base, lo) = (r.map, r.base, r.lo);
    let mut writes: Vec<(usize, u64, Bytes<'a>)> = r
        .touches
        .iter()
        .map(|t| (map.data[t.d], base + t.a, Cow::Borrowed(src(r.data, t))))
        .collect();
    writes.push((map.p, base + lo, Cow::Owned(p)));
    if let (Some(qm), Some(q)) = (map.q, q) {
        writes.push((qm, base + lo, Cow::Owned(q)));
    }
    writes.retain(|(m, _, _)| !absent[*m]);
    writes
}

/// What a write plan works on: the stripe's map, its member offset, the row `[lo, hi)`
/// and the touched chunks with the caller's bytes.
struct Rows<'m, 'a> {
    map: &'m StripeMap,
    base: u64,
    lo: u64,
    hi: u64,
    touches: &'m [Touch],
    data: &'a [u8],
}

/// Mutable borrows of `rows` in `order` (a member index, or `None` for one of `zeros`).
fn borrow_in_order<'a>(
    rows: &'a mut [Vec<u8>],
    order: &[Option<usize>],
    zeros: &'a mut [Vec<u8>],
) -> Vec<&'a mut [u8]> {
    let mut by_member: Vec<Option<&'a mut [u8]>> =
        rows.iter_mut().map(|r| Some(r.as_mut_slice())).collect();
    let mut z = zeros.iter_mut();
    order
        .iter()
        .map(|o| match o {
            Some(m) => by_member[*m].take().expect("each member once"),
            None => z
                .next()
                .expect("a zero block per empty slot")
                .as_mut_slice(),
        })
        .collect()
}
