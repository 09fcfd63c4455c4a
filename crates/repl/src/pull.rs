//! A diskless primary that takes a disk back fills it from an up-to-date peer while it
//! goes on serving (DRBD's primary that is SyncTarget). A child of node.rs, so it sees
//! the node's state.
//!
//! ```text
//!   attach on a diskless primary ─> the disk opened behind the gate, its metadata saved
//!   as invalidated (and every save masked so until the end), `todo` = every block
//!        │
//!        ├─ four pull threads (as a resync), in disk order: range lock ─> read from an
//!        │  up-to-date peer ─> write locally ─> clear the bits ─> release (paced as a
//!        │  resync)
//!        ├─ application reads: a range with bits in `todo` from an up-to-date peer,
//!        │  the rest locally
//!        ├─ application writes: local disk and peers as always (protocol C, even with
//!        │  A configured); a block wholly written leaves `todo`; answered OK only if an
//!        │  up-to-date peer has the write (the local disk is no whole copy yet)
//!        ├─ no up-to-date peer left: the pull waits, writes are refused; the last peer
//!        │  lost, back, is resynced from here for the blocks filled here only, and the
//!        │  pull goes on (no other peer is connected until the end)
//!        └─ `todo` empty ─> flush ─> the bitmaps towards the peers, then the real
//!           generations and "consistent" saved: UpToDate
//! ```
//!
//! Why a pull is safe: every write a primary acknowledges is on each up-to-date peer
//! (protocol C), and the range lock keeps a write and the copy of the same blocks apart,
//! so a copy never puts data older than a write it overlaps on the local disk.
//!
//! The set of blocks still to fill lives in memory only. A crash or a stop mid-way
//! leaves metadata that says "just created, inconsistent" (the masked saves): the node
//! comes back as a secondary that needs a full resync, never as one that holds the data.

use super::*;

/// A pull in progress.
#[derive(Debug)]
pub(super) struct Pull {
    /// Blocks of the local disk not filled yet: every one at the start; cleared by the
    /// pull, and by writes that cover a whole block.
    todo: Bitmap,
    total: u64,
    started: Instant,
    done: AtomicU64,
    pacer: Pacer,
    /// Its speed over the last seconds, for `status`.
    speed: Speed,
    /// The peer the pull reads from now (its slot), for `status`.
    source: Mutex<Option<usize>>,
    /// The last up-to-date peer, lost while no other was left: since then no write
    /// was acknowledged (they are refused without an up-to-date peer), so it still
    /// holds every acknowledged write, and it may come back to go on with the pull.
    /// Any other peer waits for the end (its bitmap may mark writes it lacks on blocks
    /// not filled here: only a whole local copy resyncs it).
    resume: Mutex<Option<usize>>,
}

