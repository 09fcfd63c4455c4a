//! The secondary's side of the handshake (target.rs calls these): the welcome and its
//! sync decision, the bitmap, the start and end of a resync, new generations, and the
//! fence store of the peer-facing export. A child of node.rs, so it sees the node's state.

use super::*;

impl Node {
    pub(crate) fn peer_named(&self, name: &str) -> Option<&Arc<Peer>> {
        self.peers.iter().find(|p| p.cfg.name == name)
    }

    pub(crate) fn welcome(&self, h: &Hello) -> std::result::Result<Welcome, String> {
        if h.resource != self.cfg.resource {
            return Err(format!(
                "this node serves resource {:?}, not {:?}",
                self.cfg.resource, h.resource
            ));
        }
        let peer = self.peer_named(&h.node).ok_or_else(|| {
            format!(
                "{:?} is not a peer of {} on {}",
                h.node, self.cfg.resource, self.cfg.node
            )
        })?;
        if self.is_diskless() {
            return Err(format!(
                "{} on {} is diskless (its disk failed or was detached): it takes no data until `cairn repl attach {}` there",
                self.cfg.resource, self.cfg.node, self.cfg.resource
            ));
        }
        if h.data_size != self.data_size || h.bm_block != self.meta.bm_block() {
            return Err(format!(
                "the data areas differ: {} holds {} bytes in {}-byte bitmap blocks, this node {} in {}",
                h.node, h.data_size, h.bm_block, self.data_size, self.meta.bm_block()
            ));
        }
        let me = self.view(peer);
        let (decision, rule) = gen::decide(&me, &h.view, self.tie(peer));
        let discard = peer.state().discard_my_data;
        if let Decision::SplitBrain { .. } = decision {
            peer.set(Conn::StandAlone, Repl::SplitBrain);
            self.event(
                "split-brain",
                Some(&h.node),
                format!(
                    "split brain with {} ({rule:?}): this node changed {} KiB since they parted{}",
                    h.node,
                    peer.bitmap.count() * self.meta.bm_block() / 1024,
                    if discard {
                        "; discarding this node's changes as the operator said"
                    } else {
                        ""
                    }
                ),
            );
        }
        let (epoch, fenced_by) = {
            let p = self.persisted();
            (
                p.epoch,
                p.fence
                    .as_ref()
                    .map(|t| t.owner.node.clone())
                    .unwrap_or_default(),
            )
        };
        Ok(Welcome {
            fenced_by,
            node: self.cfg.node.clone(),
            view: me,
            epoch,
            changes: peer.bitmap.count(),
            decision,
            discard_my_data: discard,
        })
    }

