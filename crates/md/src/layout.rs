//! The kernel's data placement for every level (ondisk-formats.md §1.9–§1.13):
//! array sector -> (member, member sector), and for RAID4/5/6 which member holds P, Q
//! and each data chunk of a stripe, with each data member's Q coefficient.
//!
//! ```text
//!   array sector s ──► Linear / Raid0 / Raid1 / ParityLayout / Raid10 ──► Location
//!                                                                        (member, sector)
//! ```
//!
//! Member sectors here are relative to the member's `data_offset`: the array layer
//! adds each member's own offset. Members are numbered by role (slot), `0..raid_disks`.
//! Sources: `drivers/md/linear.c`, `raid0.c` (`create_strip_zones`, `map_sector`),
//! `raid5.c` (`raid5_compute_sector`, `raid6_idx_to_slot`), `raid10.c` (`setup_geo`,
//! `calc_sectors`, `__raid10_find_phys`).

use cairn_block::{Error, ErrorKind, Result};

use crate::level::{BadRaid10Layout, Level, ParityAlgorithm, Raid0Layout, Raid10Layout};
use crate::ondisk::{Features, Superblock};
use crate::units::{small, wide, ChunkNo, Sectors, StripeNo};

/// Where one array sector lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    /// Member role (slot) index.
    pub member: usize,
    /// Sector on the member, relative to its `data_offset`.
    pub sector: Sectors,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// An array size that is known not to overflow when converted to bytes (the block
/// layer addresses arrays in bytes).
fn fits_in_bytes(sectors: Option<Sectors>, level: Level) -> Result<Sectors> {
    sectors
        .filter(|s| s.bytes().is_some())
        .ok_or_else(|| invalid(format!("{level}: array size overflows 64-bit byte offsets")))
}

/// The largest `raid_disks` cairn's layouts accept: what fits the superblock's role
/// table. RAID6 is further limited so that every Q coefficient is distinct.
const MAX_MEMBERS: usize = 1920;
/// RAID6 data slots (or DDF positions) must have distinct powers of g: at most 255.
const MAX_RAID6_MEMBERS: usize = 255;

// ---------------------------------------------------------------------------------------
// Linear

/// Linear concatenation: members in role order, each contributing its whole size
/// (rounded down to the rounding factor when one is set, `linear.c` `linear_conf`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Linear {
    /// Running end (exclusive) of each member in array sectors.
    ends: Vec<Sectors>,
}

impl Linear {
    pub fn new(member_sizes: &[Sectors], rounding: Sectors) -> Result<Linear> {
        if member_sizes.is_empty() || member_sizes.len() > MAX_MEMBERS {
            return Err(invalid(format!("linear: {} members", member_sizes.len())));
        }
        let mut end = Sectors::ZERO;
        let mut ends = Vec::with_capacity(member_sizes.len());
        for (i, &size) in member_sizes.iter().enumerate() {
            let size = size.round_down(rounding);
            if size == Sectors::ZERO {
                return Err(invalid(format!("linear: member {i} has no usable space")));
            }
            end = fits_in_bytes(end.checked_add(size), Level::Linear)?;
            ends.push(end);
        }
        Ok(Linear { ends })
    }

    pub fn array_sectors(&self) -> Sectors {
        *self.ends.last().expect("at least one member")
    }

    /// Where each member's part ends in the array (exclusive), in role order.
    pub fn ends(&self) -> &[Sectors] {
        &self.ends
    }

    /// The location of array sector `s`, or `None` past the end.
    pub fn map(&self, s: Sectors) -> Option<Location> {
        let member = self.ends.partition_point(|&end| end <= s);
        let end = *self.ends.get(member)?;
        let start = if member == 0 {
            Sectors::ZERO
        } else {
            self.ends[member - 1]
        };
        debug_assert!(s < end);
        Some(Location {
            member,
            sector: Sectors(s.0 - start.0),
        })
    }
}

// ---------------------------------------------------------------------------------------
// RAID0

/// One RAID0 strip zone (`struct strip_zone`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// Member sector where the zone starts (the previous distinct member size).
    pub dev_start: Sectors,
    /// Array sector where the zone ends (exclusive; running total of zone spans).
    pub zone_end: Sectors,
    /// Members in the zone, in role order.
    pub members: Vec<usize>,
}

/// RAID0 with md's zones for members of unequal size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid0 {
    chunk: Sectors,
    zones: Vec<Zone>,
    /// The selector rule in effect (always `Original` when it makes no difference).
    layout: Raid0Layout,
}