impl Node {
    /// The pull in progress, if any (a detached disk ends it).
    pub(super) fn pulling(&self) -> Option<Arc<Pull>> {
        if !self.pull_on.load(Ordering::SeqCst) {
            return None;
        }
        self.pull.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Some block of `[offset, offset + len)` is not filled yet on the local disk.
    pub(super) fn pull_covers(&self, offset: u64, len: u64) -> bool {
        let Some(pull) = self.pulling() else {
            return false;
        };
        let (a, b) = pull.todo.covering(offset, len);
        pull.todo.next_run(a, 1).is_some_and(|(s, _)| s < b)
    }

    /// A write of `[offset, offset + len)` reached the local disk (under its range
    /// lock): the blocks it covers wholly are filled. A partial block is left to the
    /// pull, which copies it from a peer that has this write too.
    pub(super) fn pulled_by_write(&self, offset: u64, len: u64) {
        if let Some(pull) = self.pulling() {
            let (a, b) = pull.todo.inside(offset, len);
            pull.todo.clear(a, b);
        }
    }

    /// A write or flush during a pull: refused before anything is sent when no
    /// up-to-date peer is connected (the local disk alone is no copy of the data, and a
    /// write that reached it only could be overwritten by the pull later).
    pub(super) fn pull_needs_a_peer(&self) -> Result<()> {
        if self.pulling().is_some() && self.up_to_date_peers().is_empty() {
            return Err(io_err(
                ErrorKind::Io,
                format!(
                    "{}: the local disk is being filled from a peer (inconsistent) and no up-to-date peer is connected",
                    self.cfg.resource
                ),
            ));
        }
        Ok(())
    }

    /// A link is being dropped: `off` sets the peer's state. If the pull loses its last
    /// up-to-date peer with it, that peer is the one it may resume with. Under the
    /// pull's lock, so two peers lost at once are ordered: the later one is the last
    /// that took every acknowledged write.
    pub(super) fn pull_lost(&self, peer: &Peer, off: impl FnOnce()) {
        let Some(pull) = self.pulling() else {
            return off();
        };
        let mut resume = pull.resume.lock().unwrap_or_else(|p| p.into_inner());
        let was_up = peer.state().repl == Repl::Established;
        off();
        if was_up && self.up_to_date_peers().is_empty() {
            *resume = Some(peer.slot);
        }
    }

    /// While a pull runs, only the peer it may resume with is connected.
    pub(super) fn pull_may_connect(&self, peer: &Peer) -> bool {
        self.pulling().is_none_or(|pull| {
            *pull.resume.lock().unwrap_or_else(|p| p.into_inner()) == Some(peer.slot)
        })
    }

    /// Before the pull's last source is resynced from here (connect_peer): its bits on
    /// blocks not filled here are cleared. They mark writes no peer acknowledged
    /// (refused while it was away, or failed with it), whose local copy is no better
    /// than its own, and the local disk has nothing else to send there; the pull
    /// copies those blocks from it afterwards. Nothing changes meanwhile: writes are
    /// refused, and the pull waits, until it is in sync again.
    pub(super) fn pull_resume_bits(&self, peer: &Peer) {
        let Some(pull) = self.pulling() else {
            return;
        };
        let mut at = 0;
        while let Some((a, b)) = peer.bitmap.next_run(at, u64::MAX) {
            for bit in a..b {
                if pull.todo.get(bit) {
                    peer.bitmap.clear(bit, bit + 1);
                }
            }
            at = b;
        }
    }

    /// The parts of bits `[a, b)` this node's disk holds: all of them, or while a fill
    /// runs, the runs of blocks it filled (or the application wrote whole). The caller
    /// holds the range lock over them, so neither changes meanwhile.
    pub(super) fn pull_filled_parts(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let Some(pull) = self.pulling() else {
            return vec![(a, b)];
        };
        let mut parts: Vec<(u64, u64)> = Vec::new();
        for bit in (a..b).filter(|&bit| !pull.todo.get(bit)) {
            match parts.last_mut() {
                Some(last) if last.1 == bit => last.1 = bit + 1,
                _ => parts.push((bit, bit + 1)),
            }
        }
        parts
    }

    /// `attach` on a diskless primary, under the admin lock: the disk (or `new`) is
    /// taken back, marked invalidated on disk, and filled from an up-to-date peer by a
    /// thread of its own while the volume is served.
    pub(super) fn attach_primary(
        self: &Arc<Self>,
        new: Option<NewDisk>,
    ) -> std::result::Result<String, String> {
        let Some((source, _)) = self.up_to_date_peers().into_iter().next() else {
            return Err(format!(
                "{} is a diskless primary on {} with no up-to-date peer connected: there is nothing to fill the disk from; it stays detached",
                self.cfg.resource, self.cfg.node
            ));
        };
        let source_name = source.cfg.name.clone();
        if let Some((disk, meta)) = &new {
            self.check_new_disk(disk.as_ref(), meta.as_ref())?;
        }
        // No write in flight while the disk comes back: a write that began diskless
        // (its local part refused by the gate) must not see an attached disk when it
        // settles, or it would detach it again.
        let all = self.locks.lock(0, self.data_size);
        if let Some((disk, meta)) = new {
            drop(self.disk_gate.replace(disk));
            drop(self.meta_gate.replace(meta));
        }
        // The bitmaps towards the peers are in memory only since the detach: all of
        // them go to the disk, before its metadata says anything but "invalidated".
        for peer in &self.peers {
            peer.bitmap.redirty_all();
        }
        let bm = self.meta.bm_block();
        let todo = Bitmap::new(self.data_size.div_ceil(bm), bm);
        todo.set_all();
        let pull = Arc::new(Pull {
            total: todo.count_bytes(self.data_size),
            todo,
            started: Instant::now(),
            done: AtomicU64::new(0),
            pacer: Pacer::new(self.cfg.resync, &self.app_io),
            speed: Speed::new(Instant::now()),
            source: Mutex::new(Some(source.slot)),
            resume: Mutex::new(None),
        });
        self.meta_gate.masked.store(true, Ordering::SeqCst);
        *self.pull.lock().unwrap_or_else(|p| p.into_inner()) = Some(pull.clone());
        self.pull_on.store(true, Ordering::SeqCst);
        self.disk_state.store(DISK_ATTACHED, Ordering::SeqCst);
        // Nothing from before the detach is in flight: the activity log starts empty.
        self.al.clear_idle();
        let saved = (|| -> Result<()> {
            self.meta.save(&self.persisted())?;
            self.meta.write_al(&[])?;
            self.write_out_bitmaps()
        })();
        if let Err(e) = saved {
            self.disk_state.store(DISK_DISKLESS, Ordering::SeqCst);
            self.end_pull(&pull);
            return Err(format!("the disk still fails ({e}): it stays detached"));
        }
        drop(all);
        self.event(
            "attached",
            None,
            format!(
                "{} on {}: disk attached to the primary, inconsistent until it is filled from {source_name}",
                self.cfg.resource, self.cfg.node
            ),
        );
        self.event(
            "resync-started",
            Some(&source_name),
            format!(
                "full resync from {source_name} started: {} bytes (this primary fills its disk while it serves)",
                pull.total
            ),
        );
        let node = self.clone();
        let h = thread::Builder::new()
            .name("repl-pull".into())
            .spawn(move || node.run_pull(&pull))
            .map_err(|e| e.to_string())?;
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
        Ok(format!(
            "{} on {}: disk attached; it is filled from {source_name} while this node stays primary (`cairn repl status` shows the progress)",
            self.cfg.resource, self.cfg.node
        ))
    }

    /// The pull is over (done, or its disk detached): its state goes, if it is still
    /// the node's.
    fn end_pull(&self, pull: &Arc<Pull>) {
        let mut cur = self.pull.lock().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, pull)) {
            *cur = None;
            self.pull_on.store(false, Ordering::SeqCst);
            self.meta_gate.masked.store(false, Ordering::SeqCst);
        }
    }

    fn is_current(&self, pull: &Arc<Pull>) -> bool {
        self.pull
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, pull))
    }

    /// The primary stops (`secondary`, shutdown) mid-pull, after its threads ended:
    /// what it holds in memory becomes what its disk says, a just-created, inconsistent
    /// node, which the next primary resyncs in full.
    pub(super) fn abandon_pull(&self) {
        let Some(pull) = self.pull.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        self.pull_on.store(false, Ordering::SeqCst);
        {
            let mut p = self.persisted();
            let given_up = detach::invalidated(&p);
            *p = given_up;
            // The gate saved it masked so far; unmasked now, the same.
            self.meta_gate.masked.store(false, Ordering::SeqCst);
            if !self.is_diskless() {
                if let Err(e) = self.meta.save(&p) {
                    tracing::warn!("{}: {e}", self.cfg.resource);
                }
            }
        }
        self.vx.invalidated.store(true, Ordering::SeqCst);
        self.event(
            "resync-stopped",
            None,
            format!(
                "{} on {}: stopped with {} bytes of the disk not filled: it stays inconsistent, a full resync from the next primary fills it",
                self.cfg.resource,
                self.cfg.node,
                pull.todo.count_bytes(self.data_size)
            ),
        );
    }

    /// The pull thread: every block of `todo`, in disk order, from an up-to-date peer,
    /// four copies in flight (as a resync), in passes: a pass hands the runs out in disk
    /// order; a run whose copy failed (its peer lost) stays in `todo` for the next one.
    fn run_pull(&self, pull: &Arc<Pull>) {
        let told_alone = AtomicBool::new(false);
        let stopping = || {
            self.stop_peers.load(Ordering::SeqCst) || self.is_diskless() || !self.is_current(pull)
        };
        loop {
            if stopping() {
                if self.is_diskless() {
                    // Detached again (the disk failed, or `detach`): detach.rs said so.
                    self.end_pull(pull);
                }
                return;
            }
            if !self.wait_for_lease(|| false) {
                continue;
            }
            if pull.todo.count() == 0 {
                break;
            }
            let cursor = Mutex::new(0u64);
            thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| self.pull_runs(pull, &cursor, &told_alone, &stopping));
                }
            });
        }
        // The last flush or save failed: detached (the fill ends with the disk), or with
        // `pass-on` tried again each second until it works or the fill is stopped.
        while !self.finish_pull(pull) {
            if self.is_diskless() {
                self.end_pull(pull);
                return;
            }
            if stopping() {
                return;
            }
            self.sleep(Duration::from_secs(1));
        }
    }

    /// One of a pass's copiers: the next run of `todo` after `cursor`, until none is
    /// left, the lease is lost or the pull stops.
    fn pull_runs(
        &self,
        pull: &Arc<Pull>,
        cursor: &Mutex<u64>,
        told_alone: &AtomicBool,
        stopping: &dyn Fn() -> bool,
    ) {
        let bm = pull.todo.block();
        let run_bits = ((1u64 << 20) / bm).max(1);
        let mut buf = vec![0u8; usize::try_from(run_bits * bm).expect("1 MiB")];
        loop {
            if stopping() || self.lease_lost() {
                return;
            }
            let run = {
                let mut c = cursor.lock().unwrap_or_else(|p| p.into_inner());
                let r = pull.todo.next_run(*c, run_bits);
                if let Some((_, end)) = r {
                    *c = end;
                }
                r
            };
            let Some((a, b)) = run else { return };
            let off = a * bm;
            let len = (b * bm).min(self.data_size) - off;
            let n = usize::try_from(len).expect("<= 1 MiB");
            // Waits holding no range, so application writes go on.
            pull.pacer.admit(len, &self.app_io, stopping);
            let (peer, link) = loop {
                if stopping() {
                    return;
                }
                if let Some(p) = self.up_to_date_peers().into_iter().next() {
                    break p;
                }
                *pull.source.lock().unwrap_or_else(|p| p.into_inner()) = None;
                if !told_alone.swap(true, Ordering::SeqCst) {
                    self.event(
                        "resync-paused",
                        None,
                        format!(
                            "{}: no up-to-date peer to fill the disk from: {} bytes not filled stay inconsistent (reads of them fail, writes are refused) \
                             until the last one is back; or make this node secondary and promote a peer that has the data",
                            self.cfg.resource,
                            pull.todo.count_bytes(self.data_size)
                        ),
                    );
                }
                self.sleep(Duration::from_millis(200));
            };
            if told_alone.swap(false, Ordering::SeqCst) {
                self.event(
                    "resync-resumed",
                    Some(&peer.cfg.name),
                    format!("filling the disk from {} again", peer.cfg.name),
                );
            }
            {
                // The peer to resume with is needed no more while one is up to date.
                // Checked under its lock: a peer lost since it was picked above may
                // have just been made the one (pull_lost), which must stay.
                let mut resume = pull.resume.lock().unwrap_or_else(|p| p.into_inner());
                if resume.is_some() && !self.up_to_date_peers().is_empty() {
                    *resume = None;
                }
            }
            *pull.source.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer.slot);
            let range = self.locks.lock(off, len);
            if let Err(e) = link.read_at(&mut buf[..n], off) {
                drop(range);
                // The run stays in `todo`: the next pass copies it from another peer.
                // (Not a newer link of the same peer: this one may be gone already.)
                if peer.link().is_some_and(|l| Arc::ptr_eq(&l, &link)) {
                    self.lose(peer, &format!("reading for the pull: {e}"));
                }
                continue;
            }
            if let Err(e) = self.disk.write_at(&buf[..n], off, WriteFlags::NONE) {
                drop(range);
                if !self.local_failed(&e) {
                    // pass-on: the disk keeps failing under the pull; it waits, and
                    // `detach` / `attach` starts it again.
                    tracing::warn!("{}: filling the disk: {e}", self.cfg.resource);
                    self.sleep(Duration::from_secs(1));
                }
                continue;
            }
            pull.todo.clear(a, b);
            drop(range);
            let done = pull.done.fetch_add(len, Ordering::Relaxed);
            pull.speed.note(Instant::now(), done + len);
        }
    }

    /// Every block is filled: flushed, then the bitmaps towards the peers and the real
    /// generations (which the up-to-date peers hold: they adopted each one) are saved
    /// with "consistent". Only then do restarts take the disk for current. False when the
    /// flush or a save failed (the disk detached, or with `pass-on` left as it is).
    fn finish_pull(&self, pull: &Arc<Pull>) -> bool {
        let r = self.disk.flush().and_then(|()| self.write_out_bitmaps());
        if let Err(e) = r {
            if !self.local_failed(&e) {
                tracing::warn!("{}: ending the fill: {e}", self.cfg.resource);
            }
            return false;
        }
        {
            let mut p = self.persisted();
            p.consistent = true;
            self.meta_gate.masked.store(false, Ordering::SeqCst);
            if let Err(e) = self.meta.save(&p) {
                self.meta_gate.masked.store(true, Ordering::SeqCst);
                drop(p);
                if !self.local_failed(&e) {
                    tracing::warn!("{}: ending the fill: {e}", self.cfg.resource);
                }
                return false;
            }
        }
        self.end_pull(pull);
        // The etcd mark the detach put on this node's own disk goes: it holds the data.
        self.clear_own_outdated();
        let source = pull
            .source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|s| self.peers[s].cfg.name.clone());
        self.event(
            "resync-done",
            source.as_deref(),
            format!(
                "resync from {} done: {} bytes in {:.1} s; the primary's disk is UpToDate",
                source.as_deref().unwrap_or("the peers"),
                pull.done.load(Ordering::Relaxed),
                pull.started.elapsed().as_secs_f64()
            ),
        );
        true
    }

    /// The pull's progress, shown on the peer it reads from (as a sync target's).
    pub(super) fn pull_progress(&self, slot: usize) -> Option<Progress> {
        let pull = self.pulling()?;
        if *pull.source.lock().unwrap_or_else(|p| p.into_inner()) != Some(slot) {
            return None;
        }
        let done = pull.done.load(Ordering::Relaxed);
        let left = pull.todo.count_bytes(self.data_size);
        let rate = pull.speed.rate(Instant::now(), done);
        let target = pull.pacer.target(&self.app_io);
        Some(Progress {
            total_bytes: pull.total,
            // Blocks the application wrote whole count as filled.
            done_bytes: pull.total.saturating_sub(left),
            bytes_per_sec: rate,
            eta_secs: (rate > 0).then(|| left / rate),
            full: true,
            target_bytes_per_sec: target.bytes_per_sec,
            throttled: target.throttled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::detach::tests::{established, faulty, kinds, wait, write};
    use super::super::tests::{far_secondary, node_a_towards};
    use super::*;
    use crate::store::Store;
    use cairn_block::testkit::FaultHandle;
    use cairn_block::MemDisk;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// A primary "a" that lost its disk, its peer "far" holding the data.
    struct Diskless {
        node: Arc<Node>,
        vol: Volume,
        far: Arc<Node>,
        far_disk: Arc<dyn BlockDevice>,
        far_stop: cairn_nbd::ShutdownHandle,
        disk: Arc<dyn BlockDevice>,
        h: FaultHandle,
        model: Vec<u8>,
        rng: SmallRng,
    }

    fn random_write(d: &mut Diskless, i: usize, range: std::ops::Range<usize>) {
        // Whole 4 KiB blocks or a few 512-byte sectors inside one (a partial block).
        let (at, len) = if d.rng.gen_bool(0.5) {
            let blocks = d.rng.gen_range(1..=8usize);
            let at = d
                .rng
                .gen_range(range.start / 4096..range.end / 4096 - blocks)
                * 4096;
            (at, blocks * 4096)
        } else {
            let at = d.rng.gen_range(range.start / 4096..range.end / 4096) * 4096
                + d.rng.gen_range(0..4usize) * 512;
            (at, d.rng.gen_range(1..=4usize) * 512)
        };
        let buf: Vec<u8> = (0..len).map(|_| d.rng.gen()).collect();
        write(&d.vol, &buf, at as u64, i).unwrap_or_else(|e| panic!("write {i} at {at}: {e}"));
        d.model[at..at + len].copy_from_slice(&buf);
    }

    fn random_read(d: &mut Diskless, i: usize) {
        let n = d.model.len();
        let blocks = d.rng.gen_range(1..=64usize);
        let at = d.rng.gen_range(0..n / 4096 - blocks) * 4096;
        let mut buf = vec![0u8; blocks * 4096];
        d.vol
            .read_at(&mut buf, at as u64)
            .unwrap_or_else(|e| panic!("read {i} at {at}: {e}"));
        assert!(
            buf == d.model[at..at + buf.len()],
            "read {i} at {at} differs"
        );
    }

    /// In sync, written, then a's disk fails under writes (a goes on diskless), more
    /// writes only the peer gets, and the disk is healed, still holding its old data.
    /// The pull is held at `min` bytes/s while the application does I/O.
    fn diskless_primary(min: u64, label: &str) -> Diskless {
        let seed: u64 = rand::random();
        println!("{label}: seed {seed}");
        let (far, far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, |c| {
            c.resync = RateLimits {
                min_bytes_per_sec: min,
                max_bytes_per_sec: 0,
            };
        });
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        let n = usize::try_from(node.data_size).unwrap();
        let mut model = vec![0u8; n];
        disk.read_at(&mut model, 0).unwrap();
        let mut d = Diskless {
            vol: Volume(node.clone()),
            node,
            far,
            far_disk,
            far_stop,
            disk,
            h,
            model,
            rng: SmallRng::seed_from_u64(seed),
        };
        for i in 0..20 {
            random_write(&mut d, i, 0..n);
        }
        d.h.fail_always();
        for i in 0..40 {
            random_write(&mut d, i, 0..n);
        }
        d.vol.flush().unwrap();
        assert_eq!(d.node.status().disk, "Diskless");
        d.h.heal();
        d
    }

    /// Reads 4 KiB at the start of the volume every 20 ms, holding the pull at its
    /// minimum rate, until dropped.
    struct AppIo(Arc<AtomicBool>, Option<thread::JoinHandle<()>>);

    fn app_io(vol: &Volume) -> AppIo {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, v) = (stop.clone(), vol.clone());
        let h = thread::spawn(move || {
            let mut b = [0u8; 4096];
            while !s.load(Ordering::SeqCst) {
                let _ = v.read_at(&mut b, 0);
                thread::sleep(Duration::from_millis(20));
            }
        });
        AppIo(stop, Some(h))
    }

    impl Drop for AppIo {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            if let Some(h) = self.1.take() {
                let _ = h.join();
            }
        }
    }

    fn on_disk(disk: &Arc<dyn BlockDevice>) -> Persisted {
        Store::open(disk.clone()).unwrap().load().unwrap()
    }

    fn pulled(node: &Node) -> u64 {
        node.status().peers[0]
            .resync
            .as_ref()
            .map_or(0, |r| r.done_bytes)
    }

    /// The whole story: attach on the diskless primary, reads and writes (whole and
    /// partial blocks) checked against a model while the disk is filled, then
    /// UpToDate with every acknowledged write on the local disk, served from it alone
    /// once the peer is gone.
    #[test]
    fn a_diskless_primary_takes_its_disk_back_and_fills_it_while_serving() {
        let mut d = diskless_primary(4 << 20, "fill while serving");
        let n = d.model.len();
        let m = d.node.attach_disk(None).unwrap();
        assert!(m.contains("filled from far"), "{m}");
        let s = d.node.status();
        assert_eq!(s.disk, "Inconsistent", "{s:?}");
        assert_eq!(s.peers[0].replication, Repl::SyncTarget, "{s:?}");
        assert!(s.peers[0].resync.as_ref().is_some_and(|r| r.full), "{s:?}");
        let k = kinds(&d.node);
        assert!(
            k.contains(&"attached".into()) && k.contains(&"resync-started".into()),
            "{k:?}"
        );
        // Until the end, the disk's metadata says it holds nothing.
        let p = on_disk(&d.disk);
        assert!(!p.consistent && p.current == JUST_CREATED, "{p:?}");
        // The end of the disk is filled last: writes there (a partial block too) come
        // before the pull reaches them.
        let end = n - 8192;
        write(&d.vol, &[0xa1; 4096], end as u64, 0).unwrap();
        d.model[end..end + 4096].fill(0xa1);
        write(&d.vol, &[0xa2; 1024], (end + 4096 + 512) as u64, 1).unwrap();
        d.model[end + 4096 + 512..end + 4096 + 1536].fill(0xa2);
        let mut i = 0;
        while d.node.status().disk != "UpToDate" {
            assert!(i < 100_000, "the pull never ended");
            if d.rng.gen_bool(0.2) {
                random_write(&mut d, i, 0..n);
            } else {
                random_read(&mut d, i);
            }
            i += 1;
        }
        println!("{i} requests during the pull");
        assert!(kinds(&d.node).contains(&"resync-done".into()));
        let s = d.node.status();
        assert_eq!(s.peers[0].replication, Repl::Established, "{s:?}");
        assert!(s.peers[0].resync.is_none(), "{s:?}");
        // The local disk itself holds every acknowledged write; so does the peer.
        let mut all = vec![0u8; n];
        d.disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the filled disk differs from the model");
        d.far_disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the peer differs from the model");
        // Its metadata holds the peer's generation now, consistent.
        let p = on_disk(&d.disk);
        assert!(p.consistent, "{p:?}");
        assert_eq!(p.current, d.far.persisted().current);
        // The peer goes away: everything is served from the local disk.
        d.far_stop.shutdown();
        d.node.set_connect(None, false, false).unwrap();
        d.vol.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the primary alone differs from the model");
        write(&d.vol, &[0x77; 4096], 0, 0).unwrap();
        d.node.demote().unwrap();
    }

    /// Writers hammer the blocks the pull is copying: the copy of a range never lands
    /// over a write to it (the range lock), so the filled disk holds the last writes.
    #[test]
    fn a_write_during_the_pull_is_never_overwritten_by_it() {
        let d = diskless_primary(2 << 20, "writes under the pull");
        const SPAN: usize = 3 << 20;
        let model = Arc::new(Mutex::new(d.model.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        // Application I/O from the start holds the pull at its minimum: an idle one
        // fills the 16 MiB before the writers begin.
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        let pull = d.node.pulling().unwrap();
        let writers: Vec<_> = (0..4usize)
            .map(|t| {
                let (vol, model, stop) = (d.vol.clone(), model.clone(), stop.clone());
                let pull = pull.clone();
                thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(t as u64);
                    let mut i = 0u8;
                    while !stop.load(Ordering::SeqCst) {
                        // Near the first block not filled yet: the run the pull copies
                        // now (or next). A block behind it is never written again, so
                        // a stale copy there would stay.
                        let Some((first, _)) = pull.todo.next_run(0, 1) else {
                            break;
                        };
                        // Thread t owns the blocks b with b % 4 == t: no two threads
                        // write one block, so the model knows the last write of each.
                        let b = usize::try_from(first).unwrap() / 4 * 4
                            + rng.gen_range(0..64usize) * 4
                            + t;
                        if b * 4096 + 4096 > SPAN {
                            thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        let (at, len) = if rng.gen_bool(0.5) {
                            (b * 4096, 4096)
                        } else {
                            (b * 4096 + rng.gen_range(0..7usize) * 512, 1024)
                        };
                        i = i.wrapping_add(1);
                        let buf = vec![i; len];
                        vol.write_at(&buf, at as u64, WriteFlags::NONE).unwrap();
                        model.lock().unwrap()[at..at + len].copy_from_slice(&buf);
                    }
                })
            })
            .collect();
        wait("the pull past the written span", || {
            pulled(&d.node) > (SPAN as u64) + (1 << 20) || d.node.status().disk == "UpToDate"
        });
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.join().unwrap();
        }
        drop(io);
        wait("the end of the pull", || d.node.status().disk == "UpToDate");
        let model = model.lock().unwrap();
        let mut all = vec![0u8; model.len()];
        d.disk.read_at(&mut all, 0).unwrap();
        let first = all.iter().zip(model.iter()).position(|(a, b)| a != b);
        assert!(first.is_none(), "the filled disk differs at {first:?}");
        d.node.demote().unwrap();
    }

    /// What a crash mid-pull leaves: metadata that says just created and inconsistent,
    /// a node that is not promotable and that its peer resyncs in full. A stop mid-pull
    /// leaves the same.
    #[test]
    fn a_crash_mid_pull_leaves_the_disk_inconsistent() {
        let d = diskless_primary(1 << 20, "crash mid-pull");
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        wait("some of the pull", || pulled(&d.node) >= 1 << 20);
        // The application writes meanwhile (the activity log, the bitmaps are saved).
        write(&d.vol, &[5; 8192], 1 << 20, 0).unwrap();
        d.vol.flush().unwrap();
        // The disk as a crash now leaves it.
        let size = d.disk.geometry().size;
        let mut img = vec![0u8; usize::try_from(size).unwrap()];
        d.disk.read_at(&mut img, 0).unwrap();
        let crashed: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(size));
        crashed.write_at(&img, 0, WriteFlags::NONE).unwrap();
        let p = on_disk(&crashed);
        assert!(!p.consistent && p.current == JUST_CREATED, "{p:?}");
        let back = Node::open(
            NodeConfig::for_tests("home", "a", "far"),
            crashed.clone(),
            Box::new(Store::open(crashed.clone()).unwrap()),
        )
        .unwrap();
        assert_eq!(back.status().disk, "Inconsistent");
        let e = back.promote(false).unwrap_err();
        assert!(e.contains("inconsistent"), "{e}");
        let (decision, rule) = gen::decide(
            &d.far.view(&d.far.peers[0]),
            &back.view(&back.peers[0]),
            gen::Tie::MeSource,
        );
        assert_eq!(decision, Decision::SourceFull, "{rule:?}");
        // A clean stop mid-pull leaves the same, in memory too.
        drop(io);
        d.node.demote().unwrap();
        let p = on_disk(&d.disk);
        assert!(!p.consistent && p.current == JUST_CREATED, "{p:?}");
        assert_eq!(d.node.status().disk, "Inconsistent");
        assert!(kinds(&d.node).contains(&"resync-stopped".into()));
        d.far_stop.shutdown();
    }

    /// The peer is lost mid-pull: the pull stops, the primary stays primary with its
    /// disk inconsistent; filled ranges are read locally, the others fail, writes and
    /// flushes are refused.
    fn peer_lost_mid_pull(label: &str) -> Diskless {
        let d = diskless_primary(1 << 20, label);
        let n = d.model.len();
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        wait("some of the pull", || pulled(&d.node) >= 1 << 20);
        d.node.set_connect(None, false, false).unwrap();
        wait("the pause", || {
            kinds(&d.node).contains(&"resync-paused".into())
        });
        drop(io);
        let s = d.node.status();
        assert_eq!(s.role, Role::Primary);
        assert_eq!(s.disk, "Inconsistent", "{s:?}");
        let mut b = vec![0u8; 4096];
        d.vol.read_at(&mut b, 4096).unwrap();
        assert!(b == d.model[4096..8192], "a filled block read wrong");
        let e = d.vol.read_at(&mut b, (n - 4096) as u64).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let e = d
            .vol
            .write_at(&[1; 4096], 8192, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(d.vol.flush().is_err());
        d
    }

    /// ... and the operator fails over: this node steps down, the peer (with every
    /// acknowledged write) is promoted and finds this node in need of a full resync.
    #[test]
    fn a_peer_lost_mid_pull_stops_it_and_the_peer_can_take_over() {
        let d = peer_lost_mid_pull("peer lost, failover");
        d.node.demote().unwrap();
        d.far.promote(false).unwrap();
        let (decision, rule) = gen::decide(
            &d.far.view(&d.far.peers[0]),
            &d.node.view(&d.node.peers[0]),
            gen::Tie::MeSource,
        );
        assert_eq!(decision, Decision::SourceFull, "{rule:?}");
        let mut all = vec![0u8; d.model.len()];
        Volume(d.far.clone()).read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the new primary lacks a write");
        d.far.demote().unwrap();
        d.far_stop.shutdown();
    }

    /// ... or the peer comes back: resynced from the primary's bitmap (nothing of the
    /// blocks not filled here), and the pull goes on to the end.
    #[test]
    fn a_peer_lost_mid_pull_comes_back_and_the_pull_goes_on() {
        let mut d = peer_lost_mid_pull("peer lost, back");
        let n = d.model.len();
        // A write refused while the peer was away that reached the local disk all the
        // same, on blocks not filled yet: marked in the peer's bitmap, never
        // acknowledged. The peer's data of those blocks stays (the pull copies it).
        let at = (n - (64 << 10)) as u64;
        d.disk
            .write_at(&[0xee; 64 << 10], at, WriteFlags::NONE)
            .unwrap();
        d.node.peers[0].bitmap.set_bytes(at, 64 << 10);
        d.node.set_connect(None, true, false).unwrap();
        wait("the pull resumed", || {
            kinds(&d.node).contains(&"resync-resumed".into())
        });
        for i in 0..20 {
            random_write(&mut d, i, 0..n);
        }
        wait("the end of the pull", || d.node.status().disk == "UpToDate");
        let mut all = vec![0u8; n];
        d.disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the filled disk differs from the model");
        d.far_disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the peer differs from the model");
        assert_eq!(on_disk(&d.disk).current, d.far.persisted().current);
        d.node.demote().unwrap();
        d.far_stop.shutdown();
    }

    /// The disk fails again mid-pull: detached again, the primary serves through its
    /// peer; healed and attached once more, it is filled to the end.
    #[test]
    fn the_disk_failing_mid_pull_detaches_it_again() {
        let mut d = diskless_primary(1 << 20, "disk fails mid-pull");
        let n = d.model.len();
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        wait("some of the pull", || pulled(&d.node) >= 1 << 20);
        d.h.fail_always();
        for i in 0..10 {
            random_write(&mut d, i, 0..n);
        }
        assert_eq!(d.node.status().disk, "Diskless");
        let mut all = vec![0u8; n];
        d.vol.read_at(&mut all, 0).unwrap();
        assert!(
            all == d.model,
            "the diskless primary differs from the model"
        );
        drop(io);
        d.h.heal();
        d.node.attach_disk(None).unwrap();
        wait("the second pull", || d.node.status().disk == "UpToDate");
        d.disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the filled disk differs from the model");
        d.node.demote().unwrap();
        d.far_stop.shutdown();
    }

    /// While a fill runs, a resync from this node sends only what the disk holds: the
    /// blocks filled, and those the application wrote whole, not the others.
    #[test]
    fn a_resync_during_a_fill_sends_only_the_filled_blocks() {
        let d = diskless_primary(1 << 20, "filled parts");
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        wait("some of the pull", || pulled(&d.node) >= 1 << 20);
        let bits = d.node.data_size / 4096;
        let far = bits - 2;
        d.vol
            .write_at(&[9u8; 4096], far * 4096, WriteFlags::NONE)
            .unwrap();
        let pull = d.node.pulling().unwrap();
        // As a resync's copier: under the range lock, so the fill stands still.
        let all = d.node.locks.lock(0, d.node.data_size);
        let parts = d.node.pull_filled_parts(0, bits);
        for bit in 0..bits {
            let inside = parts.iter().any(|&(x, y)| (x..y).contains(&bit));
            assert_eq!(inside, !pull.todo.get(bit), "bit {bit}: {parts:?}");
        }
        drop(all);
        assert!(parts.iter().any(|&(x, y)| x <= far && far < y), "{parts:?}");
        assert_eq!(parts[0].0, 0, "the filled start: {parts:?}");
        drop(io);
        wait("the end of the pull", || d.node.status().disk == "UpToDate");
        assert_eq!(d.node.pull_filled_parts(3, 7), vec![(3, 7)]);
        d.node.demote().unwrap();
        d.far_stop.shutdown();
    }

    /// Every block copied, the flush that ends the fill fails: the disk detaches and the
    /// fill ends with it (no fill left behind that would refuse every peer), and a
    /// second attach of the healed disk fills it to the end.
    #[test]
    fn the_fills_last_flush_failing_detaches_and_ends_it() {
        let d = diskless_primary(1 << 20, "the last flush fails");
        let n = d.model.len();
        let io = app_io(&d.vol);
        d.node.attach_disk(None).unwrap();
        wait("some of the pull", || pulled(&d.node) >= 1 << 20);
        d.h.fail_after(cairn_block::testkit::Op::Flush, 0);
        drop(io);
        wait("the disk detached at the end", || {
            d.node.status().disk == "Diskless"
        });
        wait("the fill ended with it", || d.node.pulling().is_none());
        d.h.heal();
        d.node.attach_disk(None).unwrap();
        wait("the second pull", || d.node.status().disk == "UpToDate");
        let mut all = vec![0u8; n];
        d.disk.read_at(&mut all, 0).unwrap();
        assert!(all == d.model, "the filled disk differs from the model");
        d.node.demote().unwrap();
        d.far_stop.shutdown();
    }
}
