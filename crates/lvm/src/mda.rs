//! Metadata areas (ondisk-formats.md §4.2): a 512-byte `mda_header` followed by a
//! circular buffer of text metadata.
//!
//! ```text
//!   start           mda_header: 0 checksum (of 4..512) | 4 magic | 20 version 1
//!                   24 start | 32 size | 40 raw_locns[] {offset, size, checksum, flags}
//!   start + 512 ... start + size    circular text buffer
//!                   raw_locns[0] = committed text, raw_locns[1] = precommitted
//! ```
//!
//! A new text starts at the next 512-byte boundary after the committed one, wraps to
//! `start + 512` at the end, and is at most `(size - 512) / 2 - 512` bytes, so it never
//! overwrites the committed text. The commit protocol across all PVs of a VG lives in
//! `vg.rs`; this module writes one area's pieces.

use cairn_block::codec::{le32, le64, put_le32, put_le64};
use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::crc::{calc_crc, crc, INITIAL_CRC};
use crate::io::{read_bytes, usize_of, write_bytes};
use crate::label::DiskLocn;

pub const MDA_MAGIC: &[u8; 16] = b" LVM2 x[5A%r0N*>";
pub const MDA_HEADER_SIZE: u64 = 512;
const HEADER_BYTES: usize = 512;
pub const FMTT_VERSION: u32 = 1;
/// `raw_locn.flags`: the area is not used by the VG.
pub const RAW_LOCN_IGNORED: u32 = 1;
/// pvcreate's default area: bytes 4096..1 MiB.
pub const DEFAULT_MDA_START: u64 = 4096;
pub const DEFAULT_MDA_SIZE: u64 = 1_044_480;

const RAW_LOCN_SIZE: usize = 24;
const RAW_LOCNS_AT: usize = 40;
/// lvm's header has room for 4 raw_locns plus the terminator; more is corruption.
const MAX_RAW_LOCNS: usize = 4;

/// Where a text lies in the buffer (`offset` relative to the area start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawLocn {
    pub offset: u64,
    /// Text bytes including the terminating NUL.
    pub size: u64,
    pub checksum: u32,
    pub flags: u32,
}

impl RawLocn {
    fn is_zero(&self) -> bool {
        *self == RawLocn::default()
    }
}

/// A parsed `mda_header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdaHeader {
    pub start: u64,
    pub size: u64,
    /// `[committed, precommitted]`, zero when absent.
    pub committed: RawLocn,
    pub precommitted: RawLocn,
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

impl MdaHeader {
    /// An empty header for a fresh area.
    pub fn empty(area: DiskLocn) -> MdaHeader {
        MdaHeader {
            start: area.offset,
            size: area.size,
            committed: RawLocn::default(),
            precommitted: RawLocn::default(),
        }
    }

    /// Whether the VG does not use this area.
    pub fn ignored(&self) -> bool {
        self.committed.flags & RAW_LOCN_IGNORED != 0
    }

