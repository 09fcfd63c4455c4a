//! `LogWritesDisk`: records every completed write, write_zeroes, discard and flush, and
//! rebuilds the images a crash could leave behind.
//!
//! ```text
//!   layer under test ── LogWritesDisk ── MemDisk
//!                           │ log: [W0, W1 fua, FLUSH, W2, D3, ...]  (completion order)
//!                           └─ WriteLog: image_at_flush(k), crash_image(rng, at), check_crash_state
//! ```
//!
//! # Recording
//! Modifying ops hold one lock across the inner call and the log append, so the log order
//! is the order the inner device applied them in, even with concurrent callers (reads do
//! not take the lock). An op is logged only when the inner call returns `Ok`. Each entry
//! carries two ticks of a [`LogClock`]: `started` (taken on entry, before the lock) and
//! `completed` (taken under the lock when it is logged). Several devices may share a clock,
//! which gives a common time line for crashing a whole stack at one instant.
//!
//! # Crash model
//! The unit is the device's logical block ("sector"): it is written atomically, and
//! nothing bigger is. A crash happens at a [`CrashPoint`], which becomes a time `T`:
//! entries with `completed < T` completed before the crash; entries with
//! `started < T <= completed` were in flight; the rest had not been issued.
//!
//! 1. Let F be the last completed flush. Every entry before F is durable: the **base**
//!    image is the initial image with those entries applied in log order. (Without a
//!    completed flush the base is the initial image.)
//! 2. The entries after F that completed or were in flight are the **candidates**. Each
//!    sector independently holds its base value or the value of any candidate covering it,
//!    in any order, torn per sector: a write's data for that sector; zeroes for
//!    write_zeroes; for discard, zeroes ([`DiscardModel::Zeroes`], what `MemDisk` does) or
//!    anything ([`DiscardModel::Unspecified`], the `BlockDevice` contract). A dropped
//!    discard leaves the older value, which is already a choice.
//! 3. Durability: a *completed* FUA write (or FUA write_zeroes) covering a sector removes
//!    every choice older than it: the sector holds that write's value or the value of a
//!    later candidate covering it (which may have landed on top). In-flight FUA writes were
//!    never acknowledged, so they guarantee nothing.
//!
//! This is exact for a disk with a volatile cache: each value in the set can be the one on
//! media, and nothing else can. Discards before F count as zeroes with `Zeroes` and as
//! unspecified with `Unspecified`.
//!
//! # Crash-testing a stack
//! ```text
//!   let clock = LogClock::new();
//!   members  = LogWritesDisk::with_options(MemDisk::new(n), LogOptions::with_clock(&clock))
//!   stack    = Layer::open(members…)
//!   top      = LogWritesDisk::with_options(stack, LogOptions { clock, discard: Unspecified, .. })
//!   run a workload on `top`; pick T in 0..=clock.now()
//!   images   = member.log().crash_image(&mut rng, CrashPoint::AtTime(T)) for each member
//!   reopen the layer over MemDisk::from_bytes(image)…, recover, read everything back
//!   top.log().check_crash_state(&recovered, CrashPoint::AtTime(T))?
//! ```
//! The top-level log holds its lock across each stack op, so the stack's modifying ops are
//! serialised; use it for crash checks, not for concurrency tests.
//!
//! Put fault injection *above* this device (`FaultyDisk(LogWritesDisk(MemDisk))`): the
//! log assumes a failed inner call changed nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::Rng;

use crate::{BlockDevice, Error, ErrorKind, Geometry, Result, WriteFlags};

/// A shared logical clock ordering log entries across devices. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LogClock(Arc<AtomicU64>);

impl LogClock {
    pub fn new() -> LogClock {
        LogClock::default()
    }

    /// The next tick to be handed out: every event so far happened before `now()`.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// What a discarded sector may read as after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiscardModel {
    /// Zeroes (or the older value, if the discard did not land). What `MemDisk` does.
    #[default]
    Zeroes,
    /// Anything: the [`BlockDevice::discard`] contract. Use it for logs over a layer.
    Unspecified,
}

