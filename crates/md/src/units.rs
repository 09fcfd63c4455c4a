//! Units of md metadata maths: 512-byte sectors, array chunk numbers, stripe numbers.
//!
//! md counts everything in 512-byte sectors, whatever the member's logical block size.
//! Chunk and stripe numbers are kept apart from sector counts so that a chunk number is
//! never added to a sector offset by accident.

use std::fmt;

/// Bytes in one md sector.
pub const SECTOR_SIZE: u64 = 512;

/// A count or offset in 512-byte sectors.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Sectors(pub u64);

impl Sectors {
    pub const ZERO: Sectors = Sectors(0);
    /// md's `MaxSector` (all ones): "no limit" / "fully in sync".
    pub const MAX: Sectors = Sectors(u64::MAX);

    /// Whole sectors in `bytes`, rounding down.
    pub const fn from_bytes_floor(bytes: u64) -> Sectors {
        Sectors(bytes / SECTOR_SIZE)
    }

    /// The sector count of `bytes`, or `None` unless it is a whole number of sectors.
    pub const fn from_bytes_exact(bytes: u64) -> Option<Sectors> {
        if bytes.is_multiple_of(SECTOR_SIZE) {
            Some(Sectors(bytes / SECTOR_SIZE))
        } else {
            None
        }
    }

    /// KiB, as mdadm prints sizes (`size * 512 / 1024`), rounding down.
    pub const fn kib(self) -> u64 {
        self.0 / 2
    }

    /// Bytes, or `None` on overflow.
    pub const fn bytes(self) -> Option<u64> {
        self.0.checked_mul(SECTOR_SIZE)
    }

    pub const fn checked_add(self, rhs: Sectors) -> Option<Sectors> {
        match self.0.checked_add(rhs.0) {
            Some(v) => Some(Sectors(v)),
            None => None,
        }
    }

    pub const fn checked_sub(self, rhs: Sectors) -> Option<Sectors> {
        match self.0.checked_sub(rhs.0) {
            Some(v) => Some(Sectors(v)),
            None => None,
        }
    }

    pub const fn checked_mul(self, n: u64) -> Option<Sectors> {
        match self.0.checked_mul(n) {
            Some(v) => Some(Sectors(v)),
            None => None,
        }
    }

    /// Rounds down to a multiple of `unit` (unchanged when `unit` is zero).
    pub const fn round_down(self, unit: Sectors) -> Sectors {
        if unit.0 == 0 {
            self
        } else {
            Sectors(self.0 - self.0 % unit.0)
        }
    }

    /// Rounds up to a multiple of `unit`, or `None` on overflow (unchanged when `unit` is 0).
    pub const fn checked_round_up(self, unit: Sectors) -> Option<Sectors> {
        if unit.0 == 0 {
            return Some(self);
        }
        let rem = self.0 % unit.0;
        if rem == 0 {
            Some(self)
        } else {
            match self.0.checked_add(unit.0 - rem) {
                Some(v) => Some(Sectors(v)),
                None => None,
            }
        }
    }

    pub const fn is_multiple_of(self, unit: Sectors) -> bool {
        unit.0 != 0 && self.0.is_multiple_of(unit.0)
    }
}

impl fmt::Display for Sectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} sectors", self.0)
    }
}

/// Index of a chunk in the array's address space (array sector / chunk size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ChunkNo(pub u64);

/// Index of a stripe: the row of chunks at the same member offset
/// (member sector / chunk size for RAID4/5/6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StripeNo(pub u64);

impl fmt::Display for ChunkNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk {}", self.0)
    }
}

impl fmt::Display for StripeNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stripe {}", self.0)
    }
}

/// Converts a `u64` that is known to be small (a member index, a remainder modulo a
/// member count) into `usize`. Every caller bounds the value by something that already
/// lives in a `usize`, so failure is a bug, not bad input.
pub(crate) fn small(v: u64) -> usize {
    usize::try_from(v).expect("value bounded by a usize quantity")
}

/// `usize` to `u64`: lossless on every platform Rust supports (usize ≤ 64 bits).
pub(crate) const fn wide(v: usize) -> u64 {
    v as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(Sectors(1000).round_down(Sectors(128)), Sectors(896));
        assert_eq!(Sectors(1000).round_down(Sectors(0)), Sectors(1000));
        assert_eq!(
            Sectors(2080).checked_round_up(Sectors(2048)),
            Some(Sectors(4096))
        );
        assert_eq!(
            Sectors(4096).checked_round_up(Sectors(2048)),
            Some(Sectors(4096))
        );
        assert_eq!(Sectors(u64::MAX).checked_round_up(Sectors(2048)), None);
        assert_eq!(Sectors::from_bytes_exact(4096), Some(Sectors(8)));
        assert_eq!(Sectors::from_bytes_exact(4097), None);
        assert_eq!(Sectors(u64::MAX).bytes(), None);
    }
}
