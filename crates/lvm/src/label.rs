//! The PV label (ondisk-formats.md §4.1): a 512-byte sector in sectors 0-3 (pvcreate uses
//! sector 1) holding `label_header` and `pv_header`.
//!
//! ```text
//!   label sector   0 id "LABELONE" | 8 sector_xl | 16 crc_xl (of bytes 20..512)
//!                 20 offset_xl (32) | 24 type "LVM2 001"
//!   pv_header     32 pv_uuid[32] | 64 device_size | 72 data areas {offset,size}.. {0,0}
//!                 then metadata areas {offset,size}.. {0,0}
//!                 then extension: version (2), flags (1 = PV_EXT_USED),
//!                 bootloader areas {offset,size}.. {0,0}
//! ```
//!
//! Every list is bounded by the sector: a missing terminator is corruption, never a read
//! past the end.

use cairn_block::codec::{le32, le64, put_le32, put_le64};
use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::crc::crc;
use crate::io::{read_bytes, write_bytes};

pub const SECTOR: u64 = 512;
const SECTOR_BYTES: usize = 512;
pub const LABEL_ID: &[u8; 8] = b"LABELONE";
pub const LVM2_TYPE: &[u8; 8] = b"LVM2 001";
/// Sectors the label may be in (`LABEL_SCAN_SECTORS`).
pub const LABEL_SCAN_SECTORS: u64 = 4;
/// The sector pvcreate writes the label to.
pub const LABEL_SECTOR: u64 = 1;
/// `pv_header_extension.flags`: the PV belongs to a VG.
pub const PV_EXT_USED: u32 = 1;
/// The extension version pvcreate writes.
pub const PV_HEADER_EXTENSION_VSN: u32 = 2;

const PV_HEADER_OFFSET: usize = 32;
const UUID_LEN: usize = 32;
const LOCN_SIZE: usize = 16;

/// A `disk_locn`: byte offset and size on the PV (size 0: to the end of the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct DiskLocn {
    pub offset: u64,
    pub size: u64,
}

/// A parsed `pv_header` (plus where the label was).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvHeader {
    /// The 32 uuid characters, without dashes.
    pub uuid: String,
    pub device_size: u64,
    pub data_areas: Vec<DiskLocn>,
    pub metadata_areas: Vec<DiskLocn>,
    /// 0 when the header has no extension (written by old lvm).
    pub ext_version: u32,
    pub ext_flags: u32,
    pub bootloader_areas: Vec<DiskLocn>,
    /// The sector the label was found in.
    pub sector: u64,
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// Reads a zero-terminated `disk_locn` list starting at `*pos`; leaves `*pos` after the
/// terminator.
fn read_list(s: &[u8], pos: &mut usize, what: &str) -> Result<Vec<DiskLocn>> {
    let mut out = Vec::new();
    loop {
        if *pos + LOCN_SIZE > s.len() {
            return Err(corrupt(format!(
                "PV label: the {what} list has no terminator"
            )));
        }
        let l = DiskLocn {
            offset: le64(s, *pos)?,
            size: le64(s, *pos + 8)?,
        };
        *pos += LOCN_SIZE;
        if l.offset == 0 && l.size == 0 {
            return Ok(out);
        }
        out.push(l);
    }
}

/// Whether a uuid has LVM's 32 characters from its alphabet.
pub fn uuid_valid(u: &str) -> bool {
    u.len() == UUID_LEN
        && u.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'!' || c == b'#')
}