impl Raid0 {
    /// Builds the zones from each member's usable size (`data_size`, in role order),
    /// each rounded down to a chunk multiple.
    ///
    /// `layout` is the array's layout when the superblock defines one (feature bit
    /// `RAID0_LAYOUT`). Like the kernel, a multi-zone array whose later zones have more
    /// than one member is refused without one: the two layouts place data differently.
    pub fn new(
        member_sizes: &[Sectors],
        chunk: Sectors,
        layout: Option<Raid0Layout>,
    ) -> Result<Raid0> {
        if member_sizes.is_empty() || member_sizes.len() > MAX_MEMBERS {
            return Err(invalid(format!("raid0: {} members", member_sizes.len())));
        }
        if chunk == Sectors::ZERO {
            return Err(invalid("raid0: chunk size 0"));
        }
        let sizes: Vec<Sectors> = member_sizes.iter().map(|s| s.round_down(chunk)).collect();
        if let Some(i) = sizes.iter().position(|&s| s == Sectors::ZERO) {
            return Err(invalid(format!(
                "raid0: member {i} is smaller than one chunk"
            )));
        }
        let mut distinct = sizes.clone();
        distinct.sort_unstable();
        distinct.dedup();

        let mut zones = Vec::with_capacity(distinct.len());
        let mut dev_start = Sectors::ZERO;
        let mut zone_end = Sectors::ZERO;
        for &next in &distinct {
            let members: Vec<usize> = (0..sizes.len()).filter(|&m| sizes[m] > dev_start).collect();
            let span = Sectors(next.0 - dev_start.0)
                .checked_mul(wide(members.len()))
                .ok_or_else(|| invalid("raid0: size overflows"))?;
            zone_end = fits_in_bytes(zone_end.checked_add(span), Level::Raid0)?;
            zones.push(Zone {
                dev_start,
                zone_end,
                members,
            });
            dev_start = next;
        }

        // raid0.c: one zone, or a second zone with a single member, map the same way
        // under both layouts.
        let layout = if zones.len() == 1 || zones[1].members.len() == 1 {
            Raid0Layout::Original
        } else {
            layout.ok_or_else(|| {
                Error::new(
                    ErrorKind::Unsupported,
                    "raid0: multi-zone array without a layout (created before kernel 5.4); \
                     the original and alternate layouts place data differently, so cairn \
                     will not guess",
                )
            })?
        };
        Ok(Raid0 {
            chunk,
            zones,
            layout,
        })
    }

    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    pub fn layout(&self) -> Raid0Layout {
        self.layout
    }

    pub fn chunk(&self) -> Sectors {
        self.chunk
    }

    pub fn array_sectors(&self) -> Sectors {
        self.zones.last().expect("at least one zone").zone_end
    }

    /// The location of array sector `s`, or `None` past the end.
    pub fn map(&self, s: Sectors) -> Option<Location> {
        let z = self.zones.partition_point(|z| z.zone_end <= s);
        let zone = self.zones.get(z)?;
        let zone_start = if z == 0 {
            Sectors::ZERO
        } else {
            self.zones[z - 1].zone_end
        };
        let in_zone = s.0 - zone_start.0;
        let selector = match self.layout {
            Raid0Layout::Original => s.0,
            Raid0Layout::Alternate => in_zone,
        };
        let chunk = self.chunk.0;
        let nb = wide(zone.members.len());
        let member = zone.members[small((selector / chunk) % nb)];
        let sector = zone.dev_start.0 + (in_zone / (nb * chunk)) * chunk + selector % chunk;
        Some(Location {
            member,
            sector: Sectors(sector),
        })
    }
}

// ---------------------------------------------------------------------------------------
// RAID1

/// RAID1: every member holds the whole array at the same member sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raid1 {
    raid_disks: usize,
    size: Sectors,
}

impl Raid1 {
    pub fn new(raid_disks: usize, component_size: Sectors) -> Result<Raid1> {
        if raid_disks == 0 || raid_disks > MAX_MEMBERS {
            return Err(invalid(format!("raid1: {raid_disks} members")));
        }
        Ok(Raid1 {
            raid_disks,
            size: fits_in_bytes(Some(component_size), Level::Raid1)?,
        })
    }

    pub fn array_sectors(&self) -> Sectors {
        self.size
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    /// Every copy of array sector `s` (one per member), or nothing past the end.
    pub fn map(&self, s: Sectors) -> impl Iterator<Item = Location> {
        let n = if s < self.size { self.raid_disks } else { 0 };
        (0..n).map(move |member| Location { member, sector: s })
    }
}

// ---------------------------------------------------------------------------------------
// RAID4/5/6

/// What a member holds in one stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StripeRole {
    /// Data chunk with this index in the stripe (array chunk = stripe*data_disks + index).
    Data(usize),
    P,
    Q,
}

/// The placement of one RAID4/5/6 stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeMap {
    pub stripe: StripeNo,
    pub p: usize,
    pub q: Option<usize>,
    /// `data[i]` is the member holding the stripe's i-th data chunk (array order).
    pub data: Vec<usize>,
    /// `q_exponent[i]`: the data chunk `data[i]` enters Q multiplied by g^q_exponent[i]
    /// (RAID6 only; empty otherwise).
    pub q_exponent: Vec<u8>,
}

impl StripeMap {
    /// What `member` holds.
    pub fn role_of(&self, member: usize) -> StripeRole {
        if member == self.p {
            StripeRole::P
        } else if Some(member) == self.q {
            StripeRole::Q
        } else {
            StripeRole::Data(
                self.data
                    .iter()
                    .position(|&m| m == member)
                    .expect("every member is data, P or Q"),
            )
        }
    }

    /// Data members in Q-syndrome order: entry e is the member whose chunk is multiplied
    /// by g^e, or `None` where that power contributes zero (the P/Q positions of DDF
    /// layouts). Empty for RAID4/5.
    pub fn syndrome_order(&self) -> Vec<Option<usize>> {
        let len = self
            .q_exponent
            .iter()
            .map(|&e| usize::from(e) + 1)
            .max()
            .unwrap_or(0);
        let mut out = vec![None; len];
        for (&member, &e) in self.data.iter().zip(&self.q_exponent) {
            out[usize::from(e)] = Some(member);
        }
        out
    }
}

