//! A local disk that fails: detach it and go on diskless (DRBD's `on-io-error detach`).
//! A child of node.rs, so it sees the node's state.
//!
//! ```text
//!   local read/write/flush fails ─> local_failed ─ pass-on ─> the error goes on as before
//!   (the application's, or a             └ detach ─> Failed: the metadata on the disk says
//!   resync's or verify's read)                       "inconsistent" (if it still takes a write)
//!                                                    ─> Diskless: Gate refuses the disk and
//!                                                    its metadata from now on
//!   primary, diskless: reads from an up-to-date peer; writes and flushes go to the peers
//!   only and are answered OK only when an up-to-date (Established) peer has them; a new
//!   generation, adopted by the peers in sync, so the old disk can never pass for current;
//!   with no up-to-date peer: the request fails, or (`--on-no-data suspend-io`) waits
//!   for one (wait_for_data) until the node stops being primary;
//!   `attach` (the same disk or a new one) fills it from an up-to-date peer (pull.rs)
//!   secondary, diskless: refuses its primary (the handshake), until `attach` (invalidate:
//!   a full resync from the primary) of the same disk, or of a new one (`--disk`: swapped
//!   in behind the gate)
//! ```

use super::*;

/// The local disk, or the metadata on it, behind the node's disk state: once the disk
/// is detached, nothing reaches it any more (a dying disk can take seconds per request,
/// and a write to it now would only make the metadata lie). `attach --disk` puts a new
/// one in its place, under the write lock while the node is diskless.
#[derive(Debug)]
pub(super) struct Gate<P> {
    pub(super) state: Arc<std::sync::atomic::AtomicU8>,
    pub(super) inner: RwLock<P>,
    /// Metadata only: while a primary fills its disk from a peer (pull.rs), every save
    /// says what an invalidated disk says (just created, inconsistent), whatever the
    /// node holds in memory: a crash mid-way must leave a disk nobody takes for current.
    pub(super) masked: AtomicBool,
}

impl<P> Gate<P> {
    pub(super) fn new(state: Arc<std::sync::atomic::AtomicU8>, inner: P) -> Gate<P> {
        Gate {
            state,
            inner: RwLock::new(inner),
            masked: AtomicBool::new(false),
        }
    }

    fn get(&self) -> std::sync::RwLockReadGuard<'_, P> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn replace(&self, new: P) -> P {
        std::mem::replace(
            &mut *self.inner.write().unwrap_or_else(|p| p.into_inner()),
            new,
        )
    }
}

fn detached_err(what: &str) -> Error {
    io_err(
        ErrorKind::Io,
        format!("{what}: the local disk is detached (it failed an I/O)"),
    )
}

impl<P> Gate<P> {
    /// Data I/O stops as soon as the disk failed.
    fn data_open(&self) -> Result<()> {
        if self.state.load(Ordering::SeqCst) == DISK_ATTACHED {
            Ok(())
        } else {
            Err(detached_err("data"))
        }
    }

    /// Metadata writes stop once detached: the detach itself records "inconsistent"
    /// while the disk is Failed.
    fn meta_open(&self) -> Result<()> {
        if self.state.load(Ordering::SeqCst) == DISK_DISKLESS {
            Err(detached_err("metadata"))
        } else {
            Ok(())
        }
    }
}

/// Every data operation asks the gate first. Its `*_then` forms run here, through the
/// gated synchronous ones, as they did before the gate was a filter: the local disk
/// completes on the calling thread anyway.
impl cairn_block::Filter for Gate<Arc<dyn BlockDevice>> {
    type Inner = Arc<dyn BlockDevice>;
    const SYNCHRONOUS: bool = true;
    fn inner(&self) -> impl std::ops::Deref<Target = Arc<dyn BlockDevice>> + '_ {
        self.get()
    }
    fn admit(&self, _op: cairn_block::IoOp) -> Result<()> {
        self.data_open()
    }
}

cairn_block::filter_device!(Gate<Arc<dyn BlockDevice>>);

impl MetaIo for Gate<Box<dyn MetaIo>> {
    fn data_size(&self) -> u64 {
        self.get().data_size()
    }
    fn bm_block(&self) -> u64 {
        self.get().bm_block()
    }
    fn al_extent(&self) -> u64 {
        self.get().al_extent()
    }
    fn max_peers(&self) -> usize {
        self.get().max_peers()
    }
    fn bind_resource(&self, id: [u8; 16]) -> Result<()> {
        self.get().bind_resource(id)
    }
    fn load(&self) -> Result<Persisted> {
        self.get().load()
    }
    fn save(&self, p: &Persisted) -> Result<()> {
        self.meta_open()?;
        if self.masked.load(Ordering::SeqCst) {
            return self.get().save(&invalidated(p));
        }
        self.get().save(p)
    }
    fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>> {
        self.get().read_bitmap(slot)
    }
    fn write_bitmap_pages(&self, slot: usize, pages: &[(usize, Vec<u64>)]) -> Result<()> {
        self.meta_open()?;
        self.get().write_bitmap_pages(slot, pages)
    }
    fn read_al(&self) -> Result<Vec<u64>> {
        self.get().read_al()
    }
    fn write_al(&self, active: &[u64]) -> Result<()> {
        self.meta_open()?;
        self.get().write_al(active)
    }
}

