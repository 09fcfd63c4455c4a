//! cairn between machines: one volume mirrored to its peers, as DRBD does.
//!
//! ```text
//!   primary node                                      secondary node
//!   clients ─ NBD ─> Replicated (device.rs)           target.rs: a cairn NBD server over
//!                     ├─ local backing device          the data area, fenced by the
//!                     └─ peers (peer.rs) ── NBD ──────> primary's epoch, answering the
//!                         writes at once (protocol C)   replication option (handshake)
//!   meta.rs   internal metadata at the end of the backing device: superblock,
//!             activity log, one out-of-sync bitmap per peer
//!   gen.rs    generation identifiers and the sync decision taken at connect
//! ```
//!
//! docs/replication-format.md has the rules and every byte.

pub mod al;
pub mod bitmap;
pub mod gen;
pub mod meta;
pub mod metrics;
pub mod node;
pub mod quorum;
pub mod ranges;

pub mod store;
pub mod target;
pub mod wire;
