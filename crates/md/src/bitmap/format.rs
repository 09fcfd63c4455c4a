//! md's internal write-intent bitmap on disk (ondisk-formats.md §1.8): `bitmap_super_t`,
//! the little-endian bits after it, and what `mdadm --create --bitmap=internal` writes.
//! Pure functions over bytes; the running bitmap (`bitmap.rs`) does the I/O.
//!
//! ```text
//!   member: 4096 superblock │ 8192 bitmap_super_t (256 B) + bits, 4 KiB blocks │ bblog │ data
//!                            bit c lives in byte 256 + c/8 of the area, block_of(c)
//! ```
//!
//! The header stays a `raw_struct!` (ondisk.rs): its field table is the kernel's C
//! struct, with the offsets checked against it when compiling.

use std::mem::size_of;

use cairn_block::{Error, ErrorKind, Result};

use crate::level::Level;
use crate::ondisk::{raw_struct, Le32, Le64, RawField, Uuid};
use crate::units::{small, wide, Sectors, SECTOR_SIZE};

/// `BITMAP_MAGIC`: "bitm" read as a little-endian `u32`.
pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// `BITMAP_MAJOR_HI`: what mdadm writes for v1.x superblocks.
pub const BITMAP_VERSION: u32 = 4;
/// `BITMAP_MAJOR_LO`: the oldest version; little-endian bits unless `HOSTENDIAN`.
pub const BITMAP_VERSION_LO: u32 = 3;
/// The header before the bits.
pub const HEADER_SIZE: usize = 256;
/// The area is rounded to, and written in, blocks of this many bytes
/// (`calc_bitmap_size(…, 4096)`).
pub const BLOCK: u64 = 4096;
/// mdadm's `DEFAULT_BITMAP_DELAY`, seconds.
pub const DEFAULT_DAEMON_SLEEP: u32 = 5;
/// mdadm's default bitmap chunk floor: 64 MiB.
pub const DEFAULT_MIN_CHUNK: u64 = 64 << 20;
/// The kernel's `COUNTER_MAX`: the write-behind limit.
pub const MAX_WRITE_BEHIND: u32 = 16383;
/// Sectors from the v1.2 superblock to the bitmap, as mdadm places it.
pub const BITMAP_OFFSET_1_2: i32 = 8;

/// `enum bitmap_state` bits in `state`.
pub mod state {
    pub const STALE: u32 = 1 << 1;
    pub const WRITE_ERROR: u32 = 1 << 2;
    pub const FIRST_USE: u32 = 1 << 3;
    pub const CLEAN: u32 = 1 << 4;
    pub const DAEMON_BUSY: u32 = 1 << 5;
    pub const HOSTENDIAN: u32 = 1 << 15;
}

raw_struct! {
    /// `bitmap_super_t` (kernel `md-bitmap.h`, mdadm `bitmap.h`), 256 bytes.
    pub struct RawBitmapSuper {
        pub magic: Le32,
        pub version: Le32,
        pub uuid: [u8; 16],
        pub events: Le64,
        pub events_cleared: Le64,
        pub sync_size: Le64,
        pub state: Le32,
        pub chunksize: Le32,
        pub daemon_sleep: Le32,
        pub write_behind: Le32,
        pub sectors_reserved: Le32,
        pub nodes: Le32,
        pub cluster_name: [u8; 64],
        pub pad: [u8; 120],
    }
}

const _: () = assert!(size_of::<RawBitmapSuper>() == HEADER_SIZE);
const _: () = assert!(std::mem::offset_of!(RawBitmapSuper, events) == 24);
const _: () = assert!(std::mem::offset_of!(RawBitmapSuper, sync_size) == 40);
const _: () = assert!(std::mem::offset_of!(RawBitmapSuper, chunksize) == 52);
const _: () = assert!(std::mem::offset_of!(RawBitmapSuper, cluster_name) == 72);
const _: () = assert!(std::mem::offset_of!(RawBitmapSuper, pad) == 136);

