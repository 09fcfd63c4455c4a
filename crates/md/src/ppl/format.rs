//! The partial-parity log's on-disk format: the ring header, the entry header, where the
//! log area lies on a member, and how a header block is judged. Pure functions over
//! bytes and the superblock; the running log and replay (`ppl.rs`) do the I/O.
//!
//! ```text
//!   member: superblock │ bitmap space │ bad-block log │ PPL area ............ │ data
//!                                                      ├ ring header (4 KiB)   [area]
//!                                                      └ ring: entry header + payload
//! ```

use cairn_block::codec::{le32_at, le64_at, put_le32, put_le64};

use crate::create::choose_bm_space;
use crate::ondisk::{Features, Superblock, Uuid, SUPER_OFFSET_1_2};
use crate::units::{small, SECTOR_SIZE};

/// The log's unit: headers and payloads are written in whole 4 KiB blocks, so members
/// with 4096-byte logical blocks take them as they are.
pub(crate) const BLOCK: u64 = 4096;
/// Everything a header says lies in its first 512 bytes (the rest of the block is
/// zero): a torn 4 KiB write on a 512-byte-sector member leaves that sector whole.
pub(crate) const HEADER_BYTES: usize = 512;

// ---- the two headers -----------------------------------------------------------------
//
// Ring header, at the first block of the area (little-endian):
//   0  magic     [u8; 8]  "cairnPLR"
//   8  version   u32      1
//  12  block     u32      4096
//  16  ring_off  u64      byte offset of the ring on the member
//  24  ring_len  u64      bytes, a multiple of 4096
//  32  floor     u64      entries with seq < floor are dead
//  40  log_id    u64      random per log; entries carry it
//  48  uuid      [u8; 16] the array's UUID
//  64  crc       u32      crc32c of bytes 0..64
//  68  zero to the end of the block
//
// Entry header, at a block boundary of the ring, followed by its payload:
//   0  magic     [u8; 8]  "cairnPLE"
//   8  version   u32      1
//  12  kind      u32      1 partial P, 2 partial Q, 3 full
//  16  seq       u64
//  24  log_id    u64
//  32  stripe    u64      partial: the stripe; full: first stripe
//  40  stripe_hi u64      full: one past the last stripe (only those whose P or Q is
//                         this member); partial: stripe + 1
//  48  x         u64      partial: stripe-relative bytes [x, y) written
//  56  y         u64
//  64  chunk     u32      chunk bytes (a check)
//  68  payload   u32      payload bytes (partial: hi - lo, the row; full: 0)
//  72  pcrc      u32      crc32c of the payload
//  76  crc       u32      crc32c of bytes 0..76
//  80  zero to the end of the block; the payload starts at the next block

const RING_MAGIC: [u8; 8] = *b"cairnPLR";
const ENTRY_MAGIC: [u8; 8] = *b"cairnPLE";
const VERSION: u32 = 1;
const RING_CRC_AT: usize = 64;
const ENTRY_CRC_AT: usize = 76;
const _: () = assert!(RING_CRC_AT + 4 <= HEADER_BYTES && ENTRY_CRC_AT + 4 <= HEADER_BYTES);

/// What an entry's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Partial parity for P over the row.
    PartialP,
    /// Partial parity for Q over the row.
    PartialQ,
    /// Stripes rewritten whole: older entries for them are dead.
    Full,
}

impl Kind {
    fn to_raw(self) -> u32 {
        match self {
            Kind::PartialP => 1,
            Kind::PartialQ => 2,
            Kind::Full => 3,
        }
    }

    fn from_raw(v: u32) -> Option<Kind> {
        match v {
            1 => Some(Kind::PartialP),
            2 => Some(Kind::PartialQ),
            3 => Some(Kind::Full),
            _ => None,
        }
    }
}

/// A ring header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingHeader {
    pub(crate) ring_off: u64,
    pub(crate) ring_len: u64,
    pub(crate) floor: u64,
    pub(crate) log_id: u64,
    pub(crate) uuid: Uuid,
}

/// An entry header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryHeader {
    pub(crate) kind: Kind,
    pub(crate) seq: u64,
    pub(crate) log_id: u64,
    pub(crate) stripe: u64,
    pub(crate) stripe_hi: u64,
    pub(crate) x: u64,
    pub(crate) y: u64,
    pub(crate) chunk: u32,
    pub(crate) payload: u32,
    pub(crate) pcrc: u32,
}

impl EntryHeader {
    /// Bytes the entry takes in the ring: its header block and its payload in blocks.
    pub(crate) fn len(&self) -> u64 {
        BLOCK + u64::from(self.payload).div_ceil(BLOCK) * BLOCK
    }
}