/// Where one array sector of a RAID4/5/6 array lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityLocation {
    pub member: usize,
    /// Member sector relative to `data_offset`.
    pub sector: Sectors,
    pub stripe: StripeNo,
    /// Array chunk number.
    pub chunk: ChunkNo,
    /// Index of the chunk within its stripe.
    pub data_index: usize,
}

/// RAID4, RAID5 or RAID6 placement (`raid5_compute_sector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityLayout {
    level: Level,
    algorithm: ParityAlgorithm,
    raid_disks: usize,
    chunk: Sectors,
    component: Sectors,
    /// `raid5_size`, checked at construction to fit in bytes.
    array: Sectors,
}

impl ParityLayout {
    /// `layout` is the superblock's layout word (ignored for RAID4, which always puts
    /// parity on the last member). `component_size` is the superblock's `size`.
    pub fn new(
        level: Level,
        layout: u32,
        raid_disks: usize,
        chunk: Sectors,
        component_size: Sectors,
    ) -> Result<ParityLayout> {
        if level.parity_members() == 0 {
            return Err(invalid(format!("{level} has no parity")));
        }
        let algorithm = ParityAlgorithm::for_level(level, layout)
            .ok_or_else(|| invalid(format!("{layout} is not a {level} layout")))?;
        let max = if level == Level::Raid6 {
            MAX_RAID6_MEMBERS
        } else {
            MAX_MEMBERS
        };
        if raid_disks < small(u64::from(level.min_raid_disks())) || raid_disks > max {
            return Err(invalid(format!("{level}: {raid_disks} members")));
        }
        if !chunk.0.is_power_of_two() || chunk.0 < 8 {
            return Err(invalid(format!(
                "{level}: chunk of {} sectors is not a power of two of at least 4 KiB",
                chunk.0
            )));
        }
        let data_disks = raid_disks - level.parity_members();
        let array = fits_in_bytes(
            component_size
                .round_down(chunk)
                .checked_mul(wide(data_disks)),
            level,
        )?;
        Ok(ParityLayout {
            level,
            algorithm,
            raid_disks,
            chunk,
            component: component_size,
            array,
        })
    }

