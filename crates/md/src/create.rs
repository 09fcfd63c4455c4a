//! What `mdadm --create --metadata=1.2` (mdadm 4.2) writes on each member, so that an
//! array cairn creates looks like one mdadm made (ondisk-formats.md §1.7; mdadm
//! `Create.c`, `super1.c` `validate_geometry1`, `init_super1`, `write_init_super1`).
//!
//! ```text
//!   CreateParams ──► data_offset (from the first member's size) ──► component size
//!   (level, layout,    (headroom + bitmap space, 1 MiB aligned)      (smallest member,
//!    chunk, sizes,                                                    chunk-rounded)
//!    names, UUIDs) ──► one Superblock per member + the array size the kernel computes
//! ```
//!
//! Deliberate differences from mdadm, each because cairn is the "kernel" here:
//! * `events` is 1. mdadm writes 0 and the kernel's first superblock update, when it
//!   starts the new array, makes it 1; cairn writes the state after that update.
//! * Without `assume_clean`, mdadm creates RAID4/5 with the last member as a spare and
//!   lets the kernel rebuild onto it; cairn writes every member active in its slot with
//!   `resync_offset` 0 (resync pending), the state the kernel reaches for RAID1/6/10.
//! * The internal bitmap is a choice ([`CreateParams::bitmap`]): mdadm adds one on its
//!   own only for component sizes over 100 GiB, `Array::create` by default for every
//!   redundant level. Its header is mdadm's (`add_internal_bitmap1`) with `events` 1,
//!   like the superblock.
//! * No `missing` members and no spares.

use cairn_block::{Error, ErrorKind, Result};

use crate::bitmap::format::{BitmapChoice, BitmapSuper};
use crate::layout::ArrayLayout;
use crate::level::{Level, ParityAlgorithm, Raid0Layout, Raid10Layout};
use crate::ondisk::{
    DevFlags, DevRole, Features, MdTime, Reshape, SetName, Superblock, Uuid, FIXED_SIZE,
    SUPER_OFFSET_1_2,
};
use crate::units::{small, wide, Sectors};

/// mdadm's `DEFAULT_CHUNK`: 512 KiB.
pub const DEFAULT_CHUNK: Sectors = Sectors(1024);
/// Chunk sizes cairn accepts: 4 KiB to 4 MiB, powers of two.
pub const MIN_CHUNK: Sectors = Sectors(8);
pub const MAX_CHUNK: Sectors = Sectors(8192);

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateParams {
    pub level: Level,
    /// The layout word; `None` for mdadm's default for the level
    /// ([`Level::default_layout`]).
    pub layout: Option<u32>,
    /// Chunk size; `None` for mdadm's default (512 KiB) on levels that stripe. Ignored
    /// for RAID1, as mdadm ignores it. For linear it is the rounding (default none).
    pub chunk: Option<Sectors>,
    /// The whole size of each member, in role order. Their count is `raid_disks`.
    pub member_sectors: Vec<Sectors>,
    /// The array name (mdadm's `--name`, by default the md device number).
    pub name: String,
    /// Prefixed to the name as `homehost:name` (mdadm's rule, see [`SetName::from_parts`]).
    pub homehost: Option<String>,
    pub uuid: Uuid,
    /// One per member, in role order (mdadm picks them at random).
    pub device_uuids: Vec<Uuid>,
    /// Creation time; also the update time.
    pub ctime: MdTime,
    /// The members' data already agrees with the parity/mirrors (new zeroed or sparse
    /// members, or mdadm's `--assume-clean`): mark the array clean instead of pending a
    /// resync. RAID0 and linear are always clean.
    pub assume_clean: bool,
    /// An internal write-intent bitmap, or none (mdadm `--bitmap`).
    pub bitmap: BitmapChoice,
}

