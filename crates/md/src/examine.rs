//! What `mdadm --examine` shows for a v1.2 member, as data a CLI can print or serialise.
//!
//! [`Examine`] holds the fields; its `Display` renders them line for line as mdadm 4.2's
//! `examine_super1` does (times in UTC: run mdadm with `TZ=UTC` to compare), so a test
//! can diff cairn's rendering against the real tool's.

use std::fmt;

use serde::Serialize;

use crate::level::{layout_text, Level};
use crate::ondisk::{DevRole, Features, Superblock, Uuid};
use crate::units::Sectors;

/// The superblock fields mdadm prints, already interpreted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Examine {
    pub magic: u32,
    /// "1.2".
    pub version: &'static str,
    pub feature_map: u32,
    pub array_uuid: Uuid,
    pub name: String,
    /// Seconds since the epoch.
    pub creation_time: u64,
    pub raid_level: Level,
    pub raid_devices: u32,
    /// `data_size`.
    pub avail_dev_size: Sectors,
    /// mdadm's array size in bytes (`size * 512 * data disks`; RAID10:
    /// `size * 512 * raid_disks / copies`); `None` for linear and RAID0, where mdadm
    /// prints none. mdadm shows it in KiB ([`Examine::array_size_kib`]) and the exact
    /// bytes in the human-readable part.
    pub array_size_bytes: Option<u64>,
    /// The component size, shown when it differs from `data_size` (levels > 0).
    pub used_dev_size: Option<Sectors>,
    pub data_offset: Sectors,
    pub super_offset: Sectors,
    pub recovery_offset: Option<Sectors>,
    /// Free sectors before and after the data, when the member's size is known.
    /// `after` is negative when the member is too small for its data.
    pub unused_space: Option<UnusedSpace>,
    /// "clean" or "active" (a resync is pending).
    pub state: &'static str,
    pub truncated: bool,
    pub device_uuid: Uuid,
    /// Sectors from the superblock to the internal bitmap.
    pub internal_bitmap: Option<i32>,
    pub reshape: Option<ExamineReshape>,
    pub write_mostly: bool,
    pub failfast: bool,
    pub update_time: u64,
    pub bad_block_log: Option<BadBlockLog>,
    pub checksum: u32,
    pub events: u64,
    /// The layout as mdadm names it, when it prints one for the level.
    pub layout: Option<String>,
    /// Chunk size in KiB (levels 0, 4, 5, 6, 10).
    pub chunk_kib: Option<u64>,
    /// Linear's rounding in KiB.
    pub rounding_kib: Option<u64>,
    pub device_role: String,
    /// One character per slot: `A` active, `.` missing, `R` replacing, `?` inconsistent.
    pub array_state: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UnusedSpace {
    pub before: u64,
    pub after: i128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BadBlockLog {
    pub entries: u32,
    pub offset: i32,
    pub bad_blocks_present: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExamineReshape {
    pub position: Sectors,
    pub delta_disks: i32,
    pub new_level: Option<String>,
    pub new_layout: Option<String>,
    pub new_chunk_kib: Option<u64>,
}

impl Examine {
    /// The array size in KiB, as mdadm prints it.
    pub fn array_size_kib(&self) -> Option<u64> {
        self.array_size_bytes.map(|b| b >> 10)
    }

    /// The fields for `sb`. `member_sectors` (the member's whole size) adds the
    /// "Unused Space" line, as mdadm prints it for a device it can size.
    ///
    /// One approximation: mdadm counts an internal bitmap's length in "before" when it
    /// reaches past 36 KiB after the superblock; the bitmap is not read here, so such
    /// (very large) bitmaps are not counted.
    pub fn new(sb: &Superblock, member_sectors: Option<Sectors>) -> Examine {
        let f = sb.features;
        let level = sb.level;
        let ddsks: Option<(u64, u64)> = match level {
            Level::Raid1 => Some((1, 1)),
            Level::Raid4 | Level::Raid5 => Some((u64::from(sb.raid_disks).saturating_sub(1), 1)),
            Level::Raid6 => Some((u64::from(sb.raid_disks).saturating_sub(2), 1)),
            Level::Raid10 => Some((
                u64::from(sb.raid_disks),
                u64::from(sb.layout & 0xff) * u64::from((sb.layout >> 8) & 0xff),
            )),
            Level::Linear | Level::Raid0 => None,
        };
        let array_size_bytes = ddsks
            .filter(|&(d, _)| d > 0)
            .map(|(d, den)| u128::from(sb.size.0) * 512 * u128::from(d) / u128::from(den.max(1)))
            .map(|b| u64::try_from(b).unwrap_or(u64::MAX));
        let level_positive = !matches!(level, Level::Linear | Level::Raid0);
        // mdadm tests `__le32_to_cpu(sb->level) > 0` unsigned, so linear (-1) passes and
        // shows "Used Dev Size : 0 sectors"; only RAID0 skips the line.
        let used_dev_size = (level != Level::Raid0 && sb.size != sb.data_size).then_some(sb.size);

        let delta_extra = if f.has(Features::RESHAPE_ACTIVE) && sb.reshape.delta_disks < 0 {
            sb.reshape.delta_disks.unsigned_abs()
        } else {
            0
        };

        let unused_space = member_sectors.and_then(|dev| {
            // getinfo_super1, metadata before data (1.1/1.2).
            let so = sb.super_offset.0;
            let mut earliest = so + (32 + 4) * 2;
            if sb.bblog_offset != 0 && sb.bblog_size != 0 {
                let bbend =
                    i128::from(so) + i128::from(sb.bblog_offset) + i128::from(sb.bblog_size);
                if bbend > i128::from(earliest) {
                    earliest = u64::try_from(bbend).unwrap_or(u64::MAX);
                }
            }
            let before = sb.data_offset.0.saturating_sub(earliest);
            let used = if level_positive {
                sb.size
            } else {
                sb.data_size
            };
            let after = i128::from(dev.0) - i128::from(used.0) - i128::from(sb.data_offset.0);
            // mdadm shows nothing when there is no room either side.
            (before != 0 || after != 0).then_some(UnusedSpace { before, after })
        });
        let show_unused = !f.has(Features::NEW_OFFSET);

        let reshape = f.has(Features::RESHAPE_ACTIVE).then(|| {
            let r = sb.reshape;
            let new_level = (r.new_level != level.to_raw()).then(|| {
                Level::from_raw(r.new_level)
                    .map_or_else(|_| "-unknown-".to_string(), |l| l.name().to_string())
            });
            let new_layout = (r.new_layout != sb.layout)
                .then(|| match level {
                    Level::Raid5 | Level::Raid6 | Level::Raid10 => {
                        layout_text(level, r.new_layout, false)
                    }
                    _ => None,
                })
                .flatten();
            ExamineReshape {
                position: r.position,
                delta_disks: r.delta_disks,
                new_level,
                new_layout,
                new_chunk_kib: (r.new_chunk != sb.chunk).then_some(r.new_chunk.0 / 2),
            }
        });

        let role = sb.role();
        let device_role = if role.0 >= DevRole::FAULTY.0 {
            "spare".to_string()
        } else if role == DevRole::JOURNAL {
            "Journal".to_string()
        } else if f.has(Features::REPLACEMENT) {
            format!("Replacement device {}", role.0)
        } else {
            format!("Active device {}", role.0)
        };

        let slots = u64::from(sb.raid_disks) + u64::from(delta_extra);
        let array_state = (0..slots)
            .map(|d| {
                let cnt = sb.dev_roles.iter().filter(|r| u64::from(r.0) == d).count();
                match cnt {
                    2 if level_positive => 'R',
                    1 => 'A',
                    0 => '.',
                    _ => '?',
                }
            })
            .collect();

        Examine {
            magic: crate::ondisk::MD_SB_MAGIC,
            version: "1.2",
            feature_map: f.0,
            array_uuid: sb.set_uuid,
            name: sb.set_name.to_string_lossy(),
            creation_time: sb.ctime.secs(),
            raid_level: level,
            raid_devices: sb.raid_disks,
            avail_dev_size: sb.data_size,
            array_size_bytes,
            used_dev_size,
            data_offset: sb.data_offset,
            super_offset: sb.super_offset,
            recovery_offset: f
                .has(Features::RECOVERY_OFFSET)
                .then_some(sb.recovery_offset),
            unused_space: unused_space.filter(|_| show_unused),
            state: if sb.is_clean() { "clean" } else { "active" },
            truncated: unused_space.is_some_and(|u| u.after < 0),
            device_uuid: sb.device_uuid,
            internal_bitmap: f.has(Features::BITMAP_OFFSET).then_some(sb.bitmap_offset),
            reshape,
            write_mostly: sb.devflags.0 & crate::ondisk::DevFlags::WRITE_MOSTLY != 0,
            failfast: sb.devflags.0 & crate::ondisk::DevFlags::FAIL_FAST != 0,
            update_time: sb.utime.secs(),
            bad_block_log: (sb.bblog_size != 0 && sb.bblog_offset != 0).then_some(BadBlockLog {
                entries: u32::from(sb.bblog_size) * 512 / 8,
                offset: sb.bblog_offset,
                bad_blocks_present: f.has(Features::BAD_BLOCKS),
            }),
            checksum: sb.checksum(),
            events: sb.events,
            layout: layout_text(level, sb.layout, f.has(Features::RAID0_LAYOUT)),
            chunk_kib: level.uses_chunks().then_some(sb.chunk.0 / 2),
            rounding_kib: (level == Level::Linear).then_some(sb.chunk.0 / 2),
            device_role,
            array_state,
        }
    }
}

/// mdadm 4.2's `human_size`: nothing below 5000 KiB, then centi-MiB/MB up to 2 GiB,
/// centi-GiB/GB above, each rounded half up (mdadm's `(x*200/unit + 1) / 2`).
pub fn human_size(bytes: u64) -> String {
    let b = u128::from(bytes);
    if b < 5000 * 1024 {
        String::new()
    } else if b < 2 << 30 {
        let cmib = (b * 200 / (1 << 20)).div_ceil(2);
        let cmb = (b / (1_000_000 / 200)).div_ceil(2);
        format!(
            " ({}.{:02} MiB {}.{:02} MB)",
            cmib / 100,
            cmib % 100,
            cmb / 100,
            cmb % 100
        )
    } else {
        let cgib = (b * 200 / (1 << 30)).div_ceil(2);
        let cgb = (b / (1_000_000_000 / 200)).div_ceil(2);
        format!(
            " ({}.{:02} GiB {}.{:02} GB)",
            cgib / 100,
            cgib % 100,
            cgb / 100,
            cgb % 100
        )
    }
}

/// C's `ctime()` text without the newline ("Tue Nov 14 22:13:20 2023"), in UTC.
pub fn ctime_utc(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = i128::from(days) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i128::from(month <= 2);
    let wday = DAYS[usize::try_from(days % 7).expect("below 7")];
    let mon = MONTHS[usize::try_from(month - 1).expect("1..=12")];
    format!(
        "{wday} {mon}{day:>3} {:02}:{:02}:{:02} {year}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl fmt::Display for Examine {
    /// mdadm's `--examine` body (everything after the "FILE:" line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "          Magic : {:08x}", self.magic)?;
        writeln!(f, "        Version : {}", self.version)?;
        writeln!(f, "    Feature Map : {:#x}", self.feature_map)?;
        writeln!(f, "     Array UUID : {}", self.array_uuid)?;
        writeln!(f, "           Name : {}", self.name)?;
        writeln!(f, "  Creation Time : {}", ctime_utc(self.creation_time))?;
        writeln!(f, "     Raid Level : {}", self.raid_level)?;
        writeln!(f, "   Raid Devices : {}", self.raid_devices)?;
        writeln!(f)?;
        let avail = self.avail_dev_size.0;
        writeln!(
            f,
            " Avail Dev Size : {avail} sectors{}",
            human_size(avail.saturating_mul(512))
        )?;
        if let Some(bytes) = self.array_size_bytes {
            writeln!(
                f,
                "     Array Size : {} KiB{}",
                bytes >> 10,
                human_size(bytes)
            )?;
        }
        if let Some(used) = self.used_dev_size {
            writeln!(
                f,
                "  Used Dev Size : {} sectors{}",
                used.0,
                human_size(used.0.saturating_mul(512))
            )?;
        }
        if self.data_offset.0 != 0 {
            writeln!(f, "    Data Offset : {} sectors", self.data_offset.0)?;
        }
        writeln!(f, "   Super Offset : {} sectors", self.super_offset.0)?;
        if let Some(r) = self.recovery_offset {
            writeln!(f, "Recovery Offset : {} sectors", r.0)?;
        }
        if let Some(u) = self.unused_space {
            if u.after >= 0 {
                writeln!(
                    f,
                    "   Unused Space : before={} sectors, after={} sectors",
                    u.before, u.after
                )?;
            } else {
                writeln!(
                    f,
                    "   Unused Space : before={} sectors, after={} sectors DEVICE TOO SMALL",
                    u.before, u.after
                )?;
            }
        }
        writeln!(
            f,
            "          State : {}{}",
            self.state,
            if self.truncated {
                " TRUNCATED DEVICE"
            } else {
                ""
            }
        )?;
        writeln!(f, "    Device UUID : {}", self.device_uuid)?;
        writeln!(f)?;
        if let Some(b) = self.internal_bitmap {
            writeln!(f, "Internal Bitmap : {b} sectors from superblock")?;
        }
        if let Some(r) = &self.reshape {
            writeln!(
                f,
                "  Reshape pos'n : {}{}",
                r.position.0 / 2,
                human_size(r.position.0.saturating_mul(512))
            )?;
            if r.delta_disks != 0 {
                let now = i64::from(self.raid_devices);
                writeln!(
                    f,
                    "  Delta Devices : {} ({}->{})",
                    r.delta_disks,
                    now - i64::from(r.delta_disks),
                    now
                )?;
            }
            if let Some(l) = &r.new_level {
                writeln!(f, "      New Level : {l}")?;
            }
            if let Some(l) = &r.new_layout {
                match self.raid_level {
                    Level::Raid10 => writeln!(f, "     New Layout :{l}")?,
                    _ => writeln!(f, "     New Layout : {l}")?,
                }
            }
            if let Some(c) = r.new_chunk_kib {
                writeln!(f, "  New Chunksize : {c}K")?;
            }
            writeln!(f)?;
        }
        if self.write_mostly || self.failfast {
            write!(f, "          Flags :")?;
            if self.write_mostly {
                write!(f, " write-mostly")?;
            }
            if self.failfast {
                write!(f, " failfast")?;
            }
            writeln!(f)?;
        }
        writeln!(f, "    Update Time : {}", ctime_utc(self.update_time))?;
        if let Some(b) = self.bad_block_log {
            writeln!(
                f,
                "  Bad Block Log : {} entries available at offset {} sectors{}",
                b.entries,
                b.offset,
                if b.bad_blocks_present {
                    " - bad blocks present."
                } else {
                    ""
                }
            )?;
        }
        writeln!(f, "       Checksum : {:x} - correct", self.checksum)?;
        writeln!(f, "         Events : {}", self.events)?;
        writeln!(f)?;
        if let Some(l) = &self.layout {
            match self.raid_level {
                Level::Raid10 => writeln!(f, "         Layout :{l}")?,
                _ => writeln!(f, "         Layout : {l}")?,
            }
        }
        if let Some(c) = self.chunk_kib {
            writeln!(f, "     Chunk Size : {c}K")?;
        }
        if let Some(r) = self.rounding_kib {
            writeln!(f, "       Rounding : {r}K")?;
        }
        writeln!(f)?;
        writeln!(f, "   Device Role : {}", self.device_role)?;
        writeln!(
            f,
            "   Array State : {} ('A' == active, '.' == missing, 'R' == replacing)",
            self.array_state
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// verification.md §2.1 prints this for member 0 of a 4 x 64 MiB RAID5.
    const DOCUMENTED: &str = "          Magic : a92b4efc
        Version : 1.2
    Feature Map : 0x0
     Array UUID : 01234567:89abcdef:01234567:89abcdef
           Name : host:0
  Creation Time : Tue Nov 14 22:13:20 2023
     Raid Level : raid5
   Raid Devices : 4

 Avail Dev Size : 126976 sectors (62.00 MiB 65.01 MB)
     Array Size : 190464 KiB (186.00 MiB 195.04 MB)
    Data Offset : 4096 sectors
   Super Offset : 8 sectors
   Unused Space : before=4016 sectors, after=0 sectors
          State : clean
    Device UUID : 00000000:00000000:00000000:00001000

    Update Time : Tue Nov 14 22:13:20 2023
  Bad Block Log : 512 entries available at offset 16 sectors
       Checksum : 968c625d - correct
         Events : 1

         Layout : left-symmetric
     Chunk Size : 512K

   Device Role : Active device 0
   Array State : AAAA ('A' == active, '.' == missing, 'R' == replacing)
";

    #[test]
    fn renders_the_documented_example() {
        let sb = crate::ondisk::tests::sample();
        let e = Examine::new(&sb, Some(Sectors(131_072)));
        assert_eq!(e.to_string(), DOCUMENTED);
        assert_eq!(e.array_size_kib(), Some(190_464));
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["array_uuid"], "01234567:89abcdef:01234567:89abcdef");
        assert_eq!(json["raid_level"], "raid5");
        assert_eq!(json["checksum"], 0x968c_625d_u32);
        assert_eq!(json["unused_space"]["before"], 4016);
        assert_eq!(json["layout"], "left-symmetric");
    }

    #[test]
    fn human_sizes_like_mdadm() {
        assert_eq!(human_size(126_976 * 512), " (62.00 MiB 65.01 MB)");
        assert_eq!(human_size(190_464 * 1024), " (186.00 MiB 195.04 MB)");
        assert_eq!(human_size(4 << 20), "");
        assert_eq!(human_size(1_047_552 * 512), " (511.50 MiB 536.35 MB)");
        assert_eq!(human_size(3 << 30), " (3.00 GiB 3.22 GB)");
    }

    #[test]
    fn ctime_like_c() {
        assert_eq!(ctime_utc(1_700_000_000), "Tue Nov 14 22:13:20 2023");
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime_utc(951_782_400), "Tue Feb 29 00:00:00 2000");
        assert_eq!(ctime_utc(1_709_251_199), "Thu Feb 29 23:59:59 2024");
    }
}
