//! RAID levels and the meaning of the superblock's `layout` word for each level
//! (ondisk-formats.md §1.2, §1.10, §1.11, §1.13; mdadm `maps.c` names).

use std::fmt;

/// An md personality cairn implements. The numbers are the superblock's `level` (s32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Linear,
    Raid0,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    pub const ALL: [Level; 7] = [
        Level::Linear,
        Level::Raid0,
        Level::Raid1,
        Level::Raid4,
        Level::Raid5,
        Level::Raid6,
        Level::Raid10,
    ];

    /// The superblock value.
    pub const fn to_raw(self) -> i32 {
        match self {
            Level::Linear => -1,
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    /// The level for a superblock value; `Err` carries a description of why not.
    pub fn from_raw(raw: i32) -> Result<Level, UnknownLevel> {
        Ok(match raw {
            -1 => Level::Linear,
            0 => Level::Raid0,
            1 => Level::Raid1,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            -4 => return Err(UnknownLevel::NotImplemented("multipath")),
            -5 => return Err(UnknownLevel::NotImplemented("faulty")),
            _ => return Err(UnknownLevel::Invalid(raw)),
        })
    }

    /// mdadm's name (`pers[]` in `maps.c`), as `--examine` prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Level::Linear => "linear",
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid4 => "raid4",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid10 => "raid10",
        }
    }

    /// Parses mdadm's level words: `raid5`, `5`, `mirror`, `stripe`, `linear`, ...
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "linear" | "-1" => Level::Linear,
            "raid0" | "0" | "stripe" => Level::Raid0,
            "raid1" | "1" | "mirror" => Level::Raid1,
            "raid4" | "4" => Level::Raid4,
            "raid5" | "5" => Level::Raid5,
            "raid6" | "6" => Level::Raid6,
            "raid10" | "10" => Level::Raid10,
            _ => return None,
        })
    }

    /// Whether the level stripes data in chunks (and so needs a non-zero chunk size).
    pub const fn uses_chunks(self) -> bool {
        matches!(
            self,
            Level::Raid0 | Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10
        )
    }

    /// Parity members per stripe (1 for RAID4/5, 2 for RAID6, else 0).
    pub const fn parity_members(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    /// The smallest `raid_disks` the kernel (and mdadm) accept.
    pub const fn min_raid_disks(self) -> u32 {
        match self {
            Level::Linear | Level::Raid0 | Level::Raid1 => 1,
            Level::Raid4 | Level::Raid5 | Level::Raid10 => 2,
            Level::Raid6 => 4,
        }
    }

    /// mdadm 4.2's default layout word for the level (`default_layout` in `Create.c`).
    pub const fn default_layout(self) -> u32 {
        match self {
            Level::Raid0 => Raid0Layout::Original.to_raw(),
            Level::Raid5 | Level::Raid6 => ParityAlgorithm::LeftSymmetric.to_raw(),
            Level::Raid10 => Raid10Layout::DEFAULT.to_raw(),
            Level::Linear | Level::Raid1 | Level::Raid4 => 0,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a superblock `level` value is not a [`Level`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownLevel {
    /// A real md personality cairn does not implement.
    NotImplemented(&'static str),
    /// Not an md level at all.
    Invalid(i32),
}

/// RAID0's layout word, meaningful only for multi-zone arrays (§1.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Raid0Layout {
    /// `RAID0_ORIG_LAYOUT` (1): the chunk selector is the array sector.
    Original,
    /// `RAID0_ALT_MULTIZONE_LAYOUT` (2): the selector is the offset inside the zone.
    Alternate,
}

impl Raid0Layout {
    pub const fn to_raw(self) -> u32 {
        match self {
            Raid0Layout::Original => 1,
            Raid0Layout::Alternate => 2,
        }
    }

    pub const fn from_raw(raw: u32) -> Option<Raid0Layout> {
        match raw {
            1 => Some(Raid0Layout::Original),
            2 => Some(Raid0Layout::Alternate),
            _ => None,
        }
    }

    /// mdadm's `r0layout` name.
    pub const fn name(self) -> &'static str {
        match self {
            Raid0Layout::Original => "original",
            Raid0Layout::Alternate => "alternate",
        }
    }
}

/// The RAID4/5/6 parity placement (`ALGORITHM_*` in the kernel's `raid5.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParityAlgorithm {
    LeftAsymmetric,
    RightAsymmetric,
    LeftSymmetric,
    RightSymmetric,
    /// Parity on member 0 (RAID6: P on 0, Q on 1).
    ParityFirst,
    /// Parity on the last member(s); RAID4 uses this placement whatever the word says.
    ParityLast,
    /// RAID6 only: DDF layouts, with member-index Q coefficients.
    DdfZeroRestart,
    DdfNRestart,
    DdfNContinue,
    /// RAID6 only: a RAID5 layout over the first `n-1` members, Q on the last one.
    LeftAsymmetric6,
    RightAsymmetric6,
    LeftSymmetric6,
    RightSymmetric6,
    ParityFirst6,
}

impl ParityAlgorithm {
    pub const ALL: [ParityAlgorithm; 14] = [
        ParityAlgorithm::LeftAsymmetric,
        ParityAlgorithm::RightAsymmetric,
        ParityAlgorithm::LeftSymmetric,
        ParityAlgorithm::RightSymmetric,
        ParityAlgorithm::ParityFirst,
        ParityAlgorithm::ParityLast,
        ParityAlgorithm::DdfZeroRestart,
        ParityAlgorithm::DdfNRestart,
        ParityAlgorithm::DdfNContinue,
        ParityAlgorithm::LeftAsymmetric6,
        ParityAlgorithm::RightAsymmetric6,
        ParityAlgorithm::LeftSymmetric6,
        ParityAlgorithm::RightSymmetric6,
        ParityAlgorithm::ParityFirst6,
    ];

    pub const fn to_raw(self) -> u32 {
        match self {
            ParityAlgorithm::LeftAsymmetric => 0,
            ParityAlgorithm::RightAsymmetric => 1,
            ParityAlgorithm::LeftSymmetric => 2,
            ParityAlgorithm::RightSymmetric => 3,
            ParityAlgorithm::ParityFirst => 4,
            ParityAlgorithm::ParityLast => 5,
            ParityAlgorithm::DdfZeroRestart => 8,
            ParityAlgorithm::DdfNRestart => 9,
            ParityAlgorithm::DdfNContinue => 10,
            ParityAlgorithm::LeftAsymmetric6 => 16,
            ParityAlgorithm::RightAsymmetric6 => 17,
            ParityAlgorithm::LeftSymmetric6 => 18,
            ParityAlgorithm::RightSymmetric6 => 19,
            ParityAlgorithm::ParityFirst6 => 20,
        }
    }

    /// The algorithm for a layout word, if the level has it. RAID4 accepts any word and
    /// always places parity last, as the kernel does.
    pub fn for_level(level: Level, raw: u32) -> Option<ParityAlgorithm> {
        let alg = ParityAlgorithm::ALL.into_iter().find(|a| a.to_raw() == raw);
        match level {
            Level::Raid4 => Some(ParityAlgorithm::ParityLast),
            Level::Raid5 => alg.filter(|a| a.raid5_allowed()),
            Level::Raid6 => alg,
            _ => None,
        }
    }

    /// Layouts the kernel's RAID5 personality accepts (`raid5.c` `algorithm_valid_raid5`).
    pub const fn raid5_allowed(self) -> bool {
        self.to_raw() <= 5
    }

    /// DDF layouts give every member its own index as the Q coefficient exponent.
    pub const fn is_ddf(self) -> bool {
        matches!(
            self,
            ParityAlgorithm::DdfZeroRestart
                | ParityAlgorithm::DdfNRestart
                | ParityAlgorithm::DdfNContinue
        )
    }

    /// mdadm's name (`r5layout` / `r6layout` in `maps.c`). For RAID5 the DDF words are
    /// never valid, so one table serves both levels.
    pub const fn name(self) -> &'static str {
        match self {
            ParityAlgorithm::LeftAsymmetric => "left-asymmetric",
            ParityAlgorithm::RightAsymmetric => "right-asymmetric",
            ParityAlgorithm::LeftSymmetric => "left-symmetric",
            ParityAlgorithm::RightSymmetric => "right-symmetric",
            ParityAlgorithm::ParityFirst => "parity-first",
            ParityAlgorithm::ParityLast => "parity-last",
            ParityAlgorithm::DdfZeroRestart => "ddf-zero-restart",
            ParityAlgorithm::DdfNRestart => "ddf-N-restart",
            ParityAlgorithm::DdfNContinue => "ddf-N-continue",
            ParityAlgorithm::LeftAsymmetric6 => "left-asymmetric-6",
            ParityAlgorithm::RightAsymmetric6 => "right-asymmetric-6",
            ParityAlgorithm::LeftSymmetric6 => "left-symmetric-6",
            ParityAlgorithm::RightSymmetric6 => "right-symmetric-6",
            ParityAlgorithm::ParityFirst6 => "parity-first-6",
        }
    }

    /// Parses mdadm's names and short forms (`ls`, `la`, `rs`, `ra`, `default`), in any
    /// case: mdadm spells two DDF names with a capital N (`ddf-N-restart`), and people type
    /// them both ways.
    pub fn parse(s: &str) -> Option<ParityAlgorithm> {
        Some(match s.to_ascii_lowercase().as_str() {
            "ls" | "default" => ParityAlgorithm::LeftSymmetric,
            "la" => ParityAlgorithm::LeftAsymmetric,
            "rs" => ParityAlgorithm::RightSymmetric,
            "ra" => ParityAlgorithm::RightAsymmetric,
            _ => {
                return ParityAlgorithm::ALL
                    .into_iter()
                    .find(|a| a.name().eq_ignore_ascii_case(s))
            }
        })
    }

    /// Parses a RAID5 layout name as mdadm's `r5layout` table does: the three DDF names are
    /// aliases of RAID5 layouts there (`ddf-zero-restart` is right-asymmetric,
    /// `ddf-N-restart` left-asymmetric, `ddf-N-continue` left-symmetric), because for a
    /// single parity block the DDF rotations coincide with md's.
    pub fn parse_raid5(s: &str) -> Option<ParityAlgorithm> {
        match ParityAlgorithm::parse(s)? {
            ParityAlgorithm::DdfZeroRestart => Some(ParityAlgorithm::RightAsymmetric),
            ParityAlgorithm::DdfNRestart => Some(ParityAlgorithm::LeftAsymmetric),
            ParityAlgorithm::DdfNContinue => Some(ParityAlgorithm::LeftSymmetric),
            a => Some(a).filter(|a| a.raid5_allowed()),
        }
    }
}

impl fmt::Display for ParityAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// RAID10's layout word: `near | far << 8 | offset << 16` (§1.13). Only the original
/// far-set variant (bits 17–18 zero) is represented; it is the only one mdadm writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Raid10Layout {
    pub near: u8,
    pub far: u8,
    /// "offset" layout: far copies are in the next chunk row, not a far region.
    pub offset: bool,
}

