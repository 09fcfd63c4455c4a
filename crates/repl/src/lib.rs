//! cairn between machines: one volume mirrored to its peers, as DRBD does.
//!
//! ```text
//!   primary node                                        secondary node
//!   clients ─ NBD ─> node::Volume (node.rs)             target.rs: the peer-facing NBD
//!                     ├─ the local backing device         server's option handler and
//!                     └─ per peer (sync.rs): a cairn ───> fence store; the data area as
//!                        NBD client, writes sent at        an export; secondary.rs answers
//!                        once (protocol C; A: answered     the handshake (wire.rs)
//!                        in the background), resync
//!   ranges.rs  range locks: overlapping writes and resync copies in one order everywhere
//!   al.rs      the activity log;  bitmap.rs  the per-peer out-of-sync bitmaps in memory
//!   gen.rs     generation identifiers and the sync decision taken at connect
//!   meta.rs    the metadata on disk (internal at the end of the backing device, or
//!              external); store.rs  the node's view of it (MetaIo)
//!   quorum.rs  the primary role as an etcd lease, outdated peers, automatic failover
//!              (fake_etcd.rs: an etcd stand-in for its tests)
//!   rate.rs    the resync/verify rate controller: the maximum when the application is
//!              idle, the minimum while it does I/O
//!   verify.rs  online verify (digests) and invalidate;  metrics.rs  Prometheus gauges
//!   control.rs the client of a resource's control socket (`cairn repl`, `cairn status`,
//!              `cairn serve`'s GET /v1/replication): its path, discovery, one request
//! ```
//!
//! docs/replication.md is the user's guide; docs/replication-format.md has every byte.

pub mod al;
pub mod bitmap;
pub mod control;
#[cfg(test)]
mod fake_etcd;
pub mod gen;
pub mod meta;
pub mod metrics;
pub mod node;
pub mod quorum;
pub mod ranges;
pub mod rate;

pub mod store;
pub mod target;
pub mod wire;
