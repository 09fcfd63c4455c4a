//! What a running array looks like, for `cairn md detail` and `cairn serve`: data a CLI
//! can print (the `Display` follows `mdadm --detail`) or serialise.

use std::fmt;

use serde::Serialize;

use crate::examine::{ctime_utc, human_size};
use crate::layout::ArrayLayout;
use crate::level::{layout_text, Level};
use crate::ondisk::{Features, Uuid};
use crate::state::Array;

/// The array's state flags; [`ArrayState::text`] words them as mdadm does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArrayState {
    /// Not written since it was last closed cleanly, and no resync pending.
    pub clean: bool,
    /// Some role is missing or failed.
    pub degraded: bool,
    /// Parity/mirrors are not known to match the data (created over old data, or not
    /// shut down cleanly): a resync is due (`Array::resync`, `Array::start_resync`).
    pub resync_pending: bool,
    /// Started dirty and degraded because the caller forced it.
    pub forced: bool,
    /// Too many members are gone to serve all data.
    pub failed: bool,
    /// A member is being rebuilt (md's "recovering").
    pub recovering: bool,
    /// This host may no longer own the array (its ownership lease ran out, or a newer
    /// owner took the members over): nothing more is written to the members
    /// (`Array::fence`).
    pub fenced: bool,
}

impl ArrayState {
    /// "clean", "active", "clean, degraded", "active, degraded, resync pending", ...
    pub fn text(&self) -> String {
        let mut parts = vec![if self.clean { "clean" } else { "active" }];
        if self.degraded {
            parts.push("degraded");
        }
        if self.failed {
            parts.push("FAILED");
        }
        if self.fenced {
            parts.push("FENCED");
        }
        if self.recovering {
            parts.push("recovering");
        }
        if self.resync_pending {
            parts.push("resync pending");
        }
        if self.forced {
            parts.push("forced");
        }
        parts.join(", ")
    }
}

/// A member's state in the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    /// In the array and in sync.
    ActiveSync,
    /// No device fills the role.
    Missing,
    /// Failed while the array ran; out of the array.
    Faulty,
    /// Given at assembly but left out (stale, marked faulty, foreign).
    LeftOut,
    /// Being rebuilt into its role (md's "spare rebuilding").
    Rebuilding,
    /// A hot spare: takes over the first role that fails.
    Spare,
    /// Being built as the replacement of the member in its role (`cairn md replace`).
    Replacement,
}

impl MemberState {
    pub fn text(self) -> &'static str {
        match self {
            MemberState::ActiveSync => "active sync",
            MemberState::Missing => "removed",
            MemberState::Faulty => "faulty",
            MemberState::LeftOut => "left out",
            MemberState::Rebuilding => "spare rebuilding",
            MemberState::Spare => "spare",
            MemberState::Replacement => "replacement",
        }
    }
}

/// One row of the member table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberReport {
    /// The role (slot) this row is about; for a left-out member, the role its own
    /// superblock claims.
    pub role: Option<u32>,
    pub name: Option<String>,
    pub state: MemberState,
    /// Why a member was left out.
    pub reason: Option<String>,
    /// The member's event count when it was read, for left-out members.
    pub events: Option<u64>,
    /// The member device's size, when the array holds it open (not for a missing or
    /// left-out member).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Why and since when a faulty member failed, when this process saw it fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<crate::observe::types::Failure>,
}

/// `mdadm --detail`'s data for a running array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArrayReport {
    /// Superblock version, or `None` for an array without superblocks.
    pub version: Option<&'static str>,
    pub uuid: Uuid,
    pub name: String,
    pub level: Level,
    /// The layout's name, where the level has one.
    pub layout: Option<String>,
    pub layout_word: u32,
    pub chunk_kib: Option<u64>,
    pub raid_devices: u32,
    pub array_size_bytes: u64,
    /// Sectors of each member the array uses, where that is one number.
    pub used_dev_size_sectors: Option<u64>,
    pub state: ArrayState,
    pub state_text: String,
    pub active_devices: u32,
    pub failed_devices: u32,
    pub spare_devices: u32,
    pub events: u64,
    pub creation_time: u64,
    pub update_time: u64,
    /// One row per role, then one per member left out at assembly.
    pub members: Vec<MemberReport>,
    /// The internal write-intent bitmap, when the array has one.
    pub bitmap: Option<crate::bitmap::BitmapInfo>,
}