/// Why a RAID10 layout word was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRaid10Layout {
    /// Bits 17–18 select a "far sets" variant cairn does not implement.
    FarSets(u32),
    /// Bits above 18 set, or bits 17–18 equal to 3.
    Invalid,
    /// `near * far` is 0.
    NoCopies,
}

impl Raid10Layout {
    /// mdadm's default, `n2`.
    pub const DEFAULT: Raid10Layout = Raid10Layout {
        near: 2,
        far: 1,
        offset: false,
    };

    pub const fn to_raw(self) -> u32 {
        (self.near as u32) | ((self.far as u32) << 8) | if self.offset { 1 << 16 } else { 0 }
    }

    pub fn from_raw(raw: u32) -> Result<Raid10Layout, BadRaid10Layout> {
        if raw >> 19 != 0 {
            return Err(BadRaid10Layout::Invalid);
        }
        match (raw >> 17) & 3 {
            0 => {}
            3 => return Err(BadRaid10Layout::Invalid),
            v => return Err(BadRaid10Layout::FarSets(v)),
        }
        let near = u8::try_from(raw & 0xff).expect("masked to 8 bits");
        let far = u8::try_from((raw >> 8) & 0xff).expect("masked to 8 bits");
        if near == 0 || far == 0 {
            return Err(BadRaid10Layout::NoCopies);
        }
        Ok(Raid10Layout {
            near,
            far,
            offset: raw & (1 << 16) != 0,
        })
    }

