//! cairn's md RAID layer: arrays whose members carry Linux md's superblock v1.2 and md's
//! data layout, so that `mdadm` recognises what cairn writes and cairn serves what
//! `mdadm` wrote.
//!
//! ```text
//!   assemble         superblocks -> roles, stale/missing members    -> Array; Array::create
//!   array, stripe    Array: BlockDevice over the members, every level, degraded I/O
//!   cache            StripeCache: concurrent partial-stripe writes merged into full stripes
//!   report, probe    mdadm --detail data; signatures create refuses to overwrite
//!   scrub            md's check / repair: redundancy against data, per stripe or region
//!   create           what mdadm 4.2 writes at --create             -> Superblock per member
//!   bitmap           write-intent bitmap: format, create, set before write, lazy clear
//!   safemode         idle arrays marked clean (events + 1), dirty again on the next write
//!   ondisk, examine  superblock v1.2 bytes <-> Superblock; mdadm --examine fields
//!   layout           array sector -> (member, member sector); P/Q placement per stripe
//!   parity           XOR, RAID6 P/Q over GF(2^8), recovery; scalar and SIMD kernels
//!   level, units     levels and layout words; Sectors, ChunkNo, StripeNo
//! ```
//!
//! The formats and formulas are those of `../shared/docs/ondisk-formats.md` §1, which
//! cites the kernel and mdadm sources they come from.
//!
//! How it is checked (no kernel here has an md driver, so nothing is ever assembled by
//! Linux itself):
//! * superblocks: `mdadm --examine` on member files over a table of shapes
//!   (`tests/mdadm_examine.rs`), plus strict parsing of mutated and random bytes;
//! * placement and parity: the kernel's maths as written in the format document, the
//!   known answers in `../shared/vectors/raid/` (`tests/vectors.rs`, whose member images
//!   were cross-checked with mdadm's own restripe code), and the worked examples;
//! * SIMD kernels: byte-for-byte against the scalar kernel on random data;
//! * the array (`tests/array_*.rs`): the block layer's conformance suite per level,
//!   healthy and degraded; random I/O against a `Vec<u8>` model over a table of level ×
//!   members × chunk × layout, then every member image checked against the layout maths
//!   and the scalar parity; the `stripe_kats` written through the array; every one- and
//!   two-member loss read back, degraded writes rebuilt by the test's own maths; crash
//!   images from `LogWritesDisk`; assembly rules, member faults and resync.
//! * scrub (`tests/scrub.rs`): bytes corrupted behind the array's back on one member
//!   are found page by page (RAID6: on the right member), repaired, and checked clean;
//!   the RAID6 error location against a brute-force search (`parity::check`).
//!
//! The AVX-512 and GFNI kernels need Rust 1.89 or later (their intrinsics were
//! stabilised then).

pub mod array;
pub mod assemble;
pub mod background;
pub mod bitmap;
pub mod cache;
pub mod create;
pub mod examine;
pub mod layout;
pub mod level;
pub mod members;
pub mod observe;
pub mod ondisk;
pub mod parity;
pub(crate) mod pipeline;
pub(crate) mod ppl;
pub mod probe;
pub mod report;
mod safemode;
pub mod scrub;
mod slot;
mod state;
mod stripe;
pub mod units;

pub use array::Array;
pub use assemble::{AssembleOptions, CreateOptions};
pub use background::{BackgroundStatus, SpeedLimits};
pub use bitmap::{BitmapChoice, BitmapInfo};
pub use cache::{StripeCache, StripeCacheOptions, StripeCacheStats};
pub use create::{create, CreateParams, CreatedArray};
pub use examine::Examine;
pub use level::{Level, ParityAlgorithm, Raid0Layout, Raid10Layout};
pub use members::Change;
pub use observe::{Failure, MdEvent, Observer};
pub use ondisk::{DevRole, FeaturePolicy, Features, MdTime, SetName, Superblock, Uuid};
pub use probe::{probe_signatures, Signature};
pub use report::{ArrayReport, ArrayState, MemberReport, MemberState};
pub use safemode::{set_default_safe_mode_delay, DEFAULT_SAFE_MODE_DELAY};
pub use scrub::{Finding, Mismatch, ScrubReport, ScrubUnits};
pub use units::{ChunkNo, Sectors, StripeNo};