/// Parses one label sector found at `sector`. `Ok(None)` if it holds no `LABELONE`.
pub fn parse_sector(s: &[u8], sector: u64) -> Result<Option<PvHeader>> {
    if s.len() < SECTOR_BYTES || &s[..8] != LABEL_ID {
        return Ok(None);
    }
    let s = &s[..SECTOR_BYTES];
    let stored = le32(s, 16)?;
    let computed = crc(&s[20..]);
    if stored != computed {
        return Err(corrupt(format!(
            "PV label in sector {sector}: checksum {stored:#010x} does not match the computed \
             {computed:#010x}"
        )));
    }
    let claimed = le64(s, 8)?;
    if claimed != sector {
        return Err(corrupt(format!(
            "PV label in sector {sector} says it belongs in sector {claimed}"
        )));
    }
    if &s[24..32] != LVM2_TYPE {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "PV label in sector {sector}: type {:?} is not \"LVM2 001\"",
                String::from_utf8_lossy(&s[24..32])
            ),
        ));
    }
    let off = le32(s, 20)? as usize;
    if off != PV_HEADER_OFFSET {
        return Err(corrupt(format!(
            "PV label in sector {sector}: pv_header offset {off} is not 32"
        )));
    }
    let uuid = String::from_utf8_lossy(&s[off..off + UUID_LEN]).into_owned();
    if !uuid_valid(&uuid) {
        return Err(corrupt(format!(
            "PV label in sector {sector}: invalid PV uuid {uuid:?}"
        )));
    }
    let device_size = le64(s, off + UUID_LEN)?;
    let mut pos = off + UUID_LEN + 8;
    let data_areas = read_list(s, &mut pos, "data area")?;
    let metadata_areas = read_list(s, &mut pos, "metadata area")?;
    let (mut ext_version, mut ext_flags, mut bootloader_areas) = (0, 0, Vec::new());
    if pos + 8 <= s.len() {
        ext_version = le32(s, pos)?;
        if ext_version != 0 {
            ext_flags = le32(s, pos + 4)?;
            pos += 8;
            bootloader_areas = read_list(s, &mut pos, "bootloader area")?;
        }
    }
    Ok(Some(PvHeader {
        uuid,
        device_size,
        data_areas,
        metadata_areas,
        ext_version,
        ext_flags,
        bootloader_areas,
        sector,
    }))
}

/// Encodes the label sector for `pv` (written at `pv.sector`).
pub fn encode(pv: &PvHeader) -> Result<Vec<u8>> {
    if !uuid_valid(&pv.uuid) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("invalid PV uuid {:?}", pv.uuid),
        ));
    }
    let mut s = vec![0u8; SECTOR_BYTES];
    s[..8].copy_from_slice(LABEL_ID);
    put_le64(&mut s, 8, pv.sector);
    put_le32(&mut s, 20, 32u32);
    s[24..32].copy_from_slice(LVM2_TYPE);
    let mut p = PV_HEADER_OFFSET;
    s[p..p + UUID_LEN].copy_from_slice(pv.uuid.as_bytes());
    p += UUID_LEN;
    put_le64(&mut s, p, pv.device_size);
    p += 8;
    let ext = if pv.ext_version != 0 { 8 } else { 0 };
    let lists = pv.data_areas.len()
        + pv.metadata_areas.len()
        + 2
        + if ext > 0 {
            pv.bootloader_areas.len() + 1
        } else {
            0
        };
    if p + lists * LOCN_SIZE + ext > s.len() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "too many areas for one PV label sector",
        ));
    }
    let put = |s: &mut [u8], p: &mut usize, l: &DiskLocn| {
        put_le64(s, *p, l.offset);
        put_le64(s, *p + 8, l.size);
        *p += LOCN_SIZE;
    };
    for l in &pv.data_areas {
        put(&mut s, &mut p, l);
    }
    p += LOCN_SIZE;
    for l in &pv.metadata_areas {
        put(&mut s, &mut p, l);
    }
    p += LOCN_SIZE;
    if ext > 0 {
        put_le32(&mut s, p, pv.ext_version);
        put_le32(&mut s, p + 4, pv.ext_flags);
        p += 8;
        for l in &pv.bootloader_areas {
            put(&mut s, &mut p, l);
        }
    }
    let c = crc(&s[20..]);
    put_le32(&mut s, 16, c);
    Ok(s)
}

