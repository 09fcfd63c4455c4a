//! Replication metadata, byte for byte (docs/replication-format.md says the same):
//! internal (at the end of the backing device, after the data) or external (on a
//! metadata device of its own, DRBD's `meta-disk /dev/X`; the data is the whole data
//! device).
//!
//! ```text
//!   internal, backing device:
//!   0 ............ data_size            replicated data (what clients see)
//!   bitmap_offset  max_peers × bitmap_bytes   one out-of-sync bitmap per peer slot
//!   al_offset      al_bytes             activity log
//!   ...            unused gap (< one bitmap step; zero after create)
//!   super_offset   4096                 superblock: the last whole 4 KiB of the device
//!
//!   external, data device:
//!   0 ............ data_size            replicated data: the whole device, rounded
//!                                       down to bm_block
//!   external, metadata device:
//!   0              max_peers × bitmap_bytes   one out-of-sync bitmap per peer slot
//!   al_offset      al_bytes             activity log
//!   ...            unused gap (not written)
//!   super_offset   4096                 superblock: the last whole 4 KiB of the device
//! ```
//!
//! Internal metadata sits at the end so the data area starts at byte 0: the backing
//! device of a node that has left the resource holds the volume as it was, readable
//! without cairn (external metadata leaves the data device all data). `super_offset` is the (metadata) device size rounded down to 4 KiB, minus
//! 4096; the other offsets follow from `data_size` and the EXTERNAL flag (see
//! [`Layout`]), and the superblock records them so a reader can check the derivation.
//!
//! Superblock, little-endian:
//!
//! ```text
//!   off len  field
//!     0   8  magic          "CAIRNRPL"
//!     8   4  version        1
//!    12   4  length         512: bytes the checksum covers, checksum included
//!    16  16  resource uuid
//!    32   4  node_id        this node, 0..=max_peers
//!    36   4  max_peers      1..=3
//!    40   4  flags          bit 0 CONSISTENT, 1 PRIMARY, 2 CLEAN, 3 CRASHED_PRIMARY,
//!                           4 EXTERNAL (fixed at create); others 0
//!    44   4  bm_block       bytes of data per bitmap bit: power of two, >= 4096
//!    48   4  al_extent      bytes of data per activity-log bit: power of two, multiple of bm_block
//!    52   4  reserved       0
//!    56   8  data_size      bytes, a multiple of bm_block, > 0
//!    64   8  bitmap_offset  = data_size (internal), 0 (external)
//!    72   8  al_offset      = bitmap_offset + max_peers × bitmap_bytes
//!    80   8  current        generation id (gen.rs); JUST_CREATED (4) after create
//!    88   8  history[0]     newest older generation; 0: none
//!    96   8  history[1]
//!   104   8  fence_epoch    role generation a primary stamps on the peer link; only grows
//!   112 288  peer slots     3 × 96 bytes, slot k at 112 + 96k:
//!              +0  4  node_id      0..=max_peers, not this node's, unique among used slots
//!              +4  4  flags        bit 0 IN_USE; others 0 (an unused slot is all zero,
//!                                  and so is every slot k >= max_peers)
//!              +8  8  bitmap_uuid  generation bitmap k started from; 0: none
//!             +16 64  name         peer name/address hint, UTF-8, NUL padded
//!             +80 16  reserved     0
//!   400  32  fence_owner    node name of the primary admitted last (the fencing
//!                           token's owner), UTF-8, NUL padded; empty: none yet
//!   432   8  fence_instance that primary's process instance
//!   440   8  fence_generation  the epoch of that token: <= fence_epoch
//!                           (400..448 all zero: no token; a token needs a uuid)
//!   448  60  reserved       0
//!   508   4  checksum       CRC32C of bytes 0..508
//!   512 ...  zero up to 4096
//! ```
//!
//! Ids (current, history, bitmap uuids) keep their reserved low bit clear (gen.rs).
//!
//! Bitmaps and activity log: bit `i` is bit `i % 64` of the little-endian u64 at byte
//! `8 × (i / 64)` of the area (so also bit `i % 8` of byte `i / 8`, md's order). Bitmap
//! bit `i` set: data bytes `[i × bm_block, (i+1) × bm_block)` may differ from that peer.
//! Activity-log bit `i` set: writes may be in flight in `[i × al_extent, (i+1) × al_extent)`;
//! after a crash as primary those extents count as out of sync with every peer. Each area
//! is rounded up to 4096 bytes; bits past the last data block are written as zero and
//! ignored when read.

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::gen::{Generations, JUST_CREATED};

/// Bytes of the superblock area (the last whole 4 KiB of the device).
pub const SUPER_SIZE: usize = 4096;
const SUPER_SIZE_U64: u64 = 4096;
/// Granularity of the bitmap and activity-log areas, and of their writes.
pub const PAGE: u64 = 4096;
pub const MAGIC: [u8; 8] = *b"CAIRNRPL";
pub const VERSION: u32 = 1;
/// Peer slots the superblock has room for; `max_peers` may be less.
pub const MAX_PEERS: u32 = 3;
const SLOTS: usize = 3;
/// Default bytes per bitmap bit.
pub const DEFAULT_BM_BLOCK: u32 = 4096;
/// Default bytes per activity-log extent.
pub const DEFAULT_AL_EXTENT: u32 = 4 << 20;
/// Longest peer name, in bytes.
pub const NAME_LEN: usize = 64;
/// Longest fencing-token owner (node) name, in bytes.
pub const OWNER_LEN: usize = 32;

