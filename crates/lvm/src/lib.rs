//! cairn's volume layer: LVM2 volume groups on disk exactly as `lvm` writes them, and
//! their linear and striped logical volumes as block devices.
//!
//! ```text
//!   NBD export (an LV)
//!     LogicalVolume           lv.rs     an LV over its PVs (map.rs: dm-linear / dm-stripe maths)
//!   Vg                        vg.rs     open (highest valid seqno wins), lvcreate/extend/
//!                                       reduce/rename/remove, commit to every PV's mdas
//!     VolumeGroup             meta.rs   the VG text as a model, unknown keys kept
//!     FreeMap                 alloc.rs  lvm's free-extent accounting and placement
//!     text.rs (LVM2 001 text) mda.rs (mda_header, circular buffer) label.rs (LABELONE)
//!   PvDevice (BlockDevice)    a file, an md array, a LUKS volume
//! ```
//!
//! Formats: `../shared/docs/ondisk-formats.md` §4. Every metadata change writes the new
//! text to free space in every metadata area, flushes, precommits, flushes, commits and
//! flushes, on all PVs phase by phase, so a crash anywhere leaves the old or the new VG.

pub mod alloc;
pub mod crc;
mod io;
pub mod label;
pub mod lv;
mod map;
pub mod mda;
pub mod meta;
pub mod raid;
pub mod text;
pub mod vg;

use std::sync::Arc;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

pub use lv::LogicalVolume;
pub use meta::VolumeGroup;
pub use vg::{
    aligned_extent_size, extent_size_ok, LvChange, LvCreate, LvReport, OpenOptions, PvReport,
    RaidCreate, SegReport, Vg, VgReport,
};

use crate::io::{read_bytes, write_bytes};
use crate::label::{DiskLocn, PvHeader};
use crate::mda::MdaHeader;

/// pvcreate's default data start: 1 MiB.
pub const DEFAULT_PE_START: u64 = 1 << 20;
/// vgcreate's default extent size: 4 MiB.
pub const DEFAULT_EXTENT_SIZE: u64 = 4 << 20;
/// lvcreate's default stripe size: 64 KiB.
pub const DEFAULT_STRIPE_SIZE: u64 = 64 << 10;

/// A device to use as a PV, with the name used in messages and as the metadata's
/// device hint.
#[derive(Debug, Clone)]
pub struct PvDevice {
    /// A path or description ("/dev/shm/pv0.img", "md array d0.img,d1.img").
    pub name: String,
    pub dev: Arc<dyn BlockDevice>,
}

impl PvDevice {
    pub fn new(name: impl Into<String>, dev: Arc<dyn BlockDevice>) -> PvDevice {
        PvDevice {
            name: name.into(),
            dev,
        }
    }
}

/// What [`probe`] and [`pvcreate`] report about a PV.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PvInfo {
    /// Dashed uuid.
    pub uuid: String,
    pub device_size: u64,
    /// Byte offset of the first extent.
    pub pe_start: u64,
    pub metadata_areas: Vec<DiskLocn>,
    /// The VG the committed metadata names, if any.
    pub vg_name: Option<String>,
    pub vg_uuid: Option<String>,
    pub seqno: Option<u64>,
    /// Why no metadata could be read, when there are areas but no valid copy.
    pub metadata_error: Option<String>,
}

/// How [`pvcreate`] lays a PV out.
#[derive(Debug, Clone, Default)]
pub struct PvCreateOptions {
    /// Align the first extent to this many bytes instead of LCM(1 MiB, optimal I/O).
    pub data_alignment: Option<u64>,
    /// Overwrite a device that carries another signature (a filesystem, a partition
    /// table, swap, md, LUKS, an LVM label).
    pub force: bool,
    /// Use this uuid (dashed or not) instead of a fresh one.
    pub uuid: Option<String>,
}

/// The message of an error without the kind's suffix, to re-word it.
pub(crate) fn message_of(e: &Error) -> String {
    let s = e.to_string();
    let suffix = format!(": {}", e.kind().describe());
    match s.strip_suffix(&suffix) {
        Some(m) => m.to_string(),
        None => s,
    }
}