    /// Parses the 512 header bytes of the area at `area`.
    pub fn parse(b: &[u8], area: DiskLocn) -> Result<MdaHeader> {
        if b.len() < HEADER_BYTES {
            return Err(corrupt("metadata area header is short"));
        }
        let b = &b[..HEADER_BYTES];
        if &b[4..20] != MDA_MAGIC {
            return Err(corrupt(format!(
                "no metadata area header at byte {} (bad magic)",
                area.offset
            )));
        }
        let stored = le32(b, 0)?;
        let computed = crc(&b[4..]);
        if stored != computed {
            return Err(corrupt(format!(
                "metadata area header at byte {}: checksum {stored:#010x} does not match the \
                 computed {computed:#010x}",
                area.offset
            )));
        }
        let version = le32(b, 20)?;
        if version != FMTT_VERSION {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "metadata area header at byte {}: version {version}",
                    area.offset
                ),
            ));
        }
        let (start, size) = (le64(b, 24)?, le64(b, 32)?);
        if start != area.offset || (area.size != 0 && size != area.size) {
            return Err(corrupt(format!(
                "metadata area header at byte {} says the area is [{start}, +{size}) but the \
                 PV label says [{}, +{}]",
                area.offset, area.offset, area.size
            )));
        }
        if size < 4 * MDA_HEADER_SIZE || size % MDA_HEADER_SIZE != 0 {
            return Err(corrupt(format!(
                "metadata area at byte {start}: impossible size {size}"
            )));
        }
        let mut locns = Vec::new();
        for i in 0..=MAX_RAW_LOCNS {
            let p = RAW_LOCNS_AT + i * RAW_LOCN_SIZE;
            let l = RawLocn {
                offset: le64(b, p)?,
                size: le64(b, p + 8)?,
                checksum: le32(b, p + 16)?,
                flags: le32(b, p + 20)?,
            };
            if l.is_zero() {
                break;
            }
            locns.push(l);
        }
        let mut h = MdaHeader {
            start,
            size,
            committed: locns.first().copied().unwrap_or_default(),
            precommitted: locns.get(1).copied().unwrap_or_default(),
        };
        // An ignored area with no text still says so in flags only.
        if h.committed.offset == 0 && h.committed.size == 0 && h.committed.flags == 0 {
            h.committed = RawLocn::default();
        }
        Ok(h)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        b[4..20].copy_from_slice(MDA_MAGIC);
        put_le32(&mut b, 20, FMTT_VERSION);
        put_le64(&mut b, 24, self.start);
        put_le64(&mut b, 32, self.size);
        let mut p = RAW_LOCNS_AT;
        // A zero committed entry would end the list early; lvm writes the precommitted
        // entry only next to a committed one.
        let locns: &[RawLocn] = if self.precommitted.is_zero() {
            std::slice::from_ref(&self.committed)
        } else {
            &[self.committed, self.precommitted]
        };
        for l in locns {
            put_le64(&mut b, p, l.offset);
            put_le64(&mut b, p + 8, l.size);
            put_le32(&mut b, p + 16, l.checksum);
            put_le32(&mut b, p + 20, l.flags);
            p += RAW_LOCN_SIZE;
        }
        let c = crc(&b[4..]);
        put_le32(&mut b, 0, c);
        b
    }

    /// The largest text (with its NUL) the buffer takes.
    pub fn max_text(&self) -> u64 {
        ((self.size.saturating_sub(MDA_HEADER_SIZE)) / 2).saturating_sub(MDA_HEADER_SIZE)
    }

    /// The two pieces `(relative offset, length)` a text at `l` occupies.
    fn pieces(&self, l: &RawLocn) -> Result<[(u64, u64); 2]> {
        let (o, n) = (l.offset, l.size);
        if o < MDA_HEADER_SIZE || o >= self.size || n == 0 || n > self.size - MDA_HEADER_SIZE {
            return Err(corrupt(format!(
                "metadata text location [{o}, +{n}) lies outside the {}-byte area at byte {}",
                self.size, self.start
            )));
        }
        let first = n.min(self.size - o);
        Ok([(o, first), (MDA_HEADER_SIZE, n - first)])
    }

    /// Where the next text of `len` bytes goes: after the committed one, aligned.
    pub fn next_location(&self, len: u64) -> Result<RawLocn> {
        if len > self.max_text() {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "metadata ({len} bytes) too large for the {}-byte metadata area at byte {} \
                     (at most {} bytes)",
                    self.size,
                    self.start,
                    self.max_text()
                ),
            ));
        }
        let mut off = if self.committed.size == 0 {
            MDA_HEADER_SIZE
        } else {
            let end_abs = self.start + self.committed.offset + self.committed.size;
            let aligned = end_abs.div_ceil(MDA_HEADER_SIZE) * MDA_HEADER_SIZE - self.start;
            if aligned > self.size {
                // The committed text wrapped: continue after its second piece.
                let [_, (o2, n2)] = self.pieces(&self.committed)?;
                (o2 + n2).div_ceil(MDA_HEADER_SIZE) * MDA_HEADER_SIZE
            } else {
                aligned
            }
        };
        if off >= self.size || self.size - off < MDA_HEADER_SIZE {
            off = MDA_HEADER_SIZE;
        }
        let new = RawLocn {
            offset: off,
            size: len,
            checksum: 0,
            flags: 0,
        };
        if self.committed.size != 0 && self.overlaps(&new, &self.committed)? {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "metadata ({len} bytes) would overwrite the committed copy in the metadata \
                     area at byte {}",
                    self.start
                ),
            ));
        }
        Ok(new)
    }

    fn overlaps(&self, a: &RawLocn, b: &RawLocn) -> Result<bool> {
        let round = |(o, n): (u64, u64)| (o, (o + n).div_ceil(MDA_HEADER_SIZE) * MDA_HEADER_SIZE);
        for pa in self.pieces(a)? {
            for pb in self.pieces(b)? {
                if pa.1 == 0 || pb.1 == 0 {
                    continue;
                }
                let (a0, a1) = round(pa);
                let (b0, b1) = round(pb);
                if a0 < b1 && b0 < a1 {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Reads and checks the text at `l`; returns it without the trailing NUL.
    pub fn read_text(&self, dev: &dyn BlockDevice, l: &RawLocn) -> Result<Vec<u8>> {
        let mut text = Vec::with_capacity(usize_of(l.size.min(16 << 20))?);
        for (o, n) in self.pieces(l)? {
            if n > 0 {
                text.extend(read_bytes(dev, self.start + o, n, "metadata text")?);
            }
        }
        let c = crc(&text);
        if c != l.checksum {
            return Err(corrupt(format!(
                "metadata text at byte {} ({} bytes): checksum {:#010x} does not match the \
                 computed {c:#010x}",
                self.start + l.offset,
                l.size,
                l.checksum
            )));
        }
        while text.last() == Some(&0) {
            text.pop();
        }
        Ok(text)
    }

    /// Writes `text` (NUL added) at the next location, without FUA; returns the location
    /// with its checksum, for the precommit and commit headers.
    pub fn write_text(&self, dev: &dyn BlockDevice, text: &[u8]) -> Result<RawLocn> {
        let mut data = text.to_vec();
        data.push(0);
        let mut l = self.next_location(data.len() as u64)?;
        l.checksum = calc_crc(INITIAL_CRC, &data);
        let mut done = 0usize;
        for (o, n) in self.pieces(&l)? {
            if n == 0 {
                continue;
            }
            let n = usize_of(n)?;
            // Pad to the 512-byte boundary: nothing else lives in the rest of that block.
            let mut piece = data[done..done + n].to_vec();
            piece.resize(n.div_ceil(512) * 512, 0);
            write_bytes(
                dev,
                self.start + o,
                &piece,
                WriteFlags::NONE,
                "metadata text",
            )?;
            done += n;
        }
        Ok(l)
    }

    /// Writes this header to its area.
    pub fn write(&self, dev: &dyn BlockDevice, flags: WriteFlags) -> Result<()> {
        write_bytes(
            dev,
            self.start,
            &self.encode(),
            flags,
            "metadata area header",
        )
    }

    /// Reads the header of the area `area`.
    pub fn read(dev: &dyn BlockDevice, area: DiskLocn) -> Result<MdaHeader> {
        let b = read_bytes(dev, area.offset, MDA_HEADER_SIZE, "metadata area header")?;
        MdaHeader::parse(&b, area)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::MemDisk;

    #[test]
    fn circular_buffer_wraps_and_never_overwrites_committed() {
        let dev = MemDisk::new(64 << 10);
        let area = DiskLocn {
            offset: 4096,
            size: 8192,
        };
        let mut h = MdaHeader::empty(area);
        h.write(&dev, WriteFlags::NONE).unwrap();
        assert_eq!(MdaHeader::read(&dev, area).unwrap(), h);
        assert_eq!(h.max_text(), (8192 - 512) / 2 - 512);
        let mut wrapped = false;
        for i in 0..40u32 {
            let len = 700 + (i as usize * 211) % 2500;
            let text: Vec<u8> = (0..len)
                .map(|j| b"abcdefghijklmnopqrstuvwxyz"[(j + i as usize) % 26])
                .collect();
            let old = h.committed;
            let l = h.write_text(&dev, &text).unwrap();
            assert_eq!(l.offset % 512, 0);
            if h.committed.size != 0 {
                assert!(
                    !h.overlaps(&l, &old).unwrap(),
                    "new text overlaps the committed one"
                );
                // The committed text is still intact.
                h.read_text(&dev, &old).unwrap();
            }
            if l.offset + l.size > h.size {
                wrapped = true;
            }
            h.committed = l;
            assert_eq!(h.read_text(&dev, &l).unwrap(), text);
        }
        assert!(wrapped, "no text wrapped");
        let big = vec![b'x'; usize::try_from(h.max_text()).unwrap()];
        assert_eq!(
            h.write_text(&dev, &big).unwrap_err().kind(),
            ErrorKind::NoSpace
        );
    }

    #[test]
    fn header_crc_and_magic() {
        let area = DiskLocn {
            offset: 4096,
            size: DEFAULT_MDA_SIZE,
        };
        let mut h = MdaHeader::empty(area);
        h.committed = RawLocn {
            offset: 3072,
            size: 1520,
            checksum: 7,
            flags: 0,
        };
        let b = h.encode();
        assert_eq!(MdaHeader::parse(&b, area).unwrap(), h);
        let mut bad = b.clone();
        bad[45] ^= 1;
        assert!(MdaHeader::parse(&bad, area)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        bad = b;
        bad[5] = b'x';
        assert!(MdaHeader::parse(&bad, area)
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }
}