/// A parsed, validated bitmap header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapSuper {
    pub version: u32,
    pub uuid: Uuid,
    /// The array's event count when the bitmap was last written.
    pub events: u64,
    /// The event count when bits were last cleared.
    pub events_cleared: u64,
    /// Sectors covered by the bits.
    pub sync_size: Sectors,
    pub state: u32,
    /// Bytes covered by one bit: a power of two, at least 512.
    pub chunk_bytes: u32,
    /// Seconds between clearing passes.
    pub daemon_sleep: u32,
    pub write_behind: u32,
    pub sectors_reserved: u32,
    pub nodes: u32,
    pub cluster_name: [u8; 64],
}

pub(crate) fn corrupt(member: &str, detail: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("{member}: bitmap superblock: {detail}"),
    )
}

impl BitmapSuper {
    /// A new header as mdadm writes it (`add_internal_bitmap1`), at array events
    /// `events`.
    pub fn new(uuid: Uuid, sync_size: Sectors, chunk_bytes: u32, events: u64) -> BitmapSuper {
        BitmapSuper {
            version: BITMAP_VERSION,
            uuid,
            events,
            events_cleared: 0,
            sync_size,
            state: 0,
            chunk_bytes,
            daemon_sleep: DEFAULT_DAEMON_SLEEP,
            write_behind: 0,
            sectors_reserved: 0,
            nodes: 0,
            cluster_name: [0; 64],
        }
    }

    /// Parses and checks the header at the start of `bytes` with the kernel's
    /// acceptance rules (`md_bitmap_read_sb`), refusing what cairn does not implement
    /// (clustered and lockless bitmaps, host-endian bits). `member` names the device.
    pub fn parse(bytes: &[u8], member: &str) -> Result<BitmapSuper> {
        let head: &[u8; HEADER_SIZE] = bytes
            .get(..HEADER_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt(member, format!("only {} bytes", bytes.len())))?;
        let raw = RawBitmapSuper::read_from(head);
        if raw.magic.get() != BITMAP_MAGIC {
            return Err(corrupt(
                member,
                format!(
                    "bad magic {:08x} (expected {BITMAP_MAGIC:08x})",
                    raw.magic.get()
                ),
            ));
        }
        let version = raw.version.get();
        let st = raw.state.get();
        let unsupported = |what: String| {
            Error::new(
                ErrorKind::Unsupported,
                format!("{member}: bitmap: {what} (cairn implements version 4 bitmaps)"),
            )
        };
        match version {
            BITMAP_VERSION_LO | BITMAP_VERSION => {}
            5 => return Err(unsupported("a clustered bitmap (version 5)".into())),
            6 => return Err(unsupported("a lockless bitmap (version 6)".into())),
            v => return Err(corrupt(member, format!("unknown version {v}"))),
        }
        if st & state::HOSTENDIAN != 0 {
            return Err(unsupported("host-endian bits".into()));
        }
        let chunk = raw.chunksize.get();
        if chunk < 512 || !chunk.is_power_of_two() {
            return Err(corrupt(
                member,
                format!("chunk size {chunk} is not a power of two of at least 512"),
            ));
        }
        let daemon_sleep = raw.daemon_sleep.get();
        if daemon_sleep == 0 || daemon_sleep > 24 * 3600 {
            return Err(corrupt(
                member,
                format!("daemon sleep {daemon_sleep}s out of range"),
            ));
        }
        let write_behind = raw.write_behind.get();
        if write_behind > MAX_WRITE_BEHIND {
            return Err(corrupt(
                member,
                format!("write-behind limit {write_behind} out of range (0 - {MAX_WRITE_BEHIND})"),
            ));
        }
        let nodes = raw.nodes.get();
        if nodes != 0 {
            return Err(unsupported(format!("a bitmap for {nodes} cluster nodes")));
        }
        let events = raw.events.get();
        let events_cleared = raw.events_cleared.get();
        let sb = BitmapSuper {
            version,
            uuid: Uuid(raw.uuid),
            events,
            events_cleared,
            sync_size: Sectors(raw.sync_size.get()),
            state: st,
            chunk_bytes: chunk,
            daemon_sleep,
            write_behind,
            sectors_reserved: raw.sectors_reserved.get(),
            nodes,
            cluster_name: raw.cluster_name,
        };
        // The area must be addressable: bits and bytes computed without overflow.
        sb.area_bytes()
            .ok_or_else(|| corrupt(member, format!("sync size {} overflows", sb.sync_size.0)))?;
        Ok(sb)
    }