    pub(crate) fn bitmap_words(
        &self,
        node: &str,
        first: usize,
        n: usize,
    ) -> std::result::Result<Vec<u8>, String> {
        let peer = self
            .peer_named(node)
            .ok_or_else(|| format!("{node:?} is not a peer"))?;
        let words = peer
            .bitmap
            .words(first, n.min(wire::BITMAP_WORDS_PER_REPLY));
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    pub(super) fn require_secondary(&self) -> std::result::Result<(), String> {
        if self.role() == Role::Primary {
            return Err(format!(
                "{} is primary on {}: it takes no data from another primary",
                self.cfg.resource, self.cfg.node
            ));
        }
        Ok(())
    }

    /// The start of a resync from `node`; `node` becomes the one whose resync this node
    /// follows (`sync_source`: only it may end it, and to any other node this node looks
    /// blank until it does, Node::view).
    pub(crate) fn sync_start(&self, node: &str, full: bool) -> std::result::Result<(), String> {
        self.require_secondary()?;
        self.vx.admit_sync_start(full)?;
        let peer = self
            .peer_named(node)
            .ok_or_else(|| format!("{node:?} is not a peer"))?;
        let mut p = self.persisted();
        *self.sync_source.lock().unwrap_or_else(|e| e.into_inner()) = Some(node.to_string());
        p.consistent = false;
        self.meta.save(&p).map_err(|e| e.to_string())?;
        drop(p);
        peer.set(Conn::Connected, Repl::SyncTarget);
        self.event(
            "resync-started",
            Some(node),
            format!(
                "{} resync from {node} started",
                if full { "full" } else { "bitmap" }
            ),
        );
        Ok(())
    }

    /// The end of a resync from `node`: this node holds its data and its generation.
    /// `in_sync`: the source's other peers that hold the source's data (sync.rs
    /// `peers_holding_my_data`); they hold this node's data now too, so the bits towards
    /// them go and their bitmap has no base, as on the source (DRBD's rule: after a
    /// resync the target's bitmap towards a third node is the source's). Bits left there
    /// from this node's own past (a crashed primary's activity log) would otherwise copy
    /// identical data the next time the two meet.
    pub(crate) fn sync_done(
        &self,
        node: &str,
        source: &Generations,
        in_sync: &[String],
    ) -> std::result::Result<(), String> {
        self.require_secondary()?;
        self.vx.admit_sync_done()?;
        let peer = self
            .peer_named(node)
            .ok_or_else(|| format!("{node:?} is not a peer"))?;
        self.disk.flush().map_err(|e| e.to_string())?;
        let mut p = self.persisted();
        // Only the node whose resync this is, and whose data connection was admitted
        // last: after another primary's SyncStart or data connection, that one's copies
        // may land over this resync's (the fencing epoch shuts this one's out), and the
        // data is neither's generation until the other's resync ends.
        let admitted = p.fence.as_ref().map(|t| t.owner.node.clone());
        let last = self
            .sync_source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if last.as_deref() != Some(node) || admitted.as_deref() != Some(node) {
            return Err(format!(
                "the resync from {node} is not the current one (last resync started by {}, last primary admitted {}): this node does not take {node}'s generation",
                last.as_deref().unwrap_or("nobody"),
                admitted.as_deref().unwrap_or("none")
            ));
        }
        let mut g = Generations {
            current: p.current,
            bitmap: p.peers[peer.slot].bitmap_uuid,
            history: p.history,
        };
        g.sync_finished_target(source);
        p.current = g.current;
        p.history = g.history;
        p.peers[peer.slot].bitmap_uuid = 0;
        p.consistent = true;
        p.crashed_primary = false;
        peer.bitmap.clear(0, peer.bitmap.bits());
        let mut cleared = Vec::new();
        for other in in_sync
            .iter()
            .filter_map(|n| self.peer_named(n))
            .filter(|o| o.slot != peer.slot)
        {
            let bytes = other.bitmap.count_bytes(self.data_size);
            if bytes > 0 || p.peers[other.slot].bitmap_uuid != 0 {
                cleared.push(format!("{} ({bytes} bytes)", other.cfg.name));
            }
            p.peers[other.slot].bitmap_uuid = 0;
            other.bitmap.clear(0, other.bitmap.bits());
        }
        // The superblock first: a crash before the bitmaps are written out leaves bits
        // that only copy identical data again, never a base without its bits.
        self.meta.save(&p).map_err(|e| e.to_string())?;
        drop(p);
        self.write_out_bitmaps().map_err(|e| e.to_string())?;
        peer.state().discard_my_data = false;
        peer.set(Conn::Connected, Repl::Established);
        self.event(
            "resync-done",
            Some(node),
            if cleared.is_empty() {
                format!("resync from {node} done: this node holds its data")
            } else {
                format!(
                    "resync from {node} done: this node holds its data; out-of-sync bits towards {} cleared: {node} holds their data",
                    cleared.join(", ")
                )
            },
        );
        Ok(())
    }

    pub(crate) fn adopt(
        &self,
        node: &str,
        source: &Generations,
    ) -> std::result::Result<(), String> {
        self.require_secondary()?;
        self.peer_named(node)
            .ok_or_else(|| format!("{node:?} is not a peer"))?;
        let mut p = self.persisted();
        p.current = source.current;
        p.history = source.history;
        self.meta.save(&p).map_err(|e| e.to_string())
    }

    // The fence store of the peer-facing export.

    pub(crate) fn fence_load(&self) -> Option<FenceToken> {
        let p = self.persisted();
        Some(p.fence.clone().unwrap_or_else(|| FenceToken {
            array: self.uuid,
            generation: 0,
            owner: OwnerId {
                node: String::new(),
                instance: 0,
            },
        }))
    }

    pub(crate) fn fence_store(&self, token: &FenceToken) -> Result<()> {
        if self.role() == Role::Primary {
            return Err(io_err(ErrorKind::ReadOnly, "this node is primary"));
        }
        if token.array != self.uuid {
            return Err(io_err(
                ErrorKind::InvalidArgument,
                "the token names another resource",
            ));
        }
        // An epoch at its maximum would leave no room for the next one: refused, as the
        // metadata refuses to load one.
        if token.generation == u64::MAX {
            return Err(io_err(
                ErrorKind::InvalidArgument,
                "the token's epoch is at its maximum",
            ));
        }
        let mut p = self.persisted();
        p.epoch = p.epoch.max(token.generation);
        p.fence = Some(token.clone());
        self.meta.save(&p)?;
        drop(p);
        if let Some(peer) = self.peer_named(&token.owner.node) {
            let mut s = peer.state();
            if s.repl == Repl::Off || s.repl == Repl::SplitBrain {
                s.conn = Conn::Connected;
                s.repl = Repl::Established;
                s.since = SystemTime::now();
            }
        }
        self.event(
            "connected",
            Some(&token.owner.node),
            format!(
                "primary {} admitted (epoch {})",
                token.owner.node, token.generation
            ),
        );
        Ok(())
    }

    /// A data connection of the primary holding `token` ended: killed, partitioned away
    /// (the peer server's TCP keepalive breaks a silent connection within about
    /// [`PEER_KEEPALIVE`] × 2), or dropped by the primary itself. Its link is gone (the
    /// primary makes a new one, with a new epoch), so the status an operator reads
    /// before promoting this node says so at once rather than `Connected` for as long as
    /// nobody writes. A connection of an older epoch (a link the primary replaced) says
    /// nothing about the current one.
    pub(crate) fn primary_connection_ended(&self, token: &FenceToken) {
        if self.role() == Role::Primary || token.generation < self.persisted().epoch {
            return;
        }
        let Some(peer) = self.peer_named(&token.owner.node) else {
            return;
        };
        {
            let mut s = peer.state();
            if s.conn != Conn::Connected {
                return;
            }
            s.conn = Conn::Connecting;
            s.repl = Repl::Off;
            s.since = SystemTime::now();
            s.last_error = Some(format!(
                "primary {}'s data connection ended (epoch {})",
                token.owner.node, token.generation
            ));
        }
        self.event(
            "disconnect",
            Some(&token.owner.node),
            format!(
                "lost primary {}: its data connection ended (epoch {})",
                token.owner.node, token.generation
            ),
        );
    }
}

/// The idle time after which the peer-facing server probes a primary's connection (TCP
/// keepalive; three probes a quarter of it apart): a primary pings every 10 s while idle
/// (sync.rs), so a partitioned one is seen gone within about 10 s of its last word.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(5);
