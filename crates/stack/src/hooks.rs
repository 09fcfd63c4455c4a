//! What a stack's owner plugs in: counters around each node's device, and passphrases.
//!
//! The library opens devices and unlocks volumes; it does not know where statistics go
//! (the daemon's registry, a benchmark, nothing) or how a passphrase is asked for (a
//! terminal, a key file, an API request). The caller says so here.

use std::fmt::Debug;
use std::sync::Arc;

use cairn_block::BlockDevice;
use cairn_luks::SecretBytes;

use crate::error::Result;

/// Who this host is across hosts, and where ownership is decided (crate::fence uses it).
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    /// This host's name in owner records and etcd leases; empty: the host name.
    pub node: String,
    /// With an etcd (and its lease TTL): every md array opened writable is first taken
    /// as a lease there.
    pub etcd: Option<(cairn_cluster::Etcd, std::time::Duration)>,
}

/// Wraps a node's device to count its I/O under the node id (`file:PATH`,
/// `member:NAME`, `export:NAME`), so the counters and the status tree name the same
/// nodes.
pub trait StatsHook: Send + Sync + Debug {
    fn wrap(&self, node_id: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice>;
}

/// Asks a person for the passphrase of a LUKS volume (`shown` names it). The CLI answers
/// from the terminal; a daemon has no one to ask and gives none.
pub trait Prompt: Send + Sync + Debug {
    fn passphrase(&self, shown: &str) -> Result<SecretBytes>;
}

/// The hooks one opening uses.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    pub stats: Option<Arc<dyn StatsHook>>,
    pub prompt: Option<Arc<dyn Prompt>>,
}

impl Hooks {
    /// `dev`, counted as `node_id` when there is a statistics hook.
    pub fn wrap(&self, node_id: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        match &self.stats {
            Some(s) => s.wrap(node_id, dev),
            None => dev,
        }
    }
}

/// How a stack is opened.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Nothing is written, not even md superblocks.
    pub read_only: bool,
    /// Plain files with O_DIRECT.
    pub direct: bool,
    /// Start md arrays that are degraded and were not shut down cleanly.
    pub force: bool,
    /// Put over RAID4/5/6 arrays opened writable; `None`: the array as it is (short
    /// metadata changes, dry runs).
    pub stripe_cache: Option<cairn_md::StripeCacheOptions>,
    /// How long a remote member (an NBD URI) may take to answer before it counts as
    /// failed; `None`: [`crate::leaf::DEFAULT_REMOTE_TIMEOUT`].
    pub remote_timeout: Option<std::time::Duration>,
    /// The pace of background work (rebuilds, resync, scrubs) of the RAID LVs a server
    /// opens while it runs; `None`: they run none (what a one-off command wants).
    pub speed_limits: Option<cairn_md::SpeedLimits>,
    /// This host's name in owner records and, with an etcd, each writable md array
    /// taken as a lease there before its members (docs/fencing.md).
    pub ownership: Ownership,
    pub hooks: Hooks,
}

impl Options {
    pub fn remote_timeout(&self) -> std::time::Duration {
        self.remote_timeout
            .unwrap_or(crate::leaf::DEFAULT_REMOTE_TIMEOUT)
    }
}