/// The node holds its metadata gate shared (`meta_gate` swaps inside it).
impl<T: MetaIo + ?Sized> MetaIo for Arc<T> {
    fn data_size(&self) -> u64 {
        (**self).data_size()
    }
    fn bm_block(&self) -> u64 {
        (**self).bm_block()
    }
    fn al_extent(&self) -> u64 {
        (**self).al_extent()
    }
    fn max_peers(&self) -> usize {
        (**self).max_peers()
    }
    fn bind_resource(&self, id: [u8; 16]) -> Result<()> {
        (**self).bind_resource(id)
    }
    fn load(&self) -> Result<Persisted> {
        (**self).load()
    }
    fn save(&self, p: &Persisted) -> Result<()> {
        (**self).save(p)
    }
    fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>> {
        (**self).read_bitmap(slot)
    }
    fn write_bitmap_pages(&self, slot: usize, pages: &[(usize, Vec<u64>)]) -> Result<()> {
        (**self).write_bitmap_pages(slot, pages)
    }
    fn read_al(&self) -> Result<Vec<u64>> {
        (**self).read_al()
    }
    fn write_al(&self, active: &[u64]) -> Result<()> {
        (**self).write_al(active)
    }
}

/// `p` as a disk given up is saved (`invalidate`, a failed disk, a disk being filled):
/// no generation, no bitmap bases, inconsistent. A restart on it gets a full sync.
pub(super) fn invalidated(p: &Persisted) -> Persisted {
    let mut q = p.clone();
    q.current = JUST_CREATED;
    q.history = [0, 0];
    for slot in &mut q.peers {
        slot.bitmap_uuid = 0;
    }
    q.consistent = false;
    q
}

/// A disk given to `attach --disk`, with its metadata.
pub type NewDisk = (Arc<dyn BlockDevice>, Box<dyn MetaIo>);

impl Node {
    /// The disk failed or was detached: nothing goes to it.
    pub(crate) fn is_diskless(&self) -> bool {
        self.disk_state.load(Ordering::SeqCst) != DISK_ATTACHED
    }

    /// The local disk failed `e`. With `--on-io-error detach` it is detached (once, by
    /// whichever request saw it first) and true is returned: the caller goes on as a
    /// diskless node. With `pass-on`, false: the error goes on.
    pub(crate) fn local_failed(&self, e: &Error) -> bool {
        if self.disk_state.load(Ordering::SeqCst) == DISK_DISKLESS {
            return true;
        }
        if self.is_diskless() {
            // Detaching now: answer only once the new generation is in place.
            drop(self.detaching.lock().unwrap_or_else(|p| p.into_inner()));
            return true;
        }
        if self.cfg.on_io_error == OnIoError::PassOn {
            return false;
        }
        self.detach_disk(&format!("the local disk failed: {e}"));
        true
    }

    /// Attached → Failed → Diskless. Returns when the node is diskless and, on a
    /// primary, its data has moved on to a generation the old disk does not hold (the
    /// peers in sync adopted it): a write answered from now on can never be taken for
    /// one the old disk has, whatever comes back with it.
    fn detach_disk(&self, why: &str) {
        let _one = self.detaching.lock().unwrap_or_else(|p| p.into_inner());
        if self
            .disk_state
            .compare_exchange(
                DISK_ATTACHED,
                DISK_FAILED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            return;
        }
        self.event(
            "disk-failed",
            None,
            format!("{} on {}: {why}", self.cfg.resource, self.cfg.node),
        );
        // The disk (if its metadata still takes a write) is given up as `invalidate`
        // does: no generation, inconsistent. A restart with it is resynced in full
        // instead of trusted.
        let on_disk = invalidated(&self.persisted());
        if let Err(e) = self.meta.save(&on_disk) {
            tracing::warn!(
                "{}: cannot mark the failed disk inconsistent in its metadata: {e}",
                self.cfg.resource
            );
        }
        self.disk_state.store(DISK_DISKLESS, Ordering::SeqCst);
        let primary = self.role() == Role::Primary;
        if primary {
            self.new_generation_detached();
            self.mark_self_outdated();
        }
        self.event(
            "detached",
            None,
            if primary {
                format!(
                    "{} on {}: diskless primary: reads and writes go to the up-to-date peers",
                    self.cfg.resource, self.cfg.node
                )
            } else {
                format!(
                    "{} on {}: diskless secondary: the primary goes on without it until `cairn repl attach`",
                    self.cfg.resource, self.cfg.node
                )
            },
        );
    }

    /// A diskless primary's next generation: the peers in sync adopt it, the others
    /// (away, resyncing) keep a bitmap base as when a peer is lost. A disk whose
    /// metadata could not be given up keeps the generation before, an ancestor of the
    /// peers': the handshake must find it behind with no bitmap that knows by how much,
    /// a full sync.
    ///
    /// Two steps, not one: after one, the peers' history would start with the disk's
    /// generation and their bitmap base be empty, which is exactly what a resync
    /// target that missed recording the end of its resync meets (gen.rs,
    /// `MeTargetMissedSyncFinished`): a bitmap resync of nothing. A generation between
    /// the two breaks that match and leaves `MyCurrentInPeerHistory`, a full sync (or,
    /// once further generations pushed it out of the history, unrelated data: refused
    /// until the operator invalidates that disk).
    fn new_generation_detached(&self) {
        let in_sync: Vec<&Arc<Peer>> = self
            .peers
            .iter()
            .filter(|o| o.link().is_some() && o.state().repl == Repl::Established)
            .collect();
        let away: Vec<usize> = self
            .peers
            .iter()
            .filter(|o| !in_sync.iter().any(|i| i.slot == o.slot))
            .map(|o| o.slot)
            .collect();
        {
            let mut p = self.persisted();
            if !away.is_empty() {
                self.rotate(&mut p, &away);
            }
            for _ in 0..if away.is_empty() { 2 } else { 1 } {
                // A base of its own keeps the bitmap bases as they are (none for
                // the peers in sync).
                let mut g = Generations {
                    current: p.current,
                    bitmap: p.current,
                    history: p.history,
                };
                g.new_current(&mut gen::random_ids());
                p.current = g.current;
                p.history = g.history;
            }
            // Not saved: the disk is gone; the peers keep it (Adopt).
        }
        self.announce_current(&in_sync);
    }

