//! Online verify and invalidate: DRBD's `drbdadm verify` and `drbdadm invalidate`.
//!
//! ```text
//!   primary (verify_run, 4 ranges in flight, handed out in disk order)   secondary
//!     wait for the rate controller (rate.rs: the resync's limits), holding nothing
//!     hold the range [off, off+len) (RangeLocks): no application write
//!     and no resync copy of it is in flight anywhere
//!     read it here, one digest per bitmap block
//!     Digest {offset, len}                               ──>   reads it there, digests
//!                                                        <──   8 bytes per bitmap block
//!     a block whose digests differ: its bit is set in the peer's bitmap
//!     release the range
//! ```
//!
//! Verify copies nothing (as DRBD): the blocks it finds are out of sync in the peer's
//! bitmap, and the next connect resyncs them (`disconnect` + `connect`), or at once with
//! `verify --resync`, which drops the link when the verify is done so the peer thread
//! reconnects and resyncs the marked blocks the usual way.
//!
//! Invalidate (on a secondary) gives this node's data up: its generation becomes
//! [`JUST_CREATED`] and it is inconsistent, both persisted, so every primary's handshake
//! decides a full sync to it (gen.rs: peer-just-created). Until a full `SyncStart` comes,
//! a bitmap `SyncStart` and a `SyncDone` are refused, so a resync that began before the
//! invalidation cannot mark the data current again.
//!
//! This file is a child module of node.rs (it reaches the node's fields, as resync does).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use cairn_block::{BlockDevice, Result};
use serde::{Deserialize, Serialize};

use super::{Conn, Node, Peer, Repl, Role};
use crate::gen::JUST_CREATED;
use crate::rate::{Pacer, RateLimits, Speed};
use crate::wire::{Request, DIGESTS_PER_REPLY};

/// Bytes read at once, and the most a verify request covers when bitmap blocks are
/// smaller (the range is held that long).
const PIECE: u64 = 1 << 20;

/// Requests in flight during a verify.
const IN_FLIGHT: usize = 4;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;

/// The 64-bit digest of one block: CRC32C of its bytes in the high half (every error
/// burst of up to 32 bits is caught), and in the low half a multiply-rotate hash of its
/// 8-byte words (xxHash64's round and final mix), which a CRC collision does not imply.
#[derive(Clone, Copy, Debug)]
struct Digest {
    crc: u32,
    h: u64,
    len: u64,
}

impl Digest {
    fn new() -> Digest {
        Digest {
            crc: 0,
            h: P3,
            len: 0,
        }
    }

    /// Every piece but a block's last is a multiple of 8 bytes (the reads are).
    fn update(&mut self, data: &[u8]) {
        debug_assert!(self.len.is_multiple_of(8), "a piece after a partial word");
        self.crc = crc32c::crc32c_append(self.crc, data);
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.h = round(self.h, u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.h = round(self.h, u64::from_le_bytes(b));
        }
        self.len += data.len() as u64;
    }

    fn finish(self) -> u64 {
        let mut h = self.h ^ self.len.wrapping_mul(P1);
        h ^= h >> 33;
        h = h.wrapping_mul(P2);
        h ^= h >> 29;
        h = h.wrapping_mul(P3);
        h ^= h >> 32;
        (u64::from(self.crc) << 32) | (h & 0xffff_ffff)
    }
}

