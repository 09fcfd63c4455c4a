//! [`LogicalVolume`]: an LV's linear and striped segments as one [`BlockDevice`] over the
//! PVs' data areas (ondisk-formats.md §4.5, the maths of dm-linear and dm-stripe).
//!
//! ```text
//!   LV byte o in segment s (o relative to s.start):
//!     linear   pv_off = pe_start + first_pe*extent + o
//!     striped  chunk = o / z, stripe = chunk % k, row = chunk / k
//!              pv_off = pe_start + first_pe[stripe]*extent + row*z + o % z
//! ```
//!
//! Requests are split at segment and stripe-chunk boundaries; flush goes to every PV the
//! LV's own extents are on (not the other PVs of a shared list), FUA and write_zeroes pass down piece by piece. A read or write that spans
//! several PVs (a striped LV) issues its pieces at once when the PVs are slow
//! (`cairn_block::overlap`), by PV when large, one after another on PVs in memory. A
//! discard joins a PV's adjacent pieces into one request per PV; over PVs that complete
//! later (remote PVs) it sends them all from the calling thread and waits once
//! (`overlap::start_all`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cairn_block::overlap::{fan_out, start_all, Latency, Overlap};
use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteFlags,
};

pub use crate::map::{MapArea, MapSegment};

/// An open logical volume.
pub struct LogicalVolume {
    name: String,
    pvs: Vec<(String, Arc<dyn BlockDevice>)>,
    segments: Vec<MapSegment>,
    geometry: Geometry,
    read_only: bool,
    /// How long a PV read or write takes: whether a request's pieces overlap.
    latency: Latency,
    /// A RAID LV: md's array over the image sub-LVs does the I/O; `segments` are then
    /// the first image's (for `locate`).
    raid: Option<Arc<cairn_md::Array>>,
    /// A RAID LV open for writing: its metadata LVs, where a finished rebuild is
    /// recorded (the array's bitmap lives there too).
    raid_meta: Option<Arc<crate::raid::RaidMeta>>,
}

/// Requests at least this large overlap their pieces by PV whatever the PVs' latency.
const OVERLAP_LARGE: usize = 1 << 20;

