//! Quorum and failover through etcd: who may be primary is an etcd lease, decided only by
//! a successful compare-and-swap, and a replica the primary went on without is marked
//! outdated there, so it can never take over with old data.
//!
//! ```text
//!   /cairn/repl/RES/primary          node name + epoch, attached to the primary's lease:
//!                                    created only if absent AND the node's own
//!                                    outdated key is absent (one transaction)
//!   /cairn/repl/RES/outdated/NODE    written by the primary before it acknowledges a write
//!                                    that NODE did not get; deleted when NODE is in sync
//! ```
//!
//! A primary checks its lease before every request: once it may have run out, I/O is
//! frozen (requests wait until the node is made secondary) or fails at once, as
//! configured. The epoch the primary stamps on the peer link (the fence gate) closes
//! the window a lease cannot: a paused primary whose lease ran out is refused by the peer
//! that took over, because the new primary raised the epoch first.

use std::time::Duration;

use cairn_cluster::Etcd;
use serde::{Deserialize, Serialize};

/// What a primary does with requests once its lease may be gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnLoss {
    /// Requests wait (a client sees no answer) until the node is made secondary: nothing
    /// is refused that a later primary might still accept.
    Freeze,
    /// Requests fail at once with EPERM.
    Error,
}

impl std::str::FromStr for OnLoss {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "freeze" => Ok(OnLoss::Freeze),
            "error" => Ok(OnLoss::Error),
            _ => Err(format!("{s:?}: expected freeze or error")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Quorum {
    pub etcd: Etcd,
    pub ttl: Duration,
    /// A consistent secondary that is not outdated takes the primary role by itself when
    /// no primary holds the lease.
    pub auto_failover: bool,
    pub on_loss: OnLoss,
}

pub fn primary_key(resource: &str) -> String {
    format!("/cairn/repl/{resource}/primary")
}

pub fn outdated_key(resource: &str, node: &str) -> String {
    format!("/cairn/repl/{resource}/outdated/{node}")
}
