//! The running bitmap's state: the area as on disk, the chunks in flight, the chunks
//! waiting to be cleared. Data and its bookkeeping only; what the array does with it
//! (setting bits before writes, clearing them, writing blocks to members) is in
//! bitmap.rs.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Instant;

use cairn_block::{BlockDevice, Error, ErrorKind, Result};

use crate::bitmap::format::{corrupt, set_bit, state, test_bit, BitmapSuper, BLOCK, HEADER_SIZE};
use crate::layout::ArrayLayout;
use crate::ondisk::Superblock;
use crate::slot::Slot;
use crate::units::{small, wide, SECTOR_SIZE};

// ---- the running bitmap ---------------------------------------------------------------

/// What the bits count in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Member bytes from `data_offset` (RAID1/4/5/6).
    Member,
    /// Array bytes (RAID10).
    Array,
}

/// A snapshot of the bitmap, for reports and tests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BitmapInfo {
    pub chunk_bytes: u64,
    pub chunks: u64,
    /// Bits set now (what `mdadm -X` would count once written).
    pub dirty: u64,
    pub events: u64,
    pub events_cleared: u64,
    pub sync_size: u64,
    /// Byte offset of the bitmap on each member.
    pub offset: u64,
    /// "member" or "array": what one chunk of bits counts.
    pub coverage: &'static str,
}

/// A chunk whose writes have all completed: cleared once a flush numbered `gen` or
/// later has completed and it has been idle since `at` for the daemon sleep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub(crate) gen: u64,
    pub(crate) at: Instant,
}

pub(crate) struct State {
    pub(crate) sb: BitmapSuper,
    /// The area as on disk: header, then the bits; whole blocks.
    pub(crate) area: Vec<u8>,
    pub(crate) inflight: Vec<u32>,
    /// Set bits with nothing in flight.
    pub(crate) done: BTreeMap<u64, Done>,
    pub(crate) flushes_started: u64,
    pub(crate) flushed: u64,
}

impl State {
    pub(crate) fn bits(&self) -> &[u8] {
        &self.area[HEADER_SIZE..]
    }

    pub(crate) fn test(&self, c: u64) -> bool {
        test_bit(self.bits(), c)
    }

    pub(crate) fn set(&mut self, c: u64, on: bool) {
        set_bit(&mut self.area[HEADER_SIZE..], c, on);
    }

    pub(crate) fn sync_header(&mut self) {
        let h = self.sb.encode();
        self.area[..HEADER_SIZE].copy_from_slice(&h);
    }

    pub(crate) fn dirty(&self, chunks: u64) -> u64 {
        wide((0..chunks).filter(|&c| self.test(c)).count())
    }
}

/// The bitmap of a running array: one per array, written to every up member.
pub(crate) struct Bitmap {
    /// Byte offset of the area on each member.
    pub(crate) at: u64,
    pub(crate) chunk: u64,
    pub(crate) chunks: u64,
    pub(crate) coverage: Coverage,
    pub(crate) daemon_sleep_ms: AtomicU64,
    pub(crate) state: Mutex<State>,
    /// Where each role's copy lives when not on the member itself (dm-raid keeps it in
    /// a metadata device beside each image): by role, `None` for a role without one.
    /// Empty for md arrays, whose bitmap is on the members.
    pub(crate) own: Vec<RwLock<Option<Arc<dyn BlockDevice>>>>,
}