fn round(acc: u64, v: u64) -> u64 {
    acc.wrapping_add(v.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

/// One digest per `bm`-byte block of `[offset, offset + len)` of `disk` (the last block
/// may be shorter: the end of the data), read in pieces of at most 1 MiB. Both sides of a
/// verify compute them with this function.
pub fn block_digests(disk: &dyn BlockDevice, offset: u64, len: u64, bm: u64) -> Result<Vec<u64>> {
    debug_assert!(bm > 0);
    let step = if bm >= PIECE {
        PIECE
    } else {
        (PIECE / bm) * bm
    };
    let mut buf = vec![0u8; usize::try_from(step.min(len)).expect("at most 1 MiB")];
    let mut out = Vec::with_capacity(usize::try_from(len.div_ceil(bm)).unwrap_or(0));
    let end = offset + len;
    let mut d = Digest::new();
    let mut p = offset;
    while p < end {
        let n = usize::try_from(step.min(end - p)).expect("at most 1 MiB");
        disk.read_at(&mut buf[..n], p)?;
        let mut data = &buf[..n];
        while !data.is_empty() {
            let take = usize::try_from((bm - d.len).min(data.len() as u64)).expect("<= data");
            d.update(&data[..take]);
            data = &data[take..];
            if d.len == bm {
                out.push(d.finish());
                d = Digest::new();
            }
        }
        p += n as u64;
    }
    if d.len > 0 {
        out.push(d.finish());
    }
    Ok(out)
}

/// The bitmap blocks a `Digest` request covers, or why it is refused: the range starts
/// on a bitmap block, ends on one or at the end of the data, and holds at most
/// [`DIGESTS_PER_REPLY`] blocks (so the answer fits in one option reply).
fn digest_range(
    offset: u64,
    len: u64,
    bm: u64,
    data_size: u64,
) -> std::result::Result<u64, String> {
    if len == 0 {
        return Err("an empty digest range".into());
    }
    let end = offset
        .checked_add(len)
        .filter(|&e| e <= data_size)
        .ok_or_else(|| {
            format!("digest range {offset}+{len} is beyond the data ({data_size} bytes)")
        })?;
    if !offset.is_multiple_of(bm) || (!end.is_multiple_of(bm) && end != data_size) {
        return Err(format!(
            "digest range {offset}+{len} is not on {bm}-byte bitmap blocks"
        ));
    }
    let blocks = len.div_ceil(bm);
    if blocks > DIGESTS_PER_REPLY {
        return Err(format!(
            "digest range of {blocks} blocks: at most {DIGESTS_PER_REPLY} per request"
        ));
    }
    Ok(blocks)
}

/// An online verify against one peer, as `status` shows it: running, or how the last
/// one ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VerifyStatus {
    pub running: bool,
    pub total_bytes: u64,
    pub done_bytes: u64,
    pub bytes_per_sec: u64,
    pub eta_secs: Option<u64>,
    /// Bitmap blocks compared so far.
    pub blocks_checked: u64,
    /// Blocks whose digests differed (each now marked in the peer's bitmap).
    pub out_of_sync_blocks: u64,
    /// Seconds the verify ran (so far).
    pub secs: f64,
    /// Why it stopped early.
    pub error: Option<String>,
    /// `--resync`: the marked blocks are resynced when the verify is done.
    pub resync: bool,
    /// While it runs: the rate the controller paces it to (bytes/s); `None`: unlimited
    /// (or not running).
    #[serde(default)]
    pub target_bytes_per_sec: Option<u64>,
    /// While it runs: application I/O holds it at the minimum rate.
    #[serde(default)]
    pub throttled: bool,
}

#[derive(Debug)]
struct Run {
    total: u64,
    resync: bool,
    started: Instant,
    done: AtomicU64,
    checked: AtomicU64,
    found: AtomicU64,
    /// Set when the run ended: its seconds and its error.
    end: Mutex<Option<(f64, Option<String>)>>,
    pacer: Pacer,
    /// Its speed over the last seconds, while it runs.
    speed: Speed,
    /// The verify after a failover (the old primary's name): a run that stops early
    /// owes it again (sync.rs `verify_after_failover`).
    after_failover: Option<String>,
}

/// The node's verify runs (the last one per peer) and its invalidation mark.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Set by `invalidate`: until a full resync starts, no resync may make this node's
    /// data current.
    pub(super) invalidated: AtomicBool,
    runs: Mutex<Vec<(String, Arc<Run>)>>,
}

impl Shared {
    fn run(&self, peer: &str) -> Option<Arc<Run>> {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.iter().find(|(n, _)| n == peer).map(|(_, r)| r.clone())
    }

    /// A verify runs against `peer` now.
    pub(super) fn running(&self, peer: &str) -> bool {
        self.run(peer)
            .is_some_and(|r| r.end.lock().unwrap_or_else(|p| p.into_inner()).is_none())
    }