/// The first [`HEADER_BYTES`] of a header block; `None` when `b` is shorter.
fn header_bytes(b: &[u8]) -> Option<&[u8; HEADER_BYTES]> {
    b.get(..HEADER_BYTES)?.try_into().ok()
}

impl RingHeader {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; small(BLOCK)];
        b[0..8].copy_from_slice(&RING_MAGIC);
        put_le32(&mut b, 8, VERSION);
        put_le32(&mut b, 12, 4096);
        put_le64(&mut b, 16, self.ring_off);
        put_le64(&mut b, 24, self.ring_len);
        put_le64(&mut b, 32, self.floor);
        put_le64(&mut b, 40, self.log_id);
        b[48..64].copy_from_slice(&self.uuid.0);
        let crc = crc32c(&b[..RING_CRC_AT]);
        put_le32(&mut b, RING_CRC_AT, crc);
        b
    }

    /// Parses a ring header block: `Err(None)` when it holds no ring header at all,
    /// `Err(Some(why))` when it holds one that cannot be used (one phrase).
    pub(crate) fn parse(b: &[u8]) -> Result<RingHeader, Option<String>> {
        let Some(b) = header_bytes(b).filter(|b| b[0..8] == RING_MAGIC) else {
            return Err(None);
        };
        let (version, block) = (le32_at::<8, _>(b), le32_at::<12, _>(b));
        if version != VERSION || block != 4096 {
            return Err(Some(format!(
                "the header has version {version} and block size {block}, not {VERSION} and 4096"
            )));
        }
        if crc32c(&b[..RING_CRC_AT]) != le32_at::<RING_CRC_AT, _>(b) {
            return Err(Some("the header fails its checksum".into()));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[48..64]);
        let h = RingHeader {
            ring_off: le64_at::<16, _>(b),
            ring_len: le64_at::<24, _>(b),
            floor: le64_at::<32, _>(b),
            log_id: le64_at::<40, _>(b),
            uuid: Uuid(uuid),
        };
        if !h.ring_off.is_multiple_of(BLOCK) || !h.ring_len.is_multiple_of(BLOCK) || h.ring_len == 0
        {
            return Err(Some(format!(
                "the ring of {} bytes at byte {} is not whole 4 KiB blocks",
                h.ring_len, h.ring_off
            )));
        }
        Ok(h)
    }
}

impl EntryHeader {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; small(BLOCK)];
        b[0..8].copy_from_slice(&ENTRY_MAGIC);
        put_le32(&mut b, 8, VERSION);
        put_le32(&mut b, 12, self.kind.to_raw());
        put_le64(&mut b, 16, self.seq);
        put_le64(&mut b, 24, self.log_id);
        put_le64(&mut b, 32, self.stripe);
        put_le64(&mut b, 40, self.stripe_hi);
        put_le64(&mut b, 48, self.x);
        put_le64(&mut b, 56, self.y);
        put_le32(&mut b, 64, self.chunk);
        put_le32(&mut b, 68, self.payload);
        put_le32(&mut b, 72, self.pcrc);
        let crc = crc32c(&b[..ENTRY_CRC_AT]);
        put_le32(&mut b, ENTRY_CRC_AT, crc);
        b
    }

    /// `None` unless `b` holds a well-formed entry header whose fields agree with each
    /// other (the payload is checked separately, against `pcrc`).
    pub(crate) fn decode(b: &[u8]) -> Option<EntryHeader> {
        let b = header_bytes(b)?;
        if b[0..8] != ENTRY_MAGIC
            || le32_at::<8, _>(b) != VERSION
            || crc32c(&b[..ENTRY_CRC_AT]) != le32_at::<ENTRY_CRC_AT, _>(b)
        {
            return None;
        }
        let h = EntryHeader {
            kind: Kind::from_raw(le32_at::<12, _>(b))?,
            seq: le64_at::<16, _>(b),
            log_id: le64_at::<24, _>(b),
            stripe: le64_at::<32, _>(b),
            stripe_hi: le64_at::<40, _>(b),
            x: le64_at::<48, _>(b),
            y: le64_at::<56, _>(b),
            chunk: le32_at::<64, _>(b),
            payload: le32_at::<68, _>(b),
            pcrc: le32_at::<72, _>(b),
        };
        if h.stripe_hi <= h.stripe || h.chunk == 0 {
            return None;
        }
        match h.kind {
            Kind::Full => (h.payload == 0).then_some(h),
            Kind::PartialP | Kind::PartialQ => {
                let (lo, hi) = row_of(u64::from(h.chunk), h.x, h.y)?;
                (h.stripe_hi == h.stripe + 1 && u64::from(h.payload) == hi - lo).then_some(h)
            }
        }
    }
}

