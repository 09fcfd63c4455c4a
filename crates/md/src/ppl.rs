//! The partial-parity log: closes the RAID4/5/6 write hole (docs/write-hole.md).
//!
//! ```text
//!   member: superblock │ bitmap space │ bad-block log │ PPL area ............ │ data
//!                                                      ├ ring header (4 KiB)
//!                                                      └ ring: entries, each a 4 KiB
//!                                                        header + payload (4 KiB units)
//!   partial-stripe write (stripe.rs, under the stripe lock)
//!     plan ─► PP = P_new ⊕ new data, PQ = Q_new ⊕ Σ g^i·new data   (= parity of the
//!             chunks *not* written, over the row [lo, hi))
//!          ─► entry {seq, stripe, x..y} + PP on the P member's ring, + PQ on Q's (FUA)
//!          ─► data and parity writes ─► done (reclaimable after the next member flush)
//!   full-stripe write over a stripe with live entries ─► a small "full" entry masks them
//!   assembly of a dirty array ─► newest entry per row: rebuild every chunk that was not
//!             being written from PP/PQ, set parity to match ─► flush ─► log emptied
//! ```
//!
//! This file is the running log and replay (state and I/O); the header layouts, where
//! the area lies and how a header block is judged are in `ppl/format.rs`.
//!
//! No md feature bit is set: the area lies between the bad-block log and `data_offset`,
//! where md keeps nothing, and only an area whose ring header carries this log's magic
//! and the array's UUID is used. md's own PPL (feature 1024) cannot coexist with a
//! bitmap; this log can.
//!
//! Ordering rules, each needed by replay (docs/write-hole.md has the reasons):
//! * the entries of a write are durable (FUA) before any of its data or parity write is
//!   issued (a batch's entries go out together, from this thread over members that
//!   complete later, and every one has answered before `log_batch` returns);
//! * a partial write whose rows overlap an earlier write to the same stripe that is not
//!   yet durable flushes the members first, so a live entry's PP never includes data
//!   that could still be lost;
//! * ring space is reused only after the entries in it are durable-complete and the ring
//!   header's sequence floor (entries below it are dead) has been written past them.
//!
//! The replay itself reads the rings, then the rows it replays, and writes their parity
//! in batches (at once, from this thread, over members that complete later); every
//! parity write has answered before the flush and the new headers that drop the log.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use cairn_block::overlap::Overlap;
use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::layout::ParityLayout;
use crate::ondisk::{Superblock, Uuid};
use crate::parity::gf;
use crate::state::{unanswered, Array, Bytes};
use crate::units::{small, wide, StripeNo, SECTOR_SIZE};

mod format;
pub(crate) mod live;

pub(crate) use format::{
    area, check_header, crc32c, row_of, EntryHeader, HeaderCheck, Kind, RingHeader, BLOCK, MAX_SEQ,
};
use live::{Live, RingState, State, UNFLUSHED_MAX};
pub(crate) use live::{LogItem, Ppl, Ticket};

/// The touched data chunks of stripe-relative `[x, y)`: (data index, in-chunk a, b).
fn touches(c: u64, x: u64, y: u64) -> Vec<(usize, u64, u64)> {
    (x / c..=(y - 1) / c)
        .map(|d| {
            let start = d * c;
            (small(d), x.max(start) - start, y.min(start + c) - start)
        })
        .collect()
}

/// Ring bytes the log needs for arrays of `chunk` bytes and `members` members: one
/// partial entry of a whole chunk plus one full entry per member (the most one batch of
/// stripe.rs writes at once), twice over so that one batch can wait for another.
pub(crate) fn ring_needed(chunk: u64, members: usize) -> u64 {
    2 * (BLOCK + chunk.div_ceil(BLOCK) * BLOCK + wide(members) * BLOCK)
}

/// The ring's size where the area allows more (replay reads all of it).
const RING_CAP: u64 = 4 << 20;

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

/// Writes an empty log on every member of a new array (called by `Array::create` after
/// the superblocks). Returns whether the array has a log: not when the area is too
/// small for the chunk size, which is warned about.
pub(crate) fn format(
    members: &[Arc<dyn BlockDevice>],
    names: &[String],
    sbs: &[Superblock],
) -> Result<bool> {
    let Some(sb0) = sbs.first() else {
        return Ok(false);
    };
    let Some((start, end)) = area(sb0) else {
        tracing::warn!(
            "md array {}: no room for a partial-parity log between the bad-block log and the \
             data; the array has no write-hole protection",
            sb0.set_name
        );
        return Ok(false);
    };
    let chunk = sb0.chunk.bytes().unwrap_or(u64::MAX);
    let needed = ring_needed(chunk, sbs.len());
    // Replay reads the whole ring: keep it small where md leaves a lot of room.
    let ring_len = (end - start - BLOCK).min(needed.max(RING_CAP));
    if ring_len < needed {
        tracing::warn!(
            "md array {}: the {} KiB between the bad-block log and the data cannot hold a \
             partial-parity log for {} KiB chunks; the array has no write-hole protection",
            sb0.set_name,
            (end - start) / 1024,
            chunk / 1024
        );
        return Ok(false);
    }
    let header = RingHeader {
        ring_off: start + BLOCK,
        ring_len,
        floor: 1,
        log_id: random_u64(),
        uuid: sb0.set_uuid,
    };
    let bytes = header.encode();
    for (dev, name) in members.iter().zip(names) {
        dev.write_at(&bytes, start, WriteFlags::FUA)
            .map_err(|e| e.context(format!("{name}: writing the partial-parity log header")))?;
    }
    Ok(true)
}