impl fmt::Debug for LogicalVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogicalVolume")
            .field("name", &self.name)
            .field("segments", &self.segments)
            .field("pvs", &self.pvs.iter().map(|p| &p.0).collect::<Vec<_>>())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl LogicalVolume {
    /// Builds the mapping; `pvs` are the devices the areas index, with their names.
    /// Checks that every area lies inside its device.
    pub fn new(
        name: String,
        pvs: Vec<(String, Arc<dyn BlockDevice>)>,
        segments: Vec<MapSegment>,
        read_only: bool,
    ) -> Result<LogicalVolume> {
        if pvs.is_empty() || segments.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("LV {name} has no segments"),
            ));
        }
        let mut lbs = 512u32;
        let mut phys = 512u32;
        let mut max_io = u32::MAX;
        for (_, d) in &pvs {
            let g = d.geometry();
            lbs = lbs.max(g.logical_block_size);
            phys = phys.max(g.physical_block_size);
            max_io = max_io.min(g.max_io_size);
        }
        let mut size = 0u64;
        for s in &segments {
            if s.start != size || s.areas.is_empty() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("LV {name}: segments do not line up"),
                ));
            }
            let k = s.areas.len() as u64;
            if k > 1 && (s.stripe_size == 0 || s.len % (s.stripe_size * k) != 0) {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("LV {name}: bad stripe shape"),
                ));
            }
            if s.len % u64::from(lbs) != 0 || (k > 1 && s.stripe_size % u64::from(lbs) != 0) {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("LV {name}: extents or stripes are not multiples of the PVs' {lbs}-byte blocks"),
                ));
            }
            for a in &s.areas {
                let (pv_name, dev) = pvs.get(a.pv).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        format!("LV {name}: area names PV {}", a.pv),
                    )
                })?;
                let need = a.offset.checked_add(s.len / k);
                let have = dev.geometry().size;
                if need.is_none_or(|n| n > have) {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "LV {name} needs bytes up to {} of PV {pv_name}, but the device has {have}",
                            need.unwrap_or(u64::MAX)
                        ),
                    ));
                }
            }
            size = size.checked_add(s.len).ok_or_else(|| {
                Error::new(ErrorKind::Corrupt, format!("LV {name}: size overflows"))
            })?;
        }
        let first = &segments[0];
        let optimal = if first.areas.len() > 1 {
            u32::try_from(first.stripe_size * first.areas.len() as u64).unwrap_or(phys)
        } else {
            pvs[first.areas[0].pv].1.geometry().optimal_io_size
        };
        let max_io = (max_io - max_io % lbs).max(lbs);
        let geometry = Geometry {
            size,
            logical_block_size: lbs,
            physical_block_size: phys,
            optimal_io_size: optimal.max(phys),
            max_io_size: max_io,
        };
        let read_only = read_only || pvs.iter().any(|(_, d)| d.capabilities().read_only);
        Ok(LogicalVolume {
            name,
            pvs,
            segments,
            geometry,
            read_only,
            latency: Latency::default(),
            raid: None,
            raid_meta: None,
        })
    }

    /// A RAID LV of `size` bytes: `array` over its images, `pvs` every PV the images
    /// use, `first` the first present image (its segments answer `locate`).
    pub fn raid(
        name: String,
        array: Arc<cairn_md::Array>,
        size: u64,
        first: &LogicalVolume,
        read_only: bool,
    ) -> LogicalVolume {
        let mut geometry = array.geometry();
        geometry.size = size.min(geometry.size);
        LogicalVolume {
            name,
            // The images are mapped over one shared PV list (Vg::lv), so the first
            // image's list is every PV of the LV.
            pvs: first.pvs.clone(),
            segments: first.segments.clone(),
            geometry,
            read_only: read_only || array.capabilities().read_only,
            latency: Latency::default(),
            raid: Some(array),
            raid_meta: None,
        }
    }

    /// Keeps the metadata LVs of a RAID LV open for writing.
    pub(crate) fn with_raid_meta(mut self, meta: Arc<crate::raid::RaidMeta>) -> LogicalVolume {
        self.raid_meta = Some(meta);
        self
    }

    /// A RAID LV's metadata LVs, when open for writing.
    pub(crate) fn raid_meta(&self) -> Option<&Arc<crate::raid::RaidMeta>> {
        self.raid_meta.as_ref()
    }

    /// A RAID LV open for writing, whose PV called `pv` (by its open name) answered
    /// again as `dev` after it went away (a remote PV whose server came back): every
    /// image out of the array with extents on it is opened over `dev` and re-added into
    /// its role, and md rebuilds only what its write-intent bitmap marks written
    /// meanwhile. Returns one sentence per image re-added; none when no image waits for
    /// that PV (or the LV is not a RAID LV open for writing).
    pub fn raid_pv_returned(&self, pv: &str, dev: &Arc<dyn BlockDevice>) -> Result<Vec<String>> {
        match &self.raid_meta {
            Some(m) => m
                .pv_returned(pv, dev)
                .map_err(|e| e.context(format!("LV {}", self.name))),
            None => Ok(Vec::new()),
        }
    }

    /// For each image of a RAID LV, the PVs (open names) its extents are on, in image
    /// order; empty for other LVs.
    pub fn raid_image_pvs(&self) -> Vec<Vec<String>> {
        let Some(m) = &self.raid_meta else {
            return Vec::new();
        };
        let maps = m
            .maps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        maps.iter()
            .map(|x| {
                x.as_ref().map_or_else(Vec::new, |(img, _)| {
                    let mut out: Vec<String> = Vec::new();
                    for a in img.segments.iter().flat_map(|s| &s.areas) {
                        let n = &img.pvs[a.pv].0;
                        if !out.contains(n) {
                            out.push(n.clone());
                        }
                    }
                    out
                })
            })
            .collect()
    }

    /// The md array doing a RAID LV's I/O (status, fail, rebuild), if it is one.
    pub fn array(&self) -> Option<&Arc<cairn_md::Array>> {
        self.raid.as_ref()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn segments(&self) -> &[MapSegment] {
        &self.segments
    }

    /// The PV devices the LV uses, by their open names, in the order its extents first
    /// reach them.
    pub fn pv_names(&self) -> Vec<&str> {
        if self.raid.is_some() {
            // Every image's PVs, in image order.
            return self.pvs.iter().map(|p| p.0.as_str()).collect();
        }
        self.used_pvs()
            .into_iter()
            .map(|i| self.pvs[i].0.as_str())
            .collect()
    }

    /// Indexes into `pvs` of the PVs the segments use, in the order first reached.
    fn used_pvs(&self) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for a in self.segments.iter().flat_map(|s| &s.areas) {
            if !out.contains(&a.pv) {
                out.push(a.pv);
            }
        }
        out
    }

    /// Where LV byte `off` lives: (PV name, byte offset on that PV).
    pub fn locate(&self, off: u64) -> Option<(&str, u64)> {
        let seg = self.segment_at(off)?;
        let (a, pv_off, _) = self.segments[seg].map(off - self.segments[seg].start);
        Some((&self.pvs[self.segments[seg].areas[a].pv].0, pv_off))
    }

    fn segment_at(&self, off: u64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.start + s.len <= off);
        (i < self.segments.len()).then_some(i)
    }

    /// Calls `f(device, pv offset, lv offset, len)` for each contiguous piece of
    /// `[offset, offset + len)`.
    fn for_pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&Arc<dyn BlockDevice>, u64, u64, u64) -> Result<()>,
    ) -> Result<()> {
        self.for_pieces_idx(offset, len, |pv, pv_off, off, n| {
            f(&self.pvs[pv].1, pv_off, off, n)
                .map_err(|e| e.context(format!("LV {} at {off}", self.name)))
        })
    }

    /// The contiguous pieces of `[offset, offset + len)`: (PV index, PV offset, LV
    /// offset, length).
    fn pieces(&self, offset: u64, len: u64) -> Result<Vec<(usize, u64, u64, u64)>> {
        let mut out = Vec::new();
        self.for_pieces_idx(offset, len, |pv, pv_off, off, n| {
            out.push((pv, pv_off, off, n));
            Ok(())
        })?;
        Ok(out)
    }

    /// [`LogicalVolume::for_pieces`] with the PV's index.
    fn for_pieces_idx(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, u64, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let off = offset + done;
            let si = self.segment_at(off).ok_or_else(|| {
                Error::new(
                    ErrorKind::OutOfRange,
                    format!("LV {}: offset {off} past the end", self.name),
                )
            })?;
            let seg = &self.segments[si];
            let (a, pv_off, avail) = seg.map(off - seg.start);
            let n = avail.min(len - done).min(seg.start + seg.len - off);
            f(seg.areas[a].pv, pv_off, off, n)?;
            done += n;
        }
        Ok(())
    }

    /// Runs `op` on one PV piece of `n` bytes, timed.
    fn timed(&self, n: usize, op: impl FnOnce() -> Result<()>) -> Result<()> {
        self.latency.time(n, op)
    }

    /// How a request of `len` bytes in `pieces` issues them.
    fn how(&self, pieces: &[(usize, u64, u64, u64)], len: usize) -> Overlap {
        if pieces.iter().all(|p| p.0 == pieces[0].0) {
            // One PV: its pieces are contiguous there only by chance, and a PV that
            // takes one request at a time gains nothing.
            Overlap::No
        } else {
            self.latency.choose(len, OVERLAP_LARGE)
        }
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::new(ErrorKind::ReadOnly, format!("LV {}", self.name)));
        }
        Ok(())
    }
}

