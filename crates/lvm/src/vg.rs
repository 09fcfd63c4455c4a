//! [`Vg`]: an open volume group, its PVs and the metadata commit protocol.
//!
//! ```text
//!   open:   every PV ── label ── each mda header ── committed text (CRC) ── parse
//!           the highest valid seqno wins; every PV of that VG must be present
//!   change: model edit ── seqno+1 ── commit:
//!             1. text -> free space of every mda, every PV     flush all
//!             2. precommit headers (raw_locns[1] = new)        flush all
//!             3. commit headers (raw_locns[0] = new, [1] = 0)  flush all
//! ```
//!
//! All texts are durable before any header points at them, so after a crash at any
//! point the highest valid seqno on any PV is a complete old or new VG. A commit that
//! fails half-way poisons the handle: reopen the VG rather than guess what is on disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use serde::{Deserialize, Serialize};

use crate::alloc::{FreeMap, Run};
use crate::label::{self, format_uuid, strip_uuid, PvHeader};
use crate::lv::{LogicalVolume, MapArea, MapSegment};
use crate::mda::MdaHeader;
use crate::meta::{Area, LvMeta, PvMeta, SegKind, Segment, VolumeGroup};
use crate::{message_of, pvcreate, validate_name, PvCreateOptions, PvDevice, DEFAULT_STRIPE_SIZE};

/// How to open a VG.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Open even if PVs are missing: LVs on them are unavailable, nothing can change.
    pub partial: bool,
    /// Never write metadata; LVs open read-only.
    pub read_only: bool,
}

/// What `lv_create` makes.
#[derive(Debug, Clone, Default)]
pub struct LvCreate {
    pub name: String,
    pub extents: u64,
    /// 0 or 1: linear.
    pub stripes: u32,
    /// Bytes; lvm's default 64 KiB when `None`.
    pub stripe_size: Option<u64>,
}

/// What `lv_create_raid` makes: `lvcreate --type raid1|raid10|raid0|raid4|raid5|raid6`.
#[derive(Debug, Clone, Default)]
pub struct RaidCreate {
    pub name: String,
    /// The LV's (usable) size in extents; rounded up to whole stripe rows.
    pub extents: u64,
    /// `raid1`, `raid10`, `raid0`, `raid4`, `raid5` (`raid5_ls`), `raid6` (`raid6_zr`)...
    pub segtype: String,
    /// `-m`: extra copies (raid1: images - 1; raid10: copies - 1). Default 1.
    pub mirrors: Option<u32>,
    /// `-i`: data stripes (raid10/0/4/5/6). Default 2 (raid6: 3).
    pub stripes: Option<u32>,
    /// `-I`, bytes; default 64 KiB.
    pub stripe_size: Option<u64>,
    /// `-R`, bytes; default 2 MiB.
    pub region_size: Option<u64>,
    /// `--nosync`: skip the initial synchronisation (lvm marks the LV NOTSYNCED).
    pub nosync: bool,
}

/// What `lv_repair` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RaidRepair {
    pub name: String,
    /// Images moved to another PV: (image, old PV key or "missing", new PV key).
    pub moved: Vec<(String, String, String)>,
    /// Images rewritten from the others.
    pub rebuilt: Vec<String>,
}

/// A repair decided and its moves committed: what remains is the rebuild.
struct RepairPlan {
    /// `VG/LV`.
    full: String,
    r: crate::meta::RaidSeg,
    /// By image: rebuilt from the others.
    rebuild: Vec<bool>,
    moved: Vec<(String, String, String)>,
    /// The freshest superblock before the repair.
    freshest: Option<crate::raid::DmRaidSuper>,
}

/// The outcome of a change to an LV.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LvChange {
    pub name: String,
    /// The LV's size in extents afterwards (0 when removed).
    pub extents: u64,
    /// Adjustments made on the way, as lvm would print them ("Rounding size ...").
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VgReport {
    pub name: String,
    pub uuid: String,
    pub seqno: u64,
    /// Bytes.
    pub extent_size: u64,
    pub extent_count: u64,
    pub free_count: u64,
    pub size: u64,
    pub free: u64,
    pub pv_count: usize,
    pub lv_count: usize,
    pub pvs: Vec<PvReport>,
    pub lvs: Vec<LvReport>,
    /// Things worth knowing about how it was opened (stale or unreadable copies).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvReport {
    /// The device name given at open (or the metadata's hint if missing).
    pub name: String,
    /// The key in the metadata (`pv0`).
    pub key: String,
    pub uuid: String,
    pub missing: bool,
    pub dev_size: u64,
    /// Bytes.
    pub pe_start: u64,
    pub pe_count: u64,
    pub pe_alloc: u64,
    pub free_count: u64,
    pub size: u64,
    pub free: u64,
    pub allocatable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegReport {
    pub start_extent: u64,
    pub extent_count: u64,
    pub segtype: String,
    pub stripes: usize,
    /// Bytes (0 for linear).
    pub stripe_size: u64,
    /// lvm's `seg_pe_ranges`: `dev:first-last` per stripe.
    pub seg_pe_ranges: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LvReport {
    pub name: String,
    pub uuid: String,
    pub size: u64,
    pub extents: u64,
    pub visible: bool,
    pub writable: bool,
    /// `None` if cairn can serve it; otherwise why not.
    pub unavailable: Option<String>,
    pub segments: Vec<SegReport>,
    /// RAID LVs: how much is in sync, in percent (lvm's `sync_percent`), from the
    /// metadata LVs' superblocks, printed as lvm prints it ("100.00"); `None` for other
    /// LVs or when no superblock can be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_percent: Option<String>,
    /// RAID LVs a running server holds: its md array's background work as lvm names it
    /// (`raid_sync_action`: "idle", "resync", "recover", "check", "repair"). `None` in
    /// a report read from the PVs alone: only the array's runner knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_sync_action: Option<String>,
    /// RAID LVs a running server holds: mismatched sectors its last finished check or
    /// repair found (lvm's `raid_mismatch_count`, md's mismatch_cnt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_mismatch_count: Option<u64>,
}

/// One valid metadata copy found on a PV.
#[derive(Debug, Clone)]
pub(crate) struct Copy {
    pub name: String,
    pub id: String,
    pub seqno: u64,
    pub vg: VolumeGroup,
}

#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub mdas: Vec<MdaHeader>,
    pub copies: Vec<Copy>,
    pub errors: Vec<String>,
}

/// Reads every metadata area the label lists; problems become messages naming the PV.
pub(crate) fn scan_header(dev: &dyn BlockDevice, name: &str, h: &PvHeader) -> Scan {
    let mut scan = Scan::default();
    for area in &h.metadata_areas {
        let m = match MdaHeader::read(dev, *area) {
            Ok(m) => m,
            Err(e) => {
                scan.errors.push(format!("{name}: {}", message_of(&e)));
                continue;
            }
        };
        if m.committed.size != 0 && !m.ignored() {
            let parsed = m
                .read_text(dev, &m.committed)
                .and_then(|t| VolumeGroup::from_text(&t));
            match parsed {
                Ok(vg) => scan.copies.push(Copy {
                    name: vg.name.clone(),
                    id: vg.id.clone(),
                    seqno: vg.seqno,
                    vg,
                }),
                Err(e) => scan
                    .errors
                    .push(format!("metadata on {name}, {}", message_of(&e))),
            }
        }
        scan.mdas.push(m);
    }
    scan
}

#[derive(Debug)]
struct Slot {
    dev: Option<PvDevice>,
    header: Option<PvHeader>,
    mdas: Vec<MdaHeader>,
}

/// An open volume group.
#[derive(Debug)]
pub struct Vg {
    meta: VolumeGroup,
    /// Parallel to `meta.pvs`.
    slots: Vec<Slot>,
    opts: OpenOptions,
    /// Read-only as the caller asked (`opts.read_only` also counts missing PVs): a RAID
    /// LV that tolerates its missing images is written degraded, as lvm's default
    /// `activation_mode = "degraded"` allows.
    user_read_only: bool,
    failed: bool,
    description: String,
    notes: Vec<String>,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl VolumeGroup {
    /// `vgcreate`: see [`Vg::create`].
    pub fn create(name: &str, pvs: Vec<PvDevice>, extent_size: u64) -> Result<Vg> {
        Vg::create(name, pvs, extent_size)
    }
}

/// Reads a PV's label for joining a VG, making it a PV first if it has none (refused,
/// without `force`, when it holds another signature, as pvcreate refuses).
fn label_for_new(pv: &PvDevice, force: bool) -> Result<(PvHeader, Scan)> {
    let h = match label::read(&*pv.dev).map_err(|e| e.context(&pv.name))? {
        Some(h) => h,
        None => {
            let opts = PvCreateOptions {
                force,
                ..PvCreateOptions::default()
            };
            pvcreate(pv, &opts)?;
            label::read(&*pv.dev)?.ok_or_else(|| {
                Error::new(
                    ErrorKind::Io,
                    format!("{}: the new label did not read back", pv.name),
                )
            })?
        }
    };
    let scan = scan_header(&*pv.dev, &pv.name, &h);
    if let Some(c) = scan.copies.first() {
        return Err(invalid(format!("{} is already in VG {}", pv.name, c.name)));
    }
    if h.ext_flags & label::PV_EXT_USED != 0 {
        return Err(invalid(format!(
            "{} is marked as used by a VG whose metadata is not on it; give that VG's PVs",
            pv.name
        )));
    }
    if h.data_areas.is_empty() {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{}: the PV label has no data area", pv.name),
        ));
    }
    if scan.mdas.is_empty() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{}: the PV has no usable metadata area", pv.name),
        ));
    }
    Ok((h, scan))
}