/// `flags`: the data is one whole generation (cleared while a resync target).
pub const FLAG_CONSISTENT: u32 = 1;
/// `flags`: set while primary; found set at open, the node crashed as primary.
pub const FLAG_PRIMARY: u32 = 2;
/// `flags`: the node stopped cleanly (cleared when it starts).
pub const FLAG_CLEAN: u32 = 4;
/// `flags`: the node crashed as primary and its activity log has not yet been resynced
/// to a peer. Kept apart from PRIMARY because the node restarts as secondary (clearing
/// PRIMARY) and the fact must survive until a resync accounts for it.
pub const FLAG_CRASHED_PRIMARY: u32 = 8;
/// `flags`: the metadata is external: it lives on a device of its own (bitmaps from
/// byte 0), and the data is a whole other device. Written by create, never changed.
pub const FLAG_EXTERNAL: u32 = 16;
const KNOWN_FLAGS: u32 =
    FLAG_CONSISTENT | FLAG_PRIMARY | FLAG_CLEAN | FLAG_CRASHED_PRIMARY | FLAG_EXTERNAL;

/// Peer slot `flags`: the slot describes a peer.
pub const SLOT_IN_USE: u32 = 1;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 8;
const OFF_LENGTH: usize = OFF_VERSION + 4;
const OFF_UUID: usize = OFF_LENGTH + 4;
const OFF_NODE_ID: usize = OFF_UUID + 16;
const OFF_MAX_PEERS: usize = OFF_NODE_ID + 4;
const OFF_FLAGS: usize = OFF_MAX_PEERS + 4;
const OFF_BM_BLOCK: usize = OFF_FLAGS + 4;
const OFF_AL_EXTENT: usize = OFF_BM_BLOCK + 4;
const OFF_RESERVED1: usize = OFF_AL_EXTENT + 4;
const OFF_DATA_SIZE: usize = OFF_RESERVED1 + 4;
const OFF_BITMAP_OFFSET: usize = OFF_DATA_SIZE + 8;
const OFF_AL_OFFSET: usize = OFF_BITMAP_OFFSET + 8;
const OFF_CURRENT: usize = OFF_AL_OFFSET + 8;
const OFF_HISTORY: usize = OFF_CURRENT + 8;
const OFF_FENCE_EPOCH: usize = OFF_HISTORY + 16;
const OFF_SLOTS: usize = OFF_FENCE_EPOCH + 8;
const SLOT_NODE_ID: usize = 0;
const SLOT_FLAGS: usize = SLOT_NODE_ID + 4;
const SLOT_BITMAP_UUID: usize = SLOT_FLAGS + 4;
const SLOT_NAME: usize = SLOT_BITMAP_UUID + 8;
const SLOT_RESERVED: usize = SLOT_NAME + NAME_LEN;
const SLOT_SIZE: usize = SLOT_RESERVED + 16;
const OFF_FENCE_OWNER: usize = OFF_SLOTS + SLOTS * SLOT_SIZE;
const OFF_FENCE_INSTANCE: usize = OFF_FENCE_OWNER + OWNER_LEN;
const OFF_FENCE_GENERATION: usize = OFF_FENCE_INSTANCE + 8;
const OFF_RESERVED2: usize = OFF_FENCE_GENERATION + 8;
const OFF_CHECKSUM: usize = OFF_RESERVED2 + 60;
/// Where the checksum sits (the harnesses re-checksum mutated superblocks).
pub const CHECKSUM_AT: usize = OFF_CHECKSUM;
/// Bytes the checksum covers, checksum included.
pub const USED: usize = OFF_CHECKSUM + 4;

const _: () = {
    assert!(OFF_DATA_SIZE == 56);
    assert!(OFF_SLOTS == 112);
    assert!(SLOT_SIZE == 96);
    assert!(OFF_FENCE_OWNER == 400);
    assert!(OFF_FENCE_INSTANCE == 432);
    assert!(OFF_FENCE_GENERATION == 440);
    assert!(OFF_RESERVED2 == 448);
    assert!(USED == 512);
    assert!(USED <= SUPER_SIZE);
    assert!(SLOTS == MAX_PEERS as usize);
    assert!(SUPER_SIZE as u64 == SUPER_SIZE_U64);
};

/// Where everything is: on one backing device (internal), or the data on a data device
/// and the rest on a metadata device (external). Offsets are on the device that holds
/// the metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The metadata is on a device of its own.
    pub external: bool,
    /// Bytes of replicated data, from byte 0 (of the data device, when external).
    pub data_size: u64,
    pub bitmap_offset: u64,
    /// Bytes of one peer's bitmap (a multiple of 4096).
    pub bitmap_bytes: u64,
    pub al_offset: u64,
    /// Bytes of the activity log (a multiple of 4096).
    pub al_bytes: u64,
    pub super_offset: u64,
    pub bm_block: u32,
    pub al_extent: u32,
    pub max_peers: u32,
}

/// Bytes of an area of one bit per `unit` over `data` bytes, rounded up to a page.
fn area_bytes(data: u64, unit: u64) -> Option<u64> {
    let bits = data.div_ceil(unit);
    let bytes = bits.div_ceil(8);
    bytes.div_ceil(PAGE).checked_mul(PAGE)
}

/// Checks the geometry parameters; the message names the one that is wrong.
fn check_params(bm_block: u32, al_extent: u32, max_peers: u32) -> std::result::Result<(), String> {
    if !bm_block.is_power_of_two() || u64::from(bm_block) < PAGE {
        return Err(format!(
            "bm_block {bm_block} is not a power of two of at least 4096"
        ));
    }
    if !al_extent.is_power_of_two() || al_extent < bm_block {
        return Err(format!(
            "al_extent {al_extent} is not a power of two multiple of bm_block {bm_block}"
        ));
    }
    if !(1..=MAX_PEERS).contains(&max_peers) {
        return Err(format!("max_peers {max_peers} is not 1..={MAX_PEERS}"));
    }
    Ok(())
}