/// The row `[lo, hi)` (in-chunk bytes) that stripe-relative bytes `[x, y)` touch:
/// `None` when `[x, y)` is empty or not inside one chunk row of any width.
pub(crate) fn row_of(c: u64, x: u64, y: u64) -> Option<(u64, u64)> {
    if x >= y || c == 0 {
        return None;
    }
    let first = x / c;
    let last = (y - 1) / c;
    if last - first >= 1 << 16 {
        return None;
    }
    let (mut lo, mut hi) = (u64::MAX, 0);
    for d in first..=last {
        let start = d * c;
        lo = lo.min(x.max(start) - start);
        hi = hi.max(y.min(start + c) - start);
    }
    Some((lo, hi))
}

/// CRC-32C (Castagnoli), reflected, as in iSCSI and ext4. The `crc32c` crate uses the
/// SSE4.2 (or ARMv8) instruction where the CPU has it, else a software table: a 4 KiB
/// payload per partial-stripe write makes a byte-wise table show in the write path.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

// ---- where the log lives --------------------------------------------------------------

/// The log area of a member described by `sb`: `(start, end)` in member bytes, from the
/// end of the bad-block log (or the bitmap space) rounded up to 4 KiB, to `data_offset`.
/// `None` for superblock layouts other than cairn's and mdadm's 1.2 default, or when md's
/// own PPL or journal could be using the space.
pub(crate) fn area(sb: &Superblock) -> Option<(u64, u64)> {
    if sb.super_offset != SUPER_OFFSET_1_2
        || sb.bblog_offset <= 0
        || sb.features.has(Features::PPL)
        || sb.features.has(Features::JOURNAL)
        || sb.features.has(Features::MULTIPLE_PPLS)
        || sb.level.parity_members() == 0
    {
        return None;
    }
    let so = sb.super_offset.0;
    let bblog_end = so
        .checked_add(u64::try_from(sb.bblog_offset).ok()?)?
        .checked_add(u64::from(sb.bblog_size))?;
    let bitmap_end = so + 8 + choose_bm_space(sb.size).0;
    let start = bblog_end.max(bitmap_end).checked_mul(SECTOR_SIZE)?;
    let start = start.div_ceil(BLOCK) * BLOCK;
    let end = sb.data_offset.bytes()? / BLOCK * BLOCK;
    (end > start + 2 * BLOCK).then_some((start, end))
}

/// Sequence numbers above this are not valid (a log writing a billion entries a second
/// reaches it after 290 years), so the next one after any valid number never overflows.
pub(crate) const MAX_SEQ: u64 = (1 << 63) - 1;

/// What the first block of a member's log area holds, judged the same way for the
/// start decision (`ppl::probe`) and for opening the log (`Ppl::open`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderCheck {
    /// No log header: the member never had one (or md or mdadm wrote something else).
    Absent,
    /// A well-formed header of another array's log (members reused): not this log.
    Foreign,
    /// This array's log header, whose ring lies inside the area.
    Usable(RingHeader),
    /// A log header that cannot be used, and why (one phrase).
    Unusable(String),
}