    /// The 256 header bytes.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let raw = RawBitmapSuper {
            magic: Le32::new(BITMAP_MAGIC),
            version: Le32::new(self.version),
            uuid: self.uuid.0,
            events: Le64::new(self.events),
            events_cleared: Le64::new(self.events_cleared),
            sync_size: Le64::new(self.sync_size.0),
            state: Le32::new(self.state),
            chunksize: Le32::new(self.chunk_bytes),
            daemon_sleep: Le32::new(self.daemon_sleep),
            write_behind: Le32::new(self.write_behind),
            sectors_reserved: Le32::new(self.sectors_reserved),
            nodes: Le32::new(self.nodes),
            cluster_name: self.cluster_name,
            pad: [0; 120],
        };
        let mut out = [0u8; HEADER_SIZE];
        raw.write_to(&mut out);
        out
    }

    /// Bits in the map: `ceil(sync_size * 512 / chunk)` (mdadm `bitmap_bits`).
    pub fn chunks(&self) -> Option<u64> {
        let bytes = self.sync_size.0.checked_mul(SECTOR_SIZE)?;
        Some(bytes.div_ceil(u64::from(self.chunk_bytes)))
    }

    /// Bytes of the on-disk area: header plus bits, rounded up to [`BLOCK`].
    pub fn area_bytes(&self) -> Option<u64> {
        let bits = self.chunks()?;
        let raw = bits.div_ceil(8).checked_add(wide(HEADER_SIZE))?;
        raw.checked_next_multiple_of(BLOCK)
    }

    /// The area mdadm writes at create (`write_bitmap1`): the header, then every bit
    /// set (`dirty`: the first assembly resyncs everything) or none.
    pub fn initial_area(&self, dirty: bool) -> Vec<u8> {
        let len = small(self.area_bytes().expect("checked when made"));
        let mut area = vec![if dirty { 0xff } else { 0 }; len];
        area[..HEADER_SIZE].copy_from_slice(&self.encode());
        area
    }
}

/// Little-endian bit `i` of `bits` (kernel `test_bit_le`).
pub(crate) fn test_bit(bits: &[u8], i: u64) -> bool {
    bits[small(i / 8)] & (1 << (i % 8)) != 0
}

pub(crate) fn set_bit(bits: &mut [u8], i: u64, on: bool) {
    let b = &mut bits[small(i / 8)];
    if on {
        *b |= 1 << (i % 8);
    } else {
        *b &= !(1 << (i % 8));
    }
}

/// Whether to give a new array a bitmap (mdadm `--bitmap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitmapChoice {
    /// No bitmap: a crash resyncs the whole array.
    None,
    /// An internal bitmap after the superblock. `chunk_bytes`: bytes per bit (mdadm
    /// `--bitmap-chunk`); `None` for mdadm's default (at least 64 MiB).
    Internal { chunk_bytes: Option<u64> },
}

impl BitmapChoice {
    /// mdadm's choice for `level` when nothing is asked for, in cairn: internal for the
    /// redundant levels (a bitmap has nothing to say about RAID0 or linear).
    pub fn default_for(level: Level) -> BitmapChoice {
        if matches!(level, Level::Linear | Level::Raid0) {
            BitmapChoice::None
        } else {
            BitmapChoice::Internal { chunk_bytes: None }
        }
    }
}

/// The sectors a bitmap covers, as mdadm computes them at create (`Create.c`): the
/// component size, or for RAID10 `size * raid_disks / (near * far)`.
pub fn sync_size_for(level: Level, layout: u32, size: Sectors, raid_disks: u32) -> Sectors {
    if level == Level::Raid10 {
        let copies = u64::from(layout & 0xff) * u64::from((layout >> 8) & 0xff);
        Sectors(size.0 * u64::from(raid_disks) / copies.max(1))
    } else {
        size
    }
}

