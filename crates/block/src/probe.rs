//! What a device already holds, from magic numbers at fixed offsets (blkid's job, for
//! the formats cairn reads and those users most often point a tool at by mistake). One
//! probe for every layer: md refuses to create over a signature, `luks format` and
//! `pvcreate` likewise, and `scan` classifies members with it.
//!
//! ```text
//!   byte 0        md 1.1, LUKS1/2 "LUKS\xba\xbe", XFS "XFSB"    byte 510/512  MBR / GPT
//!   sectors 0-3   LVM2 "LABELONE"                                byte 1080     ext2/3/4 0xEF53
//!   byte 4096     md 1.2                                         byte 4086     swap
//!   16K .. 4M     LUKS2 secondary "SKUL\xba\xbe" (powers of two)  byte 65600    btrfs
//!   end - 8..12K  md 1.0 (sector (n - 16) & !7)   end - 64..128K md 0.90 (64 KiB aligned)
//! ```
//!
//! Only magic numbers are checked (plus md's major version 1 and LUKS's version field),
//! so a hit means "looks like", which is what a refusal to overwrite needs; each format
//! crate validates what it then opens. Signatures come back in the order above, md first:
//! an md 1.0 or RAID1 member also shows its array's LUKS header or LVM label.

use std::fmt;

use crate::codec::{be16, le32, le64};
use crate::{BlockDevice, Result};

/// `MD_SB_MAGIC`, little-endian at the start of every md superblock.
pub const MD_MAGIC: u32 = 0xa92b_4efc;
/// A LUKS1 or LUKS2 (primary) header's first six bytes.
pub const LUKS_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
/// A LUKS2 secondary header's first six bytes.
pub const LUKS2_SECONDARY_MAGIC: &[u8; 6] = b"SKUL\xba\xbe";
/// Where a LUKS2 secondary header may start: 16 KiB << i, up to 4 MiB.
pub const LUKS2_SECONDARY_OFFSETS: [u64; 9] = [
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];
/// The LVM2 label's id, in one of sectors 0-3.
pub const LVM_LABEL_ID: &[u8; 8] = b"LABELONE";

/// An md superblock's version, by where it lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MdVersion {
    V0_90,
    V1_0,
    V1_1,
    V1_2,
}

/// What a signature says the device holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    Md(MdVersion),
    /// A LUKS primary header; `version` as its header says (1 and 2 are LUKS1 and LUKS2).
    Luks {
        version: u16,
    },
    Luks2Secondary,
    LvmPv,
    Ext,
    Xfs,
    Swap,
    Gpt,
    Mbr,
    Btrfs,
}

impl Kind {
    /// The words users see ("md superblock 1.2", "ext2/3/4 filesystem", ...).
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Md(MdVersion::V0_90) => "md superblock 0.90",
            Kind::Md(MdVersion::V1_0) => "md superblock 1.0",
            Kind::Md(MdVersion::V1_1) => "md superblock 1.1",
            Kind::Md(MdVersion::V1_2) => "md superblock 1.2",
            Kind::Luks { .. } => "LUKS header",
            Kind::Luks2Secondary => "LUKS2 secondary header",
            Kind::LvmPv => "LVM2 physical volume label",
            Kind::Ext => "ext2/3/4 filesystem",
            Kind::Xfs => "XFS filesystem",
            Kind::Swap => "swap area",
            Kind::Gpt => "GPT partition table",
            Kind::Mbr => "MBR partition table",
            Kind::Btrfs => "btrfs filesystem",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A signature found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub kind: Kind,
    /// Byte offset of the magic.
    pub offset: u64,
    /// More about it, when the bytes say (an md 1.2 member's array UUID and name, a
    /// filesystem's label and UUID, a partition table's partition count; as stored, not
    /// validated).
    pub detail: Option<String>,
    /// The precise format when the magic is shared ("ext4" for [`Kind::Ext`]).
    pub flavour: Option<&'static str>,
}

impl Signature {
    /// What it is, in the words users see: "ext4 filesystem", "md superblock 1.2".
    pub fn what(&self) -> String {
        match (self.kind, self.flavour) {
            (Kind::Ext, Some(f)) => format!("{f} filesystem"),
            (k, _) => k.describe().to_string(),
        }
    }

