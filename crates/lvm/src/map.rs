//! An LV segment's mapping in bytes: where LV byte `o` of a linear or striped segment
//! lies on which PV (the maths of dm-linear and dm-stripe; lv.rs draws it). Shared by
//! the LV (lv.rs) and a RAID LV's image sub-LVs kept for a re-open (raid.rs), below both.

/// One stripe of a mapped segment: the PV device (index into `LogicalVolume::pvs`) and the
/// byte offset of the stripe's first extent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapArea {
    pub pv: usize,
    pub offset: u64,
}

/// A segment in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSegment {
    /// First LV byte.
    pub start: u64,
    pub len: u64,
    /// Chunk size in bytes (0 for linear).
    pub stripe_size: u64,
    pub areas: Vec<MapArea>,
}

impl MapSegment {
    /// Maps segment-relative byte `o` to (area index, PV byte offset, bytes left in this
    /// contiguous piece).
    pub fn map(&self, o: u64) -> (usize, u64, u64) {
        debug_assert!(o < self.len);
        if self.areas.len() == 1 {
            return (0, self.areas[0].offset + o, self.len - o);
        }
        let z = self.stripe_size;
        let k = self.areas.len() as u64;
        let chunk = o / z;
        let stripe = chunk % k;
        let row = chunk / k;
        let within = o % z;
        // stripe < k = areas.len(), so the index fits.
        let idx = usize::try_from(stripe).expect("stripe index fits");
        (idx, self.areas[idx].offset + row * z + within, z - within)
    }
}