/// `pieces` (PV index, PV offset, LV offset, length) with each piece that continues its
/// PV's previous piece on that PV joined to it: a discard spanning many stripe chunks is
/// one request per PV, not one per chunk.
fn join_per_pv(pieces: Vec<(usize, u64, u64, u64)>) -> Vec<(usize, u64, u64, u64)> {
    let mut out: Vec<(usize, u64, u64, u64)> = Vec::new();
    let mut last: HashMap<usize, usize> = HashMap::new();
    for (pv, pv_off, off, n) in pieces {
        if let Some(&i) = last.get(&pv) {
            let j = &mut out[i];
            if j.1 + j.3 == pv_off {
                j.3 += n;
                continue;
            }
        }
        last.insert(pv, out.len());
        out.push((pv, pv_off, off, n));
    }
    out
}

fn to_usize(v: u64) -> usize {
    // Pieces are bounded by the caller's buffer length, which is a usize.
    usize::try_from(v).expect("piece length fits the buffer")
}

impl BlockDevice for LogicalVolume {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        if let Some(a) = &self.raid {
            let mut c = a.capabilities();
            c.read_only = self.read_only;
            return c;
        }
        let mut c = Capabilities {
            read_only: self.read_only,
            flush: Support::Native,
            fua: Support::Native,
            discard: Support::Native,
            write_zeroes: Support::Native,
            extents: false,
        };
        for (_, d) in &self.pvs {
            let p = d.capabilities();
            c.flush = c.flush.min(p.flush);
            c.fua = c.fua.min(p.fua);
            c.discard = c.discard.min(p.discard);
            c.write_zeroes = c.write_zeroes.min(p.write_zeroes).max(Support::Emulate);
        }
        c
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if let Some(a) = &self.raid {
            return a.read_at(buf, offset);
        }
        debug_assert!(offset.is_multiple_of(u64::from(self.geometry.logical_block_size)));
        let pieces = self.pieces(offset, buf.len() as u64)?;
        let how = self.how(&pieces, buf.len());
        let mut jobs = Vec::with_capacity(pieces.len());
        let mut rest: &mut [u8] = buf;
        for (pv, pv_off, off, n) in pieces {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(to_usize(n));
            rest = tail;
            jobs.push((pv, (pv, pv_off, off, piece)));
        }
        fan_out(jobs, how, |(pv, pv_off, off, piece)| {
            let n = piece.len();
            self.timed(n, || self.pvs[pv].1.read_at(piece, pv_off))
                .map_err(|e| e.context(format!("LV {} at {off}", self.name)))
        })
        .into_iter()
        .collect()
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.check_writable()?;
        if let Some(a) = &self.raid {
            return a.write_at(buf, offset, flags);
        }
        let pieces = self.pieces(offset, buf.len() as u64)?;
        let how = self.how(&pieces, buf.len());
        let jobs = pieces
            .into_iter()
            .map(|(pv, pv_off, off, n)| {
                let b = to_usize(off - offset);
                (pv, (pv, pv_off, off, &buf[b..b + to_usize(n)]))
            })
            .collect();
        fan_out(jobs, how, |(pv, pv_off, off, piece)| {
            let n = piece.len();
            self.timed(n, || self.pvs[pv].1.write_at(piece, pv_off, flags))
                .map_err(|e| e.context(format!("LV {} at {off}", self.name)))
        })
        .into_iter()
        .collect()
    }

    fn flush(&self) -> Result<()> {
        if let Some(a) = &self.raid {
            return a.flush();
        }
        // Only the PVs this LV's extents are on: a RAID LV's images are mapped over one
        // shared PV list, and an image flushing its sibling's PV would fail with it.
        let used = self.used_pvs();
        let how = if self.latency.slow() && used.len() > 1 {
            Overlap::Each
        } else {
            Overlap::No
        };
        let jobs = used
            .into_iter()
            .map(|i| (i, (&self.pvs[i].0, &self.pvs[i].1)))
            .collect();
        fan_out(jobs, how, |(name, d)| {
            d.flush()
                .map_err(|e| e.context(format!("LV {}: flushing PV {name}", self.name)))
        })
        .into_iter()
        .collect()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        if let Some(a) = &self.raid {
            return a.discard(offset, len);
        }
        let jobs = join_per_pv(self.pieces(offset, len)?);
        let context = |e: Error, off: u64| e.context(format!("LV {} at {off}", self.name));
        let later = jobs.len() > 1 && jobs.iter().all(|j| self.pvs[j.0].1.completes_later());
        if !later {
            for (pv, pv_off, off, n) in jobs {
                self.pvs[pv]
                    .1
                    .discard(pv_off, n)
                    .map_err(|e| context(e, off))?;
            }
            return Ok(());
        }
        // PVs that complete later: every discard sent from here, one wait; the first
        // error in LV order is the answer, as above (where it stops the ones after it).
        let answers = start_all(jobs.iter().collect(), |&(pv, pv_off, _, n), answer| {
            self.pvs[pv].1.discard_then(pv_off, n, answer);
        });
        for (&(_, _, off, _), answer) in jobs.iter().zip(answers) {
            answer
                .unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::Io,
                        "the PV dropped the discard without answering",
                    ))
                })
                .map_err(|e| context(e, off))?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.check_writable()?;
        if let Some(a) = &self.raid {
            return a.write_zeroes(offset, len, flags);
        }
        self.for_pieces(offset, len, |dev, pv_off, _, n| {
            dev.write_zeroes(pv_off, n, flags)
        })
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        if let Some(a) = &self.raid {
            return a.cache(offset, len);
        }
        self.for_pieces(offset, len, |dev, pv_off, _, n| dev.cache(pv_off, n))
    }
}
