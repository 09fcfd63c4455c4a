//! RAID LVs: lvm's `raid*` and legacy `mirror` segments mapped through md's data layouts
//! (crates/md), with the dm-raid superblock and md bitmap kept in each `_rmeta_` sub-LV.
//!
//! ```text
//!   LV "r" (segment type raid10, data_copies 2)
//!     cairn_md::Array::from_layout(Raid10 near=2, [r_rimage_0 .. r_rimage_3])
//!       r_rimage_N   a hidden linear/striped LV (LogicalVolume over the PVs)
//!     r_rmeta_N      a hidden 1-extent LV: dm_raid_superblock at 0, md bitmap at 4096
//! ```
//!
//! The layout of the metadata LV (docs/lvm-raid.md has it byte by byte), from the
//! kernel's `drivers/md/dm-raid.c` (`struct dm_raid_superblock`, `super_sync`):
//!
//! ```text
//!   0   magic "DmRd" (0x64526d44 LE)   4   compat_features (1: v1.9.0 fields present)
//!   8   num_devices                    12  array_position
//!   16  events (u64)                   24  failed_devices (bit per image, u64)
//!   32  disk_recovery_offset (u64)     40  array_resync_offset (u64)
//!   48  level  52 layout  56 stripe_sectors  60 flags
//!   64  reshape_position (u64)         72  new_level 76 new_layout 80 new_stripe_sectors
//!   84  delta_disks                    88  array_sectors (u64)
//!   96  data_offset  104 new_data_offset  112 sectors (u64 each)
//!   120 extended_failed_devices[3] (u64 each)   144 incompat_features   148 end
//!   the rest of the 512-byte block zero; md bitmap (bitmap_super_t + bits) at 4096
//! ```

use std::sync::{Arc, Mutex, PoisonError};

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use cairn_md::layout::{ArrayLayout, ParityLayout, Raid0, Raid1, Raid10};
use cairn_md::{Level, Raid10Layout, Sectors};

use crate::meta::RaidSeg;

/// "DmRd" read as a little-endian u32.
pub const DM_RAID_MAGIC: u32 = 0x6452_6d44;
/// `FEATURE_FLAG_SUPPORTS_V190`: the fields from `flags` on are valid.
pub const FEATURE_V190: u32 = 1;
/// The kernel's `MaxSector`: "not recovering / resync done / no reshape".
pub const MAX_SECTOR: u64 = u64::MAX;
/// Bytes of `struct dm_raid_superblock` (packed).
pub const SB_SIZE: usize = 148;
/// Where dm-raid puts md's bitmap in the metadata LV (`to_sector(4096)`).
pub const BITMAP_OFFSET: u64 = 4096;
/// lvm's default region size (lvm.conf `raid_region_size`, 2 MiB), in sectors.
pub const DEFAULT_REGION_SECTORS: u64 = 4096;

/// `struct dm_raid_superblock`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DmRaidSuper {
    pub compat_features: u32,
    pub num_devices: u32,
    pub array_position: u32,
    pub events: u64,
    /// Bits 0..256 (the first word and the three extended ones).
    pub failed_devices: [u64; 4],
    pub disk_recovery_offset: u64,
    pub array_resync_offset: u64,
    pub level: u32,
    pub layout: u32,
    pub stripe_sectors: u32,
    pub flags: u32,
    pub reshape_position: u64,
    pub new_level: u32,
    pub new_layout: u32,
    pub new_stripe_sectors: u32,
    pub delta_disks: u32,
    pub array_sectors: u64,
    pub data_offset: u64,
    pub new_data_offset: u64,
    pub sectors: u64,
    pub incompat_features: u32,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

impl DmRaidSuper {
    /// Parses the first block of a metadata LV; `None` without the magic (a new or
    /// wiped metadata LV, which dm-raid treats as a device to initialise).
    pub fn parse(b: &[u8]) -> Option<DmRaidSuper> {
        if b.len() < SB_SIZE || u32_at(b, 0) != DM_RAID_MAGIC {
            return None;
        }
        let v190 = u32_at(b, 4) & FEATURE_V190 != 0;
        let ext = |i: usize| if v190 { u64_at(b, 120 + 8 * i) } else { 0 };
        Some(DmRaidSuper {
            compat_features: u32_at(b, 4),
            num_devices: u32_at(b, 8),
            array_position: u32_at(b, 12),
            events: u64_at(b, 16),
            failed_devices: [u64_at(b, 24), ext(0), ext(1), ext(2)],
            disk_recovery_offset: u64_at(b, 32),
            array_resync_offset: u64_at(b, 40),
            level: u32_at(b, 48),
            layout: u32_at(b, 52),
            stripe_sectors: u32_at(b, 56),
            flags: u32_at(b, 60),
            reshape_position: u64_at(b, 64),
            new_level: u32_at(b, 72),
            new_layout: u32_at(b, 76),
            new_stripe_sectors: u32_at(b, 80),
            delta_disks: u32_at(b, 84),
            array_sectors: u64_at(b, 88),
            data_offset: u64_at(b, 96),
            new_data_offset: u64_at(b, 104),
            sectors: u64_at(b, 112),
            incompat_features: u32_at(b, 144),
        })
    }