/// Reads the label and the best metadata copy of a device. `Ok(None)` if there is no
/// LVM2 label.
pub fn probe(dev: &dyn BlockDevice) -> Result<Option<PvInfo>> {
    let Some(h) = label::read(dev)? else {
        return Ok(None);
    };
    let scan = vg::scan_header(dev, "the device", &h);
    let best = scan.copies.iter().max_by_key(|c| c.seqno);
    Ok(Some(PvInfo {
        uuid: label::format_uuid(&h.uuid),
        device_size: h.device_size,
        pe_start: h.data_areas.first().map_or(0, |d| d.offset),
        metadata_areas: h.metadata_areas.clone(),
        vg_name: best.map(|c| c.name.clone()),
        vg_uuid: best.map(|c| c.id.clone()),
        seqno: best.map(|c| c.seqno),
        metadata_error: if best.is_none() && !scan.errors.is_empty() {
            Some(scan.errors.join("; "))
        } else {
            None
        },
    }))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// What pvcreate refuses to overwrite without `force`, named as the shared probe names
/// it (`cairn_block::probe`: filesystems, partition tables, swap, md, LUKS), plus md's
/// magic at 0 or 4096 whatever the major version that follows it (an 0.90 or damaged
/// superblock there still says "this was an md member"). An LVM label is [`probe`]'s.
fn other_signature(pv: &PvDevice) -> Result<Option<String>> {
    let dev = &*pv.dev;
    let mut found = cairn_block::probe::probe(dev)?;
    found
        .signatures
        .retain(|s| s.kind != cairn_block::probe::Kind::LvmPv);
    if let Some(r) = found.refusal(&pv.name) {
        return Ok(Some(r));
    }
    if let Some(off) = cairn_block::probe::md_magic_at_start(dev)? {
        return Ok(Some(format!(
            "{} holds an md superblock (its magic at byte {off})",
            pv.name
        )));
    }
    Ok(None)
}

/// Wipes every signature the probe finds (as lvm's pvcreate wipes what it reports), so
/// nothing finds the old format again: its magic bytes become zeros. The label area
/// (sectors 0-3) is cleared by pvcreate itself.
fn wipe_signatures(dev: &dyn BlockDevice) -> Result<()> {
    use cairn_block::probe::Kind;
    let found = cairn_block::probe::probe(dev)?;
    for s in &found.signatures {
        let len: usize = match s.kind {
            Kind::Md(_) | Kind::Luks { .. } | Kind::Luks2Secondary | Kind::Gpt => 8,
            Kind::LvmPv => 8,
            Kind::Ext | Kind::Mbr => 2,
            Kind::Xfs => 4,
            Kind::Swap => 10,
            Kind::Btrfs => 8,
            _ => continue,
        };
        write_bytes(
            dev,
            s.offset,
            &vec![0u8; len],
            WriteFlags::NONE,
            &format!("the old {} signature", s.what()),
        )?;
    }
    // A GPT's backup header, in the last sector, would bring the table back.
    let size = dev.geometry().size;
    if found.get(Kind::Gpt).is_some() && size >= 1024 {
        let last = size - 512;
        if read_bytes(dev, last, 8, "a GPT backup header")? == b"EFI PART" {
            write_bytes(
                dev,
                last,
                &[0u8; 8],
                WriteFlags::NONE,
                "the old GPT backup header",
            )?;
        }
    }
    Ok(())
}

/// Makes `pv` an LVM2 physical volume: label in sector 1, one metadata area at 4096,
/// data from `pe_start` (1 MiB, raised to a multiple of the device's optimal I/O size so
/// every extent starts on a full stripe of an md array below).
pub fn pvcreate(pv: &PvDevice, opts: &PvCreateOptions) -> Result<PvInfo> {
    let dev = &*pv.dev;
    let g = dev.geometry();
    let ctx = |e: Error| e.context(&pv.name);
    if !opts.force {
        if let Some(info) = probe(dev).map_err(ctx)? {
            let vg = info
                .vg_name
                .map(|v| format!(" in VG {v}"))
                .unwrap_or_default();
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} is already an LVM2 physical volume{vg} (pass force to overwrite it)",
                    pv.name
                ),
            ));
        }
        if let Some(sig) = other_signature(pv).map_err(ctx)? {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{sig} (pass force to overwrite it)"),
            ));
        }
    }
    let align = match opts.data_alignment {
        Some(a) => {
            if a == 0 || a % 512 != 0 {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("data alignment {a} is not a positive multiple of 512 bytes"),
                ));
            }
            a
        }
        None => {
            let o = u64::from(g.optimal_io_size).max(512);
            DEFAULT_PE_START / gcd(DEFAULT_PE_START, o) * o
        }
    };
    let lbs = u64::from(g.logical_block_size.max(512));
    let pe_start = DEFAULT_PE_START.div_ceil(align) * align;
    if pe_start % lbs != 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("data alignment {align} is not a multiple of the device's {lbs}-byte blocks"),
        ));
    }
    if g.size < pe_start + DEFAULT_PE_START {
        return Err(Error::new(
            ErrorKind::NoSpace,
            format!(
                "{} is too small for a PV: {} bytes, but the data area starts at {pe_start}",
                pv.name, g.size
            ),
        ));
    }
    let uuid = match &opts.uuid {
        Some(u) => {
            let u = label::strip_uuid(u);
            if !label::uuid_valid(&u) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("invalid PV uuid {u:?}"),
                ));
            }
            u
        }
        None => label::new_uuid(),
    };
    let mda = DiskLocn {
        offset: mda::DEFAULT_MDA_START,
        size: mda::DEFAULT_MDA_SIZE,
    };
    let header = PvHeader {
        uuid,
        device_size: g.size,
        data_areas: vec![DiskLocn {
            offset: pe_start,
            size: 0,
        }],
        metadata_areas: vec![mda],
        ext_version: label::PV_HEADER_EXTENSION_VSN,
        ext_flags: 0,
        bootloader_areas: vec![],
        sector: label::LABEL_SECTOR,
    };
    let run = || -> Result<()> {
        if opts.force {
            wipe_signatures(dev)?;
        }
        // Sectors 0-3 hold only the label; clearing them removes old labels and magics.
        write_bytes(dev, 0, &[0u8; 2048], WriteFlags::NONE, "the label area")?;
        MdaHeader::empty(mda).write(dev, WriteFlags::NONE)?;
        label::write(dev, &header)?;
        dev.flush().map_err(|e| e.context("flush"))
    };
    run().map_err(ctx)?;
    Ok(PvInfo {
        uuid: label::format_uuid(&header.uuid),
        device_size: g.size,
        pe_start,
        metadata_areas: vec![mda],
        vg_name: None,
        vg_uuid: None,
        seqno: None,
        metadata_error: None,
    })
}