/// The bitmap mdadm would add when creating a v1.2 array (`add_internal_bitmap1`,
/// creating case): room is `choose_bm_space(size)` sectors (at most 128 KiB when the
/// chunk is not chosen), the smallest chunk from 4 KiB up whose bits fit, raised to
/// 64 MiB by default. A chosen chunk must be a power of two of at least that smallest.
pub fn plan(
    uuid: Uuid,
    sync_size: Sectors,
    room: Sectors,
    chunk: Option<u64>,
    events: u64,
) -> Result<BitmapSuper> {
    let invalid = |m: String| Error::new(ErrorKind::InvalidArgument, m);
    let room = if chunk.is_none() {
        room.0.min(256)
    } else {
        room.0
    };
    if room <= 1 {
        return Err(invalid(format!(
            "no room for a bitmap: a component of {} sectors leaves none after the superblock",
            sync_size.0
        )));
    }
    let max_bits = (room * 512 - wide(HEADER_SIZE)) * 8;
    let mut min_chunk: u64 = 4096;
    let mut bits = sync_size.0 * 512 / min_chunk + 1;
    while bits > max_bits {
        min_chunk *= 2;
        bits = bits.div_ceil(2);
    }
    let chunk = match chunk {
        None => min_chunk.max(DEFAULT_MIN_CHUNK),
        Some(c) if !c.is_power_of_two() || c < 4096 => {
            return Err(invalid(format!(
                "bitmap chunk of {c} bytes: need a power of two of at least 4 KiB"
            )))
        }
        Some(c) if c < min_chunk => {
            return Err(invalid(format!(
                "bitmap chunk of {} KiB is too small: {} KiB of room holds bits for chunks of \
                 at least {} KiB on this array",
                c >> 10,
                room / 2,
                min_chunk >> 10
            )))
        }
        Some(c) => c,
    };
    let chunk = u32::try_from(chunk)
        .map_err(|_| invalid(format!("bitmap chunk of {chunk} bytes is over 2 GiB")))?;
    Ok(BitmapSuper::new(uuid, sync_size, chunk, events))
}