    /// The 512-byte block `super_sync` writes.
    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        let mut put32 = |o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        put32(0, DM_RAID_MAGIC);
        put32(4, self.compat_features);
        put32(8, self.num_devices);
        put32(12, self.array_position);
        put32(48, self.level);
        put32(52, self.layout);
        put32(56, self.stripe_sectors);
        put32(60, self.flags);
        put32(72, self.new_level);
        put32(76, self.new_layout);
        put32(80, self.new_stripe_sectors);
        put32(84, self.delta_disks);
        put32(144, self.incompat_features);
        let mut put64 = |o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        put64(16, self.events);
        put64(24, self.failed_devices[0]);
        put64(32, self.disk_recovery_offset);
        put64(40, self.array_resync_offset);
        put64(64, self.reshape_position);
        put64(88, self.array_sectors);
        put64(96, self.data_offset);
        put64(104, self.new_data_offset);
        put64(112, self.sectors);
        for i in 0..3 {
            put64(120 + 8 * i, self.failed_devices[i + 1]);
        }
        b
    }

    /// Whether image `i` is recorded as failed.
    pub fn failed(&self, i: usize) -> bool {
        i < 256 && self.failed_devices[i / 64] & (1 << (i % 64)) != 0
    }
}

/// md's level and layout word for an lvm RAID segment type, as dm-raid's `raid_types`
/// table gives them (raid4 is level 5 with parity on the first image).
pub fn md_level_layout(r: &RaidSeg) -> Result<(Level, u32)> {
    let p = |l: u32| Ok((Level::Raid5, l));
    let q = |l: u32| Ok((Level::Raid6, l));
    match r.segtype.as_str() {
        "raid1" | "mirror" => Ok((Level::Raid1, 0)),
        "raid0" | "raid0_meta" => Ok((Level::Raid0, 0)),
        // near copies, far 1: md's layout word near | far << 8.
        "raid10" => Ok((
            Level::Raid10,
            u32::try_from(r.data_copies.max(2)).unwrap_or(2) | 1 << 8,
        )),
        "raid4" => p(4),
        "raid5_la" => p(0),
        "raid5_ra" => p(1),
        "raid5" | "raid5_ls" => p(2),
        "raid5_rs" => p(3),
        "raid5_n" => p(5),
        "raid6" | "raid6_zr" => q(8),
        "raid6_nr" => q(9),
        "raid6_nc" => q(10),
        "raid6_la_6" => q(16),
        "raid6_ra_6" => q(17),
        "raid6_ls_6" => q(18),
        "raid6_rs_6" => q(19),
        "raid6_n_6" => q(5),
        t => Err(Error::new(
            ErrorKind::Unsupported,
            format!("segment type {t} is not mapped by cairn"),
        )),
    }
}

/// md's placement for the segment over images of `image_sectors` each.
pub fn md_layout(r: &RaidSeg, image_sectors: u64) -> Result<ArrayLayout> {
    let n = r.images.len();
    let (level, layout) = md_level_layout(r)?;
    let chunk = Sectors(r.stripe_size);
    let size = Sectors(image_sectors);
    Ok(match level {
        Level::Raid1 => ArrayLayout::Raid1(Raid1::new(n, size)?),
        Level::Raid0 => ArrayLayout::Raid0(Raid0::new(&vec![size; n], chunk, None)?),
        Level::Raid10 => ArrayLayout::Raid10(Raid10::new(
            Raid10Layout {
                near: u8::try_from(r.data_copies.max(2)).unwrap_or(2),
                far: 1,
                offset: false,
            },
            n,
            chunk,
            size,
        )?),
        _ => ArrayLayout::Parity(ParityLayout::new(level, layout, n, chunk, size)?),
    })
}

