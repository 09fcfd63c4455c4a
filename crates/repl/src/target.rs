//! The secondary's answers: the replication handshake option, and the fence store that
//! keeps the newest primary's epoch in this node's metadata (so the NBD server's fence
//! gate refuses an older primary on every request, across restarts).

use std::sync::{Arc, Weak};

use cairn_block::{BlockDevice, Error, ErrorKind};
use cairn_nbd::fence::{FenceStore, FenceToken, Stored};
use cairn_nbd::proto::{REP_ACK, REP_ERR_INVALID, REP_ERR_POLICY};
use cairn_nbd::OptionHandler;

use crate::node::Node;
use crate::wire::{self, Request, OPT_CAIRN_REPL};

/// Answers for one node; holds it weakly so the servers do not keep it alive.
#[derive(Debug, Clone)]
pub struct Target(Weak<Node>);

impl Target {
    pub fn new(node: &Arc<Node>) -> Target {
        Target(Arc::downgrade(node))
    }

    fn node(&self) -> Option<Arc<Node>> {
        self.0.upgrade()
    }
}

impl OptionHandler for Target {
    fn handles(&self, option: u32) -> bool {
        option == OPT_CAIRN_REPL
    }

    fn answer(&self, _option: u32, data: &[u8]) -> (u32, Vec<u8>) {
        let Some(node) = self.node() else {
            return (REP_ERR_POLICY, b"the resource is shutting down".to_vec());
        };
        let req = match wire::parse_request(data) {
            Ok(r) => r,
            Err(m) => return (REP_ERR_INVALID, m.into_bytes()),
        };
        let r = match req {
            Request::Hello(h) => node
                .welcome(&h)
                .map(|w| serde_json::to_vec(&w).unwrap_or_default()),
            Request::Bitmap {
                node: from,
                first_word,
                words,
            } => node.bitmap_words(&from, first_word, words),
            Request::SyncStart { node: from, full } => {
                node.sync_start(&from, full).map(|()| Vec::new())
            }
            Request::SyncDone {
                node: from,
                gens,
                in_sync,
            } => node.sync_done(&from, &gens, &in_sync).map(|()| Vec::new()),
            Request::Adopt { node: from, gens } => node.adopt(&from, &gens).map(|()| Vec::new()),
            Request::Digest {
                node: from,
                offset,
                len,
            } => node.digests(&from, offset, len),
        };
        match r {
            Ok(d) => (REP_ACK, d),
            Err(m) => (REP_ERR_POLICY, m.into_bytes()),
        }
    }
}

impl FenceStore for Target {
    /// The metadata is at the end of the backing device, outside the exported data.
    fn reserved(&self) -> u64 {
        0
    }

    fn load(&self, _dev: &dyn BlockDevice) -> cairn_block::Result<Stored> {
        let node = self
            .node()
            .ok_or_else(|| Error::new(ErrorKind::Shutdown, "resource closed"))?;
        Ok(node.fence_load().map_or(Stored::Blank, Stored::Owner))
    }

    fn store(
        &self,
        _dev: &dyn BlockDevice,
        token: &FenceToken,
        _released: bool,
    ) -> cairn_block::Result<()> {
        let node = self
            .node()
            .ok_or_else(|| Error::new(ErrorKind::Shutdown, "resource closed"))?;
        node.fence_store(token)
    }

    fn connection_ended(&self, _export: &str, token: &FenceToken) {
        if let Some(node) = self.node() {
            node.primary_connection_ended(token);
        }
    }
}