impl Bitmap {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device holding `role`'s copy when the bitmap is not on the members.
    pub(crate) fn own_device(&self, role: usize) -> Option<Arc<dyn BlockDevice>> {
        self.own
            .get(role)?
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Reads the bitmap of an array being assembled whose superblock `sb` has feature bit
/// 1, from every present member of `slots` (bits are OR-ed; the header with the most
/// events wins). `events` is the array's. Returns the bitmap and whether it was out of
/// date (then every bit is set, and it must be written back). Nothing is written.
pub(crate) fn load_bitmap(
    slots: &[Slot],
    layout: &ArrayLayout,
    sb: &Superblock,
    events: u64,
    label: &str,
) -> Result<Option<(Bitmap, bool)>> {
    if !sb.features.has(crate::ondisk::Features::BITMAP_OFFSET) {
        return Ok(None);
    }
    let (coverage, covered) = match layout {
        ArrayLayout::Raid10(l) => (Coverage::Array, l.array_sectors()),
        ArrayLayout::Raid1(_) | ArrayLayout::Parity(_) => (Coverage::Member, sb.size),
        ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => {
            tracing::warn!("{label}: ignoring the bitmap of a {} array", sb.level);
            return Ok(None);
        }
    };
    let start = i128::from(sb.super_offset.0) + i128::from(sb.bitmap_offset);
    let at =
        u64::try_from(start * 512).map_err(|_| corrupt(label, "bitmap before the device start"))?;
    let limit = if sb.bblog_offset > 0 {
        i128::from(sb.super_offset.0) + i128::from(sb.bblog_offset)
    } else {
        i128::from(sb.data_offset.0)
    } * 512;
    let mut images: Vec<(BitmapSuper, Vec<u8>)> = Vec::new();
    // Only members in sync carry a bitmap that means anything (one part-way through a
    // rebuild got it when the rebuild began, but its own may be older).
    let in_sync = slots
        .iter()
        .filter(|s| s.synced.load(std::sync::atomic::Ordering::Acquire) == u64::MAX)
        .filter_map(Slot::member);
    for m in in_sync {
        let lbs = u64::from(m.dev.geometry().logical_block_size);
        if lbs > BLOCK || !BLOCK.is_multiple_of(lbs) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{}: logical blocks of {lbs} bytes cannot hold md's 4 KiB bitmap blocks",
                    m.name
                ),
            ));
        }
        let mut head = vec![0u8; small(BLOCK)];
        m.dev
            .read_at(&mut head, at)
            .map_err(|e| e.context(format!("{}: reading the bitmap", m.name)))?;
        let bsb = BitmapSuper::parse(&head, &m.name)?;
        if bsb.uuid != sb.set_uuid {
            return Err(corrupt(
                &m.name,
                format!("UUID {} is not the array's {}", bsb.uuid, sb.set_uuid),
            ));
        }
        let len = bsb.area_bytes().expect("checked by parse");
        if i128::from(at) + i128::from(len) > limit {
            return Err(corrupt(
                &m.name,
                format!("{len} bitmap bytes at byte {at} overlap what follows (byte {limit})"),
            ));
        }
        let mut area = vec![0u8; small(len)];
        m.dev
            .read_at(&mut area, at)
            .map_err(|e| e.context(format!("{}: reading the bitmap", m.name)))?;
        images.push((bsb, area));
    }
    from_images(images, at, coverage, covered, events, label, Vec::new())
}

/// The running bitmap from the copies read (`images`, header and area each): the one
/// with the most events, with the bits of every copy of the same shape OR-ed in; every
/// bit set when it is out of date (`events` is the array's). Returns whether it was.
fn from_images(
    images: Vec<(BitmapSuper, Vec<u8>)>,
    at: u64,
    coverage: Coverage,
    covered: crate::units::Sectors,
    events: u64,
    label: &str,
    own: Vec<RwLock<Option<Arc<dyn BlockDevice>>>>,
) -> Result<Option<(Bitmap, bool)>> {
    let Some(best) = images.iter().map(|(s, _)| s.events).max() else {
        return Ok(None);
    };
    let (mut bsb, mut area) = images
        .iter()
        .find(|(s, _)| s.events == best)
        .cloned()
        .expect("the maximum is one of them");
    let chunks = bsb.chunks().expect("checked by parse");
    if chunks * u64::from(bsb.chunk_bytes) < covered.0 * SECTOR_SIZE {
        return Err(corrupt(
            label,
            format!(
                "the bitmap covers {} sectors but the array needs {}",
                bsb.sync_size.0, covered.0
            ),
        ));
    }
    // Union of the members' bits (one may hold bits another never got).
    for (s, img) in &images {
        if s.chunk_bytes == bsb.chunk_bytes && s.sync_size == bsb.sync_size {
            for c in (0..chunks).filter(|&c| test_bit(&img[HEADER_SIZE..], c)) {
                set_bit(&mut area[HEADER_SIZE..], c, true);
            }
        }
    }
    let stale = bsb.events < events || bsb.state & state::STALE != 0;
    if stale {
        tracing::warn!(
            "{label}: bitmap is out of date (events {} < {events}); every chunk counts as \
             dirty, so a resync covers the whole array",
            bsb.events
        );
        for c in 0..chunks {
            set_bit(&mut area[HEADER_SIZE..], c, true);
        }
        bsb.state &= !state::STALE;
    }
    bsb.events = bsb.events.max(events);
    let now = Instant::now();
    let mut st = State {
        sb: bsb.clone(),
        area,
        inflight: vec![0; small(chunks)],
        done: BTreeMap::new(),
        flushes_started: 0,
        flushed: 0,
    };
    st.sync_header();
    let set: Vec<u64> = (0..chunks).filter(|&c| st.test(c)).collect();
    for c in set {
        st.done.insert(c, Done { gen: 0, at: now });
    }
    Ok(Some((
        Bitmap {
            at,
            chunk: u64::from(bsb.chunk_bytes),
            chunks,
            coverage,
            daemon_sleep_ms: AtomicU64::new(u64::from(bsb.daemon_sleep) * 1000),
            state: Mutex::new(st),
            own,
        },
        stale,
    )))
}