    /// Copies of every chunk.
    pub const fn copies(self) -> u32 {
        self.near as u32 * self.far as u32
    }

    /// mdadm's short form: `n2`, `f2`, `o2` (mixed near/far words are printed as
    /// `n2f2`, which mdadm cannot parse back; it cannot create them either).
    pub fn short_name(self) -> String {
        match (self.near, self.far, self.offset) {
            (n, 1, false) => format!("n{n}"),
            (1, f, true) => format!("o{f}"),
            (1, f, false) => format!("f{f}"),
            (n, f, o) => format!("n{n}{}{f}", if o { 'o' } else { 'f' }),
        }
    }

    /// Parses `nK`, `fK`, `oK` (mdadm `util.c` `parse_layout_10`).
    pub fn parse(s: &str) -> Option<Raid10Layout> {
        let (kind, num) = s.split_at_checked(1)?;
        let k: u8 = num.parse().ok()?;
        if k == 0 {
            return None;
        }
        Some(match kind {
            "n" => Raid10Layout {
                near: k,
                far: 1,
                offset: false,
            },
            "f" => Raid10Layout {
                near: 1,
                far: k,
                offset: false,
            },
            "o" => Raid10Layout {
                near: 1,
                far: k,
                offset: true,
            },
            _ => return None,
        })
    }