/// How to build a [`LogWritesDisk`].
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    /// The clock to stamp entries with; a private one if `None`.
    pub clock: Option<LogClock>,
    /// The image at construction; read from the inner device if `None`.
    pub initial: Option<Vec<u8>>,
    pub discard: DiscardModel,
}

impl LogOptions {
    pub fn with_clock(clock: &LogClock) -> LogOptions {
        LogOptions {
            clock: Some(clock.clone()),
            ..LogOptions::default()
        }
    }
}

/// One recorded op.
#[derive(Clone, PartialEq, Eq)]
pub enum LogOp {
    Write {
        offset: u64,
        data: Arc<[u8]>,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        fua: bool,
    },
    Discard {
        offset: u64,
        len: u64,
    },
    Flush,
}

impl LogOp {
    /// The byte range the op changes; `None` for flush.
    pub fn range(&self) -> Option<(u64, u64)> {
        match self {
            LogOp::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            LogOp::WriteZeroes { offset, len, .. } | LogOp::Discard { offset, len } => {
                Some((*offset, *len))
            }
            LogOp::Flush => None,
        }
    }

    /// Whether the op was durable when it completed.
    pub fn fua(&self) -> bool {
        matches!(
            self,
            LogOp::Write { fua: true, .. } | LogOp::WriteZeroes { fua: true, .. }
        )
    }

    pub fn is_flush(&self) -> bool {
        matches!(self, LogOp::Flush)
    }
}

impl fmt::Debug for LogOp {
    // Data is summarised: a log of megabyte writes must stay readable in a panic message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogOp::Write { offset, data, fua } => write!(
                f,
                "write {} bytes at {offset}{}",
                data.len(),
                if *fua { " FUA" } else { "" }
            ),
            LogOp::WriteZeroes { offset, len, fua } => write!(
                f,
                "write_zeroes {len} bytes at {offset}{}",
                if *fua { " FUA" } else { "" }
            ),
            LogOp::Discard { offset, len } => write!(f, "discard {len} bytes at {offset}"),
            LogOp::Flush => write!(f, "flush"),
        }
    }
}

/// A recorded op and the clock ticks bracketing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub op: LogOp,
    /// Taken when the call arrived.
    pub started: u64,
    /// Taken when the inner call had returned and the entry was logged.
    pub completed: u64,
}

/// When a crash happens; see the module docs for what each entry then is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Just after the first `n` log entries completed. Later entries that had started by
    /// then (concurrent callers) count as in flight.
    AfterEntries(usize),
    /// At tick `T` of the log's clock (for crashing several devices sharing one clock).
    AtTime(u64),
}

/// A crash image that no crash could have produced.
#[derive(Debug, Clone)]
pub struct CrashViolation {
    pub at: CrashPoint,
    /// How many sectors hold a value outside their allowed set.
    pub bad_sectors: u64,
    /// Explanations for the first few bad sectors.
    pub examples: Vec<String>,
}

impl fmt::Display for CrashViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "crash image at {:?} is impossible: {} sector(s) hold a value no crash could leave",
            self.at, self.bad_sectors
        )?;
        for e in &self.examples {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CrashViolation {}

/// An immutable snapshot of a log plus the image it started from; all crash maths lives
/// here so it can be done after the device is gone.
#[derive(Clone)]
pub struct WriteLog {
    geometry: Geometry,
    discard: DiscardModel,
    initial: Arc<[u8]>,
    created: u64,
    entries: Vec<LogEntry>,
}

impl fmt::Debug for WriteLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLog")
            .field("geometry", &self.geometry)
            .field("discard", &self.discard)
            .field("created", &self.created)
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// One value a sector may hold.
#[derive(Clone, Copy)]
enum Value<'a> {
    Data(&'a [u8]),
    Zero,
    /// Matches anything; generated as zeroes.
    Any,
}

impl Value<'_> {
    fn matches(&self, got: &[u8]) -> bool {
        match self {
            Value::Data(d) => *d == got,
            Value::Zero => got.iter().all(|&b| b == 0),
            Value::Any => true,
        }
    }
}