    /// With a quorum: this node's own data (the old disk) is marked outdated in etcd,
    /// so that after a restart with it the node cannot take the primary role by itself.
    fn mark_self_outdated(&self) {
        let (Some(q), Some(g)) = (&self.cfg.quorum, self.lease_guard()) else {
            return;
        };
        match self.put_outdated_mark(q, &self.cfg.node, g.id()) {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "{}: the detached disk is not marked outdated: etcd no longer holds this node's lease",
                self.cfg.resource
            ),
            Err(e) => tracing::warn!(
                "{}: cannot mark the detached disk outdated in etcd: {e}",
                self.cfg.resource
            ),
        }
    }

    /// A connected peer in sync with the data (Established), to serve a diskless
    /// primary's reads.
    pub(super) fn up_to_date_peers(&self) -> Vec<(&Arc<Peer>, Arc<Client>)> {
        self.peers
            .iter()
            .filter(|p| p.state().repl == Repl::Established)
            .filter_map(|p| p.link().map(|l| (p, l)))
            .collect()
    }

    /// A primary's read: from the local disk, or, once it failed (and is detached),
    /// from an up-to-date peer; while the disk is being filled (pull.rs), a range not
    /// filled yet is read from an up-to-date peer too. With none connected, the local
    /// error goes on.
    ///
    /// A detached disk is not even tried: the gate's refusal, seen after an `attach`
    /// that came meanwhile, would detach the new disk.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let e = if self.is_diskless() {
            detached_err("data")
        } else if self.pull_covers(offset, buf.len() as u64) {
            io_err(
                ErrorKind::Io,
                "this range of the local disk is not filled from the peer yet",
            )
        } else {
            match self.disk.read_at(buf, offset) {
                Ok(()) => return Ok(()),
                Err(e) if !self.local_failed(&e) => return Err(e),
                Err(e) => e,
            }
        };
        loop {
            for (peer, link) in self.up_to_date_peers() {
                match link.read_at(buf, offset) {
                    Ok(()) => return Ok(()),
                    Err(pe) => self.lose(peer, &pe.to_string()),
                }
            }
            // Held only while diskless (`--on-no-data suspend-io`); a range not filled
            // yet with no up-to-date peer fails at once, as a pull's writes do.
            if !self.is_diskless() || !self.wait_for_data()? {
                break;
            }
        }
        Err(e.context(format!(
            "{}: the local disk is detached or not filled yet, and no up-to-date peer is connected",
            self.cfg.resource
        )))
    }

    /// Whether a request can be served with data: Ok(true) while the disk is attached or
    /// an up-to-date peer is connected. A diskless primary with neither: with
    /// `--on-no-data io-error`, Ok(false) (the request fails as before); with
    /// `suspend-io`, the request waits (holding what its caller holds: a write, its
    /// range) until an up-to-date peer is connected (Ok(true)), or fails once the node
    /// stops being primary (demoted, stepped down by itself, stopping). The lease
    /// freeze's shape (`lease_check`).
    pub(crate) fn wait_for_data(&self) -> Result<bool> {
        if !self.is_diskless() {
            return Ok(true);
        }
        loop {
            if !self.up_to_date_peers().is_empty() {
                if self.no_data_lock().take().is_some() {
                    self.event(
                        "io-resumed",
                        None,
                        format!(
                            "{} on {}: an up-to-date peer is connected: the held requests go on",
                            self.cfg.resource, self.cfg.node
                        ),
                    );
                }
                return Ok(true);
            }
            if self.cfg.on_no_data == OnNoData::IoError {
                return Ok(false);
            }
            if self.halt.load(Ordering::SeqCst)
                || self.stopped.load(Ordering::SeqCst)
                || self.role() != Role::Primary
            {
                let why = self
                    .superseded_by()
                    .unwrap_or_else(|| "it is being made secondary".into());
                if self.no_data_lock().take().is_some() {
                    self.event(
                        "io-failed",
                        None,
                        format!(
                            "{} on {}: the held requests fail: this node is no longer primary ({why})",
                            self.cfg.resource, self.cfg.node
                        ),
                    );
                }
                return Err(io_err(
                    ErrorKind::Shutdown,
                    format!(
                        "{}: this node is diskless, its I/O was suspended for want of an up-to-date peer, and it is no longer primary: {why}",
                        self.cfg.resource
                    ),
                ));
            }
            {
                let mut held = self.no_data_lock();
                if held.is_none() {
                    let why = "this node is diskless and no up-to-date peer is connected: \
                               requests wait for one (--on-no-data suspend-io)"
                        .to_string();
                    *held = Some(why.clone());
                    drop(held);
                    self.event(
                        "io-suspended",
                        None,
                        format!(
                            "{} on {}: I/O suspended: {why}",
                            self.cfg.resource, self.cfg.node
                        ),
                    );
                }
            }
            // Held: writes this thread held back (cairn_nbd::cork) go out first.
            cairn_nbd::cork::release();
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn no_data_lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.no_data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why requests are held now (`status`), if they are.
    pub(super) fn no_data_status(&self) -> Option<String> {
        self.no_data_lock().clone()
    }

    /// A write no replica with the data took (the local disk detached under it, no
    /// up-to-date peer): failed with `e` (answer_write's) as before, or, with `--on-no-data suspend-io`,
    /// held until an up-to-date peer is connected and sent to it; answered once one has
    /// it.
    pub(crate) fn write_when_data_returns(
        &self,
        buf: &[u8],
        offset: u64,
        flags: WriteFlags,
        e: Error,
    ) -> Result<()> {
        let len = buf.len() as u64;
        loop {
            if !self.wait_for_data()? {
                return Err(e);
            }
            let mut took = 0;
            let mut missed = Ok(());
            for (peer, link) in self.up_to_date_peers() {
                match link.write_at(buf, offset, flags) {
                    Ok(()) => {
                        let (a, b) = peer.bitmap.inside(offset, len);
                        peer.bitmap.clear(a, b);
                        took += 1;
                    }
                    Err(pe) => {
                        peer.bitmap.set_bytes(offset, len);
                        self.lose(peer, &pe.to_string());
                        missed = missed.and_then(|()| self.ensure_outdated(peer));
                    }
                }
            }
            if took > 0 {
                return missed;
            }
            // A disk attached meanwhile (being filled, no peer left): wait_for_data no
            // longer waits, and this loop must not spin; nothing holds the write.
            if !self.is_diskless() {
                return Err(e);
            }
        }
    }

    /// A disk for `attach --disk` fits the resource: the same data area and bitmap
    /// geometry as the peers', room for every peer, and metadata of this resource or
    /// of none yet.
    pub(super) fn check_new_disk(
        &self,
        disk: &dyn BlockDevice,
        meta: &dyn MetaIo,
    ) -> std::result::Result<(), String> {
        let old = self.meta_gate.get();
        let same = |what: &str, new: u64, was: u64| {
            if new == was {
                Ok(())
            } else {
                Err(format!(
                    "the new disk's {what} is {new}, the resource's {was}: create-md it with the resource's sizes"
                ))
            }
        };
        same("data size", meta.data_size(), self.data_size)?;
        same("bitmap block", meta.bm_block(), old.bm_block())?;
        same("activity-log extent", meta.al_extent(), old.al_extent())?;
        if meta.max_peers() < self.peers.len() {
            return Err(format!(
                "the new disk's metadata has room for {} peers, the resource has {}",
                meta.max_peers(),
                self.peers.len()
            ));
        }
        if disk.geometry().size < self.data_size {
            return Err("the new disk is smaller than the data area".into());
        }
        meta.bind_resource(resource_id(&self.cfg.resource))
            .map_err(|e| e.to_string())
    }

    /// `detach`: the operator drops the disk. A primary needs an up-to-date peer to go
    /// on with.
    pub fn detach(&self) -> std::result::Result<String, String> {
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_diskless() {
            return Ok(format!(
                "{} on {} is diskless already",
                self.cfg.resource, self.cfg.node
            ));
        }
        if self.role() == Role::Primary && self.up_to_date_peers().is_empty() {
            return Err(format!(
                "{} is primary on {} with no up-to-date peer connected: without its disk it would have no data",
                self.cfg.resource, self.cfg.node
            ));
        }
        self.detach_disk("detached by the operator");
        Ok(format!(
            "{} on {}: disk detached; `cairn repl attach {}` takes it back (filled from an up-to-date peer on a primary, a full resync from the primary on a secondary)",
            self.cfg.resource, self.cfg.node, self.cfg.resource
        ))
    }

    /// `attach`: a diskless secondary takes its disk back, or `new` in its place (made
    /// by `create-md` for the same data size, bitmap block and activity-log extent), to
    /// be replaced by a full resync from the primary (as `invalidate`). A diskless
    /// primary fills it from an up-to-date peer while it serves (pull.rs).
    pub fn attach_disk(
        self: &Arc<Self>,
        new: Option<NewDisk>,
    ) -> std::result::Result<String, String> {
        {
            let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
            if !self.is_diskless() {
                return match new {
                    None => Ok(format!(
                        "{} on {} has its disk attached",
                        self.cfg.resource, self.cfg.node
                    )),
                    Some(_) => Err(format!(
                        "{} on {} has a disk attached: `cairn repl detach {}` first",
                        self.cfg.resource, self.cfg.node, self.cfg.resource
                    )),
                };
            }
            if self.role() == Role::Primary {
                return self.attach_primary(new);
            }
            if let Some((disk, meta)) = new {
                self.check_new_disk(disk.as_ref(), meta.as_ref())?;
                // Diskless: nothing is using either (the gates refuse), so the swap
                // waits for no request.
                drop(self.disk_gate.replace(disk));
                drop(self.meta_gate.replace(meta));
                // The bitmaps towards the other peers are in memory only: all of
                // them go to the new metadata.
                for peer in &self.peers {
                    let pages = peer.bitmap.bits().div_ceil(crate::bitmap::BITS_PER_PAGE);
                    let all: Vec<usize> = (0..usize::try_from(pages).unwrap_or(0)).collect();
                    peer.bitmap.redirty(&all);
                }
            }
            self.disk_state.store(DISK_ATTACHED, Ordering::SeqCst);
        }
        match self.invalidate().and_then(|m| {
            self.write_out_bitmaps()
                .map(|()| m)
                .map_err(|e| e.to_string())
        }) {
            Ok(_) => {
                self.event(
                    "attached",
                    None,
                    format!(
                        "{} on {}: disk attached, inconsistent until a full resync from the primary",
                        self.cfg.resource, self.cfg.node
                    ),
                );
                Ok(format!(
                    "{} on {}: disk attached; the primary resyncs all of it",
                    self.cfg.resource, self.cfg.node
                ))
            }
            Err(e) => {
                self.disk_state.store(DISK_DISKLESS, Ordering::SeqCst);
                Err(format!("the disk still fails ({e}): it stays detached"))
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::{far_secondary, fresh_of, node_a_towards, serve_peers};
    use super::*;
    use crate::store::{create, CreateParams, Store};
    use cairn_block::testkit::{Fault, FaultHandle, FaultyDisk, Op, Ops};
    use cairn_block::MemDisk;
    use rand::{Rng, SeedableRng};

    pub(in crate::node) const SIZE: u64 = 16 << 20;

    /// The gate passes every call to the disk while it is attached; its `*_then` forms
    /// run through the gated synchronous ones, and a detached gate refuses them all.
    #[test]
    fn the_gate_passes_through_while_attached_and_stops_everything_once_detached() {
        use cairn_block::testkit::conformance::{check_pass_through, Method, Recorder};
        let synchronous = [
            Method::CompletesLater,
            Method::ReadThen,
            Method::WriteThen,
            Method::FlushThen,
            Method::DiscardThen,
        ];
        check_pass_through(
            &|d| {
                Arc::new(Gate::new(
                    Arc::new(std::sync::atomic::AtomicU8::new(DISK_ATTACHED)),
                    d,
                ))
            },
            &synchronous,
        );
        let below = Arc::new(Recorder::new(1 << 20));
        let gate = Gate::new(
            Arc::new(std::sync::atomic::AtomicU8::new(DISK_DISKLESS)),
            below.clone() as Arc<dyn BlockDevice>,
        );
        let mut buf = vec![0u8; 4096];
        assert!(gate.read_at(&mut buf, 0).is_err());
        assert!(gate.write_at(&buf, 0, WriteFlags::NONE).is_err());
        assert!(gate.flush().is_err());
        assert!(gate.discard(0, 4096).is_err());
        assert!(gate.write_zeroes(0, 4096, WriteFlags::NONE).is_err());
        gate.read_then(4096, 0, Box::new(|r| assert!(r.is_err())));
        gate.write_then(&buf, 0, WriteFlags::NONE, Box::new(|r| assert!(r.is_err())));
        assert!(
            below.take().is_empty(),
            "a detached gate let a call through"
        );
    }

    fn new_disk(d: &Arc<dyn BlockDevice>) -> NewDisk {
        (d.clone(), Box::new(Store::open(d.clone()).unwrap()))
    }

    /// A 16 MiB disk with fresh metadata, behind a fault switch.
    pub(in crate::node) fn faulty() -> (Arc<dyn BlockDevice>, FaultHandle) {
        let f = FaultyDisk::new(MemDisk::new(SIZE));
        let h = f.handle();
        let p = CreateParams {
            max_peers: 1,
            bm_block: 4096,
            al_extent: 1 << 20,
            force: false,
            resource: None,
        };
        create(&f, &p).unwrap();
        (Arc::new(f), h)
    }

    pub(in crate::node) fn wait(what: &str, mut ok: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < until, "waited 30 s for {what}");
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub(in crate::node) fn established(node: &Node) -> bool {
        node.status().peers[0].replication == Repl::Established
    }

    pub(in crate::node) fn kinds(node: &Node) -> Vec<String> {
        node.status().events.into_iter().map(|e| e.kind).collect()
    }

    /// Writes through both of the primary's write paths (waiting, and answered by the
    /// last replica), alternately.
    pub(in crate::node) fn write(vol: &Volume, buf: &[u8], offset: u64, i: usize) -> Result<()> {
        if i.is_multiple_of(2) {
            return vol.write_at(buf, offset, WriteFlags::NONE);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        vol.write_then(
            buf,
            offset,
            WriteFlags::NONE,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv_timeout(Duration::from_secs(30))
            .expect("a write never answered")
    }

    /// A primary and its secondary "far"; `fail` breaks the primary's disk once the two
    /// are in sync. Random writes and reads then go on, checked against a model.
    fn primary_loses_its_disk(
        protocol: Protocol,
        fail: impl FnOnce(&FaultHandle, u64),
        label: &str,
    ) {
        let seed: u64 = rand::random();
        println!("{label}: seed {seed}");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (far, far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, |c| c.protocol = protocol);
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        let n = usize::try_from(node.data_size).unwrap();
        let mut model = vec![0u8; n];
        disk.read_at(&mut model, 0).unwrap();
        let vol = Volume(node.clone());
        let before = node.persisted().current;
        fail(&h, node.data_size);
        for i in 0..200 {
            let blocks = rng.gen_range(1..=8usize);
            let at = rng.gen_range(0..n / 4096 - blocks) * 4096;
            if rng.gen_bool(0.6) {
                let buf: Vec<u8> = (0..blocks * 4096).map(|_| rng.gen()).collect();
                write(&vol, &buf, at as u64, i).unwrap_or_else(|e| panic!("write {i}: {e}"));
                model[at..at + buf.len()].copy_from_slice(&buf);
            } else {
                let mut buf = vec![0u8; blocks * 4096];
                vol.read_at(&mut buf, at as u64)
                    .unwrap_or_else(|e| panic!("read {i}: {e}"));
                assert!(buf == model[at..at + buf.len()], "read {i} at {at} differs");
            }
            if (i + 1).is_multiple_of(50) {
                vol.flush().unwrap();
            }
        }
        let mut all = vec![0u8; n];
        vol.read_at(&mut all, 0).unwrap();
        assert!(all == model, "the volume differs from the model");
        far_disk.read_at(&mut all, 0).unwrap();
        assert!(all == model, "the peer's disk differs from the model");
        let s = node.status();
        assert_eq!(s.disk, "Diskless", "{s:?}");
        assert_eq!(s.peers[0].replication, Repl::Established);
        let k = kinds(&node);
        assert!(
            k.contains(&"disk-failed".into()) && k.contains(&"detached".into()),
            "{k:?}"
        );
        // The data moved on to a generation the peer holds and the old disk does not.
        let now = node.persisted().current;
        assert_ne!(now, before, "no new generation at the detach");
        assert_eq!(far.persisted().current, now, "the peer did not adopt it");
        assert_eq!(far.persisted().history[1], before, "not two generations on");
        // A diskless primary steps down cleanly and cannot be promoted again (it takes
        // its disk back as primary in pull.rs's tests).
        node.demote().unwrap();
        let e = node.promote(false).unwrap_err();
        assert!(e.contains("diskless"), "{e}");

        // The old disk comes back (healed, the node restarted on it): the peer, which
        // has the data, finds it behind with no bitmap to tell by how much.
        drop(node);
        h.heal();
        let old = Node::open(
            NodeConfig::for_tests("home", "a", "far"),
            disk.clone(),
            Box::new(Store::open(disk.clone()).unwrap()),
        )
        .unwrap();
        let (d, rule) = gen::decide(
            &far.view(&far.peers[0]),
            &old.view(&old.peers[0]),
            gen::Tie::MeSource,
        );
        assert_eq!(d, Decision::SourceFull, "{rule:?}");
        far_stop.shutdown();
    }

    #[test]
    fn a_primary_whose_disk_dies_goes_on_through_its_peer() {
        primary_loses_its_disk(Protocol::C, |h, _| h.fail_always(), "dead disk");
    }

    #[test]
    fn with_protocol_a_too() {
        primary_loses_its_disk(Protocol::A, |h, _| h.fail_always(), "protocol A");
    }

    #[test]
    fn a_primary_whose_data_area_fails_goes_on_and_gives_its_metadata_up() {
        // The metadata (at the end of the disk) still takes writes.
        primary_loses_its_disk(
            Protocol::C,
            |h, data| h.fail_range(Ops::ALL, 0..data),
            "data area",
        );
    }

    #[test]
    fn a_failed_read_is_answered_by_the_peer() {
        primary_loses_its_disk(
            Protocol::C,
            |h, _| h.inject(Fault::new(Op::Read)),
            "reads only",
        );
    }

    /// A primary, its peer in sync, a disk that fails all: what `adjust` and `before`
    /// set up decide whether the application sees the error.
    fn one_failed_write(adjust: impl FnOnce(&mut NodeConfig), disconnect: bool) -> Arc<Node> {
        let (_far, _far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, adjust);
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        let vol = Volume(node.clone());
        vol.write_at(&[7; 4096], 0, WriteFlags::NONE).unwrap();
        if disconnect {
            node.set_connect(None, false, false).unwrap();
        }
        h.fail_always();
        let e = vol
            .write_at(&[8; 4096], 4096, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        let mut b = [0u8; 4096];
        let e = vol.read_at(&mut b, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        far_stop.shutdown();
        node
    }

    #[test]
    fn with_pass_on_the_error_reaches_the_application() {
        let node = one_failed_write(|c| c.on_io_error = OnIoError::PassOn, false);
        let s = node.status();
        assert_eq!(s.disk, "UpToDate", "{s:?}");
        assert!(!kinds(&node).contains(&"detached".into()));
    }

    #[test]
    fn without_an_up_to_date_peer_the_error_reaches_the_application() {
        let node = one_failed_write(|_| {}, true);
        let s = node.status();
        assert_eq!(s.disk, "Diskless", "{s:?}");
    }

    #[test]
    fn a_secondary_whose_disk_fails_is_dropped_and_attaches_again() {
        secondary_loses_its_disk(false);
    }

    #[test]
    fn a_secondary_whose_disk_fails_attaches_a_new_one() {
        secondary_loses_its_disk(true);
    }

    /// The secondary's disk fails under the primary's writes; then it is healed and
    /// attached again, or (`replace`) a new disk is attached in its place.
    fn secondary_loses_its_disk(replace: bool) {
        let far_faulty = FaultyDisk::new(MemDisk::new(SIZE));
        let fh = far_faulty.handle();
        let far_disk: Arc<dyn BlockDevice> = {
            let reference = fresh_of(SIZE);
            // The same fresh metadata, on the faulty disk.
            let mut all = vec![0u8; usize::try_from(SIZE).unwrap()];
            reference.read_at(&mut all, 0).unwrap();
            far_faulty.write_at(&all, 0, WriteFlags::NONE).unwrap();
            Arc::new(far_faulty)
        };
        let far = Node::open(
            NodeConfig::for_tests("home", "far", "a"),
            far_disk.clone(),
            Box::new(Store::open(far_disk.clone()).unwrap()),
        )
        .unwrap();
        let (addr, far_stop) = serve_peers(&far);
        let disk = fresh_of(SIZE);
        let node = node_a_towards(addr, &disk, |_| {});
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        let vol = Volume(node.clone());
        fh.fail_range(Ops::ALL, 0..node.data_size);
        for i in 0..20u8 {
            vol.write_at(&[i; 4096], u64::from(i) * 8192, WriteFlags::NONE)
                .unwrap();
        }
        vol.flush().unwrap();
        assert_eq!(far.status().disk, "Diskless");
        let k = kinds(&far);
        assert!(
            k.contains(&"disk-failed".into()) && k.contains(&"detached".into()),
            "{k:?}"
        );
        assert!(kinds(&node).contains(&"disconnect".into()));
        assert!(node.status().peers[0].out_of_sync_bytes > 0);
        // The primary's reconnects are refused while far is diskless.
        wait("a refusal", || {
            node.status().peers[0]
                .last_error
                .as_ref()
                .is_some_and(|e| e.contains("diskless"))
        });
        assert_ne!(node.status().peers[0].replication, Repl::Established);
        let far_disk = if replace {
            // A disk of another size, or of another resource, is refused.
            let e = far
                .attach_disk(Some(new_disk(&fresh_of(SIZE * 2))))
                .unwrap_err();
            assert!(e.contains("data size"), "{e}");
            let other: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(SIZE));
            let params = CreateParams {
                max_peers: 1,
                bm_block: 4096,
                al_extent: 1 << 20,
                force: false,
                resource: Some(resource_id("else")),
            };
            create(other.as_ref(), &params).unwrap();
            let e = far.attach_disk(Some(new_disk(&other))).unwrap_err();
            assert!(e.contains("else") || e.contains("resource"), "{e}");
            assert_eq!(far.status().disk, "Diskless");
            // A fresh one is taken: a full resync from the primary.
            let d = fresh_of(SIZE);
            far.attach_disk(Some(new_disk(&d))).unwrap();
            d
        } else {
            // The same disk, healed: a full resync from the primary.
            fh.heal();
            far.attach_disk(None).unwrap();
            far_disk
        };
        // An idle primary notices the invalidation at its next write.
        vol.write_at(&[0xee; 4096], 0, WriteFlags::NONE).unwrap();
        wait("the resync after attach", || {
            let _ = vol.write_at(&[0xee; 4096], 0, WriteFlags::NONE);
            established(&node) && far.status().disk == "UpToDate"
        });
        assert!(kinds(&node).iter().any(|k| k == "resync-done"),);
        let n = usize::try_from(node.data_size).unwrap();
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        disk.read_at(&mut a, 0).unwrap();
        far_disk.read_at(&mut b, 0).unwrap();
        assert!(a == b, "the replicas differ after the attach");
        // The new metadata holds what the node knows (a restart finds it in sync).
        let p = Store::open(far_disk.clone()).unwrap().load().unwrap();
        assert!(
            p.consistent && p.current == node.persisted().current,
            "{p:?}"
        );
        node.demote().unwrap();
        far_stop.shutdown();
    }

    /// Where the tests below make the primary's disk fail a read: inside the data area,
    /// after its first few MiB.
    const BAD: std::ops::Range<u64> = (9 << 20)..(9 << 20) + 4096;

    /// The primary's disk fails one block's reads while it resyncs its peer (the
    /// initial full sync). `detach`: the node detaches it as an application read would,
    /// the resync stops, and the peer, not at fault, stays connected but Inconsistent.
    /// `pass-on`: the resync fails and drops its peer, the disk stays.
    fn resync_source_read_fails(on_io_error: OnIoError) -> Arc<Node> {
        let (far, _far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        h.fail_range(Op::Read, BAD);
        let node = node_a_towards(addr, &disk, |c| c.on_io_error = on_io_error);
        node.promote(true).unwrap();
        let want = if on_io_error == OnIoError::Detach {
            "resync-stopped"
        } else {
            "disconnect"
        };
        wait(want, || kinds(&node).contains(&want.to_string()));
        let s = node.status();
        let k = kinds(&node);
        if on_io_error == OnIoError::Detach {
            assert_eq!(s.disk, "Diskless", "{s:?}");
            assert!(
                k.contains(&"disk-failed".into()) && k.contains(&"detached".into()),
                "{k:?}"
            );
            assert!(
                !k.contains(&"disconnect".into()),
                "the peer was dropped: {k:?}"
            );
            let p = &s.peers[0];
            assert_eq!((p.connection, p.replication), (Conn::Connected, Repl::Off));
            let e = p.last_error.clone().unwrap_or_default();
            assert!(e.contains("detached") && e.contains("Inconsistent"), "{e}");
            assert!(p.out_of_sync_bytes > 0, "{p:?}");
            assert_eq!(far.status().disk, "Inconsistent");
            // No up-to-date replica: the application gets the error; the peer still
            // takes the write (it is connected).
            let vol = Volume(node.clone());
            let e = vol
                .write_at(&[5; 4096], 4096, WriteFlags::NONE)
                .unwrap_err();
            assert!(e.to_string().contains("no up-to-date peer"), "{e}");
            let e = node.verify(None, false).unwrap_err();
            assert!(e.contains("diskless"), "{e}");
        } else {
            assert_eq!(s.disk, "UpToDate", "{s:?}");
            assert!(!k.contains(&"detached".into()), "{k:?}");
        }
        far_stop.shutdown();
        node
    }

    #[test]
    fn a_resync_whose_local_read_fails_detaches_and_keeps_its_peer() {
        resync_source_read_fails(OnIoError::Detach);
    }

    #[test]
    fn with_pass_on_a_resync_whose_local_read_fails_drops_its_peer() {
        resync_source_read_fails(OnIoError::PassOn);
    }

    /// The primary's disk fails one block's reads during an online verify: `detach`
    /// detaches it and the verify stops saying so; the peer stays in sync and the
    /// diskless primary goes on through it. `pass-on`: the verify fails, the disk stays.
    fn verify_read_fails(on_io_error: OnIoError) {
        let (_far, far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, |c| c.on_io_error = on_io_error);
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        h.fail_range(Op::Read, BAD);
        node.verify(None, false).unwrap();
        wait("the verify's end", || {
            node.status().peers[0]
                .verify
                .as_ref()
                .is_some_and(|v| !v.running)
        });
        let s = node.status();
        let v = s.peers[0].verify.clone().unwrap();
        let e = v.error.unwrap_or_default();
        let k = kinds(&node);
        assert!(k.contains(&"verify-failed".into()), "{k:?}");
        assert!(!k.contains(&"disconnect".into()), "{k:?}");
        assert_eq!(s.peers[0].replication, Repl::Established);
        if on_io_error == OnIoError::Detach {
            assert!(e.contains("detached") && e.contains("in sync"), "{e}");
            assert_eq!(s.disk, "Diskless", "{s:?}");
            assert!(k.contains(&"detached".into()), "{k:?}");
            let vol = Volume(node.clone());
            vol.write_at(&[6; 4096], BAD.start, WriteFlags::NONE)
                .unwrap();
            let mut b = [0u8; 4096];
            vol.read_at(&mut b, BAD.start).unwrap();
            assert_eq!(b, [6; 4096]);
            far_disk.read_at(&mut b, BAD.start).unwrap();
            assert_eq!(b, [6; 4096], "the peer lacks the write");
        } else {
            assert!(e.contains("reading this node's data"), "{e}");
            assert_eq!(s.disk, "UpToDate", "{s:?}");
            assert!(!k.contains(&"detached".into()), "{k:?}");
        }
        node.demote().unwrap();
        far_stop.shutdown();
    }

    #[test]
    fn a_verify_whose_local_read_fails_detaches() {
        verify_read_fails(OnIoError::Detach);
    }

    #[test]
    fn with_pass_on_a_verify_whose_local_read_fails_only_stops() {
        verify_read_fails(OnIoError::PassOn);
    }

    /// A diskless primary with `--on-no-data suspend-io` whose only peer is
    /// disconnected: a write and a read are held, unanswered, with the status and an
    /// event saying so. `back`: the peer is connected again (nothing to copy: no write
    /// went out meanwhile) and both go on; else the node is demoted and both fail.
    fn held_without_data(back: bool) {
        let (_far, far_disk, addr, far_stop) = far_secondary();
        let (disk, _h) = faulty();
        let node = node_a_towards(addr, &disk, |c| c.on_no_data = OnNoData::SuspendIo);
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        let vol = Volume(node.clone());
        vol.write_at(&[3; 4096], 1 << 20, WriteFlags::NONE).unwrap();
        node.detach().unwrap();
        node.set_connect(None, false, false).unwrap();
        assert!(node.status().io_suspended.is_none());
        let (tx, rx) = std::sync::mpsc::channel();
        let (v, t) = (vol.clone(), tx.clone());
        thread::spawn(move || {
            let _ = t.send(("write", v.write_at(&[9; 4096], 0, WriteFlags::NONE)));
        });
        let v = vol.clone();
        thread::spawn(move || {
            let mut b = [0u8; 4096];
            let r = v.read_at(&mut b, 1 << 20);
            let r = r.and_then(|()| {
                if b == [3; 4096] {
                    Ok(())
                } else {
                    Err(io_err(ErrorKind::Io, "the held read got other data"))
                }
            });
            let _ = tx.send(("read", r));
        });
        wait("the suspension", || {
            node.status().io_suspended.is_some() && kinds(&node).contains(&"io-suspended".into())
        });
        thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "a request was answered while held");
        let why = node.status().io_suspended.unwrap();
        assert!(why.contains("no up-to-date peer"), "{why}");
        if back {
            node.set_connect(None, true, false).unwrap();
            for _ in 0..2 {
                let (what, r) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                r.unwrap_or_else(|e| panic!("the held {what}: {e}"));
            }
            assert!(established(&node));
            assert!(node.status().io_suspended.is_none());
            assert!(kinds(&node).contains(&"io-resumed".into()));
            let mut b = [0u8; 4096];
            far_disk.read_at(&mut b, 0).unwrap();
            assert_eq!(b, [9; 4096], "the peer lacks the held write");
            node.demote().unwrap();
        } else {
            node.demote().unwrap();
            for _ in 0..2 {
                let (what, r) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                let e = r.expect_err(what);
                assert!(e.to_string().contains("no longer primary"), "{what}: {e}");
            }
            assert!(kinds(&node).contains(&"io-failed".into()));
            assert!(node.status().io_suspended.is_none());
        }
        far_stop.shutdown();
    }

    #[test]
    fn a_held_write_goes_on_when_an_up_to_date_peer_returns() {
        held_without_data(true);
    }

    #[test]
    fn held_requests_fail_when_the_node_is_demoted() {
        held_without_data(false);
    }

    /// `--on-no-data suspend-io` on the path that answers from a replica's reader
    /// (protocol C, `write_then`): the disk fails under a write while no peer is up to
    /// date. The write is held, not answered, and fails when the node is demoted.
    #[test]
    fn a_write_the_disk_fails_under_is_held_until_the_demotion() {
        let (_far, _far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, |c| c.on_no_data = OnNoData::SuspendIo);
        node.promote(true).unwrap();
        wait("the initial sync", || established(&node));
        node.set_connect(None, false, false).unwrap();
        h.fail_always();
        let (tx, rx) = std::sync::mpsc::channel();
        Volume(node.clone()).write_then(
            &[4; 4096],
            0,
            WriteFlags::NONE,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        wait("the suspension", || node.status().io_suspended.is_some());
        assert_eq!(node.status().disk, "Diskless");
        thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "the held write was answered");
        node.demote().unwrap();
        let e = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("no longer primary"), "{e}");
        far_stop.shutdown();
    }

    /// `detach` by hand: refused on a primary with no up-to-date peer; with one, the
    /// primary goes on diskless and its disk sees nothing more.
    #[test]
    fn detach_by_hand() {
        let (_far, far_disk, addr, far_stop) = far_secondary();
        let (disk, h) = faulty();
        let node = node_a_towards(addr, &disk, |_| {});
        node.promote(true).unwrap();
        node.set_connect(None, false, false).unwrap();
        let e = node.detach().unwrap_err();
        assert!(e.contains("no up-to-date peer"), "{e}");
        node.set_connect(None, true, false).unwrap();
        wait("the peer back", || established(&node));
        node.detach().unwrap();
        assert_eq!(node.status().disk, "Diskless");
        let ops = h.stats().total();
        let vol = Volume(node.clone());
        vol.write_at(&[3; 8192], 1 << 20, WriteFlags::FUA).unwrap();
        vol.flush().unwrap();
        let mut b = [0u8; 8192];
        vol.read_at(&mut b, 1 << 20).unwrap();
        assert_eq!(b, [3; 8192]);
        far_disk.read_at(&mut b, 1 << 20).unwrap();
        assert_eq!(b, [3; 8192], "the peer lacks the write");
        assert_eq!(h.stats().total(), ops, "the detached disk was used");
        node.demote().unwrap();
        far_stop.shutdown();
    }
}