    /// The text mdadm's `print_r10_layout` writes after `Layout :`.
    pub fn mdadm_text(self) -> String {
        let mut s = String::new();
        let mut sep = "";
        if self.near != 1 {
            s.push_str(&format!("{sep} near={}", self.near));
            sep = ",";
        }
        if self.far != 1 {
            let kind = if self.offset { "offset" } else { "far" };
            s.push_str(&format!("{sep} {kind}={}", self.far));
        }
        if self.copies() == 1 {
            s.push_str("NO REDUNDANCY");
        }
        s
    }
}

/// Human text for a level's layout word, as `mdadm --examine` prints it after
/// `Layout :`, or `None` when mdadm prints no layout line for the level.
pub fn layout_text(level: Level, layout: u32, raid0_layout_feature: bool) -> Option<String> {
    match level {
        Level::Raid0 if raid0_layout_feature => Some(match layout {
            0 => "dangerous".to_string(),
            _ => Raid0Layout::from_raw(layout)
                .map_or_else(|| "-unknown-".to_string(), |l| l.name().to_string()),
        }),
        // mdadm's r5layout table has no names for the DDF and "-6" words, so RAID5
        // prints "-unknown-" for them; r6layout has all of them.
        Level::Raid5 | Level::Raid6 => Some(
            ParityAlgorithm::ALL
                .into_iter()
                .find(|a| a.to_raw() == layout && (level == Level::Raid6 || a.raid5_allowed()))
                .map_or_else(|| "-unknown-".to_string(), |a| a.name().to_string()),
        ),
        Level::Raid10 => Some(match Raid10Layout::from_raw(layout) {
            Ok(l) => l.mdadm_text(),
            // print_r10_layout only looks at the low 17 bits.
            Err(_) => {
                let l = Raid10Layout {
                    near: u8::try_from(layout & 0xff).expect("masked"),
                    far: u8::try_from((layout >> 8) & 0xff).expect("masked"),
                    offset: layout & (1 << 16) != 0,
                };
                l.mdadm_text()
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_round_trip() {
        for l in Level::ALL {
            assert_eq!(Level::from_raw(l.to_raw()), Ok(l));
            assert_eq!(Level::parse(l.name()), Some(l));
        }
        assert_eq!(
            Level::from_raw(-4),
            Err(UnknownLevel::NotImplemented("multipath"))
        );
        assert_eq!(Level::from_raw(3), Err(UnknownLevel::Invalid(3)));
    }

    #[test]
    fn raid10_words() {
        assert_eq!(Raid10Layout::DEFAULT.to_raw(), 0x102);
        assert_eq!(Raid10Layout::parse("f2").unwrap().to_raw(), 0x201);
        assert_eq!(Raid10Layout::parse("o2").unwrap().to_raw(), 0x10201);
        assert_eq!(Raid10Layout::parse("n3").unwrap().to_raw(), 0x103);
        for raw in [0x102, 0x201, 0x10201, 0x103, 0x202] {
            assert_eq!(Raid10Layout::from_raw(raw).unwrap().to_raw(), raw);
        }
        assert_eq!(
            Raid10Layout::from_raw(0x20102),
            Err(BadRaid10Layout::FarSets(1))
        );
        assert_eq!(
            Raid10Layout::from_raw(1 << 19 | 0x102),
            Err(BadRaid10Layout::Invalid)
        );
        assert_eq!(
            Raid10Layout::from_raw(0x100),
            Err(BadRaid10Layout::NoCopies)
        );
        assert_eq!(Raid10Layout::DEFAULT.mdadm_text(), " near=2");
        assert_eq!(Raid10Layout::parse("f2").unwrap().mdadm_text(), " far=2");
        assert_eq!(Raid10Layout::parse("o3").unwrap().mdadm_text(), " offset=3");
        assert_eq!(
            Raid10Layout::from_raw(0x202).unwrap().mdadm_text(),
            " near=2, far=2"
        );
    }

    #[test]
    fn parity_words() {
        for a in ParityAlgorithm::ALL {
            assert_eq!(
                ParityAlgorithm::for_level(Level::Raid6, a.to_raw()),
                Some(a)
            );
            assert_eq!(ParityAlgorithm::parse(a.name()), Some(a));
        }
        assert_eq!(ParityAlgorithm::for_level(Level::Raid5, 8), None);
        assert_eq!(ParityAlgorithm::for_level(Level::Raid6, 6), None);
        assert_eq!(
            ParityAlgorithm::for_level(Level::Raid4, 0),
            Some(ParityAlgorithm::ParityLast)
        );
        assert_eq!(Level::Raid5.default_layout(), 2);
    }
}