impl Layout {
    /// The layout for a data area of `data_size` bytes; `None` if an offset overflows.
    /// The bitmaps start at `data_size` (internal) or at 0 (external). `super_offset` is
    /// left at the end of the metadata; [`Layout::internal`], [`Layout::external`] and
    /// [`MetaStore::open`] put it at the end of the device.
    fn from_data_size(
        data_size: u64,
        external: bool,
        bm_block: u32,
        al_extent: u32,
        max_peers: u32,
    ) -> Option<Layout> {
        let bitmap_bytes = area_bytes(data_size, u64::from(bm_block))?;
        let al_bytes = area_bytes(data_size, u64::from(al_extent))?;
        let bitmap_offset = if external { 0 } else { data_size };
        let al_offset =
            bitmap_offset.checked_add(bitmap_bytes.checked_mul(u64::from(max_peers))?)?;
        let end = al_offset.checked_add(al_bytes)?;
        Some(Layout {
            external,
            data_size,
            bitmap_offset,
            bitmap_bytes,
            al_offset,
            al_bytes,
            super_offset: end,
            bm_block,
            al_extent,
            max_peers,
        })
    }

    /// Where the superblock of a device of `backing_size` bytes is: the last whole
    /// 4 KiB. `None` if the device is smaller than that.
    pub fn super_offset_for(backing_size: u64) -> Option<u64> {
        (backing_size / PAGE * PAGE).checked_sub(SUPER_SIZE_U64)
    }

    /// The largest data area that fits a backing device of `backing_size` bytes with
    /// its metadata. Refuses (saying how big the device must be) if not even one
    /// activity-log extent of data fits.
    pub fn internal(
        backing_size: u64,
        bm_block: u32,
        al_extent: u32,
        max_peers: u32,
    ) -> std::result::Result<Layout, String> {
        check_params(bm_block, al_extent, max_peers)?;
        let bm = u64::from(bm_block);
        let fits = |blocks: u64, limit: u64| {
            blocks
                .checked_mul(bm)
                .and_then(|d| Layout::from_data_size(d, false, bm_block, al_extent, max_peers))
                .is_some_and(|l| l.super_offset <= limit)
        };
        let min_data = u64::from(al_extent);
        let too_small = || {
            let need = Layout::from_data_size(min_data, false, bm_block, al_extent, max_peers)
                .and_then(|l| l.super_offset.checked_add(SUPER_SIZE_U64))
                .unwrap_or(u64::MAX);
            format!(
                "a device of {backing_size} bytes is too small: it has no room for one \
                 activity-log extent of data and replication metadata with {max_peers} \
                 peer(s); it must be at least {need} bytes"
            )
        };
        let Some(super_offset) = Layout::super_offset_for(backing_size) else {
            return Err(too_small());
        };
        // Data plus metadata grows with the data: the largest fitting block count by
        // bisection.
        let (mut lo, mut hi) = (0u64, super_offset / bm + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid, super_offset) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let data_size = lo * bm;
        if data_size < min_data {
            return Err(too_small());
        }
        let mut l = Layout::from_data_size(data_size, false, bm_block, al_extent, max_peers)
            .ok_or_else(too_small)?;
        l.super_offset = super_offset;
        Ok(l)
    }

    /// Bytes an external metadata device needs for a data device of `data_bytes` bytes:
    /// the bitmaps and the activity log, then the 4 KiB superblock.
    pub fn external_meta_size(
        data_bytes: u64,
        bm_block: u32,
        al_extent: u32,
        max_peers: u32,
    ) -> std::result::Result<u64, String> {
        check_params(bm_block, al_extent, max_peers)?;
        let data_size = data_bytes / u64::from(bm_block) * u64::from(bm_block);
        Layout::from_data_size(data_size, true, bm_block, al_extent, max_peers)
            .and_then(|l| l.super_offset.checked_add(SUPER_SIZE_U64))
            .ok_or_else(|| format!("a data device of {data_bytes} bytes is too large"))
    }

    /// External metadata: the data is the whole data device of `data_bytes` bytes,
    /// rounded down to `bm_block`; the bitmaps start at byte 0 of the metadata device of
    /// `meta_size` bytes, the activity log follows, the superblock is its last whole
    /// 4 KiB. Refuses (saying how big it must be) a metadata device too small for that.
    pub fn external(
        data_bytes: u64,
        meta_size: u64,
        bm_block: u32,
        al_extent: u32,
        max_peers: u32,
    ) -> std::result::Result<Layout, String> {
        check_params(bm_block, al_extent, max_peers)?;
        let bm = u64::from(bm_block);
        let data_size = data_bytes / bm * bm;
        if data_size == 0 {
            return Err(format!(
                "a data device of {data_bytes} bytes is smaller than one bitmap block \
                 ({bm_block} bytes)"
            ));
        }
        let need = Layout::external_meta_size(data_size, bm_block, al_extent, max_peers)?;
        let mut l = Layout::from_data_size(data_size, true, bm_block, al_extent, max_peers)
            .ok_or_else(|| format!("a data device of {data_bytes} bytes is too large"))?;
        match Layout::super_offset_for(meta_size) {
            Some(at) if l.super_offset <= at => {
                l.super_offset = at;
                Ok(l)
            }
            _ => Err(format!(
                "a metadata device of {meta_size} bytes is too small for {data_size} bytes \
                 of data with {max_peers} peer(s): it must be at least {need} bytes"
            )),
        }
    }

    /// Bits in one bitmap: data blocks of `bm_block` bytes.
    pub fn bits(&self) -> u64 {
        self.data_size.div_ceil(u64::from(self.bm_block))
    }

    /// Bits in the activity log: extents of `al_extent` bytes.
    pub fn al_extents(&self) -> u64 {
        self.data_size.div_ceil(u64::from(self.al_extent))
    }

    /// The bitmap bit of the data byte at `offset`.
    pub fn bit_of(&self, offset: u64) -> u64 {
        offset / u64::from(self.bm_block)
    }

    /// The data bytes bitmap bit `bit` covers (the last one may end at `data_size`).
    pub fn bytes_of_bit(&self, bit: u64) -> std::ops::Range<u64> {
        let bm = u64::from(self.bm_block);
        let start = bit.saturating_mul(bm).min(self.data_size);
        start..start.saturating_add(bm).min(self.data_size)
    }

