//! cairn across hosts: one owner per array.
//!
//! ```text
//!   owner host                                   member hosts (cairn serve, nbdkit, qemu-nbd)
//!   lease.rs   etcd key /cairn/arrays/<uuid>/owner, created only by a successful
//!              compare-and-swap; FencedDevice stops I/O when the lease may be gone
//!   owner.rs   takeover: read records, generation = max + 1, declare it on every member
//!   ondisk.rs  the owner record in each member's first 4 KiB  <── RecordStore: a cairn member
//!                                                                  server persists and enforces
//!   etcd.rs    the etcd v3 JSON gateway client                      the generation (cairn-nbd's
//!                                                                  fence option and gate)
//! ```
//!
//! docs/fencing.md has the rules and every byte.

pub mod etcd;
pub mod lease;
pub mod ondisk;
pub mod owner;

pub use cairn_nbd::fence::{FenceAnswer, FenceToken, OwnerId};
pub use etcd::{Etcd, EtcdTls};
pub use lease::{owner_key, FencedDevice, Lease, LeaseError, LeaseGuard};
pub use ondisk::{MemberStore, OwnerRecord, RecordStore, RECORD_AREA};
pub use owner::{release, take_over, take_over_whole, Owned, Rules, TakeoverError};