    /// A phrase for a refusal: `an ext4 filesystem (label "data", UUID ...)`.
    pub fn phrase(&self) -> String {
        let what = self.what();
        // As the words are said: "an md", "an MBR", "an XFS", "an LVM2", "a LUKS".
        let spoken_vowel = what.starts_with(['a', 'e', 'i', 'o', 'u', 'M', 'X'])
            || what.starts_with("md")
            || what.starts_with("LVM");
        let article = if spoken_vowel { "an" } else { "a" };
        match &self.detail {
            Some(d) => format!("{article} {what} ({d})"),
            None => format!("{article} {what}"),
        }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "has a signature at byte {}: {}",
            self.offset,
            self.what()
        )?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

/// The signatures [`probe`] found, with the questions callers ask of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// Device size in bytes.
    pub size: u64,
    pub signatures: Vec<Signature>,
}

impl Found {
    /// The first signature of `kind`.
    pub fn get(&self, kind: Kind) -> Option<&Signature> {
        self.signatures.iter().find(|s| s.kind == kind)
    }

    /// Which LUKS version the device holds, as cryptsetup decides it without validating
    /// the header: a whole primary header (4 KiB) of version 1 or 2, else a whole LUKS2
    /// secondary header (its primary destroyed).
    pub fn luks_version(&self) -> Option<u16> {
        let primary = self.signatures.iter().find_map(|s| match s.kind {
            Kind::Luks { version } if (version == 1 || version == 2) && self.size >= 4096 => {
                Some(version)
            }
            _ => None,
        });
        primary.or_else(|| {
            self.signatures
                .iter()
                .any(|s| {
                    s.kind == Kind::Luks2Secondary
                        && s.offset.checked_add(4096).is_some_and(|e| e <= self.size)
                })
                .then_some(2)
        })
    }

    /// Whether one of sectors 0-3 holds an LVM2 label id.
    pub fn has_lvm_label(&self) -> bool {
        self.signatures.iter().any(|s| s.kind == Kind::LvmPv)
    }

    pub fn is_empty(&self) -> bool {
        self.signatures.is_empty()
    }

    /// The sentence a verb that writes a new format refuses with: `nbd.img holds an ext4
    /// filesystem (label "data", UUID ...)`, every signature named; `None` when there is
    /// none. Every writing verb (md create, luks format, pvcreate, vgcreate, vgextend)
    /// refuses through this, so they name what they found the same way.
    pub fn refusal(&self, name: &str) -> Option<String> {
        if self.signatures.is_empty() {
            return None;
        }
        let what: Vec<String> = self.signatures.iter().map(Signature::phrase).collect();
        Some(format!("{name} holds {}", what.join(" and ")))
    }
}

/// Bytes `b[at..at + len]`, NUL-trimmed, as text, or `None` when empty or out of range.
fn text_field(b: &[u8], at: usize, len: usize) -> Option<String> {
    let f = b.get(at..at.checked_add(len)?)?;
    let f = &f[..f.iter().position(|&c| c == 0).unwrap_or(f.len())];
    (!f.is_empty()).then(|| String::from_utf8_lossy(f).into_owned())
}

/// A 16-byte UUID at `at` in the dashed form blkid prints, `None` when all zero.
fn uuid_field(b: &[u8], at: usize) -> Option<String> {
    let u = b.get(at..at.checked_add(16)?)?;
    if u.iter().all(|&x| x == 0) {
        return None;
    }
    let mut s = String::with_capacity(36);
    for (i, x) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    Some(s)
}