    /// The activity-log extent of the data byte at `offset`.
    pub fn extent_of(&self, offset: u64) -> u64 {
        offset / u64::from(self.al_extent)
    }

    /// The data bytes activity-log extent `extent` covers.
    pub fn bytes_of_extent(&self, extent: u64) -> std::ops::Range<u64> {
        let al = u64::from(self.al_extent);
        let start = extent.saturating_mul(al).min(self.data_size);
        start..start.saturating_add(al).min(self.data_size)
    }

    /// The bitmap bits activity-log extent `extent` covers.
    pub fn bits_of_extent(&self, extent: u64) -> std::ops::Range<u64> {
        let per = u64::from(self.al_extent / self.bm_block);
        let start = extent.saturating_mul(per).min(self.bits());
        start..start.saturating_add(per).min(self.bits())
    }

    /// Byte offset of peer slot `slot`'s bitmap.
    pub fn bitmap_at(&self, slot: u32) -> u64 {
        self.bitmap_offset + u64::from(slot) * self.bitmap_bytes
    }
}

/// One peer slot of the superblock.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PeerSlot {
    /// The slot describes a peer; an unused slot is all zero.
    pub in_use: bool,
    pub node_id: u32,
    /// Generation this slot's bitmap started from; 0: none.
    pub bitmap_uuid: u64,
    /// Name or address hint, at most [`NAME_LEN`] bytes of UTF-8 without NUL.
    pub name: String,
}

/// The parsed superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Super {
    pub uuid: [u8; 16],
    pub node_id: u32,
    pub max_peers: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    pub bm_block: u32,
    pub al_extent: u32,
    pub data_size: u64,
    pub bitmap_offset: u64,
    pub al_offset: u64,
    pub current: u64,
    pub history: [u64; 2],
    pub fence_epoch: u64,
    /// The fencing token admitted last on the peer link (or stamped by this node as
    /// primary): its owner's node name, at most [`OWNER_LEN`] bytes of UTF-8 without
    /// NUL. The token's resource array is `uuid`. All three fence fields zero: none.
    pub fence_owner: String,
    /// The token owner's process instance.
    pub fence_instance: u64,
    /// The token's generation (epoch); never above `fence_epoch`.
    pub fence_generation: u64,
    /// Always [`MAX_PEERS`] slots; those at `max_peers` and beyond are unused.
    pub peers: [PeerSlot; SLOTS],
}

fn le32(b: &[u8; SUPER_SIZE], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8; SUPER_SIZE], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put32(b: &mut [u8; SUPER_SIZE], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8; SUPER_SIZE], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The CRC32C the superblock's checksum field must hold: over bytes `0..508`.
pub fn checksum(b: &[u8; SUPER_SIZE]) -> u32 {
    crc32c::crc32c(&b[..OFF_CHECKSUM])
}

