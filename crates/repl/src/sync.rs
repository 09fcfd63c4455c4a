//! A primary's thread per peer: handshake, the sync decision, the data connection, and
//! the resync of what the peer's bitmap marks (in disk order, four copies in flight,
//! paced by the rate controller of rate.rs: `--resync-rate` while the application is
//! idle, `--resync-min-rate` while it does I/O). A child of node.rs, so it sees the
//! node's state.

use super::*;

/// How often a primary sends a read over a quiet data connection to learn that the peer
/// still answers (DRBD's `ping-int`, 10 s by default there too).
pub(super) const PING_INTERVAL: Duration = Duration::from_secs(10);

impl Node {
    pub(super) fn run_peer(self: Arc<Self>, peer: &Arc<Peer>) {
        let mut backoff = Duration::from_millis(500);
        let mut last_out = Instant::now();
        let mut last_ping = Instant::now();
        while !self.stop_peers.load(Ordering::SeqCst) {
            if !self.wait_for_lease(|| false) {
                continue;
            }
            let want = peer.state().want;
            // A diskless primary has nothing to resync a peer from: it connects only a
            // peer with nothing marked for it (connect_peer refuses one that needs a
            // copy after the handshake).
            if self.is_diskless() && peer.link().is_none() && peer.bitmap.count() > 0 {
                peer.state().last_error = Some(format!(
                    "this node is diskless: it cannot resync a peer ({} bytes out of sync)",
                    peer.bitmap.count_bytes(self.data_size)
                ));
                self.sleep(Duration::from_millis(200));
            } else if !self.pull_may_connect(peer) && peer.link().is_none() {
                // Nor while its disk is being filled: that disk is no copy to resync
                // from yet (but the pull's last source, back, is taken: pull.rs).
                peer.state().last_error = Some(
                    "this node's disk is being filled from a peer: it resyncs no peer until that is done".into(),
                );
                self.sleep(Duration::from_millis(200));
            } else if want && peer.link().is_none() && peer.state().conn != Conn::StandAlone {
                match self.connect_peer(peer) {
                    Ok(()) => backoff = Duration::from_millis(500),
                    Err(e) => {
                        peer.state().last_error = Some(e.clone());
                        tracing::debug!("{}: {}: {e}", self.cfg.resource, peer.cfg.name);
                        self.sleep(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            } else {
                self.sleep(Duration::from_millis(200));
            }
            if let Some(link) = peer.link() {
                self.check_link(peer, &link, &mut last_ping);
            }
            if peer.link().is_some() {
                self.verify_after_failover(peer);
            }
            if last_out.elapsed() > Duration::from_secs(5) {
                let _ = self.write_out_bitmaps();
                last_out = Instant::now();
            }
        }
    }

    /// DRBD's ping: a primary learns within [`PING_INTERVAL`] (and a peer timeout) that
    /// a peer's data connection is gone (the peer killed or partitioned away, or its
    /// export closed by `invalidate`), not only at its next write: an idle primary's
    /// `status` tells the truth, and the reconnect (a full sync after an invalidation)
    /// starts by itself. What the next write would do happens now: the peer is lost.
    fn check_link(&self, peer: &Arc<Peer>, link: &Arc<Client>, last_ping: &mut Instant) {
        if last_ping.elapsed() >= PING_INTERVAL {
            *last_ping = Instant::now();
            // The answer does not matter (a peer may refuse a read); a connection that
            // gets none within the peer timeout is broken, which the look below sees.
            let mut probe = [0u8; 4096];
            let _ = link.read_at(&mut probe, 0);
        }
        if let Some(why) = link.broken() {
            self.lose(peer, &format!("the data connection broke: {why}"));
        }
    }

    /// After a promotion that followed the loss of the old primary, a peer that was that
    /// primary's secondary too is verified once it is connected, and what differs is
    /// resynced (`verify --resync`): the old primary's last writes, unacknowledged, may
    /// have reached this node and not the peer, or the peer and not this node, and the
    /// generations cannot tell (both still hold the same one). Nothing is resynced
    /// when the two hold the same data.
    fn verify_after_failover(self: &Arc<Self>, peer: &Arc<Peer>) {
        let Some(old) = peer.state().verify_after_failover.clone() else {
            return;
        };
        // The admin lock, without waiting on it: `secondary` holds it while it joins
        // this thread.
        let admin = loop {
            if self.stop_peers.load(Ordering::SeqCst) {
                return;
            }
            match self.admin.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    thread::sleep(Duration::from_millis(50))
                }
            }
        };
        if self.stop_peers.load(Ordering::SeqCst) {
            return;
        }
        match self.verify_admin(Some(&peer.cfg.name), true, Some(&old)) {
            Ok(_) => {
                self.event(
                    "verify-after-failover",
                    Some(&peer.cfg.name),
                    format!(
                        "{} was {old}'s secondary too: verifying it, to resync what {old} had in flight to only one of us",
                        peer.cfg.name
                    ),
                );
            }
            // Not established yet (resyncing), or a verify already runs: tried again
            // on the next round of this loop.
            Err(e) => tracing::debug!(
                "{}: verify of {} after the failover not started yet: {e}",
                self.cfg.resource,
                peer.cfg.name
            ),
        }
        drop(admin);
    }

    /// While the primary lease is lost (no keepalive got through in time): says so
    /// once, then waits, holding nothing and waking five times a second, until the lease
    /// is valid again (a late keepalive got through before etcd's TTL ran out): true; or
    /// until the peer threads stop (the node is made secondary) or `give_up`: false. A
    /// primary without its lease neither connects nor copies: another node may be
    /// primary now.
    pub(super) fn wait_for_lease(&self, give_up: impl Fn() -> bool) -> bool {
        if !self.lease_lost() {
            return true;
        }
        if !self.lease_told.swap(true, Ordering::SeqCst) {
            self.event(
                "lease-lost",
                None,
                format!(
                    "{}: the primary lease in etcd is lost or expired: I/O is {}; {}",
                    self.cfg.resource,
                    if self.cfg.quorum.as_ref().map(|q| q.on_loss) == Some(OnLoss::Freeze) {
                        "frozen"
                    } else {
                        "refused"
                    },
                    if self.cfg.quorum.as_ref().is_some_and(|q| q.auto_failover) {
                        "this node becomes secondary by itself once etcd shows another primary"
                    } else {
                        "make this node secondary"
                    }
                ),
            );
        }
        loop {
            if self.stop_peers.load(Ordering::SeqCst) || give_up() {
                return false;
            }
            self.sleep(Duration::from_millis(200));
            if !self.lease_lost() {
                // A keepalive got through after all: etcd still held the lease. The
                // first thread to see it says so, once.
                if self.lease_told.swap(false, Ordering::SeqCst) {
                    self.event(
                        "lease-renewed",
                        None,
                        format!(
                            "{}: the primary lease in etcd is held again: I/O goes on",
                            self.cfg.resource
                        ),
                    );
                }
                return true;
            }
        }
    }

    pub(super) fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end && !self.stop_peers.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20).min(d));
        }
    }

    fn refuse(&self, peer: &Peer, kind: &'static str, repl: Repl, msg: String) -> String {
        peer.set(Conn::StandAlone, repl);
        peer.state().want = false;
        self.event(kind, Some(&peer.cfg.name), msg.clone());
        msg
    }

    /// Handshake, decision, data connection, resync.
    fn connect_peer(&self, peer: &Arc<Peer>) -> std::result::Result<(), String> {
        let w = self.hello(peer)?;
        let me = self.view(peer);
        let (decision, rule) = gen::decide(&me, &w.view, self.tie(peer));
        tracing::info!(
            "{}: {}: decision {decision:?} ({rule:?})",
            self.cfg.resource,
            peer.cfg.name
        );
        if w.view.primary
            && self
                .lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
        {
            // This node holds the etcd lease, so the peer's lease ran out: a stale
            // primary, frozen, fenced by the epoch. Wait for it to be made secondary.
            return Err(format!(
                "peer {} still says primary (its etcd lease is gone); waiting for it to be made secondary",
                peer.cfg.name
            ));
        }
        let mine = peer.bitmap.count();
        if w.view.primary {
            return Err(self.refuse(peer, "split-brain", Repl::SplitBrain, format!(
                "peer {} is primary too: two primaries (split brain): this node changed {} KiB, the peer {} KiB since they parted; make one secondary, then `cairn repl connect --discard-my-data` on it",
                peer.cfg.name,
                mine * self.meta.bm_block() / 1024,
                w.changes * self.meta.bm_block() / 1024
            )));
        }
        // Blocks the peer wrote while it was primary without this node, in the generation
        // both still hold: writes it never acknowledged (it lost its lease first, so it
        // took no new generation). This node's data wins; they are copied over.
        let theirs = w.changes;
        let full = match decision {
            Decision::InSync | Decision::SourceBitmap => false,
            Decision::SourceFull => true,
            Decision::TargetBitmap | Decision::TargetFull => {
                return Err(self.refuse(peer, "refused", Repl::Off, format!(
                    "peer {} has newer data than this primary ({rule:?}); refusing to overwrite it: make this node secondary and promote {}",
                    peer.cfg.name, peer.cfg.name
                )))
            }
            Decision::Unrelated => {
                return Err(self.refuse(peer, "refused", Repl::Off, format!(
                    "peer {} holds unrelated data (no common generation); refusing to connect", peer.cfg.name
                )))
            }
            Decision::SplitBrain { full } => {
                let ok = w.discard_my_data
                    || match self.cfg.split_brain {
                        SplitBrainPolicy::Disconnect => false,
                        SplitBrainPolicy::DiscardZeroChanges => w.changes == 0,
                        SplitBrainPolicy::DiscardLeastChanges => w.changes <= mine,
                        SplitBrainPolicy::DiscardSecondary => !w.view.primary,
                    };
                let msg = format!(
                    "split brain with {}: this node changed {} KiB, the peer {} KiB since they parted",
                    peer.cfg.name,
                    mine * self.meta.bm_block() / 1024,
                    w.changes * self.meta.bm_block() / 1024
                );
                if !ok {
                    return Err(self.refuse(peer, "split-brain", Repl::SplitBrain, format!(
                        "{msg}; staying disconnected (resolve with `cairn repl connect --discard-my-data` on the node whose changes are to go, or --split-brain)"
                    )));
                }
                self.event("split-brain", Some(&peer.cfg.name), format!("{msg}; resolved: the peer's changes are discarded"));
                full
            }
        };
        if self.pulling().is_some() {
            if full {
                return Err(format!(
                    "peer {} needs a full resync, and this node's disk is still being filled: it is connected once that is done",
                    peer.cfg.name
                ));
            }
            if !self.pull_may_connect(peer) {
                return Err(format!(
                    "this node's disk is being filled from a peer: {} is connected once that is done",
                    peer.cfg.name
                ));
            }
        }
        if self.is_diskless() && (full || mine > 0 || theirs > 0) {
            return Err(format!(
                "this node is diskless: {} needs a resync ({}), and this node has no data to copy",
                peer.cfg.name,
                if full {
                    "a full one".to_string()
                } else {
                    format!("{mine} blocks marked here, {theirs} there")
                }
            ));
        }
        let resync = full || decision != Decision::InSync || mine > 0 || theirs > 0;
        if resync && !full && (decision != Decision::InSync || theirs > 0) {
            self.fetch_peer_bitmap(peer)?;
            if self.is_diskless() && peer.bitmap.count() > 0 {
                return Err(format!(
                    "this node is diskless: {} needs a resync of its marked blocks, and this node has no data to copy",
                    peer.cfg.name
                ));
            }
        }
        // The pull's last source, back: what it holds of the blocks not filled here is
        // what the pull copies; only the rest of its bitmap is resynced from here.
        self.pull_resume_bits(peer);
        if full {
            peer.bitmap.set_all();
        }
        if resync {
            peer.request(
                &Request::SyncStart {
                    node: self.cfg.node.clone(),
                    full,
                },
                self.cfg.peer_timeout,
            )?;
        }
        // Every data connection takes a new epoch, above any the peer admitted (a node
        // that was primary since, after a split brain, has a higher one). The peer's
        // gate then refuses whatever an earlier connection of this node still has queued
        // there, so a write that timed out cannot land after the resync wrote newer
        // data over the same blocks.
        let epoch = {
            let mut p = self.persisted();
            let top = p.epoch.max(w.epoch);
            p.epoch = top
                .checked_add(1)
                .ok_or_else(|| crate::node::epoch_exhausted(top))?;
            p.fence = Some(self.token(p.epoch));
            // A diskless node keeps it in memory: its metadata is given up.
            if !self.is_diskless() {
                self.meta.save(&p).map_err(|e| e.to_string())?;
            }
            p.epoch
        };
        let mut opts = peer.cfg.opts.clone();
        opts.fence = Some(self.token(epoch));
        opts.timeout = Some(self.cfg.peer_timeout);
        opts.meta_base_allocation = false;
        // Two connections: the peer answers cheap writes on each connection's reader
        // (no worker hand-off), and fewer connections carry more requests per wake-up.
        // bench/repl.sh, 4k QD32, quiet machine, one binary: 2 connections 49.5k and
        // 58.0k IOPS, 4: 44.9k, 8: 35.4k and 42.8k (8 was best while every request went
        // through the peer's worker pool). A peer on a disk with latency still runs its
        // requests on its pool, up to 32 per connection.
        opts.connections = 2;
        let client = Client::connect(&opts)
            .map_err(|e| format!("data connection to {}: {e}", peer.cfg.name))?;
        if client.size() < self.data_size {
            return Err(format!(
                "peer {}'s data area is {} bytes, smaller than this node's {}",
                peer.cfg.name,
                client.size(),
                self.data_size
            ));
        }
        *peer.link.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(client));
        {
            let mut s = peer.state();
            s.last_error = None;
            s.discard_my_data = false;
        }
        // Writes that found no link marked their blocks before the link was set
        // (Peer::link_or_mark), some perhaps still writing here: a peer found in sync
        // at the handshake needs a resync of those blocks all the same.
        let late = !resync && peer.bitmap.count() > 0;
        if late && self.is_diskless() {
            // Marked while it connected (a write lost with it, say): a diskless node has
            // nothing to copy, and a resync would read through the gate and take that
            // refusal for a failing disk. Dropped, as the handshake drops such a peer.
            let e = format!(
                "this node is diskless: blocks were marked for {} while it connected, and it has no data to copy",
                peer.cfg.name
            );
            self.lose(peer, &e);
            return Err(e);
        }
        if late {
            if let Err(e) = peer.request(
                &Request::SyncStart {
                    node: self.cfg.node.clone(),
                    full: false,
                },
                self.cfg.peer_timeout,
            ) {
                self.lose(peer, &format!("resync: {e}"));
                return Err(e);
            }
        }
        let resync = resync || late;
        if !resync {
            self.clear_outdated(peer);
            peer.set(Conn::Connected, Repl::Established);
            self.event(
                "connected",
                Some(&peer.cfg.name),
                format!("connected to {} (in sync)", peer.cfg.name),
            );
            return Ok(());
        }
        peer.set(Conn::Connected, Repl::SyncSource);
        self.event(
            "resync-started",
            Some(&peer.cfg.name),
            format!(
                "{} resync to {} started: {} bytes",
                if full { "full" } else { "bitmap" },
                peer.cfg.name,
                peer.bitmap.count_bytes(self.data_size)
            ),
        );
        self.resync(peer, full)
    }

    /// The peers other than `target` that hold this node's data, as far as this node
    /// knows: connected and in sync (`Established`), nothing marked in their bitmap and
    /// no bitmap base (no write went without them since they were last in sync), no
    /// verify running against them and none owed after a failover (an old primary's last
    /// writes may differ there: owed until that verify has compared every block). This node would
    /// resync nothing to them; a resync target that now holds this node's data empties
    /// its bitmap towards them (secondary.rs `sync_done`).
    fn peers_holding_my_data(&self, target: &Peer) -> Vec<String> {
        let bases: Vec<u64> = self
            .persisted()
            .peers
            .iter()
            .map(|s| s.bitmap_uuid)
            .collect();
        self.peers
            .iter()
            .filter(|o| {
                if o.slot == target.slot || o.link().is_none() {
                    return false;
                }
                let s = o.state();
                s.conn == Conn::Connected
                    && s.repl == Repl::Established
                    && s.verify_after_failover.is_none()
                    && !self.vx.running(&o.cfg.name)
                    && bases[o.slot] == 0
                    && o.bitmap.count() == 0
            })
            .map(|o| o.cfg.name.clone())
            .collect()
    }

    fn fetch_peer_bitmap(&self, peer: &Peer) -> std::result::Result<(), String> {
        let total = peer.bitmap.word_count();
        let mut first = 0;
        while first < total {
            let n = (total - first).min(wire::BITMAP_WORDS_PER_REPLY);
            let data = peer.request(
                &Request::Bitmap {
                    node: self.cfg.node.clone(),
                    first_word: first,
                    words: n,
                },
                self.cfg.peer_timeout,
            )?;
            if data.len() != n * 8 {
                return Err(format!(
                    "{}: bitmap answer of {} bytes, expected {}",
                    peer.cfg.name,
                    data.len(),
                    n * 8
                ));
            }
            let words: Vec<u64> = data
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            peer.bitmap.merge_words(first, &words);
            first += n;
        }
        Ok(())
    }

    /// Copies every block the peer's bitmap marks, in disk order, several at once; then
    /// tells the peer it holds this node's generation.
    fn resync(&self, peer: &Arc<Peer>, full: bool) -> std::result::Result<(), String> {
        // Weak: the resync does not keep a dropped connection open. (It also keeps the
        // allocation, so no later link can have its address.)
        let started_on = Arc::downgrade(&peer.link().ok_or("the peer is gone")?);
        let bm = self.meta.bm_block();
        let run_bits = ((1u64 << 20) / bm).max(1);
        let total = peer.bitmap.count_bytes(self.data_size);
        peer.resync_done.store(0, Ordering::Relaxed);
        let failed: Mutex<Option<ResyncStop>> = Mutex::new(None);
        let pacer = Arc::new(Pacer::new(self.cfg.resync, &self.app_io));
        let speed = Arc::new(Speed::new(Instant::now()));
        peer.state().resync = Some(ResyncCounters {
            total,
            started: Instant::now(),
            full,
            pacer: pacer.clone(),
            speed: speed.clone(),
            passes: 0,
        });
        let stopping =
            || self.stop_peers.load(Ordering::SeqCst) || self.lease_lost() || failed_now(&failed);
        loop {
            if let Some(r) = peer.state().resync.as_mut() {
                r.passes += 1;
            }
            let cursor = Mutex::new(0u64);
            thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        let mut buf = vec![0u8; usize::try_from(run_bits * bm).expect("1 MiB")];
                        loop {
                            if stopping() {
                                return;
                            }
                            let run = {
                                let mut c = cursor.lock().unwrap_or_else(|p| p.into_inner());
                                let r = peer.bitmap.next_run(*c, run_bits);
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
                            pacer.admit(len, &self.app_io, stopping);
                            if stopping() {
                                return;
                            }
                            // Err((error, the local disk's)).
                            let r = (|| -> std::result::Result<(), (Error, bool)> {
                                let Some(link) = peer.link() else {
                                    return Err((
                                        io_err(ErrorKind::Gone, "the peer is gone"),
                                        false,
                                    ));
                                };
                                let _range = self.locks.lock(off, len);
                                self.disk
                                    .read_at(&mut buf[..n], off)
                                    .map_err(|e| (e, true))?;
                                // While this node's disk is being filled, its blocks not
                                // filled yet hold nothing to send: the peer's own are
                                // what the fill copies here (pull.rs).
                                for (x, y) in self.pull_filled_parts(a, b) {
                                    let lo = usize::try_from(x * bm - off).expect("<= 1 MiB");
                                    let hi = usize::try_from((y * bm).min(self.data_size) - off)
                                        .expect("<= 1 MiB");
                                    link.write_at(&buf[lo..hi], x * bm, WriteFlags::NONE)
                                        .map_err(|e| (e, false))?;
                                }
                                peer.bitmap.clear(a, b);
                                Ok(())
                            })();
                            if let Err((e, local)) = r {
                                // Out of the range lock: a detach asks the peers to
                                // adopt a new generation.
                                let stop = if local && self.local_failed(&e) {
                                    ResyncStop::Detached(format!("reading at {off}: {e}"))
                                } else {
                                    ResyncStop::Failed(e.to_string())
                                };
                                failed
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert(stop);
                                return;
                            }
                            let done = peer.resync_done.fetch_add(len, Ordering::Relaxed);
                            speed.note(Instant::now(), done + len);
                        }
                    });
                }
            });
            match failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
                Some(ResyncStop::Failed(e)) => {
                    self.lose(peer, &format!("resync: {e}"));
                    peer.state().resync = None;
                    return Err(e);
                }
                Some(ResyncStop::Detached(e)) => return Err(self.resync_detached(peer, &e)),
                None => {}
            }
            if self.stop_peers.load(Ordering::SeqCst) {
                peer.state().resync = None;
                return Err("stopped".into());
            }
            if peer.bitmap.count() == 0 {
                break;
            }
            // A lost lease ended the pass (its copies stop at once): wait for the lease
            // rather than begin pass after pass that copies nothing. The link dropped
            // meanwhile (`disconnect`) ends the resync as a failed copy would.
            let link_changed = || {
                !peer
                    .link()
                    .is_some_and(|l| std::ptr::eq(Arc::as_ptr(&l), started_on.as_ptr()))
            };
            if !self.wait_for_lease(link_changed) {
                peer.state().resync = None;
                return Err(if self.stop_peers.load(Ordering::SeqCst) {
                    "stopped".into()
                } else {
                    "the peer is gone".into()
                });
            }
        }
        let link = peer.link().ok_or("the peer is gone")?;
        if let Err(e) = link.flush() {
            self.lose(peer, &e.to_string());
            return Err(e.to_string());
        }
        // The peer now holds this generation: it says so on disk first.
        let gens = {
            let p = self.persisted();
            Generations {
                current: p.current,
                bitmap: p.peers[peer.slot].bitmap_uuid,
                history: p.history,
            }
        };
        peer.request(
            &Request::SyncDone {
                node: self.cfg.node.clone(),
                gens,
                in_sync: self.peers_holding_my_data(peer),
            },
            self.cfg.peer_timeout,
        )?;
        {
            let mut p = self.persisted();
            let mut g = Generations {
                current: p.current,
                bitmap: p.peers[peer.slot].bitmap_uuid,
                history: p.history,
            };
            g.sync_finished_source();
            p.history = g.history;
            p.peers[peer.slot].bitmap_uuid = g.bitmap;
            p.crashed_primary = false;
            if !self.is_diskless() {
                self.meta.save(&p).map_err(|e| e.to_string())?;
            }
        }
        let _ = self.write_out_bitmaps();
        self.clear_outdated(peer);
        let secs = peer
            .state()
            .resync
            .take()
            .map_or(0.0, |r| r.started.elapsed().as_secs_f64());
        peer.set(Conn::Connected, Repl::Established);
        let done = peer.resync_done.load(Ordering::Relaxed);
        self.event(
            "resync-done",
            Some(&peer.cfg.name),
            format!(
                "resync to {} done: {done} bytes in {secs:.1} s",
                peer.cfg.name
            ),
        );
        Ok(())
    }

    /// The resync stopped because this node's disk failed a read and was detached
    /// (`--on-io-error detach`): there is nothing left to copy from. The peer is not
    /// dropped, the fault was not its own: it stays connected and takes the
    /// application's writes, but stays Inconsistent (a resync target whose resync did
    /// not finish) until a node with the data resyncs it; its blocks not yet copied
    /// stay marked in its bitmap.
    fn resync_detached(&self, peer: &Peer, e: &str) -> String {
        let msg = format!(
            "resync to {} stopped: this node's disk failed ({e}) and was detached, so there is nothing to copy from; {} stays connected but Inconsistent until a node with the data resyncs it",
            peer.cfg.name, peer.cfg.name
        );
        {
            let mut s = peer.state();
            s.resync = None;
            s.last_error = Some(msg.clone());
        }
        peer.set(Conn::Connected, Repl::Off);
        self.event("resync-stopped", Some(&peer.cfg.name), msg.clone());
        msg
    }
}

/// Why a resync pass stopped early.
enum ResyncStop {
    /// The peer (or the link to it) failed: it is dropped.
    Failed(String),
    /// The local disk failed and was detached.
    Detached(String),
}

fn failed_now(failed: &Mutex<Option<ResyncStop>>) -> bool {
    failed.lock().unwrap_or_else(|p| p.into_inner()).is_some()
}
