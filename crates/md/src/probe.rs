//! Recognising what a device already holds before `create` overwrites it
//! (ondisk-formats.md §5 "Signatures and probing", plus the filesystems users most often
//! point a tool at by mistake).
//!
//! ```text
//!   byte 0        md 1.1, LUKS1/2, XFS "XFSB"        byte 510/512   MBR / GPT
//!   sectors 0-3   LVM2 "LABELONE"                    byte 1080      ext2/3/4 0xEF53
//!   byte 4096     md 1.2                             byte 4086      swap
//!   16K .. 4M     LUKS2 secondary "SKUL\xba\xbe"      byte 65600     btrfs
//!   end - 8..12K  md 1.0            end - 64..128K   md 0.90
//! ```
//!
//! Only magic numbers are checked, so a hit means "looks like", which is what a refusal
//! to overwrite needs.

use std::fmt;

use cairn_block::{BlockDevice, Result};

use crate::ondisk::{looks_like_md, Superblock, MD_SB_MAGIC};
use crate::units::{small, wide};

/// A signature found on a device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Signature {
    /// What it looks like: "md superblock 1.2", "ext4 filesystem", ...
    pub kind: String,
    /// Byte offset of the magic.
    pub offset: u64,
    /// More about it, when known (an md member's array UUID and name).
    pub detail: Option<String>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "has a signature at byte {}: {}", self.offset, self.kind)?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

/// Reads `len` bytes at `off`, widened to the device's logical block; `None` past the end.
fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<Option<Vec<u8>>> {
    let g = dev.geometry();
    let lbs = u64::from(g.logical_block_size.max(512));
    let start = off - off % lbs;
    let end = (off + wide(len)).div_ceil(lbs) * lbs;
    if end > g.size {
        return Ok(None);
    }
    let mut buf = vec![0u8; small(end - start)];
    dev.read_at(&mut buf, start)?;
    let skip = small(off - start);
    Ok(Some(buf[skip..skip + len].to_vec()))
}

/// Every signature found on `dev`.
pub fn probe_signatures(dev: &dyn BlockDevice) -> Result<Vec<Signature>> {
    let size = dev.geometry().size;
    let mut out = Vec::new();
    let mut hit = |kind: &str, offset: u64, detail: Option<String>| {
        out.push(Signature {
            kind: kind.to_string(),
            offset,
            detail,
        })
    };
    let head_len = small(size.min(8192));
    let head = read(dev, 0, head_len)?.unwrap_or_default();
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);

    if head.len() >= 8192 && looks_like_md(&head[4096..]) {
        let detail =
            Superblock::parse_with(&head[4096..], "", crate::ondisk::FeaturePolicy::KnownToMd)
                .ok()
                .map(|sb| format!("member of array {} ({})", sb.set_uuid, sb.set_name));
        hit("md superblock 1.2", 4096, detail);
    }
    if looks_like_md(&head) {
        hit("md superblock 1.1", 0, None);
    }
    if at(0, b"LUKS\xba\xbe") {
        hit("LUKS header", 0, None);
    }
    if at(0, b"XFSB") {
        hit("XFS filesystem", 0, None);
    }
    for sector in 0..4 {
        if at(sector * 512, b"LABELONE") {
            hit("LVM2 physical volume label", wide(sector * 512), None);
        }
    }
    if at(1080, &[0x53, 0xef]) {
        hit("ext2/3/4 filesystem", 1080, None);
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        hit("swap area", 4086, None);
    }
    if at(512, b"EFI PART") {
        hit("GPT partition table", 512, None);
    } else if at(510, &[0x55, 0xaa])
        && (0..4).any(|i| head.get(446 + 16 * i + 4).is_some_and(|&t| t != 0))
    {
        hit("MBR partition table", 510, None);
    }
    if let Some(b) = read(dev, 65_600, 8)? {
        if b == b"_BHRfS_M" {
            hit("btrfs filesystem", 65_600, None);
        }
    }
    // LUKS2 secondary header: at 16 KiB << i up to 4 MiB.
    let mut off: u64 = 16 << 10;
    while off <= 4 << 20 {
        if let Some(b) = read(dev, off, 6)? {
            if b == b"SKUL\xba\xbe" {
                hit("LUKS2 secondary header", off, None);
            }
        }
        off <<= 1;
    }
    let sectors = size / 512;
    // md 1.0: ((sectors - 16) & ~7) sectors.
    if sectors >= 24 {
        let off = ((sectors - 16) & !7) * 512;
        if let Some(b) = read(dev, off, 8)? {
            if looks_like_md(&b) {
                hit("md superblock 1.0", off, None);
            }
        }
    }
    // md 0.90: the last 64 KiB-aligned 64 KiB block.
    if sectors >= 256 {
        let off = ((sectors & !127) - 128) * 512;
        if let Some(b) = read(dev, off, 4)? {
            if b == MD_SB_MAGIC.to_le_bytes() {
                hit("md superblock 0.90", off, None);
            }
        }
    }
    Ok(out)
}