/// Reads a bitmap kept apart from the members, as dm-raid keeps it: role `i`'s copy at
/// byte `at` of `devs[i]` (roles without a device, or not in sync, are not read; their
/// copies are written from now on when they get a device). The uuid must be zero (dm-raid
/// arrays have none). `covered` is what the bits must span: array sectors for RAID10,
/// member sectors otherwise. Nothing is written.
pub(crate) fn load_own_bitmap(
    slots: &[Slot],
    layout: &ArrayLayout,
    devs: Vec<Option<Arc<dyn BlockDevice>>>,
    at: u64,
    events: u64,
    label: &str,
) -> Result<Option<(Bitmap, bool)>> {
    let (coverage, covered) = match layout {
        ArrayLayout::Raid10(l) => (Coverage::Array, l.array_sectors()),
        ArrayLayout::Raid1(l) => (Coverage::Member, l.array_sectors()),
        ArrayLayout::Parity(l) => (
            Coverage::Member,
            crate::units::Sectors(l.stripes() * l.chunk().0),
        ),
        ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => return Ok(None),
    };
    let mut images = Vec::new();
    for (role, d) in devs.iter().enumerate() {
        let Some(d) = d else { continue };
        let in_sync = slots.get(role).is_some_and(|s| {
            s.has_member() && s.synced.load(std::sync::atomic::Ordering::Acquire) == u64::MAX
        });
        if !in_sync {
            continue;
        }
        let name = format!("{label}: bitmap of role {role}");
        let mut head = vec![0u8; small(BLOCK)];
        d.read_at(&mut head, at)
            .map_err(|e| e.context(format!("{name}: reading")))?;
        // dm-raid writes it at the first activation; until then there is none.
        if head[..4] != crate::bitmap::format::BITMAP_MAGIC.to_le_bytes() {
            continue;
        }
        let bsb = BitmapSuper::parse(&head, &name)?;
        if bsb.uuid != crate::ondisk::Uuid::default() {
            return Err(corrupt(
                &name,
                format!("UUID {} where none belongs", bsb.uuid),
            ));
        }
        let len = bsb.area_bytes().expect("checked by parse");
        if at + len > d.geometry().size {
            return Err(corrupt(
                &name,
                format!("{len} bitmap bytes at byte {at} do not fit the device"),
            ));
        }
        let mut area = vec![0u8; small(len)];
        d.read_at(&mut area, at)
            .map_err(|e| e.context(format!("{name}: reading")))?;
        images.push((bsb, area));
    }
    let own = devs.into_iter().map(RwLock::new).collect();
    from_images(images, at, coverage, covered, events, label, own)
}

impl State {
    /// md: events going back (never in cairn) pull `events_cleared` with them.
    pub(crate) fn events_cleared_not_ahead(&mut self) {
        if self.sb.events < self.sb.events_cleared {
            self.sb.events_cleared = self.sb.events;
        }
    }
}