/// Judges the header block `b` of a log area `(start, end)` for the array `uuid`.
pub(crate) fn check_header(b: &[u8], (start, end): (u64, u64), uuid: Uuid) -> HeaderCheck {
    let h = match RingHeader::parse(b) {
        Ok(h) => h,
        Err(None) => return HeaderCheck::Absent,
        Err(Some(why)) => return HeaderCheck::Unusable(why),
    };
    if h.uuid != uuid {
        return HeaderCheck::Foreign;
    }
    if h.floor > MAX_SEQ {
        return HeaderCheck::Unusable(format!(
            "the sequence floor {} is past the largest sequence number",
            h.floor
        ));
    }
    // Checked before anything is sized from it: the ring lies inside the area, so replay
    // and the running log never read or write the data.
    let ring_end = h.ring_off.checked_add(h.ring_len);
    if h.ring_off != start + BLOCK || ring_end.is_none_or(|e| e > end) {
        return HeaderCheck::Unusable(format!(
            "the ring [{}, {}) is not inside the log area [{}, {end}) before the data",
            h.ring_off,
            ring_end.map_or_else(|| "overflow".to_string(), |e| e.to_string()),
            start + BLOCK
        ));
    }
    HeaderCheck::Usable(h)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn entry() -> EntryHeader {
        EntryHeader {
            kind: Kind::PartialP,
            seq: 42,
            log_id: 7,
            stripe: 3,
            stripe_hi: 4,
            x: 4096 + 512,
            y: 2 * 4096 + 1024,
            chunk: 4096,
            payload: 4096,
            pcrc: 0,
        }
    }

    #[test]
    fn crc32c_known_answer() {
        // RFC 3720 B.4: 32 bytes of zeroes.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        // Against the bit-at-a-time definition, at every length and alignment around a
        // word (the crate's hardware path handles 8-byte words and a tail).
        fn bitwise(data: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in data {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 != 0 {
                        0x82f6_3b78 ^ (crc >> 1)
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        for a in 0..9 {
            for b in a..data.len() {
                assert_eq!(crc32c(&data[a..b]), bitwise(&data[a..b]));
            }
        }
    }

    #[test]
    fn entry_round_trip() {
        let mut e = entry();
        let (lo, hi) = row_of(4096, e.x, e.y).unwrap();
        assert_eq!((lo, hi), (0, 4096));
        e.payload = u32::try_from(hi - lo).unwrap();
        let b = e.encode();
        assert_eq!(b.len(), 4096);
        assert!(b[HEADER_BYTES..].iter().all(|&v| v == 0));
        assert_eq!(EntryHeader::decode(&b), Some(e));
        assert_eq!(e.len(), 8192);
        let full = EntryHeader {
            kind: Kind::Full,
            payload: 0,
            x: 0,
            y: 0,
            stripe_hi: 9,
            ..e
        };
        assert_eq!(EntryHeader::decode(&full.encode()), Some(full));
    }

    #[test]
    fn malformed_entries_are_rejected() {
        let mut e = entry();
        e.payload = 4096;
        let good = e.encode();
        // Any single flipped bit in the header.
        for i in 0..HEADER_BYTES * 8 {
            let mut b = good.clone();
            b[i / 8] ^= 1 << (i % 8);
            if i / 8 < ENTRY_CRC_AT + 4 {
                assert_eq!(EntryHeader::decode(&b), None, "bit {i}");
            }
        }
        // Torn: a header sector from another entry, short buffers, garbage.
        assert_eq!(EntryHeader::decode(&good[..100]), None);
        assert_eq!(EntryHeader::decode(&[0u8; 4096]), None);
        assert_eq!(EntryHeader::decode(&[0xffu8; 4096]), None);
        // Fields that disagree, with a valid checksum.
        for bad in [
            EntryHeader { payload: 4095, ..e },
            EntryHeader { x: 5, y: 5, ..e },
            EntryHeader { stripe_hi: 3, ..e },
            EntryHeader { chunk: 0, ..e },
            EntryHeader {
                kind: Kind::Full,
                ..e
            },
        ] {
            assert_eq!(EntryHeader::decode(&bad.encode()), None, "{bad:?}");
        }
        let mut b = good.clone();
        put_le32(&mut b, 12, 9);
        let crc = crc32c(&b[..ENTRY_CRC_AT]);
        put_le32(&mut b, ENTRY_CRC_AT, crc);
        assert_eq!(EntryHeader::decode(&b), None, "unknown kind");
    }

    #[test]
    fn ring_header_round_trip_and_refusals() {
        let h = RingHeader {
            ring_off: 8192,
            ring_len: 8 * 4096,
            floor: 10,
            log_id: 7,
            uuid: Uuid([1; 16]),
        };
        let good = h.encode();
        assert_eq!(RingHeader::parse(&good), Ok(h));
        let area = (4096, 4096 + 4096 + 8 * 4096);
        assert_eq!(
            check_header(&good, area, Uuid([1; 16])),
            HeaderCheck::Usable(h)
        );
        assert_eq!(
            check_header(&good, area, Uuid([2; 16])),
            HeaderCheck::Foreign
        );
        assert_eq!(RingHeader::parse(&good[..100]), Err(None));
        assert_eq!(RingHeader::parse(&[0u8; 4096]), Err(None));
        let mut torn = good.clone();
        torn[20] ^= 1;
        assert_eq!(
            check_header(&torn, area, Uuid([1; 16])),
            HeaderCheck::Unusable("the header fails its checksum".into())
        );
        let odd = RingHeader { ring_len: 100, ..h }.encode();
        assert_eq!(
            RingHeader::parse(&odd),
            Err(Some(
                "the ring of 100 bytes at byte 8192 is not whole 4 KiB blocks".into()
            ))
        );
    }
}