impl Array {
    /// The array's state now.
    pub fn report(&self) -> ArrayReport {
        let meta = self.meta_lock();
        let has_sb = meta.sbs.iter().any(Option::is_some);
        let id = &self.identity;
        let down = self.down_mask();
        let mut members: Vec<MemberReport> = self
            .slots
            .iter()
            .enumerate()
            .map(|(role, slot)| {
                let member = slot.member();
                let state = match (&member, down[role]) {
                    (None, _) => MemberState::Missing,
                    (Some(_), true) if self.is_writable(role) => MemberState::Rebuilding,
                    (Some(_), true) => MemberState::Faulty,
                    (Some(_), false) => MemberState::ActiveSync,
                };
                MemberReport {
                    role: u32::try_from(role).ok(),
                    size_bytes: member.as_ref().map(|m| m.dev.geometry().size),
                    failure: member
                        .as_ref()
                        .filter(|_| state == MemberState::Faulty)
                        .and_then(|m| self.failure_of(&m.name)),
                    name: member.map(|m| m.name.clone()),
                    state,
                    reason: None,
                    events: None,
                }
            })
            .collect();
        for (role, slot) in self.slots.iter().enumerate() {
            if let Some(r) = slot.replacement() {
                members.push(MemberReport {
                    role: u32::try_from(role).ok(),
                    name: Some(r.name.clone()),
                    state: MemberState::Replacement,
                    reason: None,
                    events: None,
                    size_bytes: Some(r.dev.geometry().size),
                    failure: None,
                });
            }
        }
        members.extend(meta.spares.iter().map(|s| MemberReport {
            role: None,
            name: Some(s.member.name.clone()),
            state: MemberState::Spare,
            reason: None,
            events: None,
            size_bytes: Some(s.member.dev.geometry().size),
            failure: None,
        }));
        members.extend(meta.faulty.iter().map(|f| MemberReport {
            role: f.role.and_then(|r| u32::try_from(r).ok()),
            name: Some(f.member.name.clone()),
            state: MemberState::Faulty,
            reason: None,
            events: None,
            size_bytes: Some(f.member.dev.geometry().size),
            failure: self.failure_of(&f.member.name),
        }));
        members.extend(self.left_out.iter().map(|l| MemberReport {
            role: l.role,
            name: Some(l.name.clone()),
            state: MemberState::LeftOut,
            reason: Some(l.reason.clone()),
            events: Some(l.events),
            size_bytes: None,
            failure: None,
        }));
        let degraded = down.iter().any(|&d| d);
        let state = ArrayState {
            clean: !meta.dirty && !meta.resync_pending,
            degraded,
            resync_pending: meta.resync_pending,
            forced: self.forced,
            failed: !self.layout.tolerates(&down),
            recovering: (0..self.slots.len()).any(|r| self.is_writable(r) && !self.is_up(r))
                || self.slots.iter().any(|s| s.replacement().is_some()),
            fenced: self.is_fenced(),
        };
        let used = match &self.layout {
            ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => None,
            _ => Some(id.component_size.0),
        };
        let raid0_layout = Features(id.feature_map).has(Features::RAID0_LAYOUT);
        let failed = self
            .slots
            .iter()
            .enumerate()
            .filter(|(r, s)| s.has_member() && !self.is_writable(*r))
            .count()
            + meta.faulty.len();
        ArrayReport {
            version: has_sb.then_some("1.2"),
            uuid: id.uuid,
            name: id.set_name.to_string_lossy(),
            level: id.level,
            layout: layout_text(id.level, id.layout_word, raid0_layout)
                .map(|s| s.trim().to_string()),
            layout_word: id.layout_word,
            chunk_kib: id.level.uses_chunks().then_some(id.chunk.kib()),
            raid_devices: u32::try_from(self.slots.len()).expect("at most 1920 members"),
            array_size_bytes: crate::units::Sectors(self.layout.array_sectors().0)
                .bytes()
                .expect("fits"),
            used_dev_size_sectors: used,
            state_text: state.text(),
            state,
            active_devices: u32::try_from(down.iter().filter(|&&d| !d).count()).expect("small"),
            failed_devices: u32::try_from(failed).expect("small"),
            spare_devices: u32::try_from(meta.spares.len()).expect("small"),
            events: meta.events,
            creation_time: id.ctime.secs(),
            update_time: meta.utime.secs(),
            members,
            bitmap: self.bitmap_info(),
        }
    }
}