    /// A new run against `peer`, replacing the last one's result; `None` while one runs.
    fn begin(
        &self,
        peer: &str,
        total: u64,
        resync: bool,
        pace: (RateLimits, &AtomicU64),
        after_failover: Option<&str>,
    ) -> Option<Arc<Run>> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, r)) = runs.iter().find(|(n, _)| n == peer) {
            if r.end.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                return None;
            }
        }
        runs.retain(|(n, _)| n != peer);
        let run = Arc::new(Run {
            total,
            resync,
            started: Instant::now(),
            done: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            found: AtomicU64::new(0),
            end: Mutex::new(None),
            pacer: Pacer::new(pace.0, pace.1),
            speed: Speed::new(Instant::now()),
            after_failover: after_failover.map(str::to_string),
        });
        runs.push((peer.to_string(), run.clone()));
        Some(run)
    }

    /// `app`: the node's application I/O counter, for the controller's target.
    pub(super) fn status(&self, peer: &str, app: &AtomicU64) -> Option<VerifyStatus> {
        let run = self.run(peer)?;
        let end = run.end.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let done = run.done.load(Ordering::Relaxed);
        let secs = end
            .as_ref()
            .map_or_else(|| run.started.elapsed().as_secs_f64(), |e| e.0);
        // While it runs, the last seconds' speed; after, the average of the whole run.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rate = if end.is_none() {
            run.speed.rate(Instant::now(), done)
        } else {
            (done as f64 / secs.max(0.001)) as u64
        };
        let target = end.is_none().then(|| run.pacer.target(app));
        Some(VerifyStatus {
            running: end.is_none(),
            total_bytes: run.total,
            done_bytes: done,
            bytes_per_sec: rate,
            eta_secs: (end.is_none() && rate > 0).then(|| (run.total - done) / rate),
            blocks_checked: run.checked.load(Ordering::Relaxed),
            out_of_sync_blocks: run.found.load(Ordering::Relaxed),
            secs,
            error: end.and_then(|e| e.1),
            resync: run.resync,
            target_bytes_per_sec: target.and_then(|t| t.bytes_per_sec),
            throttled: target.is_some_and(|t| t.throttled),
        })
    }

    /// A `SyncStart` from a primary: after an invalidation only a full one.
    pub(super) fn admit_sync_start(&self, full: bool) -> std::result::Result<(), String> {
        if !full && self.invalidated.load(Ordering::SeqCst) {
            return Err("this node was invalidated: only a full resync replaces its data".into());
        }
        if full {
            self.invalidated.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// A `SyncDone`: refused when the node was invalidated after that resync began.
    pub(super) fn admit_sync_done(&self) -> std::result::Result<(), String> {
        if self.invalidated.load(Ordering::SeqCst) {
            return Err(
                "this node was invalidated during this resync: it needs a full resync".into(),
            );
        }
        Ok(())
    }
}

impl Node {
    /// `verify [--peer NAME] [--resync]` on the primary: starts comparing every block
    /// with each chosen peer (connected and in sync) in the background; `status` shows
    /// the progress and the result.
    pub fn verify(
        self: &Arc<Self>,
        peer: Option<&str>,
        resync: bool,
    ) -> std::result::Result<String, String> {
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        self.verify_admin(peer, resync, None)
    }

    /// [`Node::verify`] for a caller that holds the admin lock. `after_failover`: the
    /// verify owed after a failover from that old primary; a run that stops early owes it
    /// again.
    pub(super) fn verify_admin(
        self: &Arc<Self>,
        peer: Option<&str>,
        resync: bool,
        after_failover: Option<&str>,
    ) -> std::result::Result<String, String> {
        if self.role() != Role::Primary {
            return Err(format!(
                "{} is secondary on {}: verify runs on the primary, which compares its data with its peers'",
                self.cfg.resource, self.cfg.node
            ));
        }
        if self.is_diskless() || self.pulling().is_some() {
            // Its blocks not filled yet would all differ, and be marked in the peers'
            // bitmaps: a resync would then copy them from here.
            return Err(format!(
                "{} on {} has no whole local copy (diskless, or its disk is being filled from a peer): verify after `cairn repl status` shows it UpToDate",
                self.cfg.resource, self.cfg.node
            ));
        }
        let chosen: Vec<&Arc<Peer>> = match peer {
            Some(name) => vec![self
                .peer_named(name)
                .ok_or_else(|| format!("no peer named {name:?}"))?],
            None => self.peers.iter().collect(),
        };
        let mut started = Vec::new();
        let mut skipped = Vec::new();
        for p in chosen {
            let name = p.cfg.name.clone();
            let (conn, repl) = {
                let s = p.state();
                (s.conn, s.repl)
            };
            if conn != Conn::Connected || repl != Repl::Established || p.link().is_none() {
                skipped.push(format!(
                    "peer {name} is {conn:?}/{repl:?}: verify needs it connected and in sync (Established)"
                ));
                continue;
            }
            let pace = (self.cfg.resync, &self.app_io);
            let Some(run) = self
                .vx
                .begin(&name, self.data_size, resync, pace, after_failover)
            else {
                skipped.push(format!("a verify against {name} is running"));
                continue;
            };
            if after_failover.is_some() {
                // Owed no more while it runs: a run that stops early owes it again
                // (verify_run), which it can only do after this.
                p.state().verify_after_failover = None;
            }
            let (node, peer) = (self.clone(), p.clone());
            let h = thread::Builder::new()
                .name(format!("repl-verify-{name}"))
                .spawn(move || node.verify_run(&peer, &run))
                .map_err(|e| e.to_string())?;
            self.threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(h);
            self.event(
                "verify-started",
                Some(&name),
                format!(
                    "verify against {name} started: {} bytes{}",
                    self.data_size,
                    if resync {
                        ", the blocks found out of sync are resynced at the end"
                    } else {
                        ""
                    }
                ),
            );
            started.push(name);
        }
        if started.is_empty() {
            return Err(skipped.join("; "));
        }
        let mut msg = format!(
            "verify of {} against {} started (cairn repl status shows its progress)",
            self.cfg.resource,
            started.join(", ")
        );
        for s in skipped {
            msg.push_str("; ");
            msg.push_str(&s);
        }
        Ok(msg)
    }

    /// Compares every bitmap block with `peer`, in disk order, [`IN_FLIGHT`] ranges at
    /// once, paced by the rate controller; marks the differing ones in its bitmap.
    fn verify_run(&self, peer: &Arc<Peer>, run: &Run) {
        let bm = self.meta.bm_block();
        let step = (PIECE / bm).clamp(1, DIGESTS_PER_REPLY);
        let bits = peer.bitmap.bits();
        let cursor = Mutex::new(0u64);
        let failed: Mutex<Option<String>> = Mutex::new(None);
        let demoted = || self.stop_peers.load(Ordering::SeqCst) || self.lease_lost();
        let stopping = || demoted() || failed.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        thread::scope(|s| {
            for _ in 0..IN_FLIGHT {
                s.spawn(|| loop {
                    if failed.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                        return;
                    }
                    if demoted() {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some("this node stopped being primary".into());
                        return;
                    }
                    let a = {
                        let mut c = cursor.lock().unwrap_or_else(|p| p.into_inner());
                        if *c >= bits {
                            return;
                        }
                        let a = *c;
                        *c = (a + step).min(bits);
                        a
                    };
                    let b = (a + step).min(bits);
                    let off = a * bm;
                    let len = (b * bm).min(self.data_size) - off;
                    // Waits holding no range; a stop is seen at the top of the loop.
                    run.pacer.admit(len, &self.app_io, stopping);
                    if stopping() {
                        continue;
                    }
                    match self.verify_range(peer, off, len) {
                        Ok(diff) => {
                            for i in &diff {
                                peer.bitmap.set(a + i, a + i + 1);
                            }
                            run.found.fetch_add(diff.len() as u64, Ordering::Relaxed);
                            run.checked.fetch_add(b - a, Ordering::Relaxed);
                            let done = run.done.fetch_add(len, Ordering::Relaxed);
                            run.speed.note(Instant::now(), done + len);
                        }
                        Err(e) => {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            return;
                        }
                    }
                });
            }
        });
        let error = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let _ = self.write_out_bitmaps();
        let secs = run.started.elapsed().as_secs_f64();
        let found = run.found.load(Ordering::Relaxed);
        let checked = run.checked.load(Ordering::Relaxed);
        let name = &peer.cfg.name;
        if let (Some(_), Some(old)) = (&error, &run.after_failover) {
            // Only part of the data was compared: the verify is still owed, and until it
            // has compared every block the peer is not known to hold this node's data
            // (sync.rs `peers_holding_my_data`). Re-armed before the run is marked ended,
            // so the two are never both unset.
            peer.state().verify_after_failover = Some(old.clone());
        }
        *run.end.lock().unwrap_or_else(|p| p.into_inner()) = Some((secs, error.clone()));
        if let Some(e) = error {
            self.event(
                "verify-failed",
                Some(name),
                format!(
                    "verify against {name} stopped after {} of {} bytes: {e}; {found} blocks out of sync found (marked in its bitmap)",
                    run.done.load(Ordering::Relaxed),
                    run.total
                ),
            );
            return;
        }
        let then = match (found, run.resync) {
            (0, _) => "",
            (_, false) => {
                "; marked in its bitmap: `cairn repl disconnect` and `connect` resync them"
            }
            (_, true) => "; reconnecting to resync them",
        };
        self.event(
            "verify-done",
            Some(name),
            format!(
                "verify against {name} done: {checked} blocks checked in {secs:.2} s, {found} out of sync{then}"
            ),
        );
        if found > 0 && run.resync {
            self.lose(
                peer,
                &format!("verify found {found} blocks out of sync: reconnecting to resync them"),
            );
        }
    }

    /// One range: the bitmap blocks (indexes from the range's first) whose digests differ.
    /// The range is held throughout, so no write changes it on either side meanwhile.
    fn verify_range(
        &self,
        peer: &Peer,
        off: u64,
        len: u64,
    ) -> std::result::Result<Vec<u64>, String> {
        if peer.link().is_none() || peer.state().repl != Repl::Established {
            return Err(format!(
                "peer {} is no longer connected and in sync",
                peer.cfg.name
            ));
        }
        let bm = self.meta.bm_block();
        let range = self.locks.lock(off, len);
        let local = match block_digests(self.disk.as_ref(), off, len, bm) {
            Ok(d) => d,
            Err(e) => {
                // Out of the range lock: a detach asks the peers to adopt a new
                // generation.
                drop(range);
                if self.local_failed(&e) {
                    return Err(format!(
                        "this node's disk failed reading at {off} ({e}) and was detached: there is nothing left to compare; peer {} stays connected and in sync",
                        peer.cfg.name
                    ));
                }
                return Err(format!("reading this node's data at {off}: {e}"));
            }
        };
        let data = peer.request(
            &Request::Digest {
                node: self.cfg.node.clone(),
                offset: off,
                len,
            },
            self.cfg.peer_timeout,
        )?;
        if data.len() != local.len() * 8 {
            return Err(format!(
                "{}: digest answer of {} bytes, expected {}",
                peer.cfg.name,
                data.len(),
                local.len() * 8
            ));
        }
        Ok(local
            .iter()
            .zip(data.chunks_exact(8))
            .enumerate()
            .filter(|(_, (l, r))| **l != u64::from_le_bytes((*r).try_into().expect("8 bytes")))
            .map(|(i, _)| i as u64)
            .collect())
    }

    /// The secondary's answer to `Digest`.
    pub(crate) fn digests(
        &self,
        node: &str,
        offset: u64,
        len: u64,
    ) -> std::result::Result<Vec<u8>, String> {
        self.require_secondary()?;
        self.peer_named(node)
            .ok_or_else(|| format!("{node:?} is not a peer"))?;
        digest_range(offset, len, self.meta.bm_block(), self.data_size)?;
        let d = block_digests(self.disk.as_ref(), offset, len, self.meta.bm_block())
            .map_err(|e| format!("reading the data at {offset}: {e}"))?;
        Ok(d.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    /// `invalidate` on a secondary: this node's data is to be replaced by a full resync
    /// from the next (or the current) primary.
    pub fn invalidate(self: &Arc<Self>) -> std::result::Result<String, String> {
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        if self.role() == Role::Primary {
            return Err(format!(
                "{} is primary on {}: invalidate replaces a secondary's data with the primary's; \
                 run it on the secondary whose data is to go (or make this node secondary first)",
                self.cfg.resource, self.cfg.node
            ));
        }
        self.vx.invalidated.store(true, Ordering::SeqCst);
        {
            let mut p = self.persisted();
            let before = p.clone();
            // meta.rs keeps a just-created node's history and bitmap bases empty.
            p.current = JUST_CREATED;
            p.history = [0, 0];
            for slot in &mut p.peers {
                slot.bitmap_uuid = 0;
            }
            p.consistent = false;
            if let Err(e) = self.meta.save(&p) {
                *p = before;
                self.vx.invalidated.store(false, Ordering::SeqCst);
                return Err(format!("cannot save the metadata: {e}"));
            }
        }
        // A primary connected now loses its data connection, notices (at once, or at its
        // next write or flush), and reconnects: the handshake then decides a full sync.
        if let Some(ex) = self
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            ex.peers.remove(&self.cfg.resource);
        }
        self.readd_peer_export();
        for peer in &self.peers {
            peer.set(Conn::StandAlone, Repl::Off);
        }
        self.event(
            "invalidated",
            None,
            format!(
                "{} on {}: this node's data is to be replaced: the primary resyncs all of it",
                self.cfg.resource, self.cfg.node
            ),
        );
        Ok(format!(
            "{} on {} invalidated: inconsistent until a full resync from the primary",
            self.cfg.resource, self.cfg.node
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::{MemDisk, WriteFlags};

    #[test]
    fn digests_are_per_block_and_see_one_changed_byte() {
        let disk = MemDisk::new(1 << 20);
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        disk.write_at(&data, 0, WriteFlags::NONE).unwrap();
        for bm in [4096u64, 8192, 1 << 20] {
            let a = block_digests(&disk, 0, 1 << 20, bm).unwrap();
            assert_eq!(a.len() as u64, (1u64 << 20) / bm);
            disk.write_at(&[data[5000] ^ 1], 5000, WriteFlags::NONE)
                .unwrap();
            let b = block_digests(&disk, 0, 1 << 20, bm).unwrap();
            disk.write_at(&data[5000..5001], 5000, WriteFlags::NONE)
                .unwrap();
            let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            assert_eq!(differ, vec![usize::try_from(5000 / bm).unwrap()], "bm {bm}");
        }
        // A part of the data gives the same digests as the whole has for it.
        let whole = block_digests(&disk, 0, 1 << 20, 4096).unwrap();
        let part = block_digests(&disk, 8192, 3 * 4096, 4096).unwrap();
        assert_eq!(part, whole[2..5]);
        // Zeros of different lengths differ; the last block may be short.
        let z = MemDisk::new(8192);
        let short = block_digests(&z, 0, 6144, 4096).unwrap();
        assert_eq!(short.len(), 2);
        assert_ne!(short[0], short[1]);
    }

    #[test]
    fn a_block_bigger_than_a_read_is_digested_in_pieces() {
        let disk = MemDisk::new(4 << 20);
        let d = block_digests(&disk, 0, 4 << 20, 2 << 20).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], d[1]);
        disk.write_at(&[1], (3 << 20) + 17, WriteFlags::NONE)
            .unwrap();
        let e = block_digests(&disk, 0, 4 << 20, 2 << 20).unwrap();
        assert_eq!(e[0], d[0]);
        assert_ne!(e[1], d[1]);
    }

    #[test]
    fn digest_ranges_are_bounded() {
        let bm = 4096;
        let size = 64 << 20;
        assert_eq!(digest_range(0, 1 << 20, bm, size), Ok(256));
        assert_eq!(digest_range(size - 4096, 4096, bm, size), Ok(1));
        assert_eq!(
            digest_range(0, DIGESTS_PER_REPLY * bm, bm, size),
            Ok(DIGESTS_PER_REPLY)
        );
        for (off, len) in [
            (0, 0),
            (1, 4096),
            (0, 4095),
            (size, 4096),
            (size - 4096, 8192),
            (u64::MAX - 10, 4096),
            (0, (DIGESTS_PER_REPLY + 1) * bm),
        ] {
            assert!(digest_range(off, len, bm, size).is_err(), "{off}+{len}");
        }
        // A data area that ends mid-block: its last, short block.
        assert_eq!(digest_range(8192, 1000, bm, 9192), Ok(1));
    }

    fn node(disk: &Arc<dyn BlockDevice>) -> Arc<Node> {
        use crate::node::NodeConfig;
        let cfg = NodeConfig::for_tests("home", "b", "a");
        let meta = crate::store::Store::open(disk.clone()).unwrap();
        Node::open(cfg, disk.clone(), Box::new(meta)).unwrap()
    }

    #[test]
    fn a_secondary_answers_digests_and_invalidates_for_good() {
        let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(16 << 20));
        let params = crate::store::CreateParams {
            max_peers: 1,
            bm_block: 4096,
            al_extent: 1 << 20,
            force: false,
            resource: None,
        };
        crate::store::create(disk.as_ref(), &params).unwrap();
        disk.write_at(&[7u8; 4096], 8192, WriteFlags::NONE).unwrap();
        let n = node(&disk);
        // Digests: a known peer's, bounded, equal to the local computation.
        let d = n.digests("a", 0, 4 * 4096).unwrap();
        let want: Vec<u8> = block_digests(disk.as_ref(), 0, 4 * 4096, 4096)
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(d, want);
        assert!(n.digests("z", 0, 4096).is_err(), "a stranger's request");
        assert!(n.digests("a", 0, 1 << 30).is_err(), "beyond the data");
        assert!(n
            .verify(None, false)
            .unwrap_err()
            .contains("runs on the primary"));
        // Invalidate: blank and inconsistent, on disk too; only a full resync admitted.
        let gens = crate::gen::Generations {
            current: 0x1000,
            bitmap: 0,
            history: [0x2000, 0],
        };
        n.adopt("a", &gens).unwrap();
        n.invalidate().unwrap();
        let st = n.status();
        assert_eq!(st.disk, "Inconsistent");
        assert_eq!(st.generations.current, JUST_CREATED);
        assert!(n.sync_start("a", false).is_err());
        assert!(n.sync_done("a", &st.generations, &[]).is_err());
        drop(n);
        let n = node(&disk);
        let p = n.persisted().clone();
        assert_eq!(
            (p.current, p.history, p.consistent),
            (JUST_CREATED, [0, 0], false)
        );
        n.sync_start("a", true).unwrap();
    }

    #[test]
    fn after_an_invalidation_only_a_full_resync_is_admitted() {
        let s = Shared::default();
        s.admit_sync_start(false).unwrap();
        s.admit_sync_done().unwrap();
        s.invalidated.store(true, Ordering::SeqCst);
        assert!(s.admit_sync_start(false).is_err());
        assert!(s.admit_sync_done().is_err());
        s.admit_sync_start(true).unwrap();
        s.admit_sync_done().unwrap();
    }

    #[test]
    fn one_run_per_peer_and_its_result_stays() {
        let s = Shared::default();
        let app = AtomicU64::new(0);
        let pace = (RateLimits::default(), &app);
        let r = s.begin("b", 100, false, pace, None).unwrap();
        assert!(
            s.begin("b", 100, false, pace, None).is_none(),
            "two runs against one peer"
        );
        assert!(s.begin("c", 100, false, pace, None).is_some());
        r.done.store(100, Ordering::Relaxed);
        r.found.store(2, Ordering::Relaxed);
        let st = s.status("b", &app).unwrap();
        assert!(st.running);
        assert_eq!((st.target_bytes_per_sec, st.throttled), (None, false));
        app.fetch_add(1, Ordering::Relaxed);
        let st = s.status("b", &app).unwrap();
        assert_eq!(
            (st.target_bytes_per_sec, st.throttled),
            (Some(RateLimits::default().min_bytes_per_sec), true),
            "application I/O throttles a running verify"
        );
        *r.end.lock().unwrap() = Some((1.5, None));
        let st = s.status("b", &app).unwrap();
        assert!(!st.running);
        assert_eq!((st.target_bytes_per_sec, st.throttled), (None, false));
        assert_eq!(
            (st.out_of_sync_blocks, st.done_bytes, st.eta_secs),
            (2, 100, None)
        );
        assert!(s.begin("b", 100, true, pace, None).is_some());
        assert!(s.status("b", &app).unwrap().resync);
        assert!(s.status("nobody", &app).is_none());
    }
}