impl Super {
    /// A fencing token is recorded (any of the fence fields is set).
    pub fn has_fence(&self) -> bool {
        !self.fence_owner.is_empty() || self.fence_instance != 0 || self.fence_generation != 0
    }

    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    pub fn set(&mut self, flag: u32, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    /// The generations as seen towards peer slot `slot` (current and history are the
    /// node's, the bitmap uuid the slot's). `None` for a slot out of range.
    pub fn generations(&self, slot: u32) -> Option<Generations> {
        let s = self.peers.get(usize::try_from(slot).ok()?)?;
        Some(Generations {
            current: self.current,
            bitmap: s.bitmap_uuid,
            history: self.history,
        })
    }

    /// Stores a view back: the node-wide fields and slot `slot`'s bitmap uuid.
    pub fn set_generations(
        &mut self,
        slot: u32,
        g: &Generations,
    ) -> std::result::Result<(), String> {
        let s = usize::try_from(slot)
            .ok()
            .and_then(|i| self.peers.get_mut(i))
            .ok_or_else(|| format!("peer slot {slot} does not exist"))?;
        s.bitmap_uuid = g.bitmap;
        self.current = g.current;
        self.history = g.history;
        Ok(())
    }

    /// The layout the recorded fields derive (super_offset is the end of the metadata,
    /// not yet placed on a device).
    fn derived(&self) -> std::result::Result<Layout, String> {
        check_params(self.bm_block, self.al_extent, self.max_peers)?;
        if self.data_size == 0 || !self.data_size.is_multiple_of(u64::from(self.bm_block)) {
            return Err(format!(
                "data_size {} is not a positive multiple of bm_block {}",
                self.data_size, self.bm_block
            ));
        }
        Layout::from_data_size(
            self.data_size,
            self.has(FLAG_EXTERNAL),
            self.bm_block,
            self.al_extent,
            self.max_peers,
        )
        .ok_or_else(|| format!("data_size {} makes the offsets overflow", self.data_size))
    }

    /// Every rule a superblock must keep, whether decoded or about to be written.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(format!("unknown flags {:#x}", self.flags & !KNOWN_FLAGS));
        }
        let l = self.derived()?;
        if self.bitmap_offset != l.bitmap_offset {
            return Err(if l.external {
                format!(
                    "bitmap_offset {} is not 0 (the metadata is external)",
                    self.bitmap_offset
                )
            } else {
                format!(
                    "bitmap_offset {} is not data_size {}",
                    self.bitmap_offset, l.bitmap_offset
                )
            });
        }
        if self.al_offset != l.al_offset {
            return Err(format!(
                "al_offset {} is not the {} the layout gives",
                self.al_offset, l.al_offset
            ));
        }
        if self.node_id > self.max_peers {
            return Err(format!(
                "node_id {} is not 0..={} (max_peers {})",
                self.node_id, self.max_peers, self.max_peers
            ));
        }
        if self.current == 0 {
            return Err("current generation is 0".into());
        }
        for (name, id) in [
            ("current", self.current),
            ("history[0]", self.history[0]),
            ("history[1]", self.history[1]),
        ] {
            if id & 1 != 0 {
                return Err(format!("{name} {id:#x} has the reserved low bit set"));
            }
        }
        if self.current == JUST_CREATED && self.history != [0, 0] {
            return Err("current is JUST_CREATED but the history is not empty".into());
        }
        if self.fence_owner.len() > OWNER_LEN || self.fence_owner.contains('\0') {
            return Err(format!(
                "fence_owner is longer than {OWNER_LEN} bytes or holds a NUL"
            ));
        }
        if self.fence_epoch == u64::MAX {
            return Err(format!(
                "fence_epoch is at its maximum ({}): the next connection or promotion \
                 could not take a new one",
                self.fence_epoch
            ));
        }
        if self.fence_generation > self.fence_epoch {
            return Err(format!(
                "fence_generation {} is above fence_epoch {}",
                self.fence_generation, self.fence_epoch
            ));
        }
        if self.has_fence() && self.uuid == [0; 16] {
            return Err(
                "fence_owner: a fencing token is recorded but the resource uuid is zero".into(),
            );
        }
        for (k, s) in self.peers.iter().enumerate() {
            let used_ok = u32::try_from(k).is_ok_and(|k| k < self.max_peers);
            if !s.in_use {
                if *s != PeerSlot::default() {
                    return Err(format!("peer slot {k} is unused but not zero"));
                }
                continue;
            }
            if !used_ok {
                return Err(format!(
                    "peer slot {k} is in use but max_peers is {}",
                    self.max_peers
                ));
            }
            if s.node_id > self.max_peers || s.node_id == self.node_id {
                return Err(format!(
                    "peer slot {k}: node_id {} is not 0..={} or is this node's",
                    s.node_id, self.max_peers
                ));
            }
            if self.peers[..k]
                .iter()
                .any(|o| o.in_use && o.node_id == s.node_id)
            {
                return Err(format!(
                    "peer slot {k}: node_id {} is used by another slot",
                    s.node_id
                ));
            }
            if s.bitmap_uuid & 1 != 0 {
                return Err(format!(
                    "peer slot {k}: bitmap uuid {:#x} has the reserved low bit set",
                    s.bitmap_uuid
                ));
            }
            if s.name.len() > NAME_LEN || s.name.contains('\0') {
                return Err(format!(
                    "peer slot {k}: name is longer than {NAME_LEN} bytes or holds a NUL"
                ));
            }
        }
        Ok(())
    }

    /// The superblock as written. Call [`Super::validate`] first: a name longer than
    /// [`NAME_LEN`] is cut here rather than panicking.
    pub fn encode(&self) -> [u8; SUPER_SIZE] {
        let mut b = [0u8; SUPER_SIZE];
        b[OFF_MAGIC..OFF_VERSION].copy_from_slice(&MAGIC);
        put32(&mut b, OFF_VERSION, VERSION);
        put32(&mut b, OFF_LENGTH, 512);
        b[OFF_UUID..OFF_NODE_ID].copy_from_slice(&self.uuid);
        put32(&mut b, OFF_NODE_ID, self.node_id);
        put32(&mut b, OFF_MAX_PEERS, self.max_peers);
        put32(&mut b, OFF_FLAGS, self.flags);
        put32(&mut b, OFF_BM_BLOCK, self.bm_block);
        put32(&mut b, OFF_AL_EXTENT, self.al_extent);
        put64(&mut b, OFF_DATA_SIZE, self.data_size);
        put64(&mut b, OFF_BITMAP_OFFSET, self.bitmap_offset);
        put64(&mut b, OFF_AL_OFFSET, self.al_offset);
        put64(&mut b, OFF_CURRENT, self.current);
        put64(&mut b, OFF_HISTORY, self.history[0]);
        put64(&mut b, OFF_HISTORY + 8, self.history[1]);
        put64(&mut b, OFF_FENCE_EPOCH, self.fence_epoch);
        let owner = self.fence_owner.as_bytes();
        let n = owner.len().min(OWNER_LEN);
        b[OFF_FENCE_OWNER..OFF_FENCE_OWNER + n].copy_from_slice(&owner[..n]);
        put64(&mut b, OFF_FENCE_INSTANCE, self.fence_instance);
        put64(&mut b, OFF_FENCE_GENERATION, self.fence_generation);
        for (k, s) in self.peers.iter().enumerate() {
            let at = OFF_SLOTS + k * SLOT_SIZE;
            put32(&mut b, at + SLOT_NODE_ID, s.node_id);
            put32(
                &mut b,
                at + SLOT_FLAGS,
                if s.in_use { SLOT_IN_USE } else { 0 },
            );
            put64(&mut b, at + SLOT_BITMAP_UUID, s.bitmap_uuid);
            let name = s.name.as_bytes();
            let n = name.len().min(NAME_LEN);
            b[at + SLOT_NAME..at + SLOT_NAME + n].copy_from_slice(&name[..n]);
        }
        let crc = crc32c::crc32c(&b[..OFF_CHECKSUM]);
        put32(&mut b, OFF_CHECKSUM, crc);
        b
    }

    /// Parses and validates a superblock; the message names the field that is wrong.
    pub fn decode(b: &[u8; SUPER_SIZE]) -> std::result::Result<Super, String> {
        if b[OFF_MAGIC..OFF_VERSION] != MAGIC {
            return Err("no CAIRNRPL magic".into());
        }
        let crc = le32(b, OFF_CHECKSUM);
        let want = checksum(b);
        if crc != want {
            return Err(format!("checksum {crc:#010x}, computed {want:#010x}"));
        }
        let version = le32(b, OFF_VERSION);
        if version != VERSION {
            return Err(format!("version {version} is not {VERSION}"));
        }
        let length = le32(b, OFF_LENGTH);
        if u64::from(length) != USED as u64 {
            return Err(format!("length {length} is not {USED}"));
        }
        if le32(b, OFF_RESERVED1) != 0 || b[OFF_RESERVED2..OFF_CHECKSUM].iter().any(|&x| x != 0) {
            return Err("reserved bytes are not zero".into());
        }
        if b[USED..].iter().any(|&x| x != 0) {
            return Err(format!("bytes {USED}..{SUPER_SIZE} are not zero"));
        }
        let mut peers: [PeerSlot; SLOTS] = Default::default();
        for (k, p) in peers.iter_mut().enumerate() {
            let at = OFF_SLOTS + k * SLOT_SIZE;
            let flags = le32(b, at + SLOT_FLAGS);
            if flags & !SLOT_IN_USE != 0 {
                return Err(format!("peer slot {k}: unknown flags {flags:#x}"));
            }
            if b[at + SLOT_RESERVED..at + SLOT_SIZE]
                .iter()
                .any(|&x| x != 0)
            {
                return Err(format!("peer slot {k}: reserved bytes are not zero"));
            }
            let raw = &b[at + SLOT_NAME..at + SLOT_RESERVED];
            let len = raw.iter().position(|&x| x == 0).unwrap_or(NAME_LEN);
            if raw[len..].iter().any(|&x| x != 0) {
                return Err(format!("peer slot {k}: name is not NUL padded"));
            }
            let name = std::str::from_utf8(&raw[..len])
                .map_err(|_| format!("peer slot {k}: name is not UTF-8"))?;
            *p = PeerSlot {
                in_use: flags & SLOT_IN_USE != 0,
                node_id: le32(b, at + SLOT_NODE_ID),
                bitmap_uuid: le64(b, at + SLOT_BITMAP_UUID),
                name: name.to_owned(),
            };
        }
        let raw = &b[OFF_FENCE_OWNER..OFF_FENCE_INSTANCE];
        let len = raw.iter().position(|&x| x == 0).unwrap_or(OWNER_LEN);
        if raw[len..].iter().any(|&x| x != 0) {
            return Err("fence_owner is not NUL padded".into());
        }
        let fence_owner = std::str::from_utf8(&raw[..len])
            .map_err(|_| "fence_owner is not UTF-8".to_string())?
            .to_owned();
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[OFF_UUID..OFF_NODE_ID]);
        let s = Super {
            uuid,
            node_id: le32(b, OFF_NODE_ID),
            max_peers: le32(b, OFF_MAX_PEERS),
            flags: le32(b, OFF_FLAGS),
            bm_block: le32(b, OFF_BM_BLOCK),
            al_extent: le32(b, OFF_AL_EXTENT),
            data_size: le64(b, OFF_DATA_SIZE),
            bitmap_offset: le64(b, OFF_BITMAP_OFFSET),
            al_offset: le64(b, OFF_AL_OFFSET),
            current: le64(b, OFF_CURRENT),
            history: [le64(b, OFF_HISTORY), le64(b, OFF_HISTORY + 8)],
            fence_epoch: le64(b, OFF_FENCE_EPOCH),
            fence_owner,
            fence_instance: le64(b, OFF_FENCE_INSTANCE),
            fence_generation: le64(b, OFF_FENCE_GENERATION),
            peers,
        };
        s.validate()?;
        Ok(s)
    }
}