/// Checks a VG or LV name the way lvm does: letters, digits and `+_.-`, not starting
/// with `-`, not `.`/`..`, at most 127 bytes, and for LVs none of the names lvm keeps
/// for itself.
pub fn validate_name(kind: &str, name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("invalid {kind} name {name:?}: {why}"),
        ))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 127 {
        return bad("longer than 127 characters");
    }
    if name == "." || name == ".." {
        return bad("reserved");
    }
    if name.starts_with('-') {
        return bad("it may not start with '-'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "+_.-".contains(*c)))
    {
        return bad(&format!(
            "character {c:?} is not allowed (only letters, digits and +_.-)"
        ));
    }
    if kind == "LV" {
        for p in ["snapshot", "pvmove"] {
            if name.starts_with(p) {
                return bad(&format!("names starting with {p:?} are reserved"));
            }
        }
        for s in [
            "_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage",
            "_mlog", "_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin",
            "_wcorig",
        ] {
            if name.contains(s) {
                return bad(&format!("names containing {s:?} are reserved"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("VG", "vg0").is_ok());
        assert!(validate_name("LV", "a+b_c.d-e").is_ok());
        assert!(validate_name("LV", "-x").is_err());
        assert!(validate_name("LV", "a b").is_err());
        assert!(validate_name("LV", "x_rimage_0").is_err());
        assert!(validate_name("LV", "snapshot1").is_err());
        assert!(validate_name("VG", "..").is_err());
        assert!(validate_name("VG", "").is_err());
    }
}