/// A candidate entry for one sector.
#[derive(Clone, Copy)]
struct Cand {
    entry: usize,
    /// Completed FUA: nothing older may show.
    durable: bool,
}

/// The state of the log at a crash point.
struct Window {
    /// The log index of the last completed flush.
    flush: Option<usize>,
    /// Entries `[0, base_end)` are durable (everything before the last completed flush).
    base_end: usize,
    /// Candidate entries after that flush, in log order, with their durability.
    cands: Vec<Cand>,
}

/// Whether each sector of the base image is unspecified (discarded with
/// `DiscardModel::Unspecified`), next to the base bytes.
struct Base {
    image: Vec<u8>,
    unspecified: Vec<bool>,
}

impl WriteLog {
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The atomic unit of the crash model: the logical block size.
    pub fn sector_size(&self) -> u64 {
        u64::from(self.geometry.logical_block_size.max(1))
    }

    pub fn discard_model(&self) -> DiscardModel {
        self.discard
    }

    pub fn entries(&self) -> &[LogEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The clock tick at which the device was created; nothing in the log started earlier.
    pub fn created(&self) -> u64 {
        self.created
    }

    pub fn flush_count(&self) -> usize {
        self.entries.iter().filter(|e| e.op.is_flush()).count()
    }

    /// The log index of the `k`-th flush (1-based), if there was one.
    pub fn flush_index(&self, k: usize) -> Option<usize> {
        if k == 0 {
            return None;
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.op.is_flush())
            .nth(k - 1)
            .map(|(i, _)| i)
    }

    /// The image the device started from.
    pub fn initial_image(&self) -> &[u8] {
        &self.initial
    }

    /// The image with the first `n` entries applied in order: what the device held after
    /// them if nothing was lost. `image_after(len())` is the current contents.
    ///
    /// # Panics
    /// If `n > len()`.
    pub fn image_after(&self, n: usize) -> Vec<u8> {
        self.base(n).image
    }

    /// The image guaranteed durable by the `k`-th flush (1-based): everything logged
    /// before it, applied in order. `k == 0` is the initial image.
    ///
    /// # Panics
    /// If `k > flush_count()`.
    pub fn image_at_flush(&self, k: usize) -> Vec<u8> {
        if k == 0 {
            return self.initial.to_vec();
        }
        let idx = self.flush_index(k).unwrap_or_else(|| {
            panic!(
                "image_at_flush({k}): the log has only {} flushes",
                self.flush_count()
            )
        });
        self.image_after(idx)
    }

    /// The first `CrashPoint::AtTime` tick at which the first `n` entries have completed.
    fn time_of(&self, at: CrashPoint) -> u64 {
        match at {
            CrashPoint::AtTime(t) => t,
            CrashPoint::AfterEntries(0) => self.created,
            CrashPoint::AfterEntries(n) => {
                assert!(
                    n <= self.entries.len(),
                    "crash after {n} entries, but the log has only {}",
                    self.entries.len()
                );
                self.entries[n - 1].completed + 1
            }
        }
    }

    fn window(&self, at: CrashPoint) -> Window {
        let t = self.time_of(at);
        // Entries are appended in completion order, so `completed` is increasing.
        let completed = self.entries.partition_point(|e| e.completed < t);
        let flush = self.entries[..completed]
            .iter()
            .rposition(|e| e.op.is_flush());
        let (base_end, first) = flush.map_or((0, 0), |f| (f, f + 1));
        let cands = (first..self.entries.len())
            .filter(|&i| {
                let e = &self.entries[i];
                e.started < t && !e.op.is_flush()
            })
            .map(|i| Cand {
                entry: i,
                durable: i < completed && self.entries[i].op.fua(),
            })
            .collect();
        Window {
            flush,
            base_end,
            cands,
        }
    }

    fn base(&self, n: usize) -> Base {
        assert!(
            n <= self.entries.len(),
            "asked for the image after {n} entries, but the log has only {}",
            self.entries.len()
        );
        let ss = self.sector_size();
        let mut image = self.initial.to_vec();
        let mut unspecified = vec![false; image.len() / to_usize(ss)];
        for e in &self.entries[..n] {
            let Some((offset, len)) = e.op.range() else {
                continue;
            };
            let (o, l) = (to_usize(offset), to_usize(len));
            match &e.op {
                LogOp::Write { data, .. } => image[o..o + l].copy_from_slice(data),
                _ => image[o..o + l].fill(0),
            }
            let any =
                matches!(e.op, LogOp::Discard { .. }) && self.discard == DiscardModel::Unspecified;
            unspecified[to_usize(offset / ss)..to_usize((offset + len) / ss)].fill(any);
        }
        Base { image, unspecified }
    }

    /// The value entry `entry` gives sector `sector` (which it covers).
    fn value(&self, entry: usize, sector: u64) -> Value<'_> {
        let ss = self.sector_size();
        match &self.entries[entry].op {
            LogOp::Write { offset, data, .. } => {
                let at = to_usize(sector * ss - offset);
                Value::Data(&data[at..at + to_usize(ss)])
            }
            LogOp::Discard { .. } if self.discard == DiscardModel::Unspecified => Value::Any,
            _ => Value::Zero,
        }
    }