/// What `create-md` needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateParams {
    /// The resource's id; zero: not yet known (the data path records it when the
    /// resource first runs on this device).
    pub uuid: [u8; 16],
    pub node_id: u32,
    pub max_peers: u32,
    pub bm_block: u32,
    pub al_extent: u32,
    /// Up to `max_peers` slots, in slot order.
    pub peers: Vec<PeerSlot>,
    /// Start CONSISTENT: the blank device counts as one whole generation, so replicas
    /// created alike need no initial sync (both JUST_CREATED and consistent: in sync).
    pub consistent: bool,
}

impl CreateParams {
    /// Defaults: 4 KiB per bitmap bit, 4 MiB per activity-log extent, no peers yet.
    pub fn new(uuid: [u8; 16], node_id: u32, max_peers: u32) -> CreateParams {
        CreateParams {
            uuid,
            node_id,
            max_peers,
            bm_block: DEFAULT_BM_BLOCK,
            al_extent: DEFAULT_AL_EXTENT,
            peers: Vec::new(),
            consistent: false,
        }
    }
}

fn invalid(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, m)
}

/// The metadata of one backing device: its layout, and the reads and writes of its
/// superblock, bitmaps and activity log. Holds no device: each call takes it, so the
/// owner of the device (the replicated device, or a CLI command) decides its lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaStore {
    layout: Layout,
}