/// `label "x", UUID y` from whichever of the two a superblock holds.
fn label_uuid(label: Option<String>, uuid: Option<String>) -> Option<String> {
    let parts: Vec<String> = label
        .map(|l| format!("label {l:?}"))
        .into_iter()
        .chain(uuid.map(|u| format!("UUID {u}")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// ext2, ext3 or ext4, as blkid tells them apart: a journal makes ext3; an incompatible
/// feature ext3 lacks (extents, 64bit, flex_bg, ...) makes ext4. The superblock is at
/// 1024: s_feature_compat at +92, s_feature_incompat at +96.
fn ext_flavour(head: &[u8]) -> &'static str {
    const COMPAT_HAS_JOURNAL: u32 = 0x4;
    // FILETYPE (0x2), RECOVER (0x4), JOURNAL_DEV (0x8), META_BG (0x10) are ext3's.
    const INCOMPAT_EXT3: u32 = 0x2 | 0x4 | 0x8 | 0x10;
    let compat = le32(head, 1024 + 92).unwrap_or(0);
    let incompat = le32(head, 1024 + 96).unwrap_or(0);
    if incompat & !INCOMPAT_EXT3 != 0 {
        "ext4"
    } else if compat & COMPAT_HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    }
}

/// How many of a GPT's partition entries are in use (a non-zero type GUID), from the
/// header in LBA 1: entries' LBA at +72, their count at +80, each one's size at +84.
fn gpt_partitions(dev: &dyn BlockDevice, head: &[u8]) -> Result<Option<usize>> {
    let (Ok(lba), Ok(count), Ok(size)) = (
        le64(head, 512 + 72),
        le32(head, 512 + 80),
        le32(head, 512 + 84),
    ) else {
        return Ok(None);
    };
    // Sane headers only (parted and sfdisk write 128 entries of 128 bytes).
    if !(1..=1024).contains(&count) || !(128..=4096).contains(&size) || lba == 0 {
        return Ok(None);
    }
    let (Some(off), Ok(len)) = (lba.checked_mul(512), usize::try_from(count * size)) else {
        return Ok(None);
    };
    let Some(table) = read(dev, off, len)? else {
        return Ok(None);
    };
    let size = usize::try_from(size).unwrap_or(128);
    Ok(Some(
        table
            .chunks(size)
            .filter(|e| e.get(..16).is_some_and(|t| t.iter().any(|&x| x != 0)))
            .count(),
    ))
}

fn partitions(n: usize) -> String {
    if n == 1 {
        "1 partition".into()
    } else {
        format!("{n} partitions")
    }
}

/// Reads `len` bytes at `off`, widened to the device's logical blocks; `None` past the end.
fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<Option<Vec<u8>>> {
    let g = dev.geometry();
    let lbs = u64::from(g.logical_block_size.max(512));
    let start = off - off % lbs;
    let Some(end) = off
        .checked_add(len as u64)
        .map(|e| e.div_ceil(lbs) * lbs)
        .filter(|&e| e <= g.size)
    else {
        return Ok(None);
    };
    let n = usize::try_from(end - start)
        .map_err(|_| crate::Error::new(crate::ErrorKind::OutOfRange, "probe read"))?;
    let mut buf = vec![0u8; n];
    dev.read_at(&mut buf, start)?;
    let skip = usize::try_from(off - start).unwrap_or(0);
    Ok(Some(buf[skip..skip + len].to_vec()))
}

/// Whether `b` starts with an md superblock of major version 1.
fn md1_at(b: &[u8], at: usize) -> bool {
    le32(b, at) == Ok(MD_MAGIC) && le32(b, at + 4) == Ok(1)
}

/// The array UUID (mdadm's form) and name an md 1.x superblock at `at` stores.
fn md1_detail(b: &[u8], at: usize) -> Option<String> {
    let uuid = b.get(at + 16..at + 32)?;
    let name = b.get(at + 32..at + 64)?;
    let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
    let mut u = String::with_capacity(35);
    for (i, x) in uuid.iter().enumerate() {
        if i > 0 && i % 4 == 0 {
            u.push(':');
        }
        u.push_str(&format!("{x:02x}"));
    }
    Some(format!(
        "member of array {u} ({})",
        String::from_utf8_lossy(name)
    ))
}

/// Every signature found on `dev`, in the order of the table above.
pub fn probe(dev: &dyn BlockDevice) -> Result<Found> {
    let size = dev.geometry().size;
    let mut out = Vec::new();
    let mut hit = |kind: Kind, offset: u64, detail: Option<String>| {
        out.push(Signature {
            kind,
            offset,
            detail,
            flavour: None,
        });
    };
    let head_len = usize::try_from(size.min(8192)).unwrap_or(8192);
    let head = read(dev, 0, head_len)?.unwrap_or_default();
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);

    if head.len() >= 8192 && md1_at(&head, 4096) {
        hit(Kind::Md(MdVersion::V1_2), 4096, md1_detail(&head, 4096));
    }
    if md1_at(&head, 0) {
        hit(Kind::Md(MdVersion::V1_1), 0, None);
    }
    if at(0, LUKS_MAGIC) {
        let version = be16(&head, 6).unwrap_or(0);
        hit(Kind::Luks { version }, 0, None);
    }
    if at(0, b"XFSB") {
        // sb_uuid at 32, sb_fname (12 bytes) at 108.
        let d = label_uuid(text_field(&head, 108, 12), uuid_field(&head, 32));
        hit(Kind::Xfs, 0, d);
    }
    for sector in 0..4usize {
        if at(512 * sector, LVM_LABEL_ID) {
            hit(Kind::LvmPv, 512 * sector as u64, None);
        }
    }
    // ext2/3/4: s_magic, 56 bytes into the superblock at 1024.
    // s_uuid at +104, s_volume_name (16 bytes) at +120.
    if at(1080, &[0x53, 0xef]) {
        let d = label_uuid(
            text_field(&head, 1024 + 120, 16),
            uuid_field(&head, 1024 + 104),
        );
        hit(Kind::Ext, 1080, d);
    }
    // swap: the last 10 bytes of the first 4 KiB page; a v1 header at 1024 has the UUID
    // at +12 and the label (16 bytes) at +28.
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        let d = label_uuid(
            text_field(&head, 1024 + 28, 16),
            uuid_field(&head, 1024 + 12),
        );
        hit(Kind::Swap, 4086, d);
    }
    // GPT: the header in LBA 1 (512-byte sectors); else an MBR with a used entry.
    let mbr_used = (0..4)
        .filter(|i| head.get(446 + 16 * i + 4).is_some_and(|&t| t != 0))
        .count();
    if at(512, b"EFI PART") {
        let d = gpt_partitions(dev, &head)?.map(partitions);
        hit(Kind::Gpt, 512, d);
    } else if at(510, &[0x55, 0xaa]) && mbr_used > 0 {
        hit(Kind::Mbr, 510, Some(partitions(mbr_used)));
    }
    // btrfs: the superblock at 64 KiB, its magic 64 bytes in.
    if read(dev, 65_600, 8)?.is_some_and(|b| b == b"_BHRfS_M") {
        hit(Kind::Btrfs, 65_600, None);
    }
    for off in LUKS2_SECONDARY_OFFSETS {
        if read(dev, off, 6)?.is_some_and(|b| b == LUKS2_SECONDARY_MAGIC) {
            hit(Kind::Luks2Secondary, off, None);
        }
    }
    let sectors = size / 512;
    // md 1.0: sector (sectors - 16) & !7.
    if sectors >= 24 {
        let off = ((sectors - 16) & !7) * 512;
        if read(dev, off, 8)?.is_some_and(|b| md1_at(&b, 0)) {
            hit(Kind::Md(MdVersion::V1_0), off, None);
        }
    }
    // md 0.90: the last 64 KiB-aligned 64 KiB block.
    if sectors >= 256 {
        let off = ((sectors & !127) - 128) * 512;
        if read(dev, off, 4)?.is_some_and(|b| le32(&b, 0) == Ok(MD_MAGIC)) {
            hit(Kind::Md(MdVersion::V0_90), off, None);
        }
    }
    for s in &mut out {
        if s.kind == Kind::Ext {
            s.flavour = Some(ext_flavour(&head));
        }
    }
    Ok(Found {
        size,
        signatures: out,
    })
}