    /// Candidates per sector, in log order. A BTreeMap so that generation from a seeded
    /// RNG visits sectors in the same order every run.
    fn per_sector(&self, w: &Window) -> BTreeMap<u64, Vec<Cand>> {
        let ss = self.sector_size();
        let mut map: BTreeMap<u64, Vec<Cand>> = BTreeMap::new();
        for c in &w.cands {
            if let Some((offset, len)) = self.entries[c.entry].op.range() {
                for s in offset / ss..(offset + len) / ss {
                    map.entry(s).or_default().push(*c);
                }
            }
        }
        map
    }

    /// A random image a crash at `at` could leave (see the module docs). Each candidate
    /// entry is landed whole, dropped, or torn sector by sector; where several landed on a
    /// sector, the last one usually wins but any may.
    pub fn crash_image<R: Rng + ?Sized>(&self, rng: &mut R, at: CrashPoint) -> Vec<u8> {
        #[derive(Clone, Copy, PartialEq)]
        enum Fate {
            Landed,
            Dropped,
            Torn,
        }
        let w = self.window(at);
        let mut image = self.base(w.base_end).image;
        let fate: BTreeMap<usize, Fate> = w
            .cands
            .iter()
            .map(|c| {
                let f = if c.durable {
                    Fate::Landed
                } else {
                    match rng.gen_range(0..10) {
                        0..=3 => Fate::Landed,
                        4..=6 => Fate::Dropped,
                        _ => Fate::Torn,
                    }
                };
                (c.entry, f)
            })
            .collect();
        let ss = to_usize(self.sector_size());
        for (sector, cands) in self.per_sector(&w) {
            let floor = cands.iter().rposition(|c| c.durable).unwrap_or(0);
            let landed: Vec<Cand> = cands[floor..]
                .iter()
                .copied()
                .filter(|c| match fate[&c.entry] {
                    Fate::Landed => true,
                    Fate::Dropped => c.durable,
                    Fate::Torn => c.durable || rng.gen_bool(0.5),
                })
                .collect();
            // Nothing landed: the base value stays (a durable candidate always lands).
            let Some(&last) = landed.last() else {
                continue;
            };
            let winner = if rng.gen_bool(0.5) {
                last
            } else {
                landed[rng.gen_range(0..landed.len())]
            };
            let dst = &mut image[to_usize(sector) * ss..][..ss];
            match self.value(winner.entry, sector) {
                Value::Data(d) => dst.copy_from_slice(d),
                Value::Zero | Value::Any => dst.fill(0),
            }
        }
        image
    }