/// What the members present say about the array's log, for the start decision.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// Members carrying a usable header of this array's log.
    pub(crate) usable: usize,
    /// "NAME: why", for each member whose log header cannot be used.
    pub(crate) problems: Vec<String>,
}

impl Probe {
    /// Whether the log protects a dirty start: some member has it and no member's copy
    /// is unusable (replay would skip the entries that ring holds).
    pub(crate) fn protects(&self) -> bool {
        self.usable > 0 && self.problems.is_empty()
    }
}

/// Reads the log header of each of `members` (those present, with their names).
pub(crate) fn probe(members: &[(&str, &Arc<dyn BlockDevice>)], sb: &Superblock) -> Probe {
    let mut p = Probe::default();
    let Some(area) = area(sb) else {
        return p;
    };
    for (name, dev) in members {
        let mut b = vec![0u8; small(BLOCK)];
        if let Err(e) = dev.read_at(&mut b, area.0) {
            p.problems.push(format!(
                "{name}: reading its partial-parity log header: {e}"
            ));
            continue;
        }
        match check_header(&b, area, sb.set_uuid) {
            HeaderCheck::Usable(_) => p.usable += 1,
            HeaderCheck::Unusable(why) => p.problems.push(format!(
                "{name}: the partial-parity log cannot be used: {why}"
            )),
            HeaderCheck::Absent | HeaderCheck::Foreign => {}
        }
    }
    p
}

// ---- the running log (its state: ppl/live.rs) -------------------------------------

impl Ppl {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A flush is starting: returns its generation for [`Ppl::end_flush`].
    pub(crate) fn begin_flush(&self) -> u64 {
        self.gen.fetch_add(1, Ordering::SeqCst)
    }

    /// The flush that began at `g` made every member durable.
    pub(crate) fn end_flush(&self, g: u64) {
        self.durable.fetch_max(g, Ordering::SeqCst);
        let mut st = self.lock();
        st.unflushed.retain(|_, rows| {
            rows.retain(|r| r.2 > g);
            !rows.is_empty()
        });
        st.unflushed_rows = st.unflushed.values().map(Vec::len).sum();
    }

    fn is_durable(&self, done: Option<u64>) -> bool {
        done.is_some_and(|d| d <= self.durable.load(Ordering::SeqCst))
    }