/// The block of the area holding bit `c`.
pub(crate) fn block_of(c: u64) -> u64 {
    (wide(HEADER_SIZE) + c / 8) / BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BitmapSuper {
        let mut s = BitmapSuper::new(
            "01234567:89abcdef:01234567:89abcdef".parse().unwrap(),
            Sectors(2_095_104),
            4 << 20,
            1,
        );
        s.events_cleared = 1;
        s
    }

    #[test]
    fn header_round_trips_byte_for_byte() {
        let s = sample();
        let b = s.encode();
        assert_eq!(&b[0..4], b"bitm");
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 4);
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), 2_095_104);
        assert_eq!(u32::from_le_bytes(b[52..56].try_into().unwrap()), 4 << 20);
        assert_eq!(u32::from_le_bytes(b[56..60].try_into().unwrap()), 5);
        assert_eq!(BitmapSuper::parse(&b, "m").unwrap(), s);
        // verification.md §2.2: mdadm -X prints the sync size in KiB, 1047552 for these
        // 2095104 sectors; at 4 MiB per bit that is 256 bits.
        assert_eq!(s.chunks(), Some(256));
        assert_eq!(s.area_bytes(), Some(4096));
    }

    #[test]
    fn refusals_name_the_field() {
        let good = sample().encode();
        let patch = |off: usize, v: &[u8]| {
            let mut b = good;
            b[off..off + v.len()].copy_from_slice(v);
            b
        };
        let kind = |b: &[u8]| BitmapSuper::parse(b, "m").unwrap_err().kind();
        assert_eq!(kind(&patch(0, b"xitm")), ErrorKind::Corrupt);
        assert_eq!(kind(&patch(4, &7u32.to_le_bytes())), ErrorKind::Corrupt);
        assert_eq!(kind(&patch(4, &5u32.to_le_bytes())), ErrorKind::Unsupported);
        assert_eq!(kind(&patch(52, &3000u32.to_le_bytes())), ErrorKind::Corrupt);
        assert_eq!(kind(&patch(52, &256u32.to_le_bytes())), ErrorKind::Corrupt);
        assert_eq!(kind(&patch(56, &0u32.to_le_bytes())), ErrorKind::Corrupt);
        assert_eq!(
            kind(&patch(60, &16384u32.to_le_bytes())),
            ErrorKind::Corrupt
        );
        assert_eq!(
            kind(&patch(68, &2u32.to_le_bytes())),
            ErrorKind::Unsupported
        );
        assert_eq!(
            kind(&patch(48, &(1u32 << 15).to_le_bytes())),
            ErrorKind::Unsupported
        );
        assert_eq!(
            kind(&patch(40, &u64::MAX.to_le_bytes())),
            ErrorKind::Corrupt
        );
        assert_eq!(kind(&good[..100]), ErrorKind::Corrupt);
        // Version 3 without HOSTENDIAN reads as 4.
        assert!(BitmapSuper::parse(&patch(4, &3u32.to_le_bytes()), "m").is_ok());
    }

    #[test]
    fn parser_never_panics_on_mutations() {
        // Fuzz-style: random bytes, and the good header with random bytes changed.
        let good = sample().encode();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20_000 {
            let mut b = if round % 2 == 0 {
                good
            } else {
                let mut r = [0u8; HEADER_SIZE];
                r.iter_mut().for_each(|v| *v = next().to_le_bytes()[0]);
                r[..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
                r
            };
            for _ in 0..(next() % 6) {
                let i = small(next() % wide(HEADER_SIZE));
                b[i] = next().to_le_bytes()[0];
            }
            let len = small(next() % (wide(HEADER_SIZE) + 1));
            if let Ok(s) = BitmapSuper::parse(
                &b[..len.max(if round % 3 == 0 { 0 } else { HEADER_SIZE })],
                "m",
            ) {
                let area = s.area_bytes().unwrap();
                assert_eq!(area % BLOCK, 0);
                assert_eq!(BitmapSuper::parse(&s.encode(), "m").unwrap(), s);
            }
        }
    }

    #[test]
    fn bits_are_little_endian() {
        let mut bits = vec![0u8; 4];
        set_bit(&mut bits, 0, true);
        set_bit(&mut bits, 9, true);
        set_bit(&mut bits, 31, true);
        assert_eq!(bits, [0x01, 0x02, 0x00, 0x80]);
        assert!(test_bit(&bits, 9) && !test_bit(&bits, 8));
        set_bit(&mut bits, 9, false);
        assert_eq!(bits, [0x01, 0, 0, 0x80]);
        assert_eq!(block_of(0), 0);
        assert_eq!(block_of((4096 - 256) * 8 - 1), 0);
        assert_eq!(block_of((4096 - 256) * 8), 1);
    }

    #[test]
    fn plan_follows_mdadm() {
        let u = Uuid::default();
        // Small component: 8 sectors of room, default chunk raised to 64 MiB.
        let s = plan(u, Sectors(126_976), Sectors(8), None, 1).unwrap();
        assert_eq!(s.chunk_bytes, 64 << 20);
        assert_eq!(s.chunks(), Some(1));
        // A chosen 64 KiB chunk fits in 8 sectors for 62 MiB.
        let s = plan(u, Sectors(126_976), Sectors(8), Some(64 << 10), 1).unwrap();
        assert_eq!(s.chunks(), Some(992));
        assert_eq!(s.area_bytes(), Some(4096));
        // Too small a chunk for the room, or not a power of two.
        let big = Sectors(8 << 21); // 8 GiB
        assert!(plan(u, big, Sectors(8), Some(64 << 10), 1).is_err());
        assert!(plan(u, big, Sectors(8), Some(3 << 20), 1).is_err());
        assert!(plan(u, Sectors(100), Sectors(0), None, 1).is_err());
        // 8 GiB in 8 sectors: the smallest chunk that fits is 512 KiB; the default 64M.
        assert!(plan(u, big, Sectors(8), Some(512 << 10), 1).is_ok());
        assert!(plan(u, big, Sectors(8), Some(256 << 10), 1).is_err());
        // RAID10 covers the array.
        assert_eq!(
            sync_size_for(Level::Raid10, 0x102, Sectors(1000), 3),
            Sectors(1500)
        );
    }

    #[test]
    fn initial_area_is_mdadms() {
        let s = plan(
            Uuid::default(),
            Sectors(126_976),
            Sectors(8),
            Some(64 << 10),
            1,
        )
        .unwrap();
        let a = s.initial_area(true);
        assert_eq!(a.len(), 4096);
        assert!(a[HEADER_SIZE..].iter().all(|&b| b == 0xff));
        assert!(s.initial_area(false)[HEADER_SIZE..].iter().all(|&b| b == 0));
    }
}