impl MetaStore {
    pub fn new(layout: Layout) -> MetaStore {
        MetaStore { layout }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Metadata I/O is in whole 4 KiB pages; a device whose sector is larger (or does
    /// not divide 4096) cannot take it.
    fn check_device(dev: &dyn BlockDevice) -> Result<()> {
        let lbs = dev.geometry().logical_block_size;
        if lbs == 0 || !PAGE.is_multiple_of(u64::from(lbs)) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("logical block size {lbs} does not divide 4096"),
            ));
        }
        Ok(())
    }

    /// Writes fresh internal metadata at the end of `dev`: bitmaps and activity log
    /// zeroed (made durable first), then the superblock (FUA), so a crash in between
    /// leaves no superblock over stale bitmaps. Current is JUST_CREATED, consistent only
    /// if the params say so; CLEAN is set, as nothing runs yet. Overwrites any metadata
    /// there: the caller asks first.
    pub fn create(dev: &dyn BlockDevice, params: &CreateParams) -> Result<(MetaStore, Super)> {
        Self::check_device(dev)?;
        let size = dev.geometry().size;
        let layout = Layout::internal(size, params.bm_block, params.al_extent, params.max_peers)
            .map_err(invalid)?;
        Self::write_fresh(dev, layout, params)
    }

    /// As [`MetaStore::create`], but external: the metadata goes on `meta`, for a data
    /// device of `data_bytes` bytes (all of it data, rounded down to `bm_block`). The
    /// superblock records EXTERNAL and the data size.
    pub fn create_external(
        meta: &dyn BlockDevice,
        data_bytes: u64,
        params: &CreateParams,
    ) -> Result<(MetaStore, Super)> {
        Self::check_device(meta)?;
        let layout = Layout::external(
            data_bytes,
            meta.geometry().size,
            params.bm_block,
            params.al_extent,
            params.max_peers,
        )
        .map_err(invalid)?;
        Self::write_fresh(meta, layout, params)
    }

    fn write_fresh(
        dev: &dyn BlockDevice,
        layout: Layout,
        params: &CreateParams,
    ) -> Result<(MetaStore, Super)> {
        if params.peers.len() > usize::try_from(params.max_peers).unwrap_or(SLOTS) {
            return Err(invalid(format!(
                "{} peers given but max_peers is {}",
                params.peers.len(),
                params.max_peers
            )));
        }
        let mut peers: [PeerSlot; SLOTS] = Default::default();
        for (slot, p) in peers.iter_mut().zip(&params.peers) {
            *slot = p.clone();
        }
        let sb = Super {
            uuid: params.uuid,
            node_id: params.node_id,
            max_peers: params.max_peers,
            flags: FLAG_CLEAN
                | if params.consistent {
                    FLAG_CONSISTENT
                } else {
                    0
                }
                | if layout.external { FLAG_EXTERNAL } else { 0 },
            bm_block: params.bm_block,
            al_extent: params.al_extent,
            data_size: layout.data_size,
            bitmap_offset: layout.bitmap_offset,
            al_offset: layout.al_offset,
            current: JUST_CREATED,
            history: [0, 0],
            fence_epoch: 0,
            fence_owner: String::new(),
            fence_instance: 0,
            fence_generation: 0,
            peers,
        };
        sb.validate().map_err(invalid)?;
        let end = layout.al_offset + layout.al_bytes;
        dev.write_zeroes(
            layout.bitmap_offset,
            end - layout.bitmap_offset,
            WriteFlags::NONE,
        )
        .map_err(|e| e.context("zeroing the replication bitmaps and activity log"))?;
        dev.flush()?;
        let store = MetaStore { layout };
        store.write_super(dev, &sb)?;
        Ok((store, sb))
    }

    /// Reads and checks the metadata at the end of `dev`, internal or external (the
    /// superblock says which: [`Layout::external`]). For internal metadata the recorded
    /// data size must be what the device's size gives; the size of an external one's
    /// data device is the caller's to check.
    pub fn open(dev: &dyn BlockDevice) -> Result<(MetaStore, Super)> {
        Self::check_device(dev)?;
        let size = dev.geometry().size;
        let missing = || {
            Error::new(
                ErrorKind::NotFound,
                "no cairn replication metadata at the end of the device \
                 (create it with cairn repl create-md)",
            )
        };
        let at = Layout::super_offset_for(size).ok_or_else(missing)?;
        let mut b = [0u8; SUPER_SIZE];
        dev.read_at(&mut b, at)?;
        if b[..MAGIC.len()] != MAGIC {
            return Err(missing());
        }
        let sb = Super::decode(&b).map_err(|m| {
            Error::new(
                ErrorKind::Corrupt,
                format!("damaged replication superblock: {m}"),
            )
        })?;
        if sb.has(FLAG_EXTERNAL) {
            let want =
                Layout::external(sb.data_size, size, sb.bm_block, sb.al_extent, sb.max_peers)
                    .map_err(|m| {
                        Error::new(
                            ErrorKind::Corrupt,
                            format!("external replication metadata does not fit its device: {m}"),
                        )
                    })?;
            return Ok((MetaStore { layout: want }, sb));
        }
        let want =
            Layout::internal(size, sb.bm_block, sb.al_extent, sb.max_peers).map_err(|m| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("replication superblock does not fit the device: {m}"),
                )
            })?;
        if want.data_size != sb.data_size {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the replication metadata records {} bytes of data, but a device of \
                     {size} bytes holds {} (was the device resized or the superblock copied?)",
                    sb.data_size, want.data_size
                ),
            ));
        }
        Ok((MetaStore { layout: want }, sb))
    }

    /// Writes the superblock, durable (FUA) when it returns. Refuses one that breaks a
    /// rule or does not match this layout.
    pub fn write_super(&self, dev: &dyn BlockDevice, sb: &Super) -> Result<()> {
        sb.validate()
            .map_err(|m| invalid(format!("refusing to write a replication superblock: {m}")))?;
        let l = &self.layout;
        if (
            sb.has(FLAG_EXTERNAL),
            sb.data_size,
            sb.bm_block,
            sb.al_extent,
            sb.max_peers,
        ) != (
            l.external,
            l.data_size,
            l.bm_block,
            l.al_extent,
            l.max_peers,
        ) {
            return Err(invalid(
                "replication superblock does not match the device's layout",
            ));
        }
        dev.write_at(&sb.encode(), l.super_offset, WriteFlags::FUA)
    }

    fn slot_area(&self, slot: u32) -> Result<(u64, u64, u64)> {
        if slot >= self.layout.max_peers {
            return Err(invalid(format!(
                "peer slot {slot} does not exist (max_peers {})",
                self.layout.max_peers
            )));
        }
        Ok((
            self.layout.bitmap_at(slot),
            self.layout.bitmap_bytes,
            self.layout.bits(),
        ))
    }

    fn al_area(&self) -> (u64, u64, u64) {
        (
            self.layout.al_offset,
            self.layout.al_bytes,
            self.layout.al_extents(),
        )
    }

    /// Peer slot `slot`'s bitmap: `bitmap_bytes / 8` words, padding bits cleared.
    pub fn read_bitmap(&self, dev: &dyn BlockDevice, slot: u32) -> Result<Vec<u64>> {
        let (at, bytes, bits) = self.slot_area(slot)?;
        read_area(dev, at, bytes, bits)
    }

    /// Writes the pages of peer slot `slot`'s bitmap that hold words
    /// `first_word .. first_word + n_words`, taken from `words` (the whole bitmap, as
    /// [`MetaStore::read_bitmap`] returns it), in one FUA write: durable when it returns.
    pub fn write_bitmap_range(
        &self,
        dev: &dyn BlockDevice,
        slot: u32,
        words: &[u64],
        first_word: u64,
        n_words: u64,
    ) -> Result<()> {
        let (at, bytes, _) = self.slot_area(slot)?;
        write_area(dev, at, bytes, words, first_word, n_words)
    }

    /// Writes whole pages of peer slot `slot`'s bitmap, given as (page index, its
    /// words): at most 512 words a page, fewer meaning the rest of the page is zero.
    /// Bits past the last data block are written as zero. Everything is checked before
    /// anything is written. Durable when it returns: one FUA write when the pages are
    /// one consecutive run, otherwise one plain write per run and a flush.
    pub fn write_bitmap_pages(
        &self,
        dev: &dyn BlockDevice,
        slot: u32,
        pages: &[(u64, &[u64])],
    ) -> Result<()> {
        let (at, bytes, bits) = self.slot_area(slot)?;
        let n_pages = bytes / PAGE;
        // Runs of consecutive pages: (first page, bytes).
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for &(page, words) in pages {
            if page >= n_pages {
                return Err(Error::new(
                    ErrorKind::OutOfRange,
                    format!("bitmap page {page} past the {n_pages} of peer slot {slot}"),
                ));
            }
            if words.len() as u64 > WORDS_PER_PAGE {
                return Err(invalid(format!(
                    "{} words given for a bitmap page of {WORDS_PER_PAGE}",
                    words.len()
                )));
            }
            let mut w = words.to_vec();
            w.resize(PAGE_WORDS, 0);
            clear_padding(&mut w, page * WORDS_PER_PAGE, bits);
            let b = w.iter().flat_map(|x| x.to_le_bytes());
            match runs.last_mut() {
                Some((first, buf)) if *first + buf.len() as u64 / PAGE == page => buf.extend(b),
                _ => runs.push((page, b.collect())),
            }
        }
        match runs.as_slice() {
            [] => Ok(()),
            [(first, buf)] => dev.write_at(buf, at + first * PAGE, WriteFlags::FUA),
            _ => {
                for (first, buf) in &runs {
                    dev.write_at(buf, at + first * PAGE, WriteFlags::NONE)?;
                }
                dev.flush()
            }
        }
    }

    /// The activity log: `al_bytes / 8` words, padding bits cleared.
    pub fn read_al(&self, dev: &dyn BlockDevice) -> Result<Vec<u64>> {
        let (at, bytes, bits) = self.al_area();
        read_area(dev, at, bytes, bits)
    }

    /// Writes the activity-log pages holding words `first_word .. first_word +
    /// n_words` from `words`, one FUA write: durable when it returns, so a data write
    /// issued after it is covered.
    pub fn write_al(
        &self,
        dev: &dyn BlockDevice,
        words: &[u64],
        first_word: u64,
        n_words: u64,
    ) -> Result<()> {
        let (at, bytes, _) = self.al_area();
        write_area(dev, at, bytes, words, first_word, n_words)
    }
}