    pub fn level(&self) -> Level {
        self.level
    }
    pub fn algorithm(&self) -> ParityAlgorithm {
        self.algorithm
    }
    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }
    pub fn chunk(&self) -> Sectors {
        self.chunk
    }

    pub fn data_disks(&self) -> usize {
        self.raid_disks - self.level.parity_members()
    }

    /// Stripes in the array: the component size in whole chunks.
    pub fn stripes(&self) -> u64 {
        self.component.0 / self.chunk.0
    }

    /// `raid5_size`: the component size rounded down to a chunk, times the data disks.
    pub fn array_sectors(&self) -> Sectors {
        self.array
    }

    /// P and Q members of `stripe`.
    pub fn parity_members(&self, stripe: StripeNo) -> (usize, Option<usize>) {
        let n = self.raid_disks;
        let s = stripe.0;
        let rot = |m: usize| small(s % wide(m));
        use ParityAlgorithm as A;
        match self.level {
            Level::Raid6 => {
                let (p, q) = match self.algorithm {
                    A::LeftAsymmetric | A::DdfNContinue | A::LeftSymmetric => {
                        let p = n - 1 - rot(n);
                        let q = match self.algorithm {
                            A::DdfNContinue => (p + n - 1) % n,
                            _ => (p + 1) % n,
                        };
                        (p, q)
                    }
                    A::RightAsymmetric | A::DdfZeroRestart | A::RightSymmetric => {
                        let p = rot(n);
                        (p, (p + 1) % n)
                    }
                    A::DdfNRestart => {
                        let p = n - 1 - small((s + 1) % wide(n));
                        (p, (p + 1) % n)
                    }
                    A::ParityFirst => (0, 1),
                    A::ParityLast => (n - 2, n - 1),
                    A::LeftAsymmetric6 | A::LeftSymmetric6 => (n - 2 - rot(n - 1), n - 1),
                    A::RightAsymmetric6 | A::RightSymmetric6 => (rot(n - 1), n - 1),
                    A::ParityFirst6 => (0, n - 1),
                };
                (p, Some(q))
            }
            Level::Raid4 => (n - 1, None),
            _ => {
                let p = match self.algorithm {
                    A::LeftAsymmetric | A::LeftSymmetric => n - 1 - rot(n),
                    A::RightAsymmetric | A::RightSymmetric => rot(n),
                    A::ParityFirst => 0,
                    // ParityLast; the constructor admits no other RAID5 word.
                    _ => n - 1,
                };
                (p, None)
            }
        }
    }

    /// The member holding data chunk `dd` (0..data_disks) of `stripe`.
    pub fn data_member(&self, stripe: StripeNo, dd: usize) -> usize {
        debug_assert!(dd < self.data_disks());
        let n = self.raid_disks;
        let (p, _) = self.parity_members(stripe);
        use ParityAlgorithm as A;
        match (self.level, self.algorithm) {
            (Level::Raid4, _) | (_, A::ParityLast) => dd,
            (
                Level::Raid6,
                A::LeftAsymmetric | A::RightAsymmetric | A::DdfZeroRestart | A::DdfNRestart,
            ) => {
                if p == n - 1 {
                    dd + 1
                } else if dd >= p {
                    dd + 2
                } else {
                    dd
                }
            }
            (Level::Raid6, A::LeftSymmetric | A::RightSymmetric) => (p + 2 + dd) % n,
            (Level::Raid6, A::DdfNContinue) => (p + 1 + dd) % n,
            (Level::Raid6, A::ParityFirst) => dd + 2,
            (Level::Raid6, A::LeftAsymmetric6 | A::RightAsymmetric6) => {
                if dd >= p {
                    dd + 1
                } else {
                    dd
                }
            }
            (Level::Raid6, A::LeftSymmetric6 | A::RightSymmetric6) => (p + 1 + dd) % (n - 1),
            (Level::Raid6, A::ParityFirst6) => dd + 1,
            (_, A::LeftAsymmetric | A::RightAsymmetric) => {
                if dd >= p {
                    dd + 1
                } else {
                    dd
                }
            }
            (_, A::LeftSymmetric | A::RightSymmetric) => (p + 1 + dd) % n,
            (_, A::ParityFirst) => dd + 1,
            (_, _) => unreachable!("RAID5 admits only layouts 0..=5"),
        }
    }

    /// The Q coefficient exponent of data member `member` in `stripe`: its syndrome slot
    /// (`raid6_idx_to_slot`). Non-DDF layouts number the data members 0, 1, 2, ... walking
    /// from the member after Q (from member 0 when Q is last); DDF layouts use the
    /// member index. `None` for RAID4/5 and for the P and Q members.
    pub fn q_exponent(&self, stripe: StripeNo, member: usize) -> Option<u8> {
        let (p, q) = self.parity_members(stripe);
        let q = q?;
        if member == p || member == q || member >= self.raid_disks {
            return None;
        }
        let slot = if self.algorithm.is_ddf() {
            member
        } else {
            let n = self.raid_disks;
            let d0 = if q == n - 1 { 0 } else { q + 1 };
            let rel = |m: usize| (m + n - d0) % n;
            let r = rel(member);
            r - usize::from(rel(p) < r) - usize::from(rel(q) < r)
        };
        Some(u8::try_from(slot).expect("RAID6 is limited to 255 members"))
    }

    /// The full placement of `stripe`.
    pub fn stripe_map(&self, stripe: StripeNo) -> StripeMap {
        let (p, q) = self.parity_members(stripe);
        let data: Vec<usize> = (0..self.data_disks())
            .map(|dd| self.data_member(stripe, dd))
            .collect();
        let q_exponent = if q.is_some() {
            data.iter()
                .map(|&m| self.q_exponent(stripe, m).expect("data member"))
                .collect()
        } else {
            Vec::new()
        };
        StripeMap {
            stripe,
            p,
            q,
            data,
            q_exponent,
        }
    }

    /// The location of array sector `s`, or `None` past the end.
    pub fn map(&self, s: Sectors) -> Option<ParityLocation> {
        if s >= self.array_sectors() {
            return None;
        }
        let chunk = self.chunk.0;
        let chunk_no = s.0 / chunk;
        let dd_count = wide(self.data_disks());
        let stripe = StripeNo(chunk_no / dd_count);
        let data_index = small(chunk_no % dd_count);
        Some(ParityLocation {
            member: self.data_member(stripe, data_index),
            sector: Sectors(stripe.0 * chunk + s.0 % chunk),
            stripe,
            chunk: ChunkNo(chunk_no),
            data_index,
        })
    }
}

// ---------------------------------------------------------------------------------------
// RAID10

/// RAID10 near/far/offset placement (original far-set variant, the only one mdadm
/// writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raid10 {
    layout: Raid10Layout,
    raid_disks: usize,
    chunk: Sectors,
    /// Sectors of every member in use (`conf->dev_sectors`).
    dev_sectors: Sectors,
    /// Distance between far copies on a member.
    stride: Sectors,
    array: Sectors,
}

impl Raid10 {
    /// `component_size` is the superblock's `size`; the kernel derives the sectors used
    /// per member and the far stride from it (`calc_sectors`).
    pub fn new(
        layout: Raid10Layout,
        raid_disks: usize,
        chunk: Sectors,
        component_size: Sectors,
    ) -> Result<Raid10> {
        if raid_disks == 0 || raid_disks > MAX_MEMBERS {
            return Err(invalid(format!("raid10: {raid_disks} members")));
        }
        let copies = small(u64::from(layout.copies()));
        if copies < 2 || copies > raid_disks {
            return Err(invalid(format!(
                "raid10: {copies} copies on {raid_disks} members"
            )));
        }
        if !chunk.0.is_power_of_two() || chunk.0 < 8 {
            return Err(invalid(format!(
                "raid10: chunk of {} sectors is not a power of two of at least 4 KiB",
                chunk.0
            )));
        }
        let near = u64::from(layout.near);
        let far = u64::from(layout.far);
        let disks = wide(raid_disks);
        let overflow = || invalid("raid10: size overflows");
        // calc_sectors(conf, size)
        let array_chunks = (component_size.0 / chunk.0 / far)
            .checked_mul(disks)
            .ok_or_else(overflow)?
            / near;
        let per_dev = array_chunks
            .checked_mul(wide(copies))
            .ok_or_else(overflow)?
            .div_ceil(disks);
        let dev_sectors = Sectors(per_dev.checked_mul(chunk.0).ok_or_else(overflow)?);
        let stride = if layout.offset {
            chunk
        } else {
            Sectors(per_dev / far * chunk.0)
        };
        // raid10_size(mddev, 0, 0): recomputed from dev_sectors, as the kernel does.
        let array = fits_in_bytes(
            (per_dev / far)
                .checked_mul(disks)
                .map(|c| Sectors(c / near))
                .and_then(|c| c.checked_mul(chunk.0)),
            Level::Raid10,
        )?;
        Ok(Raid10 {
            layout,
            raid_disks,
            chunk,
            dev_sectors,
            stride,
            array,
        })
    }