impl fmt::Display for ArrayReport {
    /// `mdadm --detail`'s body (the lines after "/dev/mdX:"), with member names in
    /// place of device numbers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, k: &str, v: &dyn fmt::Display| {
            writeln!(f, "{k:>18} : {v}")
        };
        line(
            f,
            "Version",
            &self.version.unwrap_or("none (no superblocks)"),
        )?;
        line(f, "Creation Time", &ctime_utc(self.creation_time))?;
        line(f, "Raid Level", &self.level)?;
        line(
            f,
            "Array Size",
            &format!(
                "{}{}",
                self.array_size_bytes / 1024,
                human_size(self.array_size_bytes)
            ),
        )?;
        if let Some(used) = self.used_dev_size_sectors {
            line(
                f,
                "Used Dev Size",
                &format!("{}{}", used / 2, human_size(used * 512)),
            )?;
        }
        line(f, "Raid Devices", &self.raid_devices)?;
        let total = self
            .members
            .iter()
            .filter(|m| m.state != MemberState::Missing)
            .count();
        line(f, "Total Devices", &total)?;
        line(
            f,
            "Persistence",
            &if self.version.is_some() {
                "Superblock is persistent"
            } else {
                "No superblock"
            },
        )?;
        writeln!(f)?;
        if self.bitmap.is_some() {
            line(f, "Intent Bitmap", &"Internal")?;
            writeln!(f)?;
        }
        line(f, "Update Time", &ctime_utc(self.update_time))?;
        line(f, "State", &self.state_text)?;
        line(f, "Active Devices", &self.active_devices)?;
        line(
            f,
            "Working Devices",
            &(self.active_devices + self.spare_devices),
        )?;
        line(f, "Failed Devices", &self.failed_devices)?;
        line(f, "Spare Devices", &self.spare_devices)?;
        writeln!(f)?;
        let mut blank = false;
        if let Some(layout) = &self.layout {
            line(f, "Layout", layout)?;
            blank = true;
        }
        if let Some(c) = self.chunk_kib {
            line(f, "Chunk Size", &format!("{c}K"))?;
            blank = true;
        }
        if blank {
            writeln!(f)?;
        }
        if !matches!(self.level, Level::Linear | Level::Raid0) {
            let policy = if self.bitmap.is_some() {
                "bitmap"
            } else {
                "resync"
            };
            line(f, "Consistency Policy", &policy)?;
            writeln!(f)?;
        }
        line(f, "Name", &self.name)?;
        line(f, "UUID", &self.uuid)?;
        line(f, "Events", &self.events)?;
        writeln!(f)?;
        writeln!(f, "    Number   RaidDevice State         Member")?;
        for m in &self.members {
            let number = match (m.state, m.role) {
                (MemberState::Missing, _) | (MemberState::LeftOut, _) => "-".to_string(),
                (_, Some(r)) => r.to_string(),
                (_, None) => "-".to_string(),
            };
            let raid_device = match (m.state, m.role) {
                (MemberState::LeftOut, _) | (_, None) => "-".to_string(),
                (_, Some(r)) => r.to_string(),
            };
            let mut who = m.name.clone().unwrap_or_default();
            if let Some(reason) = &m.reason {
                who = format!("{who} ({reason})");
            }
            writeln!(
                f,
                "    {number:>6}   {raid_device:>10} {:<13} {who}",
                m.state.text()
            )?;
        }
        Ok(())
    }
}