const WORDS_PER_PAGE: u64 = PAGE / 8;
const PAGE_WORDS: usize = 512;
const _: () = assert!(PAGE_WORDS as u64 == WORDS_PER_PAGE);

fn read_area(dev: &dyn BlockDevice, at: u64, bytes: u64, bits: u64) -> Result<Vec<u64>> {
    let len = usize::try_from(bytes).map_err(|_| invalid("bitmap larger than memory"))?;
    let mut buf = vec![0u8; len];
    dev.read_at(&mut buf, at)?;
    let mut words: Vec<u64> = buf
        .chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect();
    // Bits past the last data block mean nothing: cleared so counts stay exact.
    clear_padding(&mut words, 0, bits);
    Ok(words)
}

/// Clears the bits at or past `bits` in `words`, the area's words from `first_word` on.
fn clear_padding(words: &mut [u64], first_word: u64, bits: u64) {
    for (k, w) in words.iter_mut().enumerate() {
        let start = (first_word + k as u64).saturating_mul(64);
        if start >= bits {
            *w = 0;
        } else if bits - start < 64 {
            *w &= (1u64 << (bits - start)) - 1;
        }
    }
}

fn write_area(
    dev: &dyn BlockDevice,
    at: u64,
    bytes: u64,
    words: &[u64],
    first_word: u64,
    n_words: u64,
) -> Result<()> {
    let total = bytes / 8;
    if words.len() as u64 != total {
        return Err(invalid(format!(
            "{} words given for an area of {total}",
            words.len()
        )));
    }
    let end = first_word
        .checked_add(n_words)
        .filter(|&e| e <= total)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::OutOfRange,
                format!("words {first_word}+{n_words} past the {total} of the area"),
            )
        })?;
    if n_words == 0 {
        return Ok(());
    }
    let first_page = first_word / WORDS_PER_PAGE;
    let end_page = end.div_ceil(WORDS_PER_PAGE);
    let lo = usize::try_from(first_page * WORDS_PER_PAGE).map_err(|_| invalid("range"))?;
    let hi = usize::try_from(end_page * WORDS_PER_PAGE).map_err(|_| invalid("range"))?;
    let buf: Vec<u8> = words[lo..hi].iter().flat_map(|w| w.to_le_bytes()).collect();
    dev.write_at(&buf, at + first_page * PAGE, WriteFlags::FUA)
}

#[cfg(test)]
mod tests;