/// The superblock dm-raid would write for image `pos` of a new, in-sync (`synced`) or
/// to-be-synced RAID LV.
pub fn new_super(
    r: &RaidSeg,
    pos: usize,
    image_sectors: u64,
    lv_sectors: u64,
    synced: bool,
) -> Result<DmRaidSuper> {
    let (level, layout) = md_level_layout(r)?;
    Ok(DmRaidSuper {
        compat_features: FEATURE_V190,
        num_devices: u32::try_from(r.images.len()).unwrap_or(u32::MAX),
        array_position: u32::try_from(pos).unwrap_or(u32::MAX),
        events: 1,
        failed_devices: [0; 4],
        disk_recovery_offset: MAX_SECTOR,
        array_resync_offset: if synced { MAX_SECTOR } else { 0 },
        level: u32::try_from(level.to_raw()).unwrap_or(0),
        layout,
        stripe_sectors: u32::try_from(r.stripe_size).unwrap_or(0),
        flags: 0,
        reshape_position: MAX_SECTOR,
        new_level: u32::try_from(level.to_raw()).unwrap_or(0),
        new_layout: layout,
        new_stripe_sectors: u32::try_from(r.stripe_size).unwrap_or(0),
        delta_disks: 0,
        array_sectors: lv_sectors,
        data_offset: 0,
        new_data_offset: 0,
        sectors: image_sectors,
        incompat_features: 0,
    })
}

/// Writes a metadata LV as dm-raid leaves it after the first activation: the
/// superblock, then md's bitmap header with every region clean (`synced`) or dirty.
pub fn write_rmeta(
    dev: &Arc<dyn BlockDevice>,
    sb: &DmRaidSuper,
    r: &RaidSeg,
    lv_sectors: u64,
    image_sectors: u64,
) -> Result<()> {
    let size = dev.geometry().size;
    // Clear the old contents of the first 4 KiB blocks lvm would have wiped.
    let mut head = vec![0u8; usize::try_from(BITMAP_OFFSET).unwrap_or(4096)];
    head[..512].copy_from_slice(&sb.encode());
    dev.write_at(&head, 0, WriteFlags::NONE)?;
    if r.region_size > 0 {
        let bm = bitmap_header(r, lv_sectors, image_sectors, sb.events);
        let area = bm.initial_area(sb.array_resync_offset != MAX_SECTOR);
        if BITMAP_OFFSET + area.len() as u64 > size {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "the bitmap ({} bytes) does not fit the metadata LV ({size} bytes); use a larger region size",
                    area.len()
                ),
            ));
        }
        dev.write_at(&area, BITMAP_OFFSET, WriteFlags::NONE)?;
    }
    dev.flush()
}

/// md's bitmap header for a RAID segment's metadata LVs, at `events`.
fn bitmap_header(
    r: &RaidSeg,
    lv_sectors: u64,
    image_sectors: u64,
    events: u64,
) -> cairn_md::bitmap::BitmapSuper {
    // md's resync_max_sectors: the array for raid10, an image otherwise.
    let sync = if r.segtype == "raid10" {
        lv_sectors
    } else {
        image_sectors
    };
    let chunk = u32::try_from(r.region_size.saturating_mul(512)).unwrap_or(1 << 31);
    cairn_md::bitmap::BitmapSuper::new(cairn_md::Uuid::default(), Sectors(sync), chunk, events)
}

/// A sub-LV's mapping, kept so that it can be opened again over a PV that came back.
#[derive(Clone)]
pub(crate) struct SubMap {
    pub(crate) name: String,
    pub(crate) pvs: Vec<(String, Arc<dyn BlockDevice>)>,
    pub(crate) segments: Vec<crate::map::MapSegment>,
}

impl SubMap {
    /// Whether the sub-LV has extents on the PV called `pv`.
    fn uses(&self, pv: &str) -> bool {
        self.segments
            .iter()
            .flat_map(|s| &s.areas)
            .any(|a| self.pvs[a.pv].0 == pv)
    }

    /// The sub-LV opened for writing, with the PV called `pv` now `dev`.
    fn open_with(&mut self, pv: &str, dev: &Arc<dyn BlockDevice>) -> Result<crate::LogicalVolume> {
        for p in self.pvs.iter_mut().filter(|p| p.0 == pv) {
            p.1 = dev.clone();
        }
        crate::LogicalVolume::new(
            self.name.clone(),
            self.pvs.clone(),
            self.segments.clone(),
            false,
        )
    }
}

/// An image's mapping and its metadata LV's (if it has one).
pub(crate) type ImageMaps = (SubMap, Option<SubMap>);