    pub fn from_raw_layout(
        layout: u32,
        raid_disks: usize,
        chunk: Sectors,
        component_size: Sectors,
    ) -> Result<Raid10> {
        let l = Raid10Layout::from_raw(layout).map_err(|e| match e {
            BadRaid10Layout::FarSets(v) => Error::new(
                ErrorKind::Unsupported,
                format!("raid10 layout {layout:#x}: far-sets variant {v} is not implemented"),
            ),
            _ => invalid(format!("raid10 layout {layout:#x} is not valid")),
        })?;
        Raid10::new(l, raid_disks, chunk, component_size)
    }

    pub fn layout(&self) -> Raid10Layout {
        self.layout
    }
    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }
    pub fn chunk(&self) -> Sectors {
        self.chunk
    }
    pub fn copies(&self) -> usize {
        small(u64::from(self.layout.copies()))
    }
    /// Sectors of each member the array uses.
    pub fn dev_sectors(&self) -> Sectors {
        self.dev_sectors
    }
    /// Distance between far copies on one member.
    pub fn stride(&self) -> Sectors {
        self.stride
    }
    pub fn array_sectors(&self) -> Sectors {
        self.array
    }

    /// Every copy of array sector `s` (`copies()` of them, near copies first), or
    /// nothing past the end. The first is the one the kernel numbers slot 0.
    pub fn map(&self, s: Sectors) -> Raid10Copies<'_> {
        let chunk = self.chunk.0;
        let disks = wide(self.raid_disks);
        let c = (s.0 / chunk) * u64::from(self.layout.near);
        let mut stripe = c / disks;
        let dev = c % disks;
        if self.layout.offset {
            stripe *= u64::from(self.layout.far);
        }
        Raid10Copies {
            geo: self,
            dev,
            sector: stripe * chunk + s.0 % chunk,
            n: if s < self.array { 0 } else { self.layout.near },
            f: 0,
            d: 0,
            s: 0,
        }
    }
}

/// Iterator over the copies of one RAID10 sector (`__raid10_find_phys`).
#[derive(Debug, Clone)]
pub struct Raid10Copies<'a> {
    geo: &'a Raid10,
    /// Member of the current near copy, and its sector.
    dev: u64,
    sector: u64,
    /// Near copies emitted so far; far copies of the current near copy emitted.
    n: u8,
    f: u8,
    /// The last far copy emitted.
    d: u64,
    s: u64,
}

impl Iterator for Raid10Copies<'_> {
    type Item = Location;

    fn next(&mut self) -> Option<Location> {
        let l = self.geo.layout;
        if self.n >= l.near {
            return None;
        }
        let disks = wide(self.geo.raid_disks);
        if self.f == 0 {
            self.d = self.dev;
            self.s = self.sector;
        } else {
            self.d = (self.d + u64::from(l.near)) % disks;
            self.s += self.geo.stride.0;
        }
        let out = Location {
            member: small(self.d),
            sector: Sectors(self.s),
        };
        self.f += 1;
        if self.f == l.far {
            self.f = 0;
            self.n += 1;
            self.dev += 1;
            if self.dev == disks {
                self.dev = 0;
                self.sector += self.geo.chunk.0;
            }
        }
        Some(out)
    }
}

// ---------------------------------------------------------------------------------------
// Any level

/// The placement of any level cairn implements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrayLayout {
    Linear(Linear),
    Raid0(Raid0),
    Raid1(Raid1),
    Parity(ParityLayout),
    Raid10(Raid10),
}

impl ArrayLayout {
    /// The layout an array with this superblock has. `member_data_sizes` are the
    /// members' `data_size`s in role order; linear and RAID0 size each member by its
    /// own, the other levels use the superblock's component `size`.
    pub fn from_superblock(sb: &Superblock, member_data_sizes: &[Sectors]) -> Result<ArrayLayout> {
        let n = small(u64::from(sb.raid_disks));
        if matches!(sb.level, Level::Linear | Level::Raid0) && member_data_sizes.len() != n {
            return Err(invalid(format!(
                "{}: {} member sizes for {n} members",
                sb.level,
                member_data_sizes.len()
            )));
        }
        Ok(match sb.level {
            Level::Linear => ArrayLayout::Linear(Linear::new(member_data_sizes, sb.chunk)?),
            Level::Raid0 => {
                let layout = if sb.features.has(Features::RAID0_LAYOUT) {
                    Some(Raid0Layout::from_raw(sb.layout).ok_or_else(|| {
                        invalid(format!("raid0 layout {} is not 1 or 2", sb.layout))
                    })?)
                } else {
                    None
                };
                ArrayLayout::Raid0(Raid0::new(member_data_sizes, sb.chunk, layout)?)
            }
            Level::Raid1 => ArrayLayout::Raid1(Raid1::new(n, sb.size)?),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => ArrayLayout::Parity(ParityLayout::new(
                sb.level, sb.layout, n, sb.chunk, sb.size,
            )?),
            Level::Raid10 => {
                ArrayLayout::Raid10(Raid10::from_raw_layout(sb.layout, n, sb.chunk, sb.size)?)
            }
        })
    }