/// Where md's magic lies at byte 4096 or 0 (the 1.2 and 1.1 places), whatever major
/// version follows it, when the device has at least 8 KiB. [`probe`] reports md 1.x only;
/// LVM's pvcreate refuses the bare magic as well (an 0.90 or damaged superblock there
/// still says "this was an md member"), and asks this.
pub fn md_magic_at_start(dev: &dyn BlockDevice) -> Result<Option<u64>> {
    if dev.geometry().size < 8192 {
        return Ok(None);
    }
    let head = read(dev, 0, 8192)?.unwrap_or_default();
    Ok([4096u64, 0]
        .into_iter()
        .find(|&off| le32(&head, usize::try_from(off).unwrap_or(0)) == Ok(MD_MAGIC)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDisk, MemDisk, OpenOptions, WriteFlags};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn disk_with(size: u64, at: &[(u64, &[u8])]) -> MemDisk {
        let d = MemDisk::new(size);
        for &(off, bytes) in at {
            // MemDisk takes whole 512-byte blocks: read, patch, write back.
            let start = off - off % 512;
            let end = (off + bytes.len() as u64).div_ceil(512) * 512;
            let mut buf = vec![0u8; usize::try_from(end - start).unwrap()];
            d.read_at(&mut buf, start).unwrap();
            let o = usize::try_from(off - start).unwrap();
            buf[o..o + bytes.len()].copy_from_slice(bytes);
            d.write_at(&buf, start, WriteFlags::NONE).unwrap();
        }
        d
    }

    fn kinds(f: &Found) -> Vec<(Kind, u64)> {
        f.signatures.iter().map(|s| (s.kind, s.offset)).collect()
    }

    #[test]
    fn bare_md_magic_is_found_whatever_its_version() {
        let magic = MD_MAGIC.to_le_bytes();
        let v0 = [magic[0], magic[1], magic[2], magic[3], 0, 0, 0, 0];
        assert_eq!(
            md_magic_at_start(&disk_with(1 << 20, &[(4096, &v0)])).unwrap(),
            Some(4096)
        );
        assert_eq!(
            md_magic_at_start(&disk_with(1 << 20, &[(0, &magic)])).unwrap(),
            Some(0)
        );
        // probe() reports md 1.x only; the bare magic is not one.
        assert!(probe(&disk_with(1 << 20, &[(4096, &v0)]))
            .unwrap()
            .is_empty());
        assert_eq!(md_magic_at_start(&MemDisk::new(1 << 20)).unwrap(), None);
        assert_eq!(md_magic_at_start(&MemDisk::new(4096)).unwrap(), None);
    }

    #[test]
    fn blank_and_tiny_devices_hold_nothing() {
        assert!(probe(&MemDisk::new(1 << 20)).unwrap().is_empty());
        assert!(probe(&MemDisk::new(512)).unwrap().is_empty());
        assert!(probe(&MemDisk::new(0)).unwrap().is_empty());
    }

    #[test]
    fn each_signature_at_its_offset() {
        let md1 = [0xfc, 0x4e, 0x2b, 0xa9, 1, 0, 0, 0];
        let mut md12 = vec![0u8; 64];
        md12[..8].copy_from_slice(&md1);
        md12[16..32].copy_from_slice(&[0x11; 16]);
        md12[32..37].copy_from_slice(b"h:vol");
        let size = 8 << 20;
        let sectors = size / 512;
        let md10 = ((sectors - 16) & !7) * 512;
        let md090 = ((sectors & !127) - 128) * 512;
        type Case<'a> = (Vec<(u64, &'a [u8])>, Vec<(Kind, u64)>);
        let cases: Vec<Case<'_>> = vec![
            (vec![(4096, &md12)], vec![(Kind::Md(MdVersion::V1_2), 4096)]),
            (vec![(0, &md1)], vec![(Kind::Md(MdVersion::V1_1), 0)]),
            (vec![(md10, &md1)], vec![(Kind::Md(MdVersion::V1_0), md10)]),
            (
                vec![(md090, &md1[..4])],
                vec![(Kind::Md(MdVersion::V0_90), md090)],
            ),
            (
                vec![(0, b"LUKS\xba\xbe\x00\x02")],
                vec![(Kind::Luks { version: 2 }, 0)],
            ),
            (
                vec![(64 << 10, b"SKUL\xba\xbe")],
                vec![(Kind::Luks2Secondary, 64 << 10)],
            ),
            (vec![(512, b"LABELONE")], vec![(Kind::LvmPv, 512)]),
            (vec![(1536, b"LABELONE")], vec![(Kind::LvmPv, 1536)]),
            (vec![(1080, &[0x53, 0xef])], vec![(Kind::Ext, 1080)]),
            (vec![(0, b"XFSB")], vec![(Kind::Xfs, 0)]),
            (vec![(4086, b"SWAPSPACE2")], vec![(Kind::Swap, 4086)]),
            (vec![(4086, b"SWAP-SPACE")], vec![(Kind::Swap, 4086)]),
            (
                vec![(510, &[0x55, 0xaa]), (512, b"EFI PART")],
                vec![(Kind::Gpt, 512)],
            ),
            (
                vec![(446 + 4, &[0x83]), (510, &[0x55, 0xaa])],
                vec![(Kind::Mbr, 510)],
            ),
            // A boot sector with no partition is not a partition table.
            (vec![(510, &[0x55, 0xaa])], vec![]),
            (vec![(65_600, b"_BHRfS_M")], vec![(Kind::Btrfs, 65_600)]),
            // md 1.x magic with another major version is not md 1.x.
            (vec![(4096, &[0xfc, 0x4e, 0x2b, 0xa9, 2, 0, 0, 0])], vec![]),
            // md first: an md 1.0 member whose data starts with a LUKS header.
            (
                vec![(0, b"LUKS\xba\xbe\x00\x01"), (md10, &md1)],
                vec![
                    (Kind::Luks { version: 1 }, 0),
                    (Kind::Md(MdVersion::V1_0), md10),
                ],
            ),
        ];
        for (put, want) in cases {
            let f = probe(&disk_with(size, &put)).unwrap();
            assert_eq!(kinds(&f), want, "{put:?}");
        }
        let f = probe(&disk_with(size, &[(4096, &md12)])).unwrap();
        assert_eq!(
            f.signatures[0].to_string(),
            "has a signature at byte 4096: md superblock 1.2: member of array \
             11111111:11111111:11111111:11111111 (h:vol)"
        );
    }

    /// The sentence every writing verb refuses with names the format, its label and UUID
    /// (or its partitions), with the article said aloud.
    #[test]
    fn refusals_name_what_is_there() {
        let mut ext = vec![0u8; 2048];
        ext[1080..1082].copy_from_slice(&[0x53, 0xef]);
        ext[1024 + 96] = 0x40; // extents: ext4
        ext[1024 + 104..1024 + 120].copy_from_slice(&[0xab; 16]);
        ext[1024 + 120..1024 + 124].copy_from_slice(b"home");
        let f = probe(&disk_with(8 << 20, &[(0, &ext)])).unwrap();
        assert_eq!(
            f.refusal("nbd.img").unwrap(),
            "nbd.img holds an ext4 filesystem (label \"home\", UUID \
             abababab-abab-abab-abab-abababababab)"
        );
        let mut ext3 = ext.clone();
        ext3[1024 + 96] = 0x2;
        ext3[1024 + 92] = 0x4;
        ext3[1024 + 120..1024 + 136].fill(0);
        let f = probe(&disk_with(8 << 20, &[(0, &ext3)])).unwrap();
        assert_eq!(
            f.refusal("d").unwrap(),
            "d holds an ext3 filesystem (UUID abababab-abab-abab-abab-abababababab)"
        );
        for (put, want) in [
            (
                vec![(0, b"LUKS\xba\xbe\x00\x02".as_slice())],
                "d holds a LUKS header",
            ),
            (
                vec![
                    (446 + 4, &[0x83][..]),
                    (462 + 4, &[0x82]),
                    (510, &[0x55, 0xaa]),
                ],
                "d holds an MBR partition table (2 partitions)",
            ),
            (vec![(0, b"XFSB")], "d holds an XFS filesystem"),
            (
                vec![(512, b"LABELONE")],
                "d holds an LVM2 physical volume label",
            ),
        ] {
            let f = probe(&disk_with(8 << 20, &put)).unwrap();
            assert_eq!(f.refusal("d").unwrap(), want);
        }
        assert_eq!(probe(&MemDisk::new(1 << 20)).unwrap().refusal("d"), None);
    }

    #[test]
    fn luks_version_as_cryptsetup_decides() {
        let v =
            |put: &[(u64, &[u8])], size: u64| probe(&disk_with(size, put)).unwrap().luks_version();
        assert_eq!(v(&[(0, b"LUKS\xba\xbe\x00\x01")], 1 << 20), Some(1));
        assert_eq!(v(&[(0, b"LUKS\xba\xbe\x00\x02")], 1 << 20), Some(2));
        assert_eq!(v(&[(0, b"LUKS\xba\xbe\x00\x03")], 1 << 20), None);
        // Primary gone, secondary there.
        assert_eq!(v(&[(16 << 10, b"SKUL\xba\xbe")], 1 << 20), Some(2));
        // Too small for a whole header.
        assert_eq!(v(&[(0, b"LUKS\xba\xbe\x00\x02")], 2048), None);
        assert_eq!(v(&[(16 << 10, b"SKUL\xba\xbe")], 18 << 10), None);
        assert_eq!(v(&[(16 << 10, b"SKUL\xba\xbe")], 20 << 10), Some(2));
    }

    /// A sparse temp file, removed on drop.
    struct Temp(PathBuf);
    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn temp(name: &str, size: u64) -> Temp {
        let dir = std::env::var_os("TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let p = dir.join(format!("cairn-probe-{}-{name}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(size).unwrap();
        Temp(p)
    }
    fn open(p: &Path) -> FileDisk {
        let o = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        FileDisk::open(p, &o).unwrap()
    }
    fn tool(argv: &[&str]) -> bool {
        match Command::new(argv[0]).args(&argv[1..]).output() {
            Ok(o) if o.status.success() => true,
            Ok(o) => panic!("{argv:?}: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                eprintln!("SKIP: {} is not installed ({e})", argv[0]);
                false
            }
        }
    }

    #[test]
    fn real_filesystems_made_by_their_tools() {
        for (name, kind, at, size, argv) in [
            (
                "ext4",
                Kind::Ext,
                1080,
                8u64 << 20,
                &["mkfs.ext4", "-q", "-F"][..],
            ),
            (
                "xfs",
                Kind::Xfs,
                0,
                300 << 20,
                &["mkfs.xfs", "-q", "-f"][..],
            ),
            ("swap", Kind::Swap, 4086, 1 << 20, &["mkswap"][..]),
        ] {
            let t = temp(name, size);
            let path = t.0.to_str().unwrap();
            let mut a = argv.to_vec();
            a.push(path);
            if !tool(&a) {
                continue;
            }
            let f = probe(&open(&t.0)).unwrap();
            assert_eq!(kinds(&f), vec![(kind, at)], "{name}");
        }
    }

    #[test]
    fn real_luks_images_from_the_vectors() {
        let dir = std::env::var_os("CAIRN_VECTORS")
            .map_or_else(|| PathBuf::from("../../../shared/vectors"), PathBuf::from)
            .join("luks-images");
        for (image, version) in [
            ("luks1_aes-xts-plain64-sha256.img.xz", 1),
            ("luks2_valid_hdr.img.xz", 2),
        ] {
            let src = dir.join(image);
            if !src.exists() {
                eprintln!("SKIP: {} is missing (set CAIRN_VECTORS)", src.display());
                continue;
            }
            let t = temp(image, 0);
            let out = match Command::new("xz").arg("-dc").arg(&src).output() {
                Ok(o) if o.status.success() => o.stdout,
                other => {
                    eprintln!("SKIP: cannot run xz: {other:?}");
                    continue;
                }
            };
            std::fs::write(&t.0, &out).unwrap();
            let f = probe(&open(&t.0)).unwrap();
            assert_eq!(f.signatures[0].kind, Kind::Luks { version }, "{image}");
            assert_eq!(f.luks_version(), Some(version), "{image}");
        }
    }
}