/// What a RAID LV open for writing keeps of its metadata LVs, to record in dm-raid's
/// superblocks what md's array does, as dm-raid's `super_sync` does: an image that fails
/// is recorded as failed in the superblocks of the images left (events + 1), so a
/// restart does not read its stale copy; a rebuild or re-add that finishes clears its
/// image's failed bit (events + 1), so the kernel and cairn take the image as in sync
/// again. It hears of the array's work as an [`cairn_md::Observer`]. The write-intent
/// bits themselves are md's bitmap, kept by the array in the same metadata LVs
/// ([`cairn_md::Array::attach_own_bitmap`]); its events follow the superblocks'.
///
/// It also keeps each image's mapping, so that an image whose PV went away (a remote PV
/// whose server stopped) can be put back when the PV answers again
/// ([`crate::LogicalVolume::raid_pv_returned`]).
pub struct RaidMeta {
    /// `VG/image` for each image, in `raids` order (the names the array's members carry).
    pub(crate) images: Vec<String>,
    /// Each image's metadata LV, where present.
    pub(crate) rmetas: Mutex<Vec<Option<Arc<dyn BlockDevice>>>>,
    /// Each image's mapping and its metadata LV's, for images present at the start.
    pub(crate) maps: Mutex<Vec<Option<ImageMaps>>>,
    /// The array (weak: the array holds this observer).
    pub(crate) array: std::sync::Weak<cairn_md::Array>,
    /// One superblock update at a time.
    pub(crate) updating: Mutex<()>,
    pub(crate) label: String,
}

impl std::fmt::Debug for RaidMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaidMeta").field("lv", &self.label).finish()
    }
}

impl RaidMeta {
    fn rmetas(&self) -> std::sync::MutexGuard<'_, Vec<Option<Arc<dyn BlockDevice>>>> {
        self.rmetas.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Image `i` has a new metadata LV (a repair moved it).
    pub(crate) fn set_rmeta(&self, i: usize, dev: Arc<dyn BlockDevice>) {
        if let Some(slot) = self.rmetas().get_mut(i) {
            *slot = Some(dev);
        }
    }

    /// Image `i` is rebuilt: every present superblock records it in sync (its failed
    /// bit cleared, its recovery done), events one past the freshest.
    pub(crate) fn image_rebuilt(&self, i: usize) -> Result<()> {
        self.update_superblocks(i, false)
    }