/// Finds and parses the label in sectors 0-3. `Ok(None)` if there is none.
pub fn read(dev: &dyn BlockDevice) -> Result<Option<PvHeader>> {
    let size = dev.geometry().size;
    let n = LABEL_SCAN_SECTORS.min(size / SECTOR);
    if n == 0 {
        return Ok(None);
    }
    let head = read_bytes(dev, 0, n * SECTOR, "the PV label")?;
    for sector in 0..n {
        let at = usize::try_from(sector * SECTOR).unwrap_or(0);
        if let Some(h) = parse_sector(&head[at..at + SECTOR_BYTES], sector)? {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

/// Writes the label to its sector with FUA, and clears `LABELONE` from the other scan
/// sectors so only one label is found.
pub fn write(dev: &dyn BlockDevice, pv: &PvHeader) -> Result<()> {
    let s = encode(pv)?;
    for other in 0..LABEL_SCAN_SECTORS {
        if other != pv.sector {
            let b = read_bytes(dev, other * SECTOR, 8, "the PV label area")?;
            if b == LABEL_ID {
                write_bytes(
                    dev,
                    other * SECTOR,
                    &[0u8; 8],
                    WriteFlags::NONE,
                    "an old label",
                )?;
            }
        }
    }
    write_bytes(dev, pv.sector * SECTOR, &s, WriteFlags::FUA, "the PV label")
}

/// Formats a 32-character uuid with LVM's dashes (6-4-4-4-4-4-6).
pub fn format_uuid(u: &str) -> String {
    if u.len() != UUID_LEN || !u.is_ascii() {
        return u.to_string();
    }
    let groups = [6, 4, 4, 4, 4, 4, 6];
    let mut out = String::with_capacity(38);
    let mut p = 0;
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        out.push_str(&u[p..p + g]);
        p += g;
    }
    out
}

/// Removes the dashes of a displayed uuid.
pub fn strip_uuid(u: &str) -> String {
    u.chars().filter(|&c| c != '-').collect()
}

/// A fresh uuid: 32 characters from LVM's generation alphabet.
pub fn new_uuid() -> String {
    use rand::Rng;
    const C: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rngs::OsRng;
    (0..UUID_LEN)
        .map(|_| char::from(C[rng.gen_range(0..C.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PvHeader {
        PvHeader {
            uuid: "WKCTnRTYCUfnop8qheb7Ff5k4DrnoKPq".into(),
            device_size: 64 << 20,
            data_areas: vec![DiskLocn {
                offset: 1 << 20,
                size: 0,
            }],
            metadata_areas: vec![DiskLocn {
                offset: 4096,
                size: 1_044_480,
            }],
            ext_version: 2,
            ext_flags: PV_EXT_USED,
            bootloader_areas: vec![],
            sector: 1,
        }
    }

    #[test]
    fn round_trip_and_crc() {
        let pv = sample();
        let s = encode(&pv).unwrap();
        assert_eq!(parse_sector(&s, 1).unwrap().unwrap(), pv);
        assert!(parse_sector(&s, 2).is_err(), "wrong sector");
        let mut bad = s.clone();
        bad[100] ^= 1;
        let e = parse_sector(&bad, 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.to_string().contains("checksum"), "{e}");
        assert_eq!(
            format_uuid(&pv.uuid),
            "WKCTnR-TYCU-fnop-8qhe-b7Ff-5k4D-rnoKPq"
        );
        assert_eq!(strip_uuid(&format_uuid(&pv.uuid)), pv.uuid);
        assert!(uuid_valid(&new_uuid()));
    }

    #[test]
    fn unterminated_list_is_corrupt() {
        let mut s = vec![0u8; 512];
        s[..8].copy_from_slice(LABEL_ID);
        put_le64(&mut s, 8, 1u64);
        put_le32(&mut s, 20, 32u32);
        s[24..32].copy_from_slice(LVM2_TYPE);
        s[32..64].copy_from_slice(b"WKCTnRTYCUfnop8qheb7Ff5k4DrnoKPq");
        for b in s[72..].iter_mut() {
            *b = 1;
        }
        let c = crc(&s[20..]);
        put_le32(&mut s, 16, c);
        assert_eq!(parse_sector(&s, 1).unwrap_err().kind(), ErrorKind::Corrupt);
    }
}