    /// Checks that `image` is a state a crash at `at` could leave: every sector holds its
    /// base value or a candidate's value, and nothing older than a completed FUA write or
    /// the last completed flush. Explains the first few bad sectors on failure.
    pub fn check_crash_state(
        &self,
        image: &[u8],
        at: CrashPoint,
    ) -> std::result::Result<(), CrashViolation> {
        const EXAMPLES: usize = 8;
        if image.len() as u64 != self.geometry.size {
            return Err(CrashViolation {
                at,
                bad_sectors: self.geometry.size / self.sector_size(),
                examples: vec![format!(
                    "image is {} bytes, the device {}",
                    image.len(),
                    self.geometry.size
                )],
            });
        }
        let w = self.window(at);
        let base = self.base(w.base_end);
        let per_sector = self.per_sector(&w);
        let ss = to_usize(self.sector_size());
        let mut bad = 0u64;
        let mut examples = Vec::new();
        for (i, got) in image.chunks_exact(ss).enumerate() {
            let sector = i as u64;
            let base_val = &base.image[i * ss..][..ss];
            let base_ok = base.unspecified[i] || base_val == got;
            let ok = match per_sector.get(&sector) {
                None => base_ok,
                Some(cands) => {
                    let floor = cands.iter().rposition(|c| c.durable);
                    (floor.is_none() && base_ok)
                        || cands[floor.unwrap_or(0)..]
                            .iter()
                            .any(|c| self.value(c.entry, sector).matches(got))
                }
            };
            if !ok {
                bad += 1;
                if examples.len() < EXAMPLES {
                    examples.push(self.explain(&w, sector, got, base_val, per_sector.get(&sector)));
                }
            }
        }
        if bad == 0 {
            Ok(())
        } else {
            Err(CrashViolation {
                at,
                bad_sectors: bad,
                examples,
            })
        }
    }

    fn explain(
        &self,
        w: &Window,
        sector: u64,
        got: &[u8],
        base_val: &[u8],
        cands: Option<&Vec<Cand>>,
    ) -> String {
        let ss = self.sector_size();
        let base_name = match w.flush {
            None => "the initial value".to_string(),
            Some(f) => format!("the value at the flush (entry #{f})"),
        };
        let name = |c: &Cand| {
            format!(
                "entry #{} ({:?}{})",
                c.entry,
                self.entries[c.entry].op,
                if c.durable { ", acknowledged" } else { "" }
            )
        };
        let mut allowed = Vec::new();
        let mut overwritten = Vec::new();
        let floor = cands.and_then(|cs| cs.iter().rposition(|c| c.durable));
        if floor.is_none() {
            allowed.push(base_name.clone());
        } else if base_val == got {
            overwritten.push(base_name.clone());
        }
        if let Some(cs) = cands {
            for (j, c) in cs.iter().enumerate() {
                if floor.is_some_and(|f| j < f) {
                    if self.value(c.entry, sector).matches(got) {
                        overwritten.push(name(c));
                    }
                } else {
                    allowed.push(name(c));
                }
            }
        }
        let holds = if overwritten.is_empty() {
            let head: Vec<String> = got.iter().take(8).map(|b| format!("{b:02x}")).collect();
            format!("none of them (starts {})", head.join(" "))
        } else {
            let f = floor
                .and_then(|f| cands.map(|cs| name(&cs[f])))
                .unwrap_or_default();
            format!("{}, which {f} must have replaced", overwritten.join(" / "))
        };
        format!(
            "sector {sector} (bytes {}..{}): allowed {}; holds {holds}",
            sector * ss,
            (sector + 1) * ss,
            allowed.join(", ")
        )
    }
}

fn to_usize(v: u64) -> usize {
    // Every offset here indexes an in-memory image of the whole device, so it fits.
    usize::try_from(v).expect("offset inside an in-memory image")
}

/// A pass-through device that logs every completed modifying op; see the module docs.
pub struct LogWritesDisk<D> {
    inner: D,
    geometry: Geometry,
    discard: DiscardModel,
    initial: Arc<[u8]>,
    clock: LogClock,
    created: u64,
    log: Mutex<Vec<LogEntry>>,
}

impl<D: fmt::Debug> fmt::Debug for LogWritesDisk<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogWritesDisk")
            .field("inner", &self.inner)
            .field("entries", &self.lock().len())
            .finish()
    }
}

impl<D: BlockDevice> LogWritesDisk<D> {
    /// Logs over `inner`, reading its current contents as the initial image.
    pub fn new(inner: D) -> Result<LogWritesDisk<D>> {
        LogWritesDisk::with_options(inner, LogOptions::default())
    }