/// Refuses a PV whose extents (`pe_count` extents of `extent_sectors` from sector
/// `pe_start`) would cover its label sector or one of its metadata areas: a write to an
/// LV there would wipe the label and the VG metadata. lvm never lays a PV out so; crafted
/// or damaged metadata may (`pe_start = 0`, 8 or 1024 sectors).
fn check_extents_clear(
    name: &str,
    h: &PvHeader,
    pe_start: u64,
    pe_count: u64,
    extent_sectors: u64,
) -> Result<()> {
    let start = pe_start.saturating_mul(512);
    let end = pe_count
        .saturating_mul(extent_sectors)
        .saturating_add(pe_start)
        .saturating_mul(512);
    if start == end {
        return Ok(());
    }
    let label = h.sector.saturating_mul(512);
    let mut areas = vec![(
        "its LVM label".to_string(),
        label,
        label.saturating_add(512),
    )];
    for (i, m) in h.metadata_areas.iter().enumerate() {
        // A size of 0 would be "to the end"; the mda header itself is 512 bytes.
        let len = m.size.max(512);
        areas.push((
            format!("its metadata area {}", i + 1),
            m.offset,
            m.offset.saturating_add(len),
        ));
    }
    for (what, a, b) in areas {
        if a < end && start < b {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{name}: the VG metadata puts the PV's extents at bytes {start}..{end} \
                     (pe_start {pe_start} sectors), over {what} at bytes {a}..{b}; refusing \
                     it, as a write to an LV there would destroy the PV's label and metadata"
                ),
            ));
        }
    }
    Ok(())
}

fn pv_meta_for(key: String, pv: &PvDevice, h: &PvHeader, extent_sectors: u64) -> Result<PvMeta> {
    let size = pv.dev.geometry().size;
    let pe_start = h.data_areas[0].offset;
    if !pe_start.is_multiple_of(512) {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{}: pe_start {pe_start} is not sector aligned", pv.name),
        ));
    }
    let pe_count = size.saturating_sub(pe_start) / 512 / extent_sectors;
    check_extents_clear(&pv.name, h, pe_start / 512, pe_count, extent_sectors)?;
    if pe_count == 0 {
        return Err(Error::new(
            ErrorKind::NoSpace,
            format!(
                "{} is too small to hold one {}-byte extent after its metadata",
                pv.name,
                extent_sectors * 512
            ),
        ));
    }
    Ok(PvMeta::new(
        key,
        format_uuid(&h.uuid),
        pv.name.clone(),
        size / 512,
        pe_start / 512,
        pe_count,
    ))
}

impl Vg {
    /// `vgcreate`: makes a VG over `pvs` (blank devices are made PVs first) with extents of
    /// `extent_size` bytes, and commits its first metadata (seqno 1).
    pub fn create(name: &str, pvs: Vec<PvDevice>, extent_size: u64) -> Result<Vg> {
        Vg::create_with(name, pvs, extent_size, false)
    }

    /// [`Vg::create`]; with `force`, devices without a label are made PVs even over
    /// another signature (a filesystem, a partition table, md, LUKS), as `pvcreate -f`.
    pub fn create_with(
        name: &str,
        pvs: Vec<PvDevice>,
        extent_size: u64,
        force: bool,
    ) -> Result<Vg> {
        validate_name("VG", name)?;
        if !extent_size_ok(extent_size) {
            return Err(invalid(format!(
                "extent size {extent_size} must be a power of two of at least 4 KiB, or a \
                 multiple of 128 KiB (lvm's rule)"
            )));
        }
        if pvs.is_empty() {
            return Err(invalid("a VG needs at least one PV"));
        }
        let es = extent_size / 512;
        let mut meta = VolumeGroup::new(name.to_string(), format_uuid(&label::new_uuid()), es);
        let mut slots = Vec::new();
        for (i, pv) in pvs.into_iter().enumerate() {
            let (h, scan) = label_for_new(&pv, force)?;
            if meta.pvs.iter().any(|p| strip_uuid(&p.id) == h.uuid) {
                return Err(invalid(format!(
                    "{} is given twice (same PV uuid)",
                    pv.name
                )));
            }
            meta.pvs.push(pv_meta_for(format!("pv{i}"), &pv, &h, es)?);
            slots.push(Slot {
                dev: Some(pv),
                header: Some(h),
                mdas: scan.mdas,
            });
        }
        let mut vg = Vg {
            meta: meta.clone(),
            slots,
            opts: OpenOptions::default(),
            user_read_only: false,
            failed: false,
            description: format!("cairn lvm vgcreate {name}"),
            notes: vec![],
        };
        vg.commit(meta)?;
        vg.mark_used()?;
        Ok(vg)
    }

    /// Sets `PV_EXT_USED` in the labels of present PVs that lack it.
    fn mark_used(&mut self) -> Result<()> {
        for s in &mut self.slots {
            if let (Some(d), Some(h)) = (&s.dev, &mut s.header) {
                if h.ext_version >= 2 && h.ext_flags & label::PV_EXT_USED == 0 {
                    h.ext_flags |= label::PV_EXT_USED;
                    label::write(&*d.dev, h).map_err(|e| e.context(&d.name))?;
                }
            }
        }
        Ok(())
    }

    /// Opens the VG held by `pvs` (all its PVs must be given).
    pub fn open(pvs: Vec<PvDevice>) -> Result<Vg> {
        Vg::open_with(pvs, OpenOptions::default())
    }