    /// Logs a batch of stripe.rs's writes before they are issued. `plans[i]` holds the
    /// member writes planned for `items[i]`; partial stripes get PP (and PQ) entries on
    /// their parity members, full stripes a masking entry when older entries for them
    /// are live. Call [`Ppl::complete`] with the ticket once the writes returned.
    pub(crate) fn log_batch(
        &self,
        array: &Array,
        pl: &ParityLayout,
        items: &[LogItem<'_>],
        plans: &[Vec<(usize, u64, Bytes<'_>)>],
    ) -> Result<Ticket> {
        let c = self.chunk;
        let width = c * wide(pl.data_disks());
        // Partial stripes whose rows overlap a write not yet durable: flush first.
        let overlaps = {
            let st = self.lock();
            st.unflushed_rows > UNFLUSHED_MAX
                || items.iter().any(|it| {
                    let partial = !(it.x == 0 && it.y == width);
                    let Some((lo, hi)) = row_of(c, it.x, it.y) else {
                        return false;
                    };
                    partial
                        && st.unflushed.get(&it.stripe).is_some_and(|rows| {
                            rows.iter()
                                .any(|&(a, b, g)| a < hi && lo < b && !self.is_durable(Some(g)))
                        })
                })
        };
        if overlaps {
            cairn_block::BlockDevice::flush(array)?;
        }
        // The entries, by ring.
        let mut entries: Vec<(usize, EntryHeader, Vec<u8>)> = Vec::new();
        let mut rows = Vec::new();
        let mut full: Vec<u64> = Vec::new();
        for (it, plan) in items.iter().zip(plans) {
            let (lo, hi) = row_of(c, it.x, it.y).expect("non-empty write");
            rows.push((it.stripe, lo, hi));
            let map = pl.stripe_map(StripeNo(it.stripe));
            if it.x == 0 && it.y == width {
                full.push(it.stripe);
                continue;
            }
            for (kind, pm) in [(Kind::PartialP, Some(map.p)), (Kind::PartialQ, map.q)] {
                let Some(pm) = pm else { continue };
                let Some((_, _, prow)) = plan.iter().find(|w| w.0 == pm) else {
                    continue; // that parity member is down: nothing to keep in step
                };
                debug_assert_eq!(wide(prow.len()), hi - lo);
                let mut pp = prow.to_vec();
                for (d, a, b) in touches(c, it.x, it.y) {
                    let at = small(a - lo)..small(b - lo);
                    let buf = small(wide(d) * c + a - it.x);
                    let new = &it.data[buf..buf + small(b - a)];
                    if kind == Kind::PartialP {
                        array.parity.xor_into(&mut pp[at], new);
                    } else {
                        array
                            .parity
                            .mul_xor_into(&mut pp[at], new, gf::exp(map.q_exponent[d]));
                    }
                }
                let header = EntryHeader {
                    kind,
                    seq: 0,
                    log_id: self.log_id,
                    stripe: it.stripe,
                    stripe_hi: it.stripe + 1,
                    x: it.x,
                    y: it.y,
                    chunk: u32::try_from(c).expect("chunks are at most 4 MiB"),
                    payload: u32::try_from(pp.len()).expect("at most a chunk"),
                    pcrc: crc32c(&pp),
                };
                entries.push((pm, header, pp));
            }
        }
        if !full.is_empty() {
            let st = self.lock();
            let masked: Vec<u64> = full
                .iter()
                .copied()
                .filter(|s| st.live.get(s).is_some_and(|&n| n > 0))
                .collect();
            drop(st);
            if let (Some(&s0), Some(&s1)) = (masked.first(), masked.last()) {
                let mut roles: Vec<usize> = Vec::new();
                for &s in &masked {
                    let map = pl.stripe_map(StripeNo(s));
                    roles.extend([Some(map.p), map.q].into_iter().flatten());
                }
                roles.sort_unstable();
                roles.dedup();
                for pm in roles.into_iter().filter(|&m| array.is_up(m)) {
                    let header = EntryHeader {
                        kind: Kind::Full,
                        seq: 0,
                        log_id: self.log_id,
                        stripe: s0,
                        stripe_hi: s1 + 1,
                        x: 0,
                        y: 0,
                        chunk: u32::try_from(c).expect("chunks are at most 4 MiB"),
                        payload: 0,
                        pcrc: crc32c(&[]),
                    };
                    entries.push((pm, header, Vec::new()));
                }
            }
        }
        let mut ticket = Ticket {
            seq: 0,
            roles: Vec::new(),
            rows,
        };
        if entries.is_empty() {
            return Ok(ticket);
        }
        // Room on every ring, or reclaim and try again.
        let (seq, placed) = loop {
            if let Some(got) = self.allocate(array, &mut entries) {
                break got;
            }
            self.reclaim(array)?;
            if let Some(got) = self.allocate(array, &mut entries) {
                break got;
            }
            // Other requests' entries fill the ring until their writes return.
            let st = self.lock();
            let _ = self
                .completed
                .wait_timeout(st, std::time::Duration::from_millis(1));
        };
        ticket.seq = seq;
        let mut jobs = Vec::with_capacity(entries.len());
        for ((pm, header, payload), pos) in entries.into_iter().zip(placed) {
            let mut buf = header.encode();
            let padded = small(header.len() - BLOCK);
            buf.extend_from_slice(&payload);
            buf.resize(small(BLOCK) + padded, 0);
            ticket.roles.push(pm);
            jobs.push((pm, (pm, buf, pos)));
        }
        // The entries go to their parity members at once; all are durable (FUA) before
        // this returns, so before any data write of the batch is issued.
        let jobs = jobs
            .into_iter()
            .map(|(pm, (_, buf, pos))| (pm, buf, self.ring_off + pos))
            .collect();
        let failed = self.write_all_abs(array, jobs, array.flush_overlap_pays());
        for (pm, e) in failed.into_iter().flatten() {
            // The parity member is out; its planned write fails too, which is what a
            // member failure means for the stripe anyway.
            array.fail_member(pm, &e);
        }
        Ok(ticket)
    }

    /// Places `entries` on their rings under one sequence number; `None` when a ring is
    /// short of room.
    fn allocate(
        &self,
        array: &Array,
        entries: &mut [(usize, EntryHeader, Vec<u8>)],
    ) -> Option<(u64, Vec<u64>)> {
        let mut st = self.lock();
        let mut heads: HashMap<usize, (u64, Option<u64>)> = HashMap::new();
        let mut placed = Vec::with_capacity(entries.len());
        for (pm, header, _) in entries.iter() {
            let ring = &st.rings[*pm];
            let (head, tail) = heads
                .entry(*pm)
                .or_insert_with(|| (ring.head, ring.live.front().map(|l| l.pos)));
            let len = header.len();
            let pos = match *tail {
                None => {
                    if *head + len <= self.ring_len {
                        *head
                    } else if len <= self.ring_len {
                        0
                    } else {
                        return None;
                    }
                }
                Some(t) if *head > t => {
                    if *head + len <= self.ring_len {
                        *head
                    } else if len <= t {
                        0
                    } else {
                        return None;
                    }
                }
                Some(t) => {
                    if *head + len <= t {
                        *head
                    } else {
                        return None;
                    }
                }
            };
            *head = pos + len;
            if tail.is_none() {
                *tail = Some(pos);
            }
            placed.push(pos);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        // A member that came without this log's header (added since assembly) gets one
        // before its first entry, or replay would not find the entry. Under the lock, so
        // no entry of a later sequence can land first.
        for (pm, _, _) in entries.iter() {
            if st.rings[*pm].floor == 0 {
                st.rings[*pm].floor = seq;
                if let Err(e) = self.write_header(array, *pm, seq) {
                    array.fail_member(*pm, &e);
                }
            }
        }
        for ((pm, header, _), &pos) in entries.iter_mut().zip(&placed) {
            header.seq = seq;
            let stripe = (header.kind != Kind::Full).then_some(header.stripe);
            if let Some(s) = stripe {
                *st.live.entry(s).or_insert(0) += 1;
            }
            let ring = &mut st.rings[*pm];
            ring.head = pos + header.len();
            ring.live.push_back(Live {
                seq,
                pos,
                stripe,
                done: None,
            });
        }
        Some((seq, placed))
    }

    /// The batch's member writes have returned.
    pub(crate) fn complete(&self, ticket: Ticket) {
        let g = self.gen.load(Ordering::SeqCst);
        let mut st = self.lock();
        for &pm in &ticket.roles {
            if let Some(l) = st.rings[pm]
                .live
                .iter_mut()
                .rev()
                .find(|l| l.seq == ticket.seq)
            {
                l.done = Some(g);
            }
        }
        for (s, lo, hi) in ticket.rows {
            st.unflushed.entry(s).or_default().push((lo, hi, g));
            st.unflushed_rows += 1;
        }
        drop(st);
        if !ticket.roles.is_empty() {
            self.completed.notify_all();
        }
    }

    /// Makes room: flush the members, then drop the entries that are now durable and
    /// record each ring's new floor (before its space can be reused).
    fn reclaim(&self, array: &Array) -> Result<()> {
        let _one = self.reclaim.lock().unwrap_or_else(PoisonError::into_inner);
        cairn_block::BlockDevice::flush(array)?;
        let mut st = self.lock();
        let next = st.next_seq;
        // Each ring's durable-complete entries, and the floor past them.
        let mut done = Vec::new();
        for role in 0..st.rings.len() {
            let n = st.rings[role]
                .live
                .iter()
                .take_while(|l| self.is_durable(l.done))
                .count();
            if n > 0 {
                let floor = st.rings[role].live.get(n).map_or(next, |l| l.seq);
                done.push((role, n, floor, array.is_up(role)));
            }
        }
        // The new floors go to every ring at once, before any of the space is reused.
        let headers = done
            .iter()
            .filter(|d| d.3)
            .map(|&(role, _, floor, _)| (role, self.header(floor), self.header_off))
            .collect();
        for (role, e) in self
            .write_all_abs(array, headers, array.flush_overlap_pays())
            .into_iter()
            .flatten()
        {
            array.fail_member(role, &e);
        }
        for (role, n, floor, up) in done {
            let gone: Vec<Live> = st.rings[role].live.drain(..n).collect();
            // A member that is not up gets a header again before its next entry.
            st.rings[role].floor = if up { floor } else { 0 };
            if st.rings[role].live.is_empty() {
                st.rings[role].head = 0;
            }
            for l in gone {
                if let Some(s) = l.stripe {
                    if let Some(c) = st.live.get_mut(&s) {
                        *c -= 1;
                        if *c == 0 {
                            st.live.remove(&s);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Ppl::write_abs`] for every `(role, buf, off)` (FUA), issued as `how` says;
    /// each job's failure. Over members that are all up and complete later, every write
    /// is sent from this thread and all are waited for once (an answer the device
    /// dropped is a failure); either way every write has returned, durable or failed,
    /// when this returns.
    fn write_all_abs(
        &self,
        array: &Array,
        jobs: Vec<(usize, Vec<u8>, u64)>,
        how: cairn_block::overlap::Overlap,
    ) -> Vec<Option<(usize, Error)>> {
        let Some(members) = array.later_members(jobs.iter().map(|(role, _, _)| *role)) else {
            let jobs = jobs.into_iter().map(|j| (j.0, j)).collect();
            return cairn_block::overlap::fan_out(jobs, how, |(role, buf, off)| {
                self.write_abs(array, role, &buf, off, WriteFlags::FUA)
                    .err()
                    .map(|e| (role, e))
            });
        };
        let answers = cairn_block::overlap::start_all(
            jobs.iter().zip(&members).collect(),
            |((_, buf, off), m), answer| m.dev.write_then(buf, *off, WriteFlags::FUA, answer),
        );
        jobs.into_iter()
            .zip(answers)
            .map(|((role, _, off), answer)| {
                let e = answer.unwrap_or_else(|| Err(unanswered())).err()?;
                Some((role, Self::abs_failed(array, role, off, e)))
            })
            .collect()
    }

    /// The ring header with sequence floor `floor`, encoded.
    fn header(&self, floor: u64) -> Vec<u8> {
        RingHeader {
            ring_off: self.ring_off,
            ring_len: self.ring_len,
            floor,
            log_id: self.log_id,
            uuid: self.uuid,
        }
        .encode()
    }

    fn write_header(&self, array: &Array, role: usize, floor: u64) -> Result<()> {
        let h = self.header(floor);
        self.write_abs(array, role, &h, self.header_off, WriteFlags::FUA)
    }

    fn write_abs(
        &self,
        array: &Array,
        role: usize,
        buf: &[u8],
        off: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let Some(m) = array.slots[role].member() else {
            return Err(Error::new(ErrorKind::Degraded, "member missing"));
        };
        m.dev
            .write_at(buf, off, flags)
            .map_err(|e| Self::abs_failed(array, role, off, e))
    }

    fn abs_failed(array: &Array, role: usize, off: u64, e: Error) -> Error {
        e.context(format!(
            "{}: partial-parity log write at byte {off}",
            array.describe_role(role)
        ))
    }

    /// Empties the log: every write so far must be durable (the caller flushed). Used on
    /// a clean close and after replay.
    pub(crate) fn reset(&self, array: &Array) -> Result<()> {
        let mut st = self.lock();
        let floor = st.next_seq;
        for role in 0..st.rings.len() {
            if array.is_up(role)
                && (st.rings[role].floor != floor || !st.rings[role].live.is_empty())
            {
                if let Err(e) = self.write_header(array, role, floor) {
                    array.fail_member(role, &e);
                }
            }
            st.rings[role] = RingState {
                head: 0,
                live: VecDeque::new(),
                floor: if array.is_up(role) { floor } else { 0 },
            };
        }
        st.live.clear();
        st.unflushed.clear();
        st.unflushed_rows = 0;
        Ok(())
    }
}

// ---- assembly: find the log, replay it --------------------------------------------------

/// A valid entry found on a ring, with its payload.
struct Found {
    role: usize,
    header: EntryHeader,
    payload: Vec<u8>,
}

/// Reads `role`'s ring: its header (if it is this log's) and its entries at or above the
/// floor.
fn read_ring(
    array: &Array,
    role: usize,
    (start, end): (u64, u64),
    uuid: Uuid,
    log_id: Option<u64>,
    entries: bool,
) -> Option<(RingHeader, Vec<Found>)> {
    let m = array.slots[role].member()?;
    let mut b = vec![0u8; small(BLOCK)];
    m.dev.read_at(&mut b, start).ok()?;
    // The same judgement as the start decision's (`probe`), which warned about the rest.
    let HeaderCheck::Usable(h) = check_header(&b, (start, end), uuid) else {
        return None;
    };
    if log_id.is_some_and(|id| id != h.log_id) {
        return None;
    }
    if !entries {
        return Some((h, Vec::new()));
    }
    let mut ring = vec![0u8; small(h.ring_len)];
    if let Err(e) = m.dev.read_at(&mut ring, h.ring_off) {
        tracing::warn!(
            "{}: reading its partial-parity log: {e}",
            array.describe_role(role)
        );
        return None;
    }
    Some((h, scan(&ring, &h, role)))
}

/// [`read_ring`] for every role when each member present completes later: the ring
/// headers are sent together from this thread, then (`entries`) the rings of those that
/// are usable, each batch waited for once. Headers of another log are kept here; the
/// caller drops every ring whose log id is not the first one's, as it does after
/// `read_ring`. `None` when some member does not complete later.
#[allow(clippy::type_complexity)]
fn read_rings_later(
    array: &Array,
    n: usize,
    (start, end): (u64, u64),
    uuid: Uuid,
    entries: bool,
) -> Option<Vec<Option<(RingHeader, Vec<Found>)>>> {
    let members: Vec<_> = (0..n)
        .filter_map(|role| Some((role, array.slots[role].member()?)))
        .collect();
    if members.is_empty() || !members.iter().all(|(_, m)| m.dev.completes_later()) {
        return None;
    }
    let heads = cairn_block::overlap::start_all(members.iter().collect(), |(_, m), answer| {
        m.dev.read_then(small(BLOCK), start, answer);
    });
    let usable: Vec<_> = members
        .iter()
        .zip(heads)
        .filter_map(|((role, m), b)| {
            let b = b?.ok().filter(|b| b.len() == small(BLOCK))?;
            let HeaderCheck::Usable(h) = check_header(&b, (start, end), uuid) else {
                return None;
            };
            Some((*role, m, h))
        })
        .collect();
    let rings = if entries {
        cairn_block::overlap::start_all(usable.iter().collect(), |(_, m, h), answer| {
            m.dev.read_then(small(h.ring_len), h.ring_off, answer);
        })
    } else {
        Vec::new()
    };
    let mut out: Vec<Option<(RingHeader, Vec<Found>)>> = (0..n).map(|_| None).collect();
    let mut rings = rings.into_iter();
    for (role, _, h) in usable {
        if !entries {
            out[role] = Some((h, Vec::new()));
            continue;
        }
        let ring = match rings.next().flatten().unwrap_or_else(|| Err(unanswered())) {
            Ok(ring) if ring.len() == small(h.ring_len) => Ok(ring),
            Ok(ring) => Err(Error::new(
                ErrorKind::Io,
                format!("the device answered {} bytes", ring.len()),
            )),
            Err(e) => Err(e),
        };
        match ring {
            Ok(ring) => out[role] = Some((h, scan(&ring, &h, role))),
            Err(e) => tracing::warn!(
                "{}: reading its partial-parity log: {e}",
                array.describe_role(role)
            ),
        }
    }
    Some(out)
}

/// Every valid live entry in a ring image.
fn scan(ring: &[u8], h: &RingHeader, role: usize) -> Vec<Found> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + small(BLOCK) <= ring.len() {
        let block = &ring[pos..pos + small(BLOCK)];
        let Some(e) = EntryHeader::decode(block).filter(|e| e.log_id == h.log_id) else {
            pos += small(BLOCK);
            continue;
        };
        let end = wide(pos).checked_add(e.len());
        let Some(end) = end.filter(|&end| end <= wide(ring.len())) else {
            pos += small(BLOCK);
            continue;
        };
        let p0 = pos + small(BLOCK);
        let payload = &ring[p0..p0 + small(u64::from(e.payload))];
        if crc32c(payload) != e.pcrc {
            pos += small(BLOCK);
            continue;
        }
        if e.seq >= h.floor && e.seq <= MAX_SEQ {
            out.push(Found {
                role,
                header: e,
                payload: payload.to_vec(),
            });
        }
        pos = small(end);
    }
    out
}

impl Ppl {
    /// Opens the log of a just-built array, replaying it when the array was not shut
    /// down cleanly. `None` when the members carry no log for this array.
    pub(crate) fn open(array: &Array, sb: &Superblock, dirty: bool) -> Result<Option<Ppl>> {
        let Some((start, end)) = area(sb) else {
            return Ok(None);
        };
        let crate::layout::ArrayLayout::Parity(pl) = &array.layout else {
            return Ok(None);
        };
        let n = pl.raid_disks();
        let mut rings = read_rings_later(array, n, (start, end), sb.set_uuid, dirty)
            .unwrap_or_else(|| {
                let mut rings = Vec::with_capacity(n);
                let mut log_id = None;
                for role in 0..n {
                    let r = read_ring(array, role, (start, end), sb.set_uuid, log_id, dirty);
                    if let Some((h, _)) = &r {
                        log_id = Some(h.log_id);
                    }
                    rings.push(r);
                }
                rings
            });
        let Some(first) = rings.iter().flatten().map(|r| r.0).next() else {
            return Ok(None);
        };
        // A ring read before the log id was known may belong to another log.
        for r in rings.iter_mut() {
            if r.as_ref().is_some_and(|(h, _)| h.log_id != first.log_id) {
                *r = None;
            }
        }
        let c = pl.chunk().0 * SECTOR_SIZE;
        let mut next_seq = 1;
        for (h, found) in rings.iter().flatten() {
            next_seq = next_seq.max(h.floor);
            for f in found {
                next_seq = next_seq.max(f.header.seq + 1);
            }
        }
        let ppl = Ppl {
            header_off: start,
            ring_off: first.ring_off,
            ring_len: first.ring_len,
            log_id: first.log_id,
            uuid: sb.set_uuid,
            chunk: c,
            state: Mutex::new(State {
                next_seq,
                rings: rings
                    .iter()
                    .map(|r| RingState {
                        head: 0,
                        live: VecDeque::new(),
                        // A member without this log's header gets one at the reset.
                        floor: r.as_ref().map_or(0, |(h, _)| h.floor),
                    })
                    .collect(),
                live: HashMap::new(),
                unflushed: HashMap::new(),
                unflushed_rows: 0,
            }),
            reclaim: Mutex::new(()),
            completed: Condvar::new(),
            gen: AtomicU64::new(1),
            durable: AtomicU64::new(0),
        };
        let found: Vec<Found> = rings.into_iter().flatten().flat_map(|r| r.1).collect();
        let writable = !array.capabilities().read_only;
        if dirty && writable {
            let entries = found.len();
            replay(array, pl, c, found)?;
            cairn_block::BlockDevice::flush(array)?;
            if entries > 0 {
                tracing::info!(
                    "{}: replayed {entries} partial-parity log entries",
                    array.array_label()
                );
            }
        }
        if writable {
            ppl.reset(array)?;
        }
        Ok(Some(ppl))
    }
}

/// Makes parity agree with every chunk that was not being written, for the rows of the
/// newest live entry of each stripe (older entries are masked row by row).
fn replay(array: &Array, pl: &ParityLayout, c: u64, found: Vec<Found>) -> Result<()> {
    // Partial entries by (stripe, seq); full entries by ring.
    let mut partial: HashMap<(u64, u64), Vec<Found>> = HashMap::new();
    let mut full: Vec<Found> = Vec::new();
    for f in found {
        if f.header.chunk != u32::try_from(c).unwrap_or(0) {
            continue;
        }
        if f.header.kind == Kind::Full {
            full.push(f);
            continue;
        }
        if f.header.stripe >= pl.stripes() || f.header.y > c * wide(pl.data_disks()) {
            continue;
        }
        // Only where this member really is that parity for that stripe.
        let map = pl.stripe_map(StripeNo(f.header.stripe));
        let ok = match f.header.kind {
            Kind::PartialP => f.role == map.p,
            Kind::PartialQ => Some(f.role) == map.q,
            Kind::Full => false,
        };
        if ok {
            partial
                .entry((f.header.stripe, f.header.seq))
                .or_default()
                .push(f);
        }
    }
    let mut by_stripe: HashMap<u64, Vec<(u64, Vec<Found>)>> = HashMap::new();
    for ((s, seq), fs) in partial {
        by_stripe.entry(s).or_default().push((seq, fs));
    }
    let mut stripes: Vec<u64> = by_stripe.keys().copied().collect();
    stripes.sort_unstable();
    for group in by_stripe.values_mut() {
        group.sort_by_key(|g| std::cmp::Reverse(g.0));
    }
    // Every row to replay is planned first: rows of different stripes, and the parts of
    // one stripe's entries not covered by a newer one, are disjoint, so their reads (and
    // then their writes) go out together (`replay_segments`).
    let mut segments = Vec::new();
    for s in stripes {
        let group = &by_stripe[&s];
        let map = pl.stripe_map(StripeNo(s));
        // The newest full entry on this stripe's parity members masks all older ones.
        let masked_below = full
            .iter()
            .filter(|f| {
                (f.role == map.p || Some(f.role) == map.q)
                    && f.header.stripe <= s
                    && s < f.header.stripe_hi
            })
            .map(|f| f.header.seq)
            .max()
            .unwrap_or(0);
        let mut covered: Vec<(u64, u64)> = Vec::new();
        for (seq, fs) in group {
            if *seq < masked_below {
                break;
            }
            let h = fs[0].header;
            let (lo, hi) = row_of(c, h.x, h.y).expect("checked at decode");
            let pp = fs.iter().find(|f| f.header.kind == Kind::PartialP);
            let pq = fs.iter().find(|f| f.header.kind == Kind::PartialQ);
            // Copies must agree; a parity member that is up but lacks its copy means the
            // log write never finished, so none of the write was issued: mask only.
            let agree = fs.iter().all(|f| (f.header.x, f.header.y) == (h.x, h.y));
            let issued = (pp.is_some() || !array.is_up(map.p))
                && (pq.is_some() || map.q.is_none_or(|q| !array.is_up(q)));
            if agree && issued {
                for (r0, r1) in uncovered(lo, hi, &covered) {
                    let (pp, pq) = (pp.map(|f| &f.payload[..]), pq.map(|f| &f.payload[..]));
                    segments.extend(row_segments(c, s, (h.x, h.y), (r0, r1), lo, pp, pq));
                }
            }
            covered.push((lo, hi));
        }
    }
    // In batches of about `REPLAY_BATCH` bytes of member reads.
    let per_row = wide(pl.raid_disks());
    let mut batch = 0;
    let mut from = 0;
    for (i, g) in segments.iter().enumerate() {
        batch += (g.s1 - g.s0) * per_row;
        if batch >= REPLAY_BATCH || i + 1 == segments.len() {
            replay_segments(array, pl, &segments[from..=i])?;
            (from, batch) = (i + 1, 0);
        }
    }
    Ok(())
}

/// Member bytes the replay reads at once, at most (a segment larger alone goes alone).
const REPLAY_BATCH: u64 = 4 << 20;

/// A part of a replayed row with one set of data chunks being written (`modified`, by
/// data index): stripe `s`, stripe-relative bytes `[s0, s1)` of each member's chunk, the
/// entry's PP/PQ indexed from `lo`.
struct Segment<'f> {
    s: u64,
    s0: u64,
    s1: u64,
    lo: u64,
    modified: Vec<bool>,
    pp: Option<&'f [u8]>,
    pq: Option<&'f [u8]>,
}

/// Parts of `[lo, hi)` outside every range of `covered`.
fn uncovered(lo: u64, hi: u64, covered: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = vec![(lo, hi)];
    for &(a, b) in covered {
        out = out
            .into_iter()
            .flat_map(|(x, y)| {
                let mut v = Vec::new();
                if x < a.min(y) {
                    v.push((x, a.min(y)));
                }
                if b.max(x) < y {
                    v.push((b.max(x), y));
                }
                v
            })
            .collect();
    }
    out
}

/// The segments of rows `[r0, r1)` of stripe `s` (chunk `c` bytes), whose entry wrote
/// stripe-relative `[x, y)` over the row starting at `lo` (`pp`/`pq` are indexed from
/// `lo`): cut where the set of chunks being written changes.
fn row_segments<'f>(
    c: u64,
    s: u64,
    (x, y): (u64, u64),
    (r0, r1): (u64, u64),
    lo: u64,
    pp: Option<&'f [u8]>,
    pq: Option<&'f [u8]>,
) -> Vec<Segment<'f>> {
    let t = touches(c, x, y);
    let mut cuts: Vec<u64> = vec![r0, r1];
    for &(_, a, b) in &t {
        cuts.extend([a, b].into_iter().filter(|&v| r0 < v && v < r1));
    }
    cuts.sort_unstable();
    cuts.dedup();
    let data = t.iter().map(|&(d, _, _)| d + 1).max().unwrap_or(0);
    cuts.windows(2)
        .map(|w| {
            let (s0, s1) = (w[0], w[1]);
            let modified = (0..data)
                .map(|d| t.iter().any(|&(td, a, b)| td == d && a <= s0 && s1 <= b))
                .collect();
            Segment {
                s,
                s0,
                s1,
                lo,
                modified,
                pp,
                pq,
            }
        })
        .collect()
}

/// Replays `segments`: their member reads all at once (`read_members`: from this
/// thread over members that complete later), then each one's parity made to match,
/// the new P and Q written all at once, every write answered before this returns.
fn replay_segments(array: &Array, pl: &ParityLayout, segments: &[Segment<'_>]) -> Result<()> {
    let c = pl.chunk().0 * SECTOR_SIZE;
    let n = pl.raid_disks();
    let down = array.down_mask();
    let mut all_rows: Vec<Vec<Vec<u8>>> = segments
        .iter()
        .map(|g| (0..n).map(|_| vec![0u8; small(g.s1 - g.s0)]).collect())
        .collect();
    let reads = all_rows.iter_mut().zip(segments).flat_map(|(rows, g)| {
        let up = rows.iter_mut().enumerate().filter(|(m, _)| !down[*m]);
        up.map(move |(m, row)| (m, (m, row.as_mut_slice(), g.s * c + g.s0)))
    });
    let failed = array.read_members(reads.collect(), Overlap::No);
    if let Some((_, e)) = failed.into_iter().flatten().next() {
        return Err(e);
    }
    let mut writes: Vec<(usize, u64, Vec<u8>)> = Vec::new();
    for (g, mut rows) in segments.iter().zip(all_rows) {
        let (s, s0, s1, lo, pp, pq) = (g.s, g.s0, g.s1, g.lo, g.pp, g.pq);
        let map = &pl.stripe_map(StripeNo(s));
        let modified: Vec<bool> = (0..map.data.len())
            .map(|d| g.modified.get(d).copied().unwrap_or(false))
            .collect();
        // 1. Chunks not being written that are missing: from PP/PQ, over a stripe whose
        //    written chunks count as zero.
        let missing_unmod: Vec<usize> = (0..map.data.len())
            .filter(|&d| !modified[d] && down[map.data[d]])
            .map(|d| map.data[d])
            .collect();
        if !missing_unmod.is_empty() {
            let mut v: Vec<Vec<u8>> = rows.clone();
            for (d, &m) in map.data.iter().enumerate() {
                if modified[d] {
                    v[m].fill(0);
                }
            }
            let mut vmissing = missing_unmod.clone();
            let seg = small(s0 - lo)..small(s1 - lo);
            match pp {
                Some(pp) => v[map.p].copy_from_slice(&pp[seg.clone()]),
                None => vmissing.push(map.p),
            }
            if let Some(q) = map.q {
                match pq {
                    Some(pq) => v[q].copy_from_slice(&pq[seg.clone()]),
                    None => vmissing.push(q),
                }
            }
            if vmissing.len() > pl.level().parity_members() {
                tracing::warn!(
                    "{}: stripe {s}: the log cannot rebuild {} here",
                    array.array_label(),
                    missing_unmod
                        .iter()
                        .map(|&m| array.describe_role(m))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                continue;
            }
            vmissing.sort_unstable();
            array.recover(map, &mut v, &vmissing)?;
            for &m in &missing_unmod {
                rows[m] = std::mem::take(&mut v[m]);
            }
        }
        // 2. Chunks being written that are missing: whatever the parity on disk says.
        let mut rest: Vec<usize> = (0..map.data.len())
            .filter(|&d| modified[d] && down[map.data[d]])
            .map(|d| map.data[d])
            .collect();
        if !rest.is_empty() {
            rest.extend(
                [Some(map.p), map.q]
                    .into_iter()
                    .flatten()
                    .filter(|&m| down[m]),
            );
            rest.sort_unstable();
            if rest.len() > pl.level().parity_members() {
                continue;
            }
            array.recover(map, &mut rows, &rest)?;
        }
        // 3. Parity to match.
        let refs: Vec<&[u8]> = map.data.iter().map(|&m| rows[m].as_slice()).collect();
        let (p, q) = array.gen_parity(map, &refs);
        if !down[map.p] && p != rows[map.p] {
            writes.push((map.p, s * c + s0, p));
        }
        if let (Some(qm), Some(q)) = (map.q, q) {
            if !down[qm] && q != rows[qm] {
                writes.push((qm, s * c + s0, q));
            }
        }
    }
    // Every one has answered before this returns, so before the flush and the new ring
    // headers that drop the entries (`Ppl::open`).
    let writes = writes
        .iter()
        .map(|(m, off, b)| (*m, (*m, Bytes::Borrowed(b.as_slice()), *off)))
        .collect();
    let failed = array.write_members(writes, WriteFlags::NONE, Overlap::No);
    if let Some((_, e)) = failed.into_iter().flatten().next() {
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::format::tests::entry;
    use super::*;

    #[test]
    fn torn_payload_is_skipped_by_scan() {
        let h = RingHeader {
            ring_off: 8192,
            ring_len: 8 * 4096,
            floor: 10,
            log_id: 7,
            uuid: Uuid([1; 16]),
        };
        assert_eq!(RingHeader::parse(&h.encode()), Ok(h));
        let mut ring = vec![0u8; 8 * 4096];
        let payload = vec![0x5au8; 4096];
        let mut e = entry();
        e.payload = 4096;
        e.pcrc = crc32c(&payload);
        for (i, seq) in [(0usize, 12u64), (2, 9), (4, 13)] {
            let mut ee = e;
            ee.seq = seq;
            ring[i * 4096..(i + 1) * 4096].copy_from_slice(&ee.encode());
            ring[(i + 1) * 4096..(i + 2) * 4096].copy_from_slice(&payload);
        }
        // Below the floor: dead. Entry at block 4: torn payload.
        ring[5 * 4096 + 100] ^= 1;
        let got: Vec<u64> = scan(&ring, &h, 0).iter().map(|f| f.header.seq).collect();
        assert_eq!(got, vec![12]);
        // Random garbage never panics.
        let mut x = 0x1234_5678_u64;
        for _ in 0..64 {
            for b in ring.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x.to_le_bytes()[0];
            }
            let _ = scan(&ring, &h, 0);
            let _ = RingHeader::parse(&ring);
        }
    }

    #[test]
    fn rows_and_uncovered() {
        assert_eq!(row_of(4096, 0, 0), None);
        assert_eq!(row_of(4096, 100, 200), Some((100, 200)));
        assert_eq!(row_of(4096, 4000, 4096 + 100), Some((0, 4096)));
        assert_eq!(row_of(4096, 4000, 4096 + 3000), Some((0, 4096)));
        assert_eq!(row_of(4096, 3000, 4096 + 100), Some((0, 4096)));
        assert_eq!(row_of(4096, 512, 1024), Some((512, 1024)));
        assert_eq!(
            uncovered(0, 100, &[(10, 20), (50, 200)]),
            vec![(0, 10), (20, 50)]
        );
        assert_eq!(uncovered(0, 100, &[(0, 100)]), vec![]);
    }
}