    /// The array's size as the kernel computes it.
    pub fn array_sectors(&self) -> Sectors {
        match self {
            ArrayLayout::Linear(l) => l.array_sectors(),
            ArrayLayout::Raid0(l) => l.array_sectors(),
            ArrayLayout::Raid1(l) => l.array_sectors(),
            ArrayLayout::Parity(l) => l.array_sectors(),
            ArrayLayout::Raid10(l) => l.array_sectors(),
        }
    }

    /// Members in role order.
    pub fn raid_disks(&self) -> usize {
        match self {
            ArrayLayout::Linear(l) => l.ends().len(),
            ArrayLayout::Raid0(l) => l.zones()[0].members.len(),
            ArrayLayout::Raid1(l) => l.raid_disks(),
            ArrayLayout::Parity(l) => l.raid_disks(),
            ArrayLayout::Raid10(l) => l.raid_disks(),
        }
    }

    /// How many members may be missing at most, whichever they are (RAID10 may survive
    /// more when the missing members hold different copies; see [`ArrayLayout::tolerates`]).
    pub fn redundancy(&self) -> usize {
        match self {
            ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => 0,
            ArrayLayout::Raid1(l) => l.raid_disks() - 1,
            ArrayLayout::Parity(l) => l.level().parity_members(),
            ArrayLayout::Raid10(l) => l.copies() - 1,
        }
    }

    /// Whether every array sector still has a readable copy (or enough members to
    /// rebuild it) when the members marked in `down` (indexed by role) are missing.
    pub fn tolerates(&self, down: &[bool]) -> bool {
        let missing = down.iter().filter(|&&d| d).count();
        match self {
            ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => missing == 0,
            ArrayLayout::Raid1(l) => missing < l.raid_disks(),
            ArrayLayout::Parity(l) => missing <= l.level().parity_members(),
            ArrayLayout::Raid10(l) => {
                // The copy sets repeat every `raid_disks` array chunks (the first copy's
                // member advances by `near` per chunk), so checking one period suffices.
                let chunks = l.array_sectors().0 / l.chunk().0;
                (0..chunks.min(wide(l.raid_disks()))).all(|c| {
                    l.map(Sectors(c * l.chunk().0))
                        .any(|loc| !down.get(loc.member).copied().unwrap_or(true))
                })
            }
        }
    }

