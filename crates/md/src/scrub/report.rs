//! What a scrub reports: the regions where redundancy and data disagree. Data only;
//! the scrub itself is in scrub.rs.

use crate::units::SECTOR_SIZE;

/// The unit of comparison and of `mismatch_sectors` (md's `STRIPE_SIZE`).
pub const PAGE: u64 = 4096;
/// Regions kept in a report; the rest are only counted.
pub const REGION_LIMIT: usize = 1000;

/// What a scrub found in a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// RAID4/5: P is not the XOR of the data. Which member is wrong cannot be told.
    Parity,
    /// RAID6: P alone disagrees with the data.
    P,
    /// RAID6: Q alone disagrees with the data.
    Q,
    /// RAID6: one data chunk alone explains both P and Q disagreeing.
    Data,
    /// RAID6: more than one block of the row is wrong; which ones cannot be told.
    Unidentifiable,
    /// RAID1/10: a copy differs from the first copy.
    Copies,
    /// A member could not read these bytes; they were rebuilt from redundancy (and not
    /// compared).
    ReadError,
}

/// One region where the redundancy disagreed with the data (or a member could not
/// read). Adjacent pages with the same finding are merged into one region.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    pub finding: Finding,
    /// RAID4/5/6: the stripe.
    pub stripe: Option<u64>,
    /// The first array byte of the region. RAID1/10: the region is array bytes
    /// `[array_offset, array_offset + len)`. RAID4/5/6: the region is a row of the
    /// stripe, `len` bytes at this offset in its first data chunk and at the same place
    /// in every other block (data chunk `d` at `array_offset + d * chunk`).
    pub array_offset: u64,
    /// Where the region starts in the members' data areas (bytes after the data
    /// offset): the same on every member of a stripe; RAID1/10: the first copy's.
    pub member_offset: u64,
    /// Bytes per member.
    pub len: u64,
    /// The role holding the wrong bytes, when the level can tell: a RAID6 row with one
    /// wrong block (data, P or Q), or the member that failed to read. `None` for RAID4/5
    /// and mirrors (md cannot tell which copy or block is wrong) and unidentifiable rows.
    pub blamed: Option<usize>,
    /// The roles repair rewrites (or rewrote): the blamed one, P for RAID4/5, P and Q
    /// for an unidentifiable row, the copies that differ from the first.
    pub rewritten: Vec<usize>,
    /// Repair rewrote them, and every one of those members is still up.
    pub repaired: bool,
}

impl Mismatch {
    /// Whether `next` continues this region.
    pub(crate) fn absorbs(&self, next: &Mismatch) -> bool {
        self.finding == next.finding
            && self.stripe == next.stripe
            && self.blamed == next.blamed
            && self.rewritten == next.rewritten
            && self.repaired == next.repaired
            && self.array_offset + self.len == next.array_offset
            && self.member_offset + self.len == next.member_offset
    }
}

/// The outcome of a check or repair.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScrubReport {
    /// A repair (true) or a check.
    pub repair: bool,
    /// Every unit was done (false: stopped part-way by the progress callback).
    pub complete: bool,
    /// Array bytes scrubbed.
    pub bytes_checked: u64,
    /// md's `mismatch_cnt`: 512-byte sectors that disagreed, 8 per 4 KiB page row.
    /// Read errors are not counted here.
    pub mismatch_sectors: u64,
    /// Member reads that failed and were rebuilt from redundancy.
    pub read_errors: u64,
    /// The regions found, in array order, at most [`REGION_LIMIT`].
    pub regions: Vec<Mismatch>,
    /// Regions found beyond the limit.
    pub regions_omitted: u64,
    /// The last omitted region, so that its pages are counted once.
    #[serde(skip)]
    pub(crate) tail: Option<Mismatch>,
}

impl ScrubReport {
    pub fn new(repair: bool) -> ScrubReport {
        ScrubReport {
            repair,
            ..ScrubReport::default()
        }
    }

    /// Adds a region, merging it with the previous one when it continues it.
    pub(crate) fn record(&mut self, m: Mismatch) {
        if m.finding == Finding::ReadError {
            self.read_errors += 1;
        } else {
            self.mismatch_sectors += m.len.div_ceil(PAGE) * (PAGE / SECTOR_SIZE);
        }
        if let Some(t) = self.tail.as_mut() {
            if t.absorbs(&m) {
                t.len += m.len;
            } else {
                self.regions_omitted += 1;
                self.tail = Some(m);
            }
            return;
        }
        if let Some(last) = self.regions.last_mut() {
            if last.absorbs(&m) {
                last.len += m.len;
                return;
            }
        }
        if self.regions.len() < REGION_LIMIT {
            self.regions.push(m);
        } else {
            self.regions_omitted += 1;
            self.tail = Some(m);
        }
    }
}

/// How a scrub walks the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubUnits {
    /// Units, numbered `0..count` for `Array::scrub_unit`.
    pub count: u64,
    /// Array bytes per unit (the last one may be shorter).
    pub unit_bytes: u64,
    /// Array bytes in all.
    pub total_bytes: u64,
}