    pub fn with_options(inner: D, opts: LogOptions) -> Result<LogWritesDisk<D>> {
        let geometry = inner.geometry();
        let size = usize::try_from(geometry.size).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "LogWritesDisk: device of {} bytes does not fit in memory",
                    geometry.size
                ),
            )
        })?;
        let initial = match opts.initial {
            Some(img) if img.len() == size => img,
            Some(img) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "LogWritesDisk: initial image is {} bytes, the device {size}",
                        img.len()
                    ),
                ))
            }
            None => {
                let mut img = vec![0u8; size];
                // In max_io_size pieces: the inner device need not take one huge read.
                let step = usize::try_from(geometry.max_io_size)
                    .unwrap_or(usize::MAX)
                    .max(geometry.logical_block_size as usize)
                    .max(1);
                for (i, chunk) in img.chunks_mut(step).enumerate() {
                    inner
                        .read_at(chunk, (i * step) as u64)
                        .map_err(|e| e.context("LogWritesDisk: reading the initial image"))?;
                }
                img
            }
        };
        let clock = opts.clock.unwrap_or_default();
        let created = clock.now();
        Ok(LogWritesDisk {
            inner,
            geometry,
            discard: opts.discard,
            initial: initial.into(),
            clock,
            created,
            log: Mutex::new(Vec::new()),
        })
    }
}

impl<D> LogWritesDisk<D> {
    fn lock(&self) -> MutexGuard<'_, Vec<LogEntry>> {
        // The log is only ever appended to whole; a panic elsewhere leaves it valid.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn clock(&self) -> &LogClock {
        &self.clock
    }

    /// A snapshot of the log so far, for crash maths.
    pub fn log(&self) -> WriteLog {
        WriteLog {
            geometry: self.geometry,
            discard: self.discard,
            initial: self.initial.clone(),
            created: self.created,
            entries: self.lock().clone(),
        }
    }

    pub fn log_len(&self) -> usize {
        self.lock().len()
    }

    pub fn flush_count(&self) -> usize {
        self.lock().iter().filter(|e| e.op.is_flush()).count()
    }

    /// See [`WriteLog::image_at_flush`].
    pub fn image_at_flush(&self, k: usize) -> Vec<u8> {
        self.log().image_at_flush(k)
    }

    /// See [`WriteLog::crash_image`].
    pub fn crash_image<R: Rng + ?Sized>(&self, rng: &mut R, at: CrashPoint) -> Vec<u8> {
        self.log().crash_image(rng, at)
    }

    /// See [`WriteLog::check_crash_state`].
    pub fn check_crash_state(
        &self,
        image: &[u8],
        at: CrashPoint,
    ) -> std::result::Result<(), CrashViolation> {
        self.log().check_crash_state(image, at)
    }

    /// Runs `f` (the inner call) under the log lock and logs `op` if it succeeded.
    fn logged(&self, op: impl FnOnce() -> LogOp, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let started = self.clock.tick();
        let mut log = self.lock();
        f()?;
        log.push(LogEntry {
            op: op(),
            started,
            completed: self.clock.tick(),
        });
        Ok(())
    }
}

/// It logs the synchronous forms; the `*_then` forms run through them.
impl<D: BlockDevice> crate::Filter for LogWritesDisk<D> {
    type Inner = D;
    const SYNCHRONOUS: bool = true;

    fn inner(&self) -> impl std::ops::Deref<Target = D> + '_ {
        &self.inner
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.logged(
            || LogOp::Write {
                offset,
                data: Arc::from(buf),
                fua: flags.fua(),
            },
            || self.inner.write_at(buf, offset, flags),
        )
    }

    fn flush(&self) -> Result<()> {
        self.logged(|| LogOp::Flush, || self.inner.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.logged(
            || LogOp::Discard { offset, len },
            || self.inner.discard(offset, len),
        )
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.logged(
            || LogOp::WriteZeroes {
                offset,
                len,
                fua: flags.fua(),
            },
            || self.inner.write_zeroes(offset, len, flags),
        )
    }
}

crate::filter_device!([D: BlockDevice] LogWritesDisk<D>);