    /// Where array sector `s` is read from: the only location, or the first copy.
    pub fn primary(&self, s: Sectors) -> Option<Location> {
        match self {
            ArrayLayout::Linear(l) => l.map(s),
            ArrayLayout::Raid0(l) => l.map(s),
            ArrayLayout::Raid1(l) => l.map(s).next(),
            ArrayLayout::Parity(l) => l.map(s).map(|p| Location {
                member: p.member,
                sector: p.sector,
            }),
            ArrayLayout::Raid10(l) => l.map(s).next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(member: usize, sector: u64) -> Location {
        Location {
            member,
            sector: Sectors(sector),
        }
    }

    #[test]
    fn raid0_worked_example() {
        // ondisk-formats.md §1.10: sizes 72, 160, 160, chunk 8.
        let sizes = [Sectors(72), Sectors(160), Sectors(160)];
        for layout in [Raid0Layout::Original, Raid0Layout::Alternate] {
            let r = Raid0::new(&sizes, Sectors(8), Some(layout)).unwrap();
            assert_eq!(r.zones().len(), 2);
            assert_eq!(r.zones()[0].members, vec![0, 1, 2]);
            assert_eq!(r.zones()[0].zone_end, Sectors(216));
            assert_eq!(r.zones()[1].members, vec![1, 2]);
            assert_eq!(r.zones()[1].dev_start, Sectors(72));
            assert_eq!(r.zones()[1].zone_end, Sectors(392));
            assert_eq!(r.array_sectors(), Sectors(392));
            assert_eq!(r.map(Sectors(392)), None);
        }
        let orig = Raid0::new(&sizes, Sectors(8), Some(Raid0Layout::Original)).unwrap();
        let alt = Raid0::new(&sizes, Sectors(8), Some(Raid0Layout::Alternate)).unwrap();
        let table = [
            (0, (0, 0), (0, 0)),
            (8, (1, 0), (1, 0)),
            (24, (0, 8), (0, 8)),
            (215, (2, 71), (2, 71)),
            (216, (2, 72), (1, 72)),
            (224, (1, 72), (2, 72)),
            (391, (1, 159), (2, 159)),
        ];
        for (s, (om, os), (am, as_)) in table {
            assert_eq!(orig.map(Sectors(s)), Some(loc(om, os)), "orig {s}");
            assert_eq!(alt.map(Sectors(s)), Some(loc(am, as_)), "alt {s}");
        }
        // Without a layout a true multi-zone array is refused...
        let e = Raid0::new(&sizes, Sectors(8), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        // ...but equal members, or a single-member last zone, need none.
        assert!(Raid0::new(&[Sectors(80); 3], Sectors(8), None).is_ok());
        let r = Raid0::new(&[Sectors(80), Sectors(80), Sectors(160)], Sectors(8), None).unwrap();
        assert_eq!(r.map(Sectors(240)), Some(loc(2, 80)));
    }

    #[test]
    fn raid0_rounds_members_to_chunks_and_covers_every_sector_once() {
        let sizes = [Sectors(75), Sectors(163), Sectors(20), Sectors(163)];
        for layout in [Raid0Layout::Original, Raid0Layout::Alternate] {
            let r = Raid0::new(&sizes, Sectors(8), Some(layout)).unwrap();
            assert_eq!(r.array_sectors(), Sectors(72 + 160 + 16 + 160));
            let mut seen = std::collections::HashSet::new();
            for s in 0..r.array_sectors().0 {
                let l = r.map(Sectors(s)).unwrap();
                assert!(l.sector.0 < sizes[l.member].round_down(Sectors(8)).0);
                assert!(seen.insert(l), "{s} maps onto an occupied sector");
            }
        }
    }

    #[test]
    fn linear_maps_in_role_order() {
        let l = Linear::new(&[Sectors(10), Sectors(20), Sectors(5)], Sectors::ZERO).unwrap();
        assert_eq!(l.array_sectors(), Sectors(35));
        assert_eq!(l.map(Sectors(0)), Some(loc(0, 0)));
        assert_eq!(l.map(Sectors(9)), Some(loc(0, 9)));
        assert_eq!(l.map(Sectors(10)), Some(loc(1, 0)));
        assert_eq!(l.map(Sectors(34)), Some(loc(2, 4)));
        assert_eq!(l.map(Sectors(35)), None);
        let r = Linear::new(&[Sectors(10), Sectors(20)], Sectors(8)).unwrap();
        assert_eq!(r.array_sectors(), Sectors(24));
        assert_eq!(r.map(Sectors(8)), Some(loc(1, 0)));
    }

    #[test]
    fn raid1_copies() {
        let r = Raid1::new(3, Sectors(100)).unwrap();
        let v: Vec<_> = r.map(Sectors(42)).collect();
        assert_eq!(v, vec![loc(0, 42), loc(1, 42), loc(2, 42)]);
        assert_eq!(r.map(Sectors(100)).count(), 0);
    }

    fn r10_chunk(r: &Raid10, chunk_no: u64) -> Vec<(usize, u64)> {
        let c = r.chunk().0;
        r.map(Sectors(chunk_no * c))
            .map(|l| {
                assert_eq!(l.sector.0 % c, 0);
                (l.member, l.sector.0 / c)
            })
            .collect()
    }

    #[test]
    fn raid10_worked_examples() {
        // §1.13 table, 4 members; positions as (member, member chunk).
        let c = Sectors(128);
        let n2 = Raid10::from_raw_layout(0x102, 4, c, Sectors(100 * 128)).unwrap();
        assert_eq!(r10_chunk(&n2, 0), [(0, 0), (1, 0)]);
        assert_eq!(r10_chunk(&n2, 1), [(2, 0), (3, 0)]);
        assert_eq!(r10_chunk(&n2, 4), [(0, 2), (1, 2)]);
        let f2 = Raid10::from_raw_layout(0x201, 4, c, Sectors(100 * 128)).unwrap();
        assert_eq!(f2.stride(), Sectors(50 * 128));
        assert_eq!(r10_chunk(&f2, 0), [(0, 0), (1, 50)]);
        assert_eq!(r10_chunk(&f2, 1), [(1, 0), (2, 50)]);
        assert_eq!(r10_chunk(&f2, 4), [(0, 1), (1, 51)]);
        let o2 = Raid10::from_raw_layout(0x10201, 4, c, Sectors(100 * 128)).unwrap();
        assert_eq!(r10_chunk(&o2, 0), [(0, 0), (1, 1)]);
        assert_eq!(r10_chunk(&o2, 1), [(1, 0), (2, 1)]);
        assert_eq!(r10_chunk(&o2, 4), [(0, 2), (1, 3)]);
        // "With 3 members, n2 gives chunk 1 -> (2,0) (0,1), chunk 2 -> (1,1) (2,1)."
        let n2_3 = Raid10::from_raw_layout(0x102, 3, c, Sectors(100 * 128)).unwrap();
        assert_eq!(r10_chunk(&n2_3, 1), [(2, 0), (0, 1)]);
        assert_eq!(r10_chunk(&n2_3, 2), [(1, 1), (2, 1)]);
        // Sizes: n2 on 4 members of 100 chunks holds 200 chunks.
        assert_eq!(n2.array_sectors(), Sectors(200 * 128));
        assert_eq!(f2.array_sectors(), Sectors(200 * 128));
        assert_eq!(n2_3.array_sectors(), Sectors(150 * 128));
        assert_eq!(n2.map(n2.array_sectors()).count(), 0);
    }

    /// Mixed near+offset words (e.g. n2o2 on 5 members) are left out: under the
    /// kernel's own maths a near copy that wraps to member 0 lands in the row the
    /// offset copies use. mdadm cannot create such words and neither does cairn.
    #[test]
    fn raid10_every_shape_stores_each_chunk_copies_times_without_collision() {
        for disks in 2..=7usize {
            for (near, far, offset) in [
                (2, 1, false),
                (3, 1, false),
                (1, 2, false),
                (1, 3, false),
                (1, 2, true),
                (1, 3, true),
                (2, 2, false),
            ] {
                let l = Raid10Layout { near, far, offset };
                let copies = usize::from(near) * usize::from(far);
                if copies > disks {
                    continue;
                }
                let chunk = Sectors(8);
                let r = Raid10::new(l, disks, chunk, Sectors(8 * 37)).unwrap();
                let mut used = std::collections::HashMap::new();
                for ch in 0..r.array_sectors().0 / 8 {
                    let locs = r10_chunk(&r, ch);
                    assert_eq!(locs.len(), copies);
                    let mut members: Vec<_> = locs.iter().map(|l| l.0).collect();
                    members.sort_unstable();
                    members.dedup();
                    assert_eq!(
                        members.len(),
                        copies,
                        "{l:?} on {disks}: copies share a member"
                    );
                    for (m, mc) in locs {
                        assert!(
                            mc * 8 < r.dev_sectors().0,
                            "{l:?} on {disks}: chunk {ch} past dev_sectors"
                        );
                        assert!(
                            used.insert((m, mc), ch).is_none(),
                            "{l:?} on {disks}: collision at ({m},{mc})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn parity_layout_sizes_and_refusals() {
        let p = ParityLayout::new(Level::Raid5, 2, 4, Sectors(1024), Sectors(126_976)).unwrap();
        assert_eq!(p.array_sectors(), Sectors(126_976 * 3));
        let p = ParityLayout::new(Level::Raid6, 2, 4, Sectors(1024), Sectors(126_976 + 5)).unwrap();
        assert_eq!(p.array_sectors(), Sectors(126_976 * 2));
        assert!(ParityLayout::new(Level::Raid5, 8, 4, Sectors(1024), Sectors(0)).is_err());
        assert!(ParityLayout::new(Level::Raid6, 2, 3, Sectors(1024), Sectors(0)).is_err());
        assert!(ParityLayout::new(Level::Raid6, 2, 4, Sectors(24), Sectors(0)).is_err());
        assert!(ParityLayout::new(Level::Raid6, 2, 256, Sectors(8), Sectors(0)).is_err());
    }

    /// Independent check of every RAID4/5/6 layout: each stripe's members are a
    /// permutation of data + P (+ Q), and the Q exponents are the walk the kernel does.
    #[test]
    fn every_parity_layout_is_a_permutation_with_kernel_slot_order() {
        for level in [Level::Raid4, Level::Raid5, Level::Raid6] {
            for alg in ParityAlgorithm::ALL {
                if ParityAlgorithm::for_level(level, alg.to_raw()) != Some(alg)
                    && level != Level::Raid4
                {
                    continue;
                }
                for n in small(u64::from(level.min_raid_disks()))..=9 {
                    let l = ParityLayout::new(level, alg.to_raw(), n, Sectors(8), Sectors(8 * 40))
                        .unwrap();
                    for s in 0..2 * wide(n) {
                        let m = l.stripe_map(StripeNo(s));
                        let mut all: Vec<usize> = m.data.clone();
                        all.push(m.p);
                        all.extend(m.q);
                        all.sort_unstable();
                        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{level} {alg} n={n} s={s}");
                        if let Some(q) = m.q {
                            // The kernel's walk (set_syndrome_sources).
                            let ddf = alg.is_ddf();
                            let d0 = if ddf || q == n - 1 { 0 } else { q + 1 };
                            let mut count = 0usize;
                            let mut i = d0;
                            loop {
                                let slot = count;
                                if ddf {
                                    count += 1;
                                }
                                if i != m.p && i != q {
                                    if !ddf {
                                        count += 1;
                                    }
                                    assert_eq!(
                                        l.q_exponent(StripeNo(s), i),
                                        Some(u8::try_from(slot).unwrap())
                                    );
                                }
                                i = (i + 1) % n;
                                if i == d0 {
                                    break;
                                }
                            }
                            let order = m.syndrome_order();
                            for (e, member) in order.iter().enumerate() {
                                if let Some(member) = member {
                                    assert_eq!(
                                        m.role_of(*member),
                                        StripeRole::Data(
                                            m.data.iter().position(|x| x == member).unwrap()
                                        )
                                    );
                                    assert_eq!(
                                        l.q_exponent(StripeNo(s), *member),
                                        Some(u8::try_from(e).unwrap())
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_documented_left_asymmetric_example() {
        // §1.12: RAID6 left-asymmetric, 5 members, stripe 2: P=2, Q=3, data 0,1,4;
        // member 4 gets g^0, member 0 g^1, member 1 g^2.
        let l = ParityLayout::new(Level::Raid6, 0, 5, Sectors(8), Sectors(80)).unwrap();
        let m = l.stripe_map(StripeNo(2));
        assert_eq!((m.p, m.q), (2, Some(3)));
        assert_eq!(m.data, vec![0, 1, 4]);
        assert_eq!(m.q_exponent, vec![1, 2, 0]);
        assert_eq!(m.syndrome_order(), vec![Some(4), Some(0), Some(1)]);
    }
}