    /// Rewrites the superblocks of the images in the array (and of image `i`) with
    /// image `i`'s failed bit set (`failed`) or cleared, events one past the freshest;
    /// then the bitmap records those events. An image out of the array is left alone
    /// (its PV may be gone); a write that fails is the array's next failure, not this
    /// update's.
    fn update_superblocks(&self, i: usize, failed: bool) -> Result<()> {
        let _one = self.updating.lock().unwrap_or_else(PoisonError::into_inner);
        let array = self.array.upgrade();
        let rmetas = self.rmetas().clone();
        let mut sbs = Vec::new();
        for (j, d) in rmetas.iter().enumerate() {
            let Some(d) = d else { continue };
            let out = array.as_ref().is_some_and(|a| a.is_out(j));
            if out && (j != i || failed) {
                continue;
            }
            match read_rmeta(&**d) {
                Ok(Some(sb)) => sbs.push((j, d.clone(), sb)),
                Ok(None) => {}
                Err(e) if j != i => {
                    tracing::warn!("LV {}: metadata LV of image {j}: {e}", self.label);
                }
                Err(e) => return Err(e),
            }
        }
        let events = sbs
            .iter()
            .map(|s| s.2.events)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        let mut first_err = None;
        for (j, d, mut sb) in sbs {
            if i < 256 {
                if failed {
                    sb.failed_devices[i / 64] |= 1 << (i % 64);
                } else {
                    sb.failed_devices[i / 64] &= !(1 << (i % 64));
                }
            }
            if j == i && !failed {
                sb.disk_recovery_offset = MAX_SECTOR;
            }
            sb.array_position = u32::try_from(j).unwrap_or(u32::MAX);
            sb.events = events;
            if let Err(e) = d.write_at(&sb.encode(), 0, WriteFlags::FUA) {
                tracing::warn!("LV {}: superblock of image {j}: {e}", self.label);
                first_err.get_or_insert(e);
            }
        }
        if let Some(a) = array {
            // md writes its events into the bitmap with every superblock update; one
            // behind would make the next start take the bitmap as out of date.
            a.record_events(events)?;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// What image `i`'s metadata LV says of it: the events of its superblock (0 when it
    /// has none), as it was when the image left.
    fn image_events(dev: &dyn BlockDevice) -> u64 {
        read_rmeta(dev).ok().flatten().map_or(0, |sb| sb.events)
    }

    /// The PV called `pv` answers again as `dev`: each image out of the array with
    /// extents on it is opened over `dev` and re-added into its role. Returns what was
    /// done, one sentence per image.
    pub(crate) fn pv_returned(&self, pv: &str, dev: &Arc<dyn BlockDevice>) -> Result<Vec<String>> {
        let Some(array) = self.array.upgrade() else {
            return Ok(Vec::new());
        };
        let mut done = Vec::new();
        let mut maps = self.maps.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, m) in maps.iter_mut().enumerate() {
            let Some((image, meta)) = m else { continue };
            let uses = image.uses(pv) || meta.as_ref().is_some_and(|m| m.uses(pv));
            if !uses {
                continue;
            }
            if !array.is_out(i) {
                // Keep the mapping current for the next time the PV goes.
                image.open_with(pv, dev)?;
                if let Some(m) = meta {
                    m.open_with(pv, dev)?;
                }
                continue;
            }
            let img = image.open_with(pv, dev)?;
            let rmeta: Option<Arc<dyn BlockDevice>> = match meta {
                Some(m) => Some(Arc::new(m.open_with(pv, dev)?)),
                None => None,
            };
            let events = rmeta.as_deref().map_or(0, Self::image_events);
            if let Some(d) = &rmeta {
                // Before the re-add: a rebuild that ends at once records the image in
                // sync through this metadata LV, not the dead one.
                self.set_rmeta(i, d.clone());
            }
            let change =
                array.readd_into(i, Arc::new(img), self.images[i].clone(), rmeta, events)?;
            done.push(change.message);
        }
        Ok(done)
    }
}

impl cairn_md::Observer for RaidMeta {
    fn md_event(&self, _array: &str, event: &cairn_md::MdEvent) {
        let image = |m: &str| self.images.iter().position(|n| n == m);
        match event {
            cairn_md::MdEvent::MemberFailed { member, .. } => {
                let Some(i) = image(member) else { return };
                match self.update_superblocks(i, true) {
                    Ok(()) => tracing::info!(
                        "LV {}: {} recorded as failed in the metadata LVs",
                        self.label,
                        self.images[i]
                    ),
                    Err(e) => tracing::warn!(
                        "LV {}: {} failed, but recording it in the metadata LVs failed: {e}",
                        self.label,
                        self.images[i]
                    ),
                }
            }
            cairn_md::MdEvent::JobEnded { job, .. }
                if job.action == "recovery" && job.state == "finished" =>
            {
                let Some(i) = job.member.as_deref().and_then(image) else {
                    return;
                };
                match self.image_rebuilt(i) {
                    Ok(()) => tracing::info!(
                        "LV {}: {} rebuilt; its metadata LVs say in sync",
                        self.label,
                        self.images[i]
                    ),
                    Err(e) => tracing::warn!(
                        "LV {}: {} rebuilt, but recording it in the metadata LVs failed: {e}; \
                         it counts as failed at the next start",
                        self.label,
                        self.images[i]
                    ),
                }
            }
            _ => {}
        }
    }
}

/// Reads the superblock of a metadata LV; `Ok(None)` when it carries none.
pub fn read_rmeta(dev: &dyn BlockDevice) -> Result<Option<DmRaidSuper>> {
    let lbs = usize::try_from(dev.geometry().logical_block_size.max(512)).unwrap_or(512);
    let mut b = vec![0u8; lbs];
    dev.read_at(&mut b, 0)?;
    Ok(DmRaidSuper::parse(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_at_the_kernel_offsets() {
        let mut sb = DmRaidSuper {
            compat_features: FEATURE_V190,
            num_devices: 4,
            array_position: 2,
            events: 7,
            sectors: 8192,
            ..Default::default()
        };
        sb.failed_devices[0] = 1 << 3;
        sb.failed_devices[2] = 1;
        let b = sb.encode();
        assert_eq!(&b[..4], b"DmRd");
        assert_eq!(u32_at(&b, 8), 4);
        assert_eq!(u64_at(&b, 112), 8192);
        assert_eq!(u64_at(&b, 128), 1);
        assert!(b[SB_SIZE..].iter().all(|&x| x == 0));
        let p = DmRaidSuper::parse(&b).unwrap();
        assert_eq!(p, sb);
        assert!(p.failed(3) && p.failed(128) && !p.failed(0));
    }
}