/// The superblocks to write and what the array will be.
#[derive(Debug, Clone)]
pub struct CreatedArray {
    /// One per member, in role order, to be written at byte 4096 of each.
    pub superblocks: Vec<Superblock>,
    /// The placement of data, as the kernel computes it from these superblocks.
    pub layout: ArrayLayout,
    /// The array's size as the kernel computes it (for RAID10 this can be below what
    /// `mdadm --examine` prints as "Array Size", which ignores chunk rounding).
    pub array_sectors: Sectors,
    /// The bitmap header, when one was asked for; its area goes at
    /// [`CreatedArray::bitmap_byte_offset`] of every member.
    pub bitmap: Option<BitmapSuper>,
}

impl CreatedArray {
    /// Byte offset of the bitmap on each member (`super_offset + bitmap_offset`).
    pub fn bitmap_byte_offset(&self) -> u64 {
        let sb = &self.superblocks[0];
        // Created arrays put it after the superblock (`BITMAP_OFFSET_1_2`).
        sb.super_offset
            .0
            .checked_add_signed(i64::from(sb.bitmap_offset))
            .expect("8 sectors after the superblock")
            * 512
    }

    /// The bitmap area to write on every member: all bits set when the superblocks
    /// say a resync is pending (mdadm's first assembly resyncs everything), none when
    /// the array is created clean.
    pub fn bitmap_area(&self) -> Option<Vec<u8>> {
        let dirty = self.superblocks[0].resync_offset != Sectors::MAX;
        self.bitmap.as_ref().map(|b| b.initial_area(dirty))
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// `choose_bm_space`: sectors mdadm reserves after the superblock for a bitmap, by size.
pub fn choose_bm_space(sectors: Sectors) -> Sectors {
    let s = sectors.0;
    Sectors(if s < 128 {
        0
    } else if s - 128 >= 200 * 1024 * 1024 * 2 {
        256
    } else if s - 8 > 8 * 1024 * 1024 * 2 {
        128
    } else {
        8
    })
}

/// mdadm's default `data_offset` for a member of `member_sectors` (`validate_geometry1`,
/// minor 1.2): room for superblock, bitmap and reshape headroom (about 0.1% of the
/// member, at most 128 MiB, at least two chunks), rounded up to 1 MiB.
pub fn default_data_offset(member_sectors: Sectors, chunk: Sectors) -> Sectors {
    let mut headroom: u64 = 128 * 1024 * 2;
    while (headroom << 10) > member_sectors.0 && (chunk.0 == 0 || headroom / 2 >= chunk.0 * 2) {
        headroom >>= 1;
    }
    let raw = 12 * 2 + choose_bm_space(member_sectors).0 + headroom;
    Sectors(raw)
        .checked_round_up(Sectors(2048))
        .expect("at most ~264192 sectors")
}

/// The layout word for `p`, checked for the level.
fn layout_word(p: &CreateParams, raid_disks: u32) -> Result<u32> {
    let word = p.layout.unwrap_or_else(|| p.level.default_layout());
    let bad = || {
        invalid(format!(
            "layout {word:#x} is not a {} layout cairn creates",
            p.level
        ))
    };
    match p.level {
        Level::Linear | Level::Raid1 | Level::Raid4 => {
            if word != 0 {
                return Err(bad());
            }
        }
        Level::Raid0 => {
            Raid0Layout::from_raw(word).ok_or_else(bad)?;
        }
        Level::Raid5 | Level::Raid6 => {
            ParityAlgorithm::for_level(p.level, word).ok_or_else(bad)?;
        }
        Level::Raid10 => {
            let l = Raid10Layout::from_raw(word).map_err(|_| bad())?;
            // mdadm creates only nK, fK and oK.
            if l.near != 1 && l.far != 1 {
                return Err(invalid(format!(
                    "raid10 layout {word:#x} mixes near and far copies; mdadm creates only nK, fK or oK"
                )));
            }
            if l.copies() < 2 || l.copies() > raid_disks {
                return Err(invalid(format!(
                    "raid10 layout {}: {} copies on {raid_disks} members",
                    l.short_name(),
                    l.copies()
                )));
            }
        }
    }
    Ok(word)
}

fn chunk_for(p: &CreateParams) -> Result<Sectors> {
    match p.level {
        Level::Raid1 => Ok(Sectors::ZERO),
        Level::Linear => {
            let c = p.chunk.unwrap_or(Sectors::ZERO);
            if c != Sectors::ZERO && (!c.0.is_power_of_two() || c < MIN_CHUNK || c > MAX_CHUNK) {
                return Err(invalid(format!(
                    "linear rounding of {} KiB: need a power of two from 4 KiB to 4 MiB",
                    c.kib()
                )));
            }
            Ok(c)
        }
        _ => {
            let c = p.chunk.unwrap_or(DEFAULT_CHUNK);
            if !c.0.is_power_of_two() || c < MIN_CHUNK || c > MAX_CHUNK {
                return Err(invalid(format!(
                    "chunk of {} sectors: need a power of two from 4 KiB to 4 MiB",
                    c.0
                )));
            }
            Ok(c)
        }
    }
}

/// Computes the superblocks mdadm 4.2 would write for `p` (with the differences listed
/// in the module documentation). Nothing is written.
pub fn create(p: &CreateParams) -> Result<CreatedArray> {
    let n = p.member_sectors.len();
    let raid_disks = u32::try_from(n).map_err(|_| invalid("too many members"))?;
    if raid_disks < p.level.min_raid_disks() {
        return Err(invalid(format!(
            "{} needs at least {} members, got {n}",
            p.level,
            p.level.min_raid_disks()
        )));
    }
    let max_members = if p.level == Level::Raid6 { 255 } else { 1920 };
    if n > max_members {
        return Err(invalid(format!(
            "{} takes at most {max_members} members, got {n}",
            p.level
        )));
    }
    if p.device_uuids.len() != n {
        return Err(invalid(format!(
            "{} device UUIDs for {n} members",
            p.device_uuids.len()
        )));
    }
    if p.name.is_empty() {
        return Err(invalid("the array needs a name"));
    }
    let layout = layout_word(p, raid_disks)?;
    let chunk = chunk_for(p)?;

    // mdadm: the first member's geometry sets data_offset for the whole array.
    let data_offset = default_data_offset(p.member_sectors[0], chunk);
    // Usable space per member, in whole KiB (mdadm works in KiB), rounded to the chunk.
    let mut min_free = u64::MAX;
    for (i, &size) in p.member_sectors.iter().enumerate() {
        let free = size.checked_sub(data_offset).ok_or_else(|| {
            invalid(format!(
                "member {i} ({} sectors) is too small: data starts at sector {}",
                size.0, data_offset.0
            ))
        })?;
        let free = free.round_down(Sectors(2)).round_down(chunk);
        if free == Sectors::ZERO {
            return Err(invalid(format!("member {i} has no space left for data")));
        }
        min_free = min_free.min(free.0);
    }
    // Levels > 0 record the component size; RAID1 rounds it to 64 KiB so that a later
    // reshape to RAID5 has a chunk multiple. RAID0 and linear leave it 0 (mdadm sets
    // `size` only when "size is meaningful", level > 0).
    let size = match p.level {
        Level::Linear | Level::Raid0 => Sectors::ZERO,
        Level::Raid1 => Sectors(min_free).round_down(Sectors(128)),
        _ => Sectors(min_free),
    };
    if p.level == Level::Raid1 && size == Sectors::ZERO {
        return Err(invalid("raid1 members are smaller than 64 KiB of data"));
    }

    // The bitmap, if any (add_internal_bitmap1): room is what choose_bm_space leaves.
    let bitmap = match p.bitmap {
        BitmapChoice::None => None,
        BitmapChoice::Internal { .. } if matches!(p.level, Level::Linear | Level::Raid0) => {
            return Err(invalid(format!(
                "a bitmap is not meaningful for {}: it has no redundancy to resync",
                p.level
            )))
        }
        BitmapChoice::Internal { chunk_bytes } => Some(crate::bitmap::format::plan(
            p.uuid,
            crate::bitmap::format::sync_size_for(p.level, layout, size, raid_disks),
            choose_bm_space(size),
            chunk_bytes,
            1,
        )?),
    };
    // Bad-block log right after the space reserved for a bitmap: sized by the component
    // size, or the bitmap's own size when there is one (write_init_super1).
    let bm_space = match &bitmap {
        Some(b) => Sectors(b.area_bytes().expect("planned") / 512),
        None => choose_bm_space(size),
    };
    let bm_offset: u64 = 8;
    let (bblog_size, bblog_offset) =
        if data_offset.0 >= SUPER_OFFSET_1_2.0 + bm_offset + bm_space.0 + 8 {
            (8u16, bm_offset + bm_space.0)
        } else if data_offset.0 >= SUPER_OFFSET_1_2.0 + 16 {
            (8, data_offset.0 - 8 - SUPER_OFFSET_1_2.0)
        } else {
            (0, 0)
        };
    let bblog_offset =
        i32::try_from(bblog_offset).expect("below data_offset, a few hundred sectors");

    // A RAID0 with a layout word gets the feature bit (mdadm on kernel >= 5.4).
    let mut features = if p.level == Level::Raid0 && layout != 0 {
        Features(Features::RAID0_LAYOUT)
    } else {
        Features(0)
    };
    if bitmap.is_some() {
        if data_offset.0 < SUPER_OFFSET_1_2.0 + bm_offset + bm_space.0 {
            return Err(invalid(format!(
                "the bitmap ({} sectors) does not fit before the data at sector {}",
                bm_space.0, data_offset.0
            )));
        }
        features.0 |= Features::BITMAP_OFFSET;
    }
    let max_dev = (wide(FIXED_SIZE + 2 * n).div_ceil(512) * 512 - wide(FIXED_SIZE)) / 2;
    let mut dev_roles = vec![DevRole::SPARE; small(max_dev)];
    for (i, r) in dev_roles.iter_mut().take(n).enumerate() {
        *r = DevRole::active(u16::try_from(i).expect("at most 1920 members"));
    }
    let clean = p.assume_clean || matches!(p.level, Level::Linear | Level::Raid0);
    let set_name = SetName::from_parts(p.homehost.as_deref(), &p.name);

    let superblocks: Vec<Superblock> = p
        .member_sectors
        .iter()
        .zip(&p.device_uuids)
        .enumerate()
        .map(|(i, (&member, &device_uuid))| Superblock {
            features,
            set_uuid: p.uuid,
            set_name,
            ctime: p.ctime,
            level: p.level,
            layout,
            size,
            chunk,
            raid_disks,
            bitmap_offset: if bitmap.is_some() {
                crate::bitmap::format::BITMAP_OFFSET_1_2
            } else {
                0
            },
            reshape: Reshape::default(),
            data_offset,
            data_size: Sectors(member.0 - data_offset.0),
            super_offset: SUPER_OFFSET_1_2,
            recovery_offset: Sectors::ZERO,
            dev_number: u32::try_from(i).expect("at most 1920 members"),
            cnt_corrected_read: 0,
            device_uuid,
            devflags: DevFlags(0),
            bblog_shift: 0,
            bblog_size,
            bblog_offset,
            utime: p.ctime,
            events: 1,
            resync_offset: if clean { Sectors::MAX } else { Sectors::ZERO },
            dev_roles: dev_roles.clone(),
        })
        .collect();

    // Every superblock must be one cairn reads back; the layout must build.
    for sb in &superblocks {
        sb.encode()?;
    }
    let data_sizes: Vec<Sectors> = superblocks.iter().map(|s| s.data_size).collect();
    let layout = ArrayLayout::from_superblock(&superblocks[0], &data_sizes)?;
    let array_sectors = layout.array_sectors();
    if array_sectors == Sectors::ZERO {
        return Err(invalid("the array would hold no data"));
    }
    Ok(CreatedArray {
        superblocks,
        layout,
        array_sectors,
        bitmap,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 2048;
    const GIB: u64 = 1024 * MIB;

    #[test]
    fn data_offset_table() {
        // ondisk-formats.md §1.7: member size -> data_offset for chunk 512K, 64K, RAID1.
        let rows = [
            (64 * MIB, [4096, 2048, 2048]),
            (GIB, [4096, 4096, 4096]),
            (10 * GIB, [18432, 18432, 18432]),
            (100 * GIB, [133_120, 133_120, 133_120]),
            (128 * GIB, [264_192, 264_192, 264_192]),
            (4096 * GIB, [264_192, 264_192, 264_192]),
        ];
        for (size, want) in rows {
            for (chunk, w) in [Sectors(1024), Sectors(128), Sectors(0)]
                .into_iter()
                .zip(want)
            {
                assert_eq!(
                    default_data_offset(Sectors(size), chunk),
                    Sectors(w),
                    "{size} sectors, chunk {}",
                    chunk.0
                );
            }
        }
    }

    fn params(level: Level, sizes: &[u64]) -> CreateParams {
        CreateParams {
            level,
            layout: None,
            chunk: None,
            member_sectors: sizes.iter().map(|&s| Sectors(s)).collect(),
            name: "0".into(),
            homehost: Some("host".into()),
            uuid: "01234567:89abcdef:01234567:89abcdef".parse().unwrap(),
            device_uuids: (0..sizes.len())
                .map(|i| {
                    let mut u = [0u8; 16];
                    u[14] = 0x10;
                    u[15] = u8::try_from(i).unwrap();
                    Uuid(u)
                })
                .collect(),
            ctime: MdTime::from_secs(1_700_000_000),
            assume_clean: true,
            bitmap: BitmapChoice::None,
        }
    }

    #[test]
    fn the_documented_raid5_member() {
        // verification.md §2.1: 4 x 64 MiB RAID5, checksum 968c625d on member 0.
        let a = create(&params(Level::Raid5, &[64 * MIB; 4])).unwrap();
        let sb = &a.superblocks[0];
        assert_eq!(sb.data_offset, Sectors(4096));
        assert_eq!(sb.data_size, Sectors(126_976));
        assert_eq!(sb.size, Sectors(126_976));
        assert_eq!((sb.bblog_offset, sb.bblog_size), (16, 8));
        assert_eq!(sb.max_dev(), 128);
        assert_eq!(sb.checksum(), 0x968c_625d);
        assert_eq!(a.array_sectors, Sectors(126_976 * 3));
        assert_eq!(a.superblocks[3].role(), DevRole::active(3));
    }

    #[test]
    fn sizes_per_level() {
        // Unequal members: the smallest decides, rounded to the chunk.
        let a = create(&params(
            Level::Raid6,
            &[64 * MIB, 64 * MIB + 1000, 70 * MIB, 64 * MIB],
        ))
        .unwrap();
        assert_eq!(a.superblocks[0].size, Sectors(126_976));
        assert_eq!(a.superblocks[1].data_size, Sectors(126_976 + 1000));
        assert_eq!(a.array_sectors, Sectors(126_976 * 2));
        // RAID1: 64 KiB multiple, no chunk.
        let mut p = params(Level::Raid1, &[64 * MIB + 300, 64 * MIB + 300]);
        p.chunk = Some(Sectors(128));
        let a = create(&p).unwrap();
        assert_eq!(a.superblocks[0].chunk, Sectors::ZERO);
        assert_eq!(a.superblocks[0].data_offset, Sectors(2048));
        assert_eq!(
            a.superblocks[0].size,
            Sectors((64 * MIB + 300 - 2048) / 128 * 128)
        );
        assert_eq!(a.array_sectors, a.superblocks[0].size);
        // RAID0 multi-zone: size 0, each member's own data_size, feature bit set.
        let a = create(&params(Level::Raid0, &[64 * MIB, 96 * MIB, 96 * MIB])).unwrap();
        let sb = &a.superblocks[0];
        assert_eq!(sb.size, Sectors::ZERO);
        assert!(sb.features.has(Features::RAID0_LAYOUT));
        assert_eq!(sb.layout, 1);
        assert_eq!(sb.bblog_offset, 8, "choose_bm_space(size = 0) is 0");
        let z0 = 64 * MIB - 4096;
        let z1 = 96 * MIB - 4096;
        assert_eq!(a.array_sectors, Sectors(z0 * 3 + (z1 - z0) * 2));
        // RAID10 n2 on 3 members: 1.5 members' worth.
        let a = create(&params(Level::Raid10, &[64 * MIB; 3])).unwrap();
        assert_eq!(a.array_sectors, Sectors(126_976 * 3 / 2));
        // Not clean unless asked.
        let mut p = params(Level::Raid5, &[64 * MIB; 3]);
        p.assume_clean = false;
        assert_eq!(
            create(&p).unwrap().superblocks[0].resync_offset,
            Sectors::ZERO
        );
    }

    #[test]
    fn bitmaps_as_mdadm_adds_them() {
        let mut p = params(Level::Raid5, &[64 * MIB; 4]);
        p.bitmap = BitmapChoice::Internal { chunk_bytes: None };
        let a = create(&p).unwrap();
        let sb = &a.superblocks[0];
        assert!(sb.features.has(Features::BITMAP_OFFSET));
        assert_eq!(sb.bitmap_offset, 8);
        assert_eq!((sb.bblog_offset, sb.bblog_size), (16, 8));
        let b = a.bitmap.as_ref().unwrap();
        assert_eq!(b.chunk_bytes, 64 << 20);
        assert_eq!(b.sync_size, sb.size);
        assert_eq!(b.events, 1);
        assert_eq!(a.bitmap_byte_offset(), 8192);
        // Clean (assume_clean): no bit set; otherwise all of them.
        assert!(a.bitmap_area().unwrap()[256..].iter().all(|&x| x == 0));
        p.assume_clean = false;
        let a = create(&p).unwrap();
        assert!(a.bitmap_area().unwrap()[256..].iter().all(|&x| x == 0xff));
        // A chosen small chunk; 10 GiB components: the log follows the 4 KiB bitmap.
        let mut p = params(Level::Raid6, &[10 * GIB; 4]);
        p.bitmap = BitmapChoice::Internal {
            chunk_bytes: Some(1 << 20),
        };
        let a = create(&p).unwrap();
        assert_eq!(a.superblocks[0].bblog_offset, 16);
        // Component: (10 GiB - 18432 sectors) rounded to the chunk = 10231 MiB.
        assert_eq!(a.bitmap.unwrap().chunks(), Some(10231));
        // 64 KiB chunks fit the 64 KiB of room left for 10 GiB members: the log moves.
        p.bitmap = BitmapChoice::Internal {
            chunk_bytes: Some(64 << 10),
        };
        assert_eq!(create(&p).unwrap().superblocks[0].bblog_offset, 8 + 48);
        // Too small a chunk for the room, RAID0, RAID10 sync size.
        p.bitmap = BitmapChoice::Internal {
            chunk_bytes: Some(4 << 10),
        };
        assert_eq!(create(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid0, &[64 * MIB; 2]);
        p.bitmap = BitmapChoice::Internal { chunk_bytes: None };
        assert_eq!(create(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid10, &[64 * MIB; 3]);
        p.bitmap = BitmapChoice::Internal { chunk_bytes: None };
        let a = create(&p).unwrap();
        assert_eq!(a.bitmap.unwrap().sync_size, Sectors(126_976 * 3 / 2));
    }

    #[test]
    fn refusals() {
        let e = |p: CreateParams| create(&p).unwrap_err().kind();
        assert_eq!(
            e(params(Level::Raid6, &[64 * MIB; 3])),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            e(params(Level::Raid5, &[64 * MIB, 2048])),
            ErrorKind::InvalidArgument
        );
        let mut p = params(Level::Raid5, &[64 * MIB; 3]);
        p.chunk = Some(Sectors(24));
        assert_eq!(e(p), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid5, &[64 * MIB; 3]);
        p.layout = Some(16);
        assert_eq!(e(p), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid10, &[64 * MIB; 3]);
        p.layout = Some(0x202);
        assert_eq!(e(p), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid10, &[64 * MIB; 3]);
        p.layout = Some(0x104);
        assert_eq!(e(p), ErrorKind::InvalidArgument);
        let mut p = params(Level::Raid5, &[64 * MIB; 3]);
        p.device_uuids.pop();
        assert_eq!(e(p), ErrorKind::InvalidArgument);
    }
}