    pub fn open_with(pvs: Vec<PvDevice>, opts: OpenOptions) -> Result<Vg> {
        if pvs.is_empty() {
            return Err(invalid("no devices given"));
        }
        let mut found = Vec::new();
        let mut errors = Vec::new();
        let mut copies: Vec<(usize, Copy)> = Vec::new();
        for (i, pv) in pvs.iter().enumerate() {
            let h = label::read(&*pv.dev)
                .map_err(|e| Error::new(e.kind(), format!("{}: {}", pv.name, message_of(&e))))?
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!("{} is not an LVM2 physical volume (no label)", pv.name),
                    )
                })?;
            let scan = scan_header(&*pv.dev, &pv.name, &h);
            errors.extend(scan.errors.iter().cloned());
            copies.extend(scan.copies.iter().cloned().map(|c| (i, c)));
            found.push((h, scan.mdas));
        }
        let Some(best) = copies
            .iter()
            .max_by_key(|(_, c)| c.seqno)
            .map(|(_, c)| c.clone())
        else {
            return Err(if errors.is_empty() {
                Error::new(
                    ErrorKind::NotFound,
                    "none of the devices holds VG metadata (PVs not in a VG?)",
                )
            } else {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("no valid VG metadata: {}", errors.join("; ")),
                )
            });
        };
        let mut ids: Vec<(String, String)> = copies
            .iter()
            .map(|(_, c)| (c.id.clone(), c.name.clone()))
            .collect();
        ids.sort();
        ids.dedup();
        if ids.len() > 1 {
            let names: Vec<String> = ids.iter().map(|(_, n)| n.clone()).collect();
            return Err(invalid(format!(
                "the devices hold more than one VG ({}); give the PVs of one VG",
                names.join(", ")
            )));
        }
        let mut notes: Vec<String> = errors
            .iter()
            .map(|e| format!("{e} (another copy is used)"))
            .collect();
        for (i, c) in &copies {
            if c.seqno < best.seqno {
                notes.push(format!(
                    "{} holds older metadata (seqno {}, current {}); the next change rewrites it",
                    pvs[*i].name, c.seqno, best.seqno
                ));
            }
        }
        let meta = best.vg;
        let mut slots: Vec<Slot> = meta
            .pvs
            .iter()
            .map(|_| Slot {
                dev: None,
                header: None,
                mdas: vec![],
            })
            .collect();
        for (pv, (h, mdas)) in pvs.into_iter().zip(found) {
            let Some(idx) = meta.pvs.iter().position(|p| strip_uuid(&p.id) == h.uuid) else {
                return Err(invalid(format!(
                    "{} (PV {}) is not a PV of VG {}",
                    pv.name,
                    format_uuid(&h.uuid),
                    meta.name
                )));
            };
            if slots[idx].dev.is_some() {
                return Err(invalid(format!(
                    "{} is given twice (same PV uuid)",
                    pv.name
                )));
            }
            let p = &meta.pvs[idx];
            check_extents_clear(
                &format!("{} ({})", pv.name, p.key),
                &h,
                p.pe_start,
                p.pe_count,
                meta.extent_size,
            )?;
            slots[idx] = Slot {
                dev: Some(pv),
                header: Some(h),
                mdas,
            };
        }
        let missing: Vec<String> = meta
            .pvs
            .iter()
            .zip(&slots)
            .filter(|(_, s)| s.dev.is_none())
            .map(|(p, _)| match &p.device {
                Some(d) => format!("{} (uuid {}, last seen as {d})", p.key, p.id),
                None => format!("{} (uuid {})", p.key, p.id),
            })
            .collect();
        if !missing.is_empty() {
            let msg = format!("VG {} is missing PV {}", meta.name, missing.join(", "));
            if !opts.partial {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("{msg}; give all its devices"),
                ));
            }
            notes.push(msg);
        }
        for n in &notes {
            tracing::warn!("{n}");
        }
        Ok(Vg {
            description: String::new(),
            meta,
            slots,
            opts: OpenOptions {
                read_only: opts.read_only || !missing.is_empty(),
                ..opts
            },
            user_read_only: opts.read_only,
            failed: false,
            notes,
        })
    }

    /// The committed metadata.
    pub fn metadata(&self) -> &VolumeGroup {
        &self.meta
    }

    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// Warnings from opening (unreadable or stale copies, missing PVs).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The trailer `description` of the next commit (lvm puts the command line there).
    pub fn set_description(&mut self, d: impl Into<String>) {
        self.description = d.into();
    }

    /// Names of the LVs cairn can serve: visible and mappable.
    pub fn exportable_lvs(&self) -> Vec<String> {
        self.meta
            .lvs
            .iter()
            .filter(|l| l.visible() && l.unsupported.is_none())
            .map(|l| l.name.clone())
            .collect()
    }

    fn check_writable(&self) -> Result<()> {
        if self.failed {
            return Err(Error::new(
                ErrorKind::PreviousIo,
                format!(
                    "VG {}: an earlier metadata write failed; reopen the VG",
                    self.meta.name
                ),
            ));
        }
        if self.opts.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("VG {} is open read-only (or partially)", self.meta.name),
            ));
        }
        self.meta
            .writable()
            .map_err(|m| Error::new(ErrorKind::Unsupported, m))
    }

    /// Writes `new` as the next seqno to every metadata area of every present PV.
    fn commit(&mut self, mut new: VolumeGroup) -> Result<()> {
        new.seqno = self.meta.seqno + 1;
        for (p, s) in new.pvs.iter_mut().zip(&self.slots) {
            if let Some(d) = &s.dev {
                p.device = Some(d.name.clone());
            }
        }
        new.trailer.description = if self.description.is_empty() {
            "cairn".into()
        } else {
            self.description.clone()
        };
        new.trailer.creation_host = hostname();
        new.trailer.creation_time = now();
        let text = new.to_text();
        let len = text.len() as u64 + 1;
        let mut targets = Vec::new();
        for (si, s) in self.slots.iter().enumerate() {
            if s.dev.is_none() {
                continue;
            }
            for (mi, m) in s.mdas.iter().enumerate() {
                if !m.ignored() {
                    m.next_location(len)
                        .map_err(|e| e.context(&s.dev.as_ref().expect("present").name))?;
                    targets.push((si, mi));
                }
            }
        }
        if targets.is_empty() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("VG {}: no PV has a metadata area to write to", new.name),
            ));
        }
        let seqno = new.seqno;
        let result = self.write_phases(&targets, text.as_bytes());
        match result {
            Ok(locs) => {
                for ((si, mi), l) in targets.iter().zip(locs) {
                    let m = &mut self.slots[*si].mdas[*mi];
                    m.committed = l;
                    m.precommitted = Default::default();
                }
                self.meta = new;
                Ok(())
            }
            Err(e) => {
                self.failed = true;
                Err(e.context(format!(
                    "VG {}: committing metadata seqno {seqno}",
                    new.name
                )))
            }
        }
    }

    fn write_phases(
        &self,
        targets: &[(usize, usize)],
        text: &[u8],
    ) -> Result<Vec<crate::mda::RawLocn>> {
        let dev = |si: usize| self.slots[si].dev.as_ref().expect("present PV");
        let flush_all = || -> Result<()> {
            for s in &self.slots {
                if let Some(d) = &s.dev {
                    d.dev
                        .flush()
                        .map_err(|e| e.context(format!("{}: flush", d.name)))?;
                }
            }
            Ok(())
        };
        let mut locs = Vec::new();
        for &(si, mi) in targets {
            let d = dev(si);
            let l = self.slots[si].mdas[mi]
                .write_text(&*d.dev, text)
                .map_err(|e| e.context(&d.name))?;
            locs.push(l);
        }
        flush_all()?;
        for (&(si, mi), l) in targets.iter().zip(&locs) {
            let d = dev(si);
            let mut h = self.slots[si].mdas[mi].clone();
            h.precommitted = *l;
            h.write(&*d.dev, WriteFlags::NONE)
                .map_err(|e| e.context(&d.name))?;
        }
        flush_all()?;
        for (&(si, mi), l) in targets.iter().zip(&locs) {
            let d = dev(si);
            let mut h = self.slots[si].mdas[mi].clone();
            h.committed = *l;
            h.precommitted = Default::default();
            h.write(&*d.dev, WriteFlags::NONE)
                .map_err(|e| e.context(&d.name))?;
        }
        flush_all()?;
        Ok(locs)
    }

    /// `vgextend`: adds PVs (blank devices are made PVs first).
    pub fn extend(&mut self, pvs: Vec<PvDevice>) -> Result<()> {
        self.extend_with(pvs, false)
    }

    /// [`Vg::extend`]; with `force`, as [`Vg::create_with`].
    pub fn extend_with(&mut self, pvs: Vec<PvDevice>, force: bool) -> Result<()> {
        self.check_writable()?;
        let mut new = self.meta.clone();
        let mut slots = Vec::new();
        for pv in pvs {
            let (h, scan) = label_for_new(&pv, force)?;
            if new.pvs.iter().any(|p| strip_uuid(&p.id) == h.uuid) {
                return Err(invalid(format!(
                    "{} is already in VG {}",
                    pv.name, new.name
                )));
            }
            let mut n = new.pvs.len();
            while new.pvs.iter().any(|p| p.key == format!("pv{n}")) {
                n += 1;
            }
            new.pvs
                .push(pv_meta_for(format!("pv{n}"), &pv, &h, new.extent_size)?);
            slots.push(Slot {
                dev: Some(pv),
                header: Some(h),
                mdas: scan.mdas,
            });
        }
        let before = self.slots.len();
        self.slots.extend(slots);
        if let Err(e) = self.commit(new) {
            if !self.failed {
                self.slots.truncate(before);
            }
            return Err(e);
        }
        self.mark_used()
    }

    fn lv_meta(&self, name: &str) -> Result<&LvMeta> {
        self.meta.lv(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("LV {}/{name} does not exist", self.meta.name),
            )
        })
    }

    fn changeable(&self, name: &str) -> Result<&LvMeta> {
        let lv = self.lv_meta(name)?;
        if let Some(why) = &lv.unsupported {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("cairn cannot change LV {}/{name}: {why}", self.meta.name),
            ));
        }
        if let Some(owner) = self.meta.raid_owner(name) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LV {}/{name} is a sub-LV of RAID LV {}; change that LV instead",
                    self.meta.name, owner.name
                ),
            ));
        }
        Ok(lv)
    }

    /// [`Vg::changeable`], refusing RAID LVs for the changes cairn does not make to
    /// them yet (extend, reduce, rename).
    fn changeable_plain(&self, name: &str, what: &str) -> Result<&LvMeta> {
        let lv = self.changeable(name)?;
        if lv
            .segments
            .iter()
            .any(|s| matches!(s.kind, SegKind::Raid(_)))
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LV {}/{name} is a RAID LV; cairn does not {what} RAID LVs yet",
                    self.meta.name
                ),
            ));
        }
        Ok(lv)
    }

    /// `lvcreate`.
    pub fn lv_create(&mut self, c: &LvCreate) -> Result<LvChange> {
        self.check_writable()?;
        validate_name("LV", &c.name)?;
        if self.meta.lv(&c.name).is_some() {
            return Err(invalid(format!(
                "LV {}/{} already exists",
                self.meta.name, c.name
            )));
        }
        if c.extents == 0 {
            return Err(invalid("an LV needs at least one extent"));
        }
        let mut notes = Vec::new();
        let mut free = FreeMap::of(&self.meta)?;
        let k = u64::from(c.stripes.max(1));
        let segments = if k == 1 {
            if c.stripe_size.is_some() {
                notes.push("Ignoring stripe size for a linear LV.".into());
            }
            runs_to_linear(0, free.linear(c.extents, None)?)
        } else {
            let z = self.stripe_size(c.stripe_size)?;
            let mut n = c.extents;
            if !n.is_multiple_of(k) {
                let r = n.div_ceil(k) * k;
                notes.push(format!(
                    "Rounding size ({n} extents) up to stripe boundary size ({r} extents)."
                ));
                n = r;
            }
            let k_usize = usize::try_from(k).unwrap_or(usize::MAX);
            let rounds = free.striped(n / k, k_usize)?;
            rounds_to_striped(0, z, rounds)
        };
        let size: u64 = segments.iter().map(|s| s.extent_count).sum();
        let lv = LvMeta::new(
            c.name.clone(),
            format_uuid(&label::new_uuid()),
            now(),
            hostname(),
            segments,
        );
        let mut new = self.meta.clone();
        new.lvs.push(lv);
        self.commit(new)?;
        Ok(LvChange {
            name: c.name.clone(),
            extents: size,
            notes,
        })
    }

    /// `lvcreate --type raid*`: one metadata LV (1 extent, `NAME_rmeta_N`) and one image
    /// LV (`NAME_rimage_N`) per image, each pair on its own PV, as lvm allocates them;
    /// then the metadata LVs get dm-raid's superblock and bitmap, and (unless `nosync`)
    /// the images are synchronised through md's resync before anything is served.
    pub fn lv_create_raid(&mut self, c: &RaidCreate) -> Result<LvChange> {
        self.check_writable()?;
        validate_name("LV", &c.name)?;
        if self.meta.lv(&c.name).is_some() {
            return Err(invalid(format!(
                "LV {}/{} already exists",
                self.meta.name, c.name
            )));
        }
        if c.extents == 0 {
            return Err(invalid("an LV needs at least one extent"));
        }
        let segtype = match c.segtype.as_str() {
            "raid5" => "raid5_ls".to_string(),
            "raid6" => "raid6_zr".to_string(),
            "raid1" | "raid10" | "raid0" | "raid4" => c.segtype.clone(),
            t if crate::meta::RaidSeg::known_type(t) && t != "mirror" => t.to_string(),
            t => {
                return Err(invalid(format!(
                    "segment type {t:?}: cairn creates raid1, raid10, raid0, raid4, raid5 and raid6 LVs"
                )))
            }
        };
        let mut notes = Vec::new();
        let mirrors = u64::from(c.mirrors.unwrap_or(1));
        let parity: u64 = if segtype.starts_with("raid6") {
            2
        } else if segtype.starts_with("raid5") || segtype == "raid4" {
            1
        } else {
            0
        };
        let default_stripes = if parity == 2 { 3 } else { 2 };
        let stripes = u64::from(c.stripes.unwrap_or(default_stripes));
        if c.mirrors.is_some() && !matches!(segtype.as_str(), "raid1" | "raid10") {
            return Err(invalid(format!("-m (mirrors) does not apply to {segtype}")));
        }
        if stripes == 0 || mirrors == 0 {
            return Err(invalid("stripes and mirrors must be at least 1"));
        }
        let (images, data_stripes, copies) = match segtype.as_str() {
            "raid1" => (mirrors + 1, 1, mirrors + 1),
            "raid10" => (stripes * (mirrors + 1), stripes, mirrors + 1),
            "raid0" => (stripes, stripes, 1),
            _ => (stripes + parity, stripes, 1),
        };
        if images > 64 {
            return Err(invalid(format!(
                "{segtype} with {images} images: at most 64"
            )));
        }
        let mut n = c.extents;
        if !n.is_multiple_of(data_stripes) {
            let r = n.div_ceil(data_stripes) * data_stripes;
            notes.push(format!(
                "Rounding size ({n} extents) up to stripe boundary size ({r} extents)."
            ));
            n = r;
        }
        let per_image = n / data_stripes;
        let stripe_size = if segtype == "raid1" {
            0
        } else {
            self.stripe_size(c.stripe_size)?
        };
        let region = match c.region_size {
            None => crate::raid::DEFAULT_REGION_SECTORS,
            Some(b) if b >= 4096 && b.is_power_of_two() => b / 512,
            Some(b) => {
                return Err(invalid(format!(
                    "region size {b} must be a power of two of at least 4 KiB"
                )))
            }
        };
        let with_meta = segtype != "raid0";
        let need = per_image + u64::from(with_meta);
        let mut free = FreeMap::of(&self.meta)?;
        let fitting: Vec<String> = free
            .pv_keys()
            .into_iter()
            .filter(|k| free.free_on(k) >= need)
            .collect();
        if (fitting.len() as u64) < images {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "{segtype} LV {} needs {images} images on {images} different PVs with {need} free extents each,                      but only {} PV(s) of VG {} have that much",
                    c.name,
                    fitting.len(),
                    self.meta.name
                ),
            ));
        }
        let now_ = now();
        let host = hostname();
        let mut new = self.meta.clone();
        let mut image_names = Vec::new();
        let mut meta_names = Vec::new();
        let mut subs = Vec::new();
        for (i, pv) in fitting
            .iter()
            .take(usize::try_from(images).unwrap_or(usize::MAX))
            .enumerate()
        {
            let mut runs = free.on_pv(pv, need).expect("checked free space");
            if with_meta {
                let first = runs.first_mut().expect("at least one run");
                let meta_run = Run {
                    pv: first.pv.clone(),
                    pe: first.pe,
                    count: 1,
                };
                first.pe += 1;
                first.count -= 1;
                runs.retain(|r| r.count > 0);
                let mname = format!("{}_rmeta_{i}", c.name);
                let mut m = LvMeta::new(
                    mname.clone(),
                    format_uuid(&label::new_uuid()),
                    now_,
                    host.clone(),
                    runs_to_linear(0, vec![meta_run]),
                );
                m.status = vec!["READ".into(), "WRITE".into()];
                subs.push(m);
                meta_names.push(Some(mname));
            } else {
                meta_names.push(None);
            }
            let iname = format!("{}_rimage_{i}", c.name);
            let mut im = LvMeta::new(
                iname.clone(),
                format_uuid(&label::new_uuid()),
                now_,
                host.clone(),
                runs_to_linear(0, runs),
            );
            im.status = vec!["READ".into(), "WRITE".into()];
            subs.push(im);
            image_names.push(iname);
        }
        let raid = crate::meta::RaidSeg {
            segtype: segtype.clone(),
            stripe_size,
            region_size: if with_meta { region } else { 0 },
            data_copies: if segtype == "raid10" { copies } else { 0 },
            images: image_names,
            metas: meta_names,
            mirror_log: None,
        };
        let mut top = LvMeta::new(
            c.name.clone(),
            format_uuid(&label::new_uuid()),
            now_,
            host,
            vec![Segment::raid(0, n, raid.clone())],
        );
        if c.nosync && with_meta {
            top.status.push("NOTSYNCED".into());
        }
        new.lvs.push(top);
        // lvm lists the sub-LVs after the LV they belong to.
        new.lvs.extend(subs);
        self.commit(new)?;
        self.init_raid(&c.name, &raid, n, per_image, c.nosync)?;
        Ok(LvChange {
            name: c.name.clone(),
            extents: n,
            notes,
        })
    }

    /// Writes the metadata LVs of a new RAID LV and, unless `nosync`, synchronises its
    /// images (md resync) first, so the superblocks can say "in sync".
    fn init_raid(
        &self,
        name: &str,
        r: &crate::meta::RaidSeg,
        extents: u64,
        per_image: u64,
        nosync: bool,
    ) -> Result<()> {
        let es = self.meta.extent_size;
        let lv_sectors = extents * es;
        let image_sectors = per_image * es;
        if !nosync && r.segtype != "raid0" {
            let lv = self.lv(name)?;
            if let Some(a) = lv.array() {
                a.resync().map_err(|e| {
                    e.context(format!("LV {}/{name}: initial sync", self.meta.name))
                })?;
            }
        }
        let mut devs = Vec::new();
        let mut index = BTreeMap::new();
        for (i, m) in r.metas.iter().enumerate() {
            let Some(m) = m else { continue };
            let Some(dev) = self.open_sub(m, &mut devs, &mut index, false)? else {
                continue;
            };
            let sb = crate::raid::new_super(r, i, image_sectors, lv_sectors, true)?;
            let dev: Arc<dyn BlockDevice> = Arc::new(dev);
            crate::raid::write_rmeta(&dev, &sb, r, lv_sectors, image_sectors)
                .map_err(|e| e.context(format!("LV {}/{m}", self.meta.name)))?;
        }
        Ok(())
    }

    /// The first half of a repair: which images are rebuilt, and the moves of the images
    /// off missing PVs (or PV `replace`) committed to the metadata. `None` when nothing
    /// needs doing.
    fn repair_plan(&mut self, name: &str, replace: Option<&str>) -> Result<Option<RepairPlan>> {
        if self.failed {
            return Err(Error::new(
                ErrorKind::PreviousIo,
                format!(
                    "VG {}: an earlier metadata write failed; reopen the VG",
                    self.meta.name
                ),
            ));
        }
        if self.user_read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("VG {} is open read-only", self.meta.name),
            ));
        }
        self.meta
            .writable()
            .map_err(|m| Error::new(ErrorKind::Unsupported, m))?;
        let lv = self.changeable(name)?.clone();
        let full = format!("{}/{name}", self.meta.name);
        let Some(SegKind::Raid(r)) = lv.segments.first().map(|s| s.kind.clone()) else {
            return Err(invalid(format!("LV {full} is not a RAID LV")));
        };
        if r.segtype.starts_with("raid0") || r.segtype == "mirror" {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LV {full}: cairn repairs raid1/raid10/raid4/5/6 LVs, not {}",
                    r.segtype
                ),
            ));
        }
        let replace_key = match replace {
            None => None,
            Some(pv) => Some(
                self.meta
                    .pvs
                    .iter()
                    .zip(&self.slots)
                    .find(|(p, s)| {
                        p.key == pv
                            || p.device.as_deref() == Some(pv)
                            || s.dev.as_ref().is_some_and(|d| d.name == pv)
                    })
                    .map(|(p, _)| p.key.clone())
                    .ok_or_else(|| invalid(format!("{pv} is not a PV of VG {}", self.meta.name)))?,
            ),
        };
        let missing_key = |k: &str| {
            self.meta
                .pvs
                .iter()
                .position(|p| p.key == k)
                .is_some_and(|i| self.slots[i].dev.is_none())
        };
        let pvs_of = |lv_name: &str| -> Vec<String> {
            self.meta
                .lv(lv_name)
                .map(|l| {
                    l.segments
                        .iter()
                        .flat_map(|s| s.areas().iter().map(|a| a.pv.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        // Which images move, and which are rebuilt.
        let n = r.images.len();
        let mut moving = vec![false; n];
        for (i, img) in r.images.iter().enumerate() {
            let used: Vec<String> = pvs_of(img)
                .into_iter()
                .chain(r.metas[i].iter().flat_map(|m| pvs_of(m)))
                .collect();
            moving[i] = used
                .iter()
                .any(|k| missing_key(k) || replace_key.as_deref() == Some(k.as_str()));
        }
        let freshest = self.raid_superblock(&r);
        let mut rebuild: Vec<bool> = (0..n)
            .map(|i| moving[i] || freshest.as_ref().is_some_and(|sb| sb.failed(i)))
            .collect();
        if replace_key.is_some() && !moving.iter().any(|m| *m) {
            return Err(invalid(format!(
                "LV {full} has no image on {}",
                replace.unwrap_or("")
            )));
        }
        if !rebuild.iter().any(|b| *b) {
            return Ok(None);
        }
        let seg = &lv.segments[0];
        let per_image = crate::meta::image_extents(&r, seg.extent_count);
        let mut moved = Vec::new();
        if moving.iter().any(|m| *m) {
            let mut free = FreeMap::of(&self.meta)?;
            // PVs holding the images that stay, and the ones being left.
            let mut taken: Vec<String> = Vec::new();
            for (i, img) in r.images.iter().enumerate() {
                if !moving[i] {
                    taken.extend(pvs_of(img));
                }
            }
            let mut new = self.meta.clone();
            for i in (0..n).filter(|&i| moving[i]) {
                let need = per_image + u64::from(r.metas[i].is_some());
                let target = free
                    .pv_keys()
                    .into_iter()
                    .find(|k| !taken.contains(k) && !missing_key(k) && replace_key.as_deref() != Some(k.as_str()) && free.free_on(k) >= need)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::NoSpace,
                            format!(
                                "LV {full}: image {} needs another PV with {need} free extents that holds no other image of the LV; the VG has none (add one with vgextend)",
                                r.images[i]
                            ),
                        )
                    })?;
                let mut runs = free.on_pv(&target, need).expect("checked free space");
                let old_pv = pvs_of(&r.images[i]).first().cloned().unwrap_or_default();
                if let Some(m) = &r.metas[i] {
                    let first = runs.first_mut().expect("a run");
                    let meta_run = Run {
                        pv: first.pv.clone(),
                        pe: first.pe,
                        count: 1,
                    };
                    first.pe += 1;
                    first.count -= 1;
                    runs.retain(|x| x.count > 0);
                    if let Some(l) = new.lvs.iter_mut().find(|l| &l.name == m) {
                        l.segments = runs_to_linear(0, vec![meta_run]);
                    }
                }
                if let Some(l) = new.lvs.iter_mut().find(|l| l.name == r.images[i]) {
                    l.segments = runs_to_linear(0, runs);
                }
                taken.push(target.clone());
                moved.push((
                    r.images[i].clone(),
                    if missing_key(&old_pv) {
                        "missing".into()
                    } else {
                        old_pv
                    },
                    target,
                ));
            }
            for (p, s) in new.pvs.iter_mut().zip(&self.slots) {
                if s.dev.is_none() && !p.flags.iter().any(|f| f == "MISSING") {
                    p.flags.push("MISSING".into());
                }
            }
            self.commit(new)?;
        }
        rebuild.truncate(n);
        Ok(Some(RepairPlan {
            full,
            r,
            rebuild,
            moved,
            freshest,
        }))
    }

    /// `lvconvert --repair` (`replace` = `None`) or `lvconvert --replace PV`: images on
    /// missing PVs, or on PV `replace` (a device name or PV key), move to other PVs of
    /// the VG (one image per PV, as lvcreate places them; refused clearly when no PV has
    /// room); then those images and any the superblocks record as failed are rebuilt
    /// from the others, `progress(done, total)` bytes as it goes; then every metadata
    /// LV says in sync again. Works with PVs missing (their PVs get lvm's `MISSING`
    /// flag; the other PVs get the new metadata).
    pub fn lv_repair(
        &mut self,
        name: &str,
        replace: Option<&str>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<RaidRepair> {
        let Some(plan) = self.repair_plan(name, replace)? else {
            return Ok(RaidRepair {
                name: name.to_string(),
                moved: vec![],
                rebuilt: vec![],
            });
        };
        let RepairPlan {
            full,
            r,
            mut rebuild,
            moved,
            freshest,
        } = plan;
        let n = r.images.len();
        let lv = self.lv_meta(name)?.clone();
        let seg = &lv.segments[0];
        let per_image = crate::meta::image_extents(&r, seg.extent_count);
        // Rebuild: read through the array without the images being rebuilt, write
        // through the array with all of them (full stripes, so parity is computed from
        // the data, never from a stale image).
        let lv = self.lv_meta(name)?.clone();
        let degraded = self.open_raid_with(&lv, &r, full.clone(), true, &rebuild, false)?;
        let whole = self.open_raid_with(&lv, &r, full.clone(), false, &[], true)?;
        if whole.array().is_some_and(|a| !a.down_roles().is_empty()) {
            return Err(Error::new(
                ErrorKind::Degraded,
                format!("LV {full}: an image is still missing after the move"),
            ));
        }
        let size = degraded.geometry().size;
        let stripe = u64::from(whole.geometry().optimal_io_size.max(4096));
        let step = (4u64 << 20).div_ceil(stripe) * stripe;
        let mut buf = vec![0u8; usize::try_from(step).unwrap_or(4 << 20)];
        let mut off = 0u64;
        while off < size {
            let len = step.min(size - off);
            let b = &mut buf[..usize::try_from(len).unwrap_or(0)];
            degraded
                .read_at(b, off)
                .map_err(|e| e.context(format!("LV {full}: rebuild read")))?;
            whole
                .write_at(b, off, WriteFlags::NONE)
                .map_err(|e| e.context(format!("LV {full}: rebuild write")))?;
            off += len;
            progress(off, size);
        }
        whole.flush()?;
        // Every metadata LV: in sync, nothing failed, events past the old ones.
        let es = self.meta.extent_size;
        let mut devs = Vec::new();
        let mut index = BTreeMap::new();
        let events = freshest.as_ref().map_or(1, |f| f.events) + 1;
        for (i, m) in r.metas.iter().enumerate() {
            let Some(m) = m else { continue };
            let Some(dev) = self.open_sub(m, &mut devs, &mut index, false)? else {
                continue;
            };
            let mut sb =
                crate::raid::new_super(&r, i, per_image * es, seg.extent_count * es, true)?;
            sb.events = events;
            let dev: Arc<dyn BlockDevice> = Arc::new(dev);
            crate::raid::write_rmeta(&dev, &sb, &r, seg.extent_count * es, per_image * es)?;
        }
        rebuild.truncate(n);
        Ok(RaidRepair {
            name: name.to_string(),
            moved,
            rebuilt: r
                .images
                .iter()
                .zip(&rebuild)
                .filter(|(_, b)| **b)
                .map(|(i, _)| i.clone())
                .collect(),
        })
    }

    /// [`Vg::lv_repair`] for a RAID LV being served, `live` (opened for writing from
    /// this VG, e.g. by `cairn serve`): the moves are committed the same way, then each
    /// image to rebuild is put into `live`'s running md array, which rebuilds it in the
    /// background while clients go on (md's speed limits once the array is managed,
    /// progress in its [`cairn_md::Array::background`]). Until the rebuild finishes the
    /// metadata LVs record the image as failed (a stop part-way leaves it to be repaired
    /// again); when it finishes they record it in sync. An image being replaced that is
    /// still in the array is failed first: the LV is degraded while its copy is rebuilt,
    /// as an offline `--replace` reads it.
    pub fn lv_repair_live(
        &mut self,
        name: &str,
        replace: Option<&str>,
        live: &LogicalVolume,
    ) -> Result<RaidRepair> {
        let full = format!("{}/{name}", self.meta.name);
        let (Some(array), Some(meta)) = (live.array(), live.raid_meta()) else {
            return Err(invalid(format!(
                "LV {full}: the device given is not a RAID LV open for writing"
            )));
        };
        if live.name() != full {
            return Err(invalid(format!(
                "LV {full}: the device given is LV {}",
                live.name()
            )));
        }
        let Some(plan) = self.repair_plan(name, replace)? else {
            return Ok(RaidRepair {
                name: name.to_string(),
                moved: vec![],
                rebuilt: vec![],
            });
        };
        let RepairPlan {
            r,
            rebuild,
            moved,
            freshest,
            ..
        } = plan;
        let es = self.meta.extent_size;
        let lv = self.lv_meta(name)?.clone();
        let seg = &lv.segments[0];
        let per_image = crate::meta::image_extents(&r, seg.extent_count);
        let (lv_s, img_s) = (seg.extent_count * es, per_image * es);
        // The images being rebuilt count as failed in every superblock until they are
        // in sync.
        self.record_failed(&r, &rebuild, freshest.as_ref())
            .map_err(|e| e.context(format!("LV {full}: recording the images to rebuild")))?;
        let events = self.raid_superblock(&r).map_or(1, |f| f.events);
        array
            .record_events(events)
            .map_err(|e| e.context(format!("LV {full}: its bitmap")))?;
        let mut rebuilt = Vec::new();
        for i in (0..r.images.len()).filter(|&i| rebuild[i]) {
            let image = format!("{}/{}", self.meta.name, r.images[i]);
            if array.is_up(i) || array.member(i).is_some() {
                // Still serving (a --replace of a present PV): out first.
                let cur = array.member_names()[i].clone().unwrap_or_default();
                array
                    .fail(&cur)
                    .map_err(|e| e.context(format!("LV {full}: taking {image} out")))?;
            }
            let mut devs = Vec::new();
            let mut index = BTreeMap::new();
            let img = self
                .open_sub(&r.images[i], &mut devs, &mut index, false)?
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Degraded,
                        format!("LV {full}: {image} is still on a missing PV"),
                    )
                })?;
            let rmeta: Option<Arc<dyn BlockDevice>> = match &r.metas[i] {
                Some(m) => self
                    .open_sub(m, &mut devs, &mut index, false)?
                    .map(|d| Arc::new(d) as Arc<dyn BlockDevice>),
                None => None,
            };
            if let Some(d) = &rmeta {
                // Its superblock as the others' (it is failed until rebuilt), recovery
                // from the start, and a bitmap header the array fills in.
                let mut sb = crate::raid::new_super(&r, i, img_s, lv_s, true)?;
                if let Some(f) = &freshest {
                    sb.failed_devices = f.failed_devices;
                }
                sb.failed_devices[i / 64] |= 1 << (i % 64);
                sb.events = events;
                sb.disk_recovery_offset = 0;
                crate::raid::write_rmeta(d, &sb, &r, lv_s, img_s)
                    .map_err(|e| e.context(format!("LV {full}: metadata LV of {image}")))?;
                meta.set_rmeta(i, d.clone());
            }
            array
                .rebuild_into(i, Arc::new(img), image.clone(), rmeta)
                .map_err(|e| e.context(format!("LV {full}")))?;
            rebuilt.push(r.images[i].clone());
        }
        Ok(RaidRepair {
            name: name.to_string(),
            moved,
            rebuilt,
        })
    }

    /// The freshest dm-raid superblock among a RAID segment's present metadata LVs.
    fn raid_superblock(&self, r: &crate::meta::RaidSeg) -> Option<crate::raid::DmRaidSuper> {
        let mut devs = Vec::new();
        let mut index = BTreeMap::new();
        let mut best: Option<crate::raid::DmRaidSuper> = None;
        for m in r.metas.iter().flatten() {
            let Ok(Some(dev)) = self.open_sub(m, &mut devs, &mut index, true) else {
                continue;
            };
            if let Ok(Some(sb)) = crate::raid::read_rmeta(&dev) {
                if best.as_ref().is_none_or(|b| sb.events > b.events) {
                    best = Some(sb);
                }
            }
        }
        best
    }

    /// Writes `failed` (by image) into the superblock of every present metadata LV of
    /// `r`, events one past the freshest, the rest of each superblock kept.
    fn record_failed(
        &self,
        r: &crate::meta::RaidSeg,
        failed: &[bool],
        freshest: Option<&crate::raid::DmRaidSuper>,
    ) -> Result<()> {
        let mut devs = Vec::new();
        let mut index = BTreeMap::new();
        let events = freshest.map_or(1, |f| f.events) + 1;
        for (i, m) in r.metas.iter().enumerate() {
            let Some(m) = m else { continue };
            if failed.get(i).copied().unwrap_or(true) {
                continue;
            }
            let Some(dev) = self.open_sub(m, &mut devs, &mut index, false)? else {
                continue;
            };
            let Some(mut sb) = crate::raid::read_rmeta(&dev)?.or_else(|| freshest.cloned()) else {
                continue;
            };
            let before = sb.failed_devices;
            for (j, f) in failed.iter().enumerate() {
                if *f && j < 256 {
                    sb.failed_devices[j / 64] |= 1 << (j % 64);
                }
            }
            if before == sb.failed_devices && freshest.is_some_and(|f| f.events == sb.events) {
                continue;
            }
            sb.array_position = u32::try_from(i).unwrap_or(u32::MAX);
            sb.events = events;
            dev.write_at(&sb.encode(), 0, WriteFlags::FUA)?;
        }
        Ok(())
    }

    /// lvm's `sync_percent` of a RAID LV: 100 when `NOTSYNCED` (as lvm shows a
    /// `--nosync` LV), else the least synchronised of the array resync and every
    /// image's recovery, as the freshest superblocks record them.
    pub fn sync_percent(&self, lv: &LvMeta) -> Option<f64> {
        let SegKind::Raid(r) = &lv.segments.first()?.kind else {
            return None;
        };
        if lv.status.iter().any(|s| s == "NOTSYNCED") {
            return Some(100.0);
        }
        let seg = &lv.segments[0];
        let image =
            (crate::meta::image_extents(r, seg.extent_count) * self.meta.extent_size) as f64;
        let array = (seg.extent_count * self.meta.extent_size) as f64;
        let mut devs = Vec::new();
        let mut index = BTreeMap::new();
        let mut pct: Option<f64> = None;
        for m in r.metas.iter().flatten() {
            let Ok(Some(dev)) = self.open_sub(m, &mut devs, &mut index, true) else {
                continue;
            };
            let Ok(Some(sb)) = crate::raid::read_rmeta(&dev) else {
                continue;
            };
            let frac = |off: u64, of: f64| {
                if off == crate::raid::MAX_SECTOR {
                    100.0
                } else {
                    (off as f64 * 100.0 / of.max(1.0)).min(100.0)
                }
            };
            let mut p = frac(sb.disk_recovery_offset, image);
            // raid10's resync counts array sectors, the others' an image's.
            let resync_of = if r.segtype == "raid10" { array } else { image };
            p = p.min(frac(sb.array_resync_offset, resync_of));
            pct = Some(pct.map_or(p, |q: f64| q.min(p)));
        }
        pct
    }

    /// A stripe size in sectors from bytes, checked like lvm.
    fn stripe_size(&self, bytes: Option<u64>) -> Result<u64> {
        let b = bytes.unwrap_or(DEFAULT_STRIPE_SIZE);
        let extent = self.meta.extent_size * 512;
        if b < 4096 || !b.is_power_of_two() {
            return Err(invalid(format!(
                "stripe size {b} must be a power of two of at least 4 KiB"
            )));
        }
        if b > extent {
            return Err(invalid(format!(
                "stripe size {b} may not exceed the extent size {extent}"
            )));
        }
        Ok(b / 512)
    }

    /// `lvextend`: adds `extents` extents at the end.
    pub fn lv_extend(&mut self, name: &str, extents: u64) -> Result<LvChange> {
        self.check_writable()?;
        let lv = self.changeable_plain(name, "extend")?.clone();
        if extents == 0 {
            return Err(invalid("extend by at least one extent"));
        }
        let mut free = FreeMap::of(&self.meta)?;
        let mut notes = Vec::new();
        let mut segs = lv.segments.clone();
        let end = lv.extents();
        let last = segs
            .last()
            .cloned()
            .ok_or_else(|| invalid(format!("LV {name} has no segments")))?;
        let SegKind::Striped {
            stripe_size,
            stripes,
        } = &last.kind
        else {
            unreachable!("changeable LVs are striped")
        };
        let k = stripes.len() as u64;
        if k == 1 {
            let a = &stripes[0];
            let runs = free.linear(extents, Some((&a.pv, a.pe + last.extent_count)))?;
            let mut runs = runs.into_iter().peekable();
            if let Some(r) = runs.peek() {
                if r.pv == a.pv && r.pe == a.pe + last.extent_count {
                    let n = segs.len() - 1;
                    segs[n].extent_count += r.count;
                    runs.next();
                }
            }
            let start = segs.iter().map(|s| s.extent_count).sum();
            segs.extend(runs_to_linear(start, runs.collect()));
        } else {
            let mut n = extents;
            if !n.is_multiple_of(k) {
                let r = n.div_ceil(k) * k;
                notes.push(format!(
                    "Rounding size ({n} extents) up to stripe boundary size ({r} extents)."
                ));
                n = r;
            }
            let per_old = last.extent_count / k;
            let per = n / k;
            if stripes
                .iter()
                .all(|a| free.is_free(&a.pv, a.pe + per_old, per))
            {
                let i = segs.len() - 1;
                segs[i].extent_count += n;
            } else {
                let rounds = free.striped(per, usize::try_from(k).unwrap_or(usize::MAX))?;
                segs.extend(rounds_to_striped(end, *stripe_size, rounds));
            }
        }
        let size: u64 = segs.iter().map(|s| s.extent_count).sum();
        self.replace_lv(name, |l| l.segments = segs)?;
        Ok(LvChange {
            name: name.to_string(),
            extents: size,
            notes,
        })
    }

    fn replace_lv(&mut self, name: &str, f: impl FnOnce(&mut LvMeta)) -> Result<()> {
        let mut new = self.meta.clone();
        let lv = new
            .lvs
            .iter_mut()
            .find(|l| l.name == name)
            .expect("checked by the caller");
        f(lv);
        self.commit(new)
    }

    /// `lvreduce`: removes `extents` extents from the end. Without `force` it refuses,
    /// saying what would be lost.
    pub fn lv_reduce(&mut self, name: &str, extents: u64, force: bool) -> Result<LvChange> {
        self.check_writable()?;
        let lv = self.changeable_plain(name, "reduce")?.clone();
        let size = lv.extents();
        if extents == 0 {
            return Err(invalid("reduce by at least one extent"));
        }
        if extents >= size {
            return Err(invalid(format!(
                "reducing LV {}/{name} by {extents} extents would leave nothing (it has {size}); \
                 remove it instead",
                self.meta.name
            )));
        }
        let mut target = size - extents;
        let mut notes = Vec::new();
        let mut segs = lv.segments.clone();
        while let Some(last) = segs.last_mut() {
            if last.start_extent >= target {
                segs.pop();
                continue;
            }
            let keep = target - last.start_extent;
            let k = last.areas().len().max(1) as u64;
            let keep_r = keep.div_ceil(k) * k;
            if keep_r != keep {
                notes.push(format!(
                    "Rounding size ({target} extents) up to stripe boundary size for segment ({} extents).",
                    last.start_extent + keep_r
                ));
                target = last.start_extent + keep_r;
            }
            last.extent_count = keep_r;
            break;
        }
        if target >= size {
            return Err(invalid(format!(
                "LV {}/{name}: reducing by {extents} extents is less than one stripe row; nothing to do",
                self.meta.name
            )));
        }
        let es = self.meta.extent_size * 512;
        if !force {
            return Err(invalid(format!(
                "reducing LV {}/{name} from {size} to {target} extents would discard the data in its \
                 last {} extents ({} bytes, from byte {}); pass force to reduce anyway",
                self.meta.name,
                size - target,
                (size - target) * es,
                target * es
            )));
        }
        self.replace_lv(name, |l| l.segments = segs)?;
        Ok(LvChange {
            name: name.to_string(),
            extents: target,
            notes,
        })
    }

    /// `lvrename`.
    pub fn lv_rename(&mut self, old: &str, new_name: &str) -> Result<()> {
        self.check_writable()?;
        self.lv_meta(old)?;
        if self.meta.raid_owner(old).is_some()
            || self
                .lv_meta(old)?
                .segments
                .iter()
                .any(|s| matches!(s.kind, SegKind::Raid(_)))
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LV {}/{old} is part of a RAID LV; cairn does not rename those yet",
                    self.meta.name
                ),
            ));
        }
        validate_name("LV", new_name)?;
        if self.meta.lv(new_name).is_some() {
            return Err(invalid(format!(
                "LV {}/{new_name} already exists",
                self.meta.name
            )));
        }
        let n = new_name.to_string();
        self.replace_lv(old, |l| l.name = n)
    }

    /// `lvremove`.
    pub fn lv_remove(&mut self, name: &str) -> Result<()> {
        self.check_writable()?;
        let lv = self.changeable(name)?;
        // A RAID LV goes with its image and metadata sub-LVs.
        let mut gone: Vec<String> = vec![name.to_string()];
        for seg in &lv.segments {
            if let SegKind::Raid(r) = &seg.kind {
                gone.extend(r.images.iter().cloned());
                gone.extend(r.metas.iter().flatten().cloned());
                gone.extend(r.mirror_log.iter().cloned());
            }
        }
        let mut new = self.meta.clone();
        new.lvs.retain(|l| !gone.contains(&l.name));
        self.commit(new)
    }

    /// Opens an LV as a block device.
    pub fn lv(&self, name: &str) -> Result<Arc<LogicalVolume>> {
        let lv = self.lv_meta(name)?;
        let full = format!("{}/{name}", self.meta.name);
        if let Some(why) = &lv.unsupported {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("LV {full} is unavailable: {why}"),
            ));
        }
        if !lv.visible() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("LV {full} is an internal LV (not VISIBLE); it is not served on its own"),
            ));
        }
        let ro = self.opts.read_only || !lv.writable();
        let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        if let Some(SegKind::Raid(r)) = lv.segments.first().map(|s| &s.kind) {
            let ro = self.user_read_only || !lv.writable();
            return self.open_raid(lv, r, full, ro).map(Arc::new);
        }
        let map = self.map_segments(lv, &full, &mut devs, &mut index)?;
        LogicalVolume::new(full, devs, map, ro).map(Arc::new)
    }

    /// A linear/striped LV's segments in bytes over `devs` (PV devices added as met,
    /// `index` by PV key). Errors with `Degraded` when a PV it needs is missing.
    fn map_segments(
        &self,
        lv: &LvMeta,
        full: &str,
        devs: &mut Vec<(String, Arc<dyn BlockDevice>)>,
        index: &mut BTreeMap<String, usize>,
    ) -> Result<Vec<MapSegment>> {
        let es = self.meta.extent_size * 512;
        let mut map = Vec::new();
        for seg in &lv.segments {
            let SegKind::Striped {
                stripe_size,
                stripes,
            } = &seg.kind
            else {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "LV {full}: segment type {} is not linear or striped",
                        seg.type_name()
                    ),
                ));
            };
            let mut areas = Vec::new();
            for a in stripes {
                let pi = self
                    .meta
                    .pvs
                    .iter()
                    .position(|p| p.key == a.pv)
                    .expect("checked at parse");
                let p = &self.meta.pvs[pi];
                let Some(d) = &self.slots[pi].dev else {
                    return Err(Error::new(
                        ErrorKind::Degraded,
                        format!("LV {full} needs PV {} ({}), which is missing", p.key, p.id),
                    ));
                };
                let idx = *index.entry(a.pv.clone()).or_insert_with(|| {
                    devs.push((d.name.clone(), d.dev.clone()));
                    devs.len() - 1
                });
                areas.push(MapArea {
                    pv: idx,
                    offset: p.pe_start * 512 + a.pe * es,
                });
            }
            map.push(MapSegment {
                start: seg.start_extent * es,
                len: seg.extent_count * es,
                stripe_size: stripe_size * 512,
                areas,
            });
        }
        Ok(map)
    }

    /// Opens a sub-LV (image or metadata LV of a RAID LV) over the shared `devs`;
    /// `Ok(None)` when one of its PVs is missing.
    fn open_sub(
        &self,
        name: &str,
        devs: &mut Vec<(String, Arc<dyn BlockDevice>)>,
        index: &mut BTreeMap<String, usize>,
        ro: bool,
    ) -> Result<Option<LogicalVolume>> {
        let sub = self.lv_meta(name)?;
        let full = format!("{}/{name}", self.meta.name);
        match self.map_segments(sub, &full, devs, index) {
            Ok(map) => LogicalVolume::new(full, devs.clone(), map, ro).map(Some),
            Err(e) if e.kind() == ErrorKind::Degraded => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A RAID LV: md's array over its image sub-LVs. An image whose PV is missing, or
    /// that the metadata LVs record as failed, is a missing member: reads come from the
    /// other copies or parity, as md reads a degraded array.
    fn open_raid(
        &self,
        lv: &LvMeta,
        r: &crate::meta::RaidSeg,
        full: String,
        ro: bool,
    ) -> Result<LogicalVolume> {
        self.open_raid_with(lv, r, full, ro, &[], false)
    }

    /// [`Vg::open_raid`] with images `force_down` left out as well, or (`ignore_failed`)
    /// with the images the superblocks record as failed put back (a rebuild's target).
    fn open_raid_with(
        &self,
        lv: &LvMeta,
        r: &crate::meta::RaidSeg,
        full: String,
        ro: bool,
        force_down: &[bool],
        ignore_failed: bool,
    ) -> Result<LogicalVolume> {
        let es = self.meta.extent_size * 512;
        let seg = &lv.segments[0];
        let lv_bytes = seg.extent_count * es;
        let image_bytes = crate::meta::image_extents(r, seg.extent_count) * es;
        // Map every image first so they all index one PV list.
        let mut devs: Vec<(String, Arc<dyn BlockDevice>)> = Vec::new();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        let mut maps = Vec::new();
        for name in &r.images {
            let sub = self.lv_meta(name)?;
            let f = format!("{}/{name}", self.meta.name);
            maps.push(match self.map_segments(sub, &f, &mut devs, &mut index) {
                Ok(m) => Some((f, m)),
                Err(e) if e.kind() == ErrorKind::Degraded => None,
                Err(e) => return Err(e),
            });
        }
        let mut images: Vec<Option<LogicalVolume>> = Vec::new();
        let mut image_maps: Vec<Option<crate::raid::SubMap>> = Vec::new();
        for m in maps {
            image_maps.push(m.as_ref().map(|(f, map)| crate::raid::SubMap {
                name: f.clone(),
                pvs: devs.clone(),
                segments: map.clone(),
            }));
            images.push(match m {
                Some((f, map)) => Some(LogicalVolume::new(f, devs.clone(), map, ro)?),
                None => None,
            });
        }
        // What the metadata LVs say: the freshest superblock's failed images.
        let mut freshest: Option<crate::raid::DmRaidSuper> = None;
        let mut scratch_devs = Vec::new();
        let mut scratch_index = BTreeMap::new();
        for m in r.metas.iter().flatten() {
            if let Some(meta_lv) = self.open_sub(m, &mut scratch_devs, &mut scratch_index, true)? {
                if let Ok(Some(sb)) = crate::raid::read_rmeta(&meta_lv) {
                    if freshest.as_ref().is_none_or(|f| sb.events > f.events) {
                        freshest = Some(sb);
                    }
                }
            }
        }
        let mut notes = Vec::new();
        for (i, img) in images.iter_mut().enumerate() {
            if force_down.get(i).copied().unwrap_or(false) {
                *img = None;
            }
        }
        if let Some(sb) = freshest.as_ref().filter(|_| !ignore_failed) {
            for (i, img) in images.iter_mut().enumerate() {
                if img.is_some() && sb.failed(i) {
                    notes.push(format!("image {} is recorded as failed", r.images[i]));
                    *img = None;
                }
            }
        }
        let Some(first) = images.iter().flatten().next() else {
            return Err(Error::new(
                ErrorKind::Degraded,
                format!("LV {full}: no image is present"),
            ));
        };
        let first_segments_lv = LogicalVolume::new(
            first.name().to_string(),
            devs.clone(),
            first.segments().to_vec(),
            ro,
        )?;
        let layout = crate::raid::md_layout(r, image_bytes / 512)?;
        let down: Vec<bool> = images.iter().map(Option::is_none).collect();
        if !layout.tolerates(&down) {
            return Err(Error::new(
                ErrorKind::Degraded,
                format!(
                    "LV {full}: too many images are missing ({} of {}) for {}",
                    down.iter().filter(|d| **d).count(),
                    down.len(),
                    r.segtype
                ),
            ));
        }
        if layout.array_sectors().0 * 512 < lv_bytes {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("LV {full}: its images hold less than its {lv_bytes} bytes"),
            ));
        }
        let mut recorded = false;
        if !ro && !ignore_failed && down.iter().any(|d| *d) {
            // As dm-raid's super_sync: the images left record the missing ones as
            // failed, so that when a missing PV returns its stale image is not read
            // until a repair rebuilds it.
            self.record_failed(r, &down, freshest.as_ref())
                .map_err(|e| e.context(format!("LV {full}: recording failed images")))?;
            recorded = true;
        }
        let n = images.len();
        let members: Vec<Option<Arc<dyn BlockDevice>>> = images
            .into_iter()
            .map(|i| i.map(|l| Arc::new(l) as Arc<dyn BlockDevice>))
            .collect();
        for n in &notes {
            tracing::warn!("LV {full}: {n}");
        }
        let mut array =
            cairn_md::Array::from_layout(layout, members, &vec![cairn_md::Sectors::ZERO; n])
                .map_err(|e| e.context(format!("LV {full}")))?;
        array.set_label(format!("RAID LV {full}"));
        let image_names: Vec<String> = r
            .images
            .iter()
            .map(|i| format!("{}/{i}", self.meta.name))
            .collect();
        array.name_members(&image_names);
        let writable = !(ro || ignore_failed || array.capabilities().read_only);
        // Open for writing: md's write-intent bitmap, kept in the metadata LVs as dm-raid
        // keeps it. Its dirty bits say where the last writer stopped mid-way; those
        // regions (only those) are resynced before serving.
        let mut rmetas: Vec<Option<Arc<dyn BlockDevice>>> = vec![None; n];
        let mut meta_maps: Vec<Option<crate::raid::SubMap>> = vec![None; n];
        if writable {
            let mut mdevs = Vec::new();
            let mut mindex = BTreeMap::new();
            for (i, m) in r.metas.iter().enumerate() {
                let Some(m) = m else { continue };
                let sub = self.lv_meta(m)?;
                let f = format!("{}/{m}", self.meta.name);
                match self.map_segments(sub, &f, &mut mdevs, &mut mindex) {
                    Ok(map) => {
                        rmetas[i] = Some(Arc::new(LogicalVolume::new(
                            f.clone(),
                            mdevs.clone(),
                            map.clone(),
                            false,
                        )?));
                        meta_maps[i] = Some(crate::raid::SubMap {
                            name: f,
                            pvs: mdevs.clone(),
                            segments: map,
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::Degraded => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let events = freshest.as_ref().map_or(1, |f| f.events);
        let mut dirty = None;
        if writable && r.region_size > 0 {
            // Only the images in the array carry a bitmap that means anything.
            let devs = rmetas
                .iter()
                .zip(&down)
                .map(|(d, dn)| if *dn { None } else { d.clone() })
                .collect();
            dirty = array
                .attach_own_bitmap(devs, crate::raid::BITMAP_OFFSET, events)
                .map_err(|e| e.context(format!("LV {full}: its bitmap")))?;
            if recorded {
                // The superblocks moved on (the failed images); the bitmap follows, as
                // md writes its events with every superblock update.
                array
                    .record_events(self.raid_superblock(r).map_or(events, |f| f.events))
                    .map_err(|e| e.context(format!("LV {full}: its bitmap")))?;
            }
        }
        let array = Arc::new(array);
        let lv = LogicalVolume::raid(
            full.clone(),
            array.clone(),
            lv_bytes,
            &first_segments_lv,
            ro,
        );
        if !writable {
            return Ok(lv);
        }
        if let Some(bits) = dirty.filter(|b| *b > 0) {
            if array.down_roles().is_empty() {
                tracing::warn!(
                    "LV {full} was not closed cleanly: resyncing the {bits} regions its bitmap marks"
                );
                array
                    .resync()
                    .map_err(|e| e.context(format!("LV {full}: resync")))?;
                tracing::info!("LV {full}: resynced {} bytes", array.resynced_bytes());
            } else {
                tracing::warn!(
                    "LV {full} was not closed cleanly and is degraded: its {bits} dirty \
                     regions cannot be resynced until it is repaired; copies may differ \
                     where writes were in flight"
                );
            }
        }
        let maps = image_maps
            .into_iter()
            .zip(meta_maps)
            .zip(&down)
            // Images missing at the start come back through a repair, not a re-add.
            .map(|((img, meta), dn)| if *dn { None } else { img.map(|i| (i, meta)) })
            .collect();
        let meta = Arc::new(crate::raid::RaidMeta {
            images: image_names,
            rmetas: std::sync::Mutex::new(rmetas),
            maps: std::sync::Mutex::new(maps),
            array: Arc::downgrade(&array),
            updating: std::sync::Mutex::new(()),
            label: full,
        });
        array.observe(meta.clone());
        Ok(lv.with_raid_meta(meta))
    }

    /// `vgs` + `pvs` + `lvs` in one.
    pub fn report(&self) -> VgReport {
        let m = &self.meta;
        let es = m.extent_size * 512;
        let free = FreeMap::of(m).ok();
        let name_of = |key: &str| -> String {
            m.pvs
                .iter()
                .position(|p| p.key == key)
                .map(|i| match (&self.slots[i].dev, &m.pvs[i].device) {
                    (Some(d), _) => d.name.clone(),
                    (None, Some(h)) => h.clone(),
                    (None, None) => format!("[unknown {key}]"),
                })
                .unwrap_or_else(|| key.to_string())
        };
        let pvs: Vec<PvReport> = m
            .pvs
            .iter()
            .zip(&self.slots)
            .map(|(p, s)| {
                let fc = free.as_ref().map_or(0, |f| f.free_on(&p.key));
                PvReport {
                    name: name_of(&p.key),
                    key: p.key.clone(),
                    uuid: p.id.clone(),
                    missing: s.dev.is_none(),
                    dev_size: p.dev_size * 512,
                    pe_start: p.pe_start * 512,
                    pe_count: p.pe_count,
                    pe_alloc: p.pe_count - fc.min(p.pe_count),
                    free_count: fc,
                    size: p.pe_count * es,
                    free: fc * es,
                    allocatable: p.allocatable(),
                }
            })
            .collect();
        let lvs = m
            .lvs
            .iter()
            .map(|l| LvReport {
                name: l.name.clone(),
                uuid: l.id.clone(),
                size: l.extents() * es,
                extents: l.extents(),
                visible: l.visible(),
                writable: l.writable(),
                unavailable: l.unsupported.clone(),
                sync_percent: self.sync_percent(l).map(|p| format!("{p:.2}")),
                raid_sync_action: None,
                raid_mismatch_count: None,
                segments: l
                    .segments
                    .iter()
                    .map(|s| {
                        let k = s.areas().len() as u64;
                        let per = s.extent_count.checked_div(k).unwrap_or(0);
                        let ranges: Vec<String> = match &s.kind {
                            // lvm names the images and their extents.
                            SegKind::Raid(r) => {
                                let n = crate::meta::image_extents(r, s.extent_count);
                                r.images
                                    .iter()
                                    .map(|i| format!("{i}:0-{}", n.max(1) - 1))
                                    .collect()
                            }
                            _ => s
                                .areas()
                                .iter()
                                .map(|a| {
                                    format!("{}:{}-{}", name_of(&a.pv), a.pe, a.pe + per.max(1) - 1)
                                })
                                .collect(),
                        };
                        SegReport {
                            start_extent: s.start_extent,
                            extent_count: s.extent_count,
                            segtype: s.type_name().to_string(),
                            stripes: match &s.kind {
                                SegKind::Raid(r) => r.images.len(),
                                _ => s.areas().len(),
                            },
                            stripe_size: s.stripe_sectors() * 512,
                            seg_pe_ranges: ranges.join(" "),
                        }
                    })
                    .collect(),
            })
            .collect();
        let extent_count: u64 = m.pvs.iter().map(|p| p.pe_count).sum();
        let free_count = free.as_ref().map_or(0, FreeMap::free);
        VgReport {
            name: m.name.clone(),
            uuid: m.id.clone(),
            seqno: m.seqno,
            extent_size: es,
            extent_count,
            free_count,
            size: extent_count * es,
            free: free_count * es,
            pv_count: m.pvs.len(),
            lv_count: m.lvs.iter().filter(|l| l.visible()).count(),
            pvs,
            lvs,
            notes: self.notes.clone(),
        }
    }
}

fn runs_to_linear(start: u64, runs: Vec<Run>) -> Vec<Segment> {
    let mut at = start;
    runs.into_iter()
        .map(|r| {
            let s = Segment::striped(at, r.count, 0, vec![Area { pv: r.pv, pe: r.pe }]);
            at += r.count;
            s
        })
        .collect()
}

fn rounds_to_striped(start: u64, stripe_size: u64, rounds: Vec<Vec<Run>>) -> Vec<Segment> {
    let mut at = start;
    rounds
        .into_iter()
        .map(|round| {
            let k = round.len() as u64;
            let count = round.first().map_or(0, |r| r.count) * k;
            let s = Segment::striped(
                at,
                count,
                stripe_size,
                round
                    .into_iter()
                    .map(|r| Area { pv: r.pv, pe: r.pe })
                    .collect(),
            );
            at += count;
            s
        })
        .collect()
}

/// lvm's rule for extent sizes: a power of two (cairn: at least 4 KiB), or a multiple of
/// 128 KiB ("Physical Extent size must be a multiple of 128.00 KiB when not a power of
/// 2"), at most 1 TiB.
pub fn extent_size_ok(b: u64) -> bool {
    let pow2 = b >= 4096 && b.is_power_of_two();
    (pow2 || (b > 0 && b.is_multiple_of(128 << 10))) && b <= 1 << 40
}

/// The extent size that keeps every extent on a full stripe of every PV: `wanted`
/// raised to the least common multiple with each PV's optimal I/O size (a RAID full
/// stripe such as 192 KiB makes 4 MiB extents 12 MiB). `None` when that would exceed
/// 1 GiB or break lvm's rule; the caller then keeps `wanted` and warns.
pub fn aligned_extent_size(wanted: u64, pvs: &[PvDevice]) -> Option<u64> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut e = wanted;
    for pv in pvs {
        let o = u64::from(pv.dev.geometry().optimal_io_size).max(1);
        e = e.checked_mul(o / gcd(e, o))?;
    }
    (e <= 1 << 30 && extent_size_ok(e)).then_some(e)
}
