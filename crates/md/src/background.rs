//! Background work on a running array, one job at a time, while the array goes on
//! serving I/O: rebuilds onto spares and replacements, resync, and scrubs. Each runs
//! with md's speed limits, shows progress for `cairn status`, and keeps a checkpoint so
//! that a clean stop resumes where it left off.
//!
//! ```text
//!   Array::manage(limits) ─┐   (or fail / add / replace / check: kick())
//!                          v
//!   worker thread: loop { next_work() } ── Replace(role) > Recover(role) > take a spare
//!        │                                  for a down role > Resync > Scrub
//!        │   for each window of units (stripes, or 1 MiB pieces of mirrors) from the
//!        │   checkpoint (pipeline.rs: the next window read meanwhile while unpaced):
//!        │     do it under the write locks; done += window; pace to min/max speed
//!   Array::background() <── progress ─────── Job { action, member, done, total, speed }
//!   Array::close() ── stop flag, join ─────> checkpoints go into the superblocks
//! ```
//!
//! Pacing follows md's `speed_limit_min`/`speed_limit_max`: while clients are doing
//! I/O the work runs at the minimum speed, so foreground requests keep the members;
//! when the array is idle it runs up to the maximum.
//!
//! Checkpoints: the resync's is md's `recovery_cp` (`resync_offset`), written only by
//! a clean stop as md does (a dirty array records 0, so a crash resyncs all); member
//! sectors for RAID1 and RAID4/5/6, always 0 for RAID10 (md counts RAID10 differently).
//! A rebuild's is the member's `recovery_offset`, written every few seconds and at a
//! clean stop (a member part-way through a rebuild reassembles as such).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, Error, ErrorKind, Result};

pub(crate) mod job;

pub(crate) use job::{ratio, Job};
pub use job::{BackgroundStatus, SpeedLimits};

use crate::layout::ArrayLayout;
use crate::pipeline::{MirrorResync, Pipe, Resync, Walk};
use crate::scrub::{ScrubReport, ScrubStage};
use crate::state::{Array, Manager};
use crate::units::{Sectors, SECTOR_SIZE};

/// Paces a job to the speed limits and keeps its speed figure.
pub(crate) struct Pacer {
    limits: Option<SpeedLimits>,
    /// For the speed figure: a start and the bytes done then.
    window: (Instant, u64),
    /// When the previous unit ended (after its pause) and the bytes done then: each
    /// unit is paced on its own, at the limit that holds while it runs.
    mark: (Instant, u64),
    last_fg: u64,
    /// Whether the last step paused; before the first, whether there are limits (the
    /// work counts as paced until a step shows it need not pause).
    paused: bool,
}

impl Pacer {
    pub(crate) fn new(array: &Array, limits: Option<SpeedLimits>, done: u64) -> Pacer {
        Pacer {
            limits,
            window: (Instant::now(), done),
            mark: (Instant::now(), done),
            last_fg: array.foreground_ops(),
            paused: limits.is_some(),
        }
    }

    /// Whether clients did I/O since the last look.
    fn busy(&mut self, array: &Array) -> bool {
        let fg = array.foreground_ops();
        let busy = fg != self.last_fg;
        self.last_fg = fg;
        busy
    }

    /// Whether the work runs unpaced: no limits, or the last step did not pause and
    /// clients did no I/O since. Only then may it read ahead (holding the next stripes'
    /// locks), since a pause never holds one.
    pub(crate) fn unhindered(&self, array: &Array) -> bool {
        self.limits.is_none() || (!self.paused && array.foreground_ops() == self.last_fg)
    }

    /// Whether [`Pacer::step`] at `done` would pause (as things stand now).
    pub(crate) fn pause_due(&self, array: &Array, done: u64) -> bool {
        let Some(limits) = self.limits else {
            return false;
        };
        let busy = array.foreground_ops() != self.last_fg;
        let target = if busy { limits.min } else { limits.max }.max(1);
        let bytes = done.saturating_sub(self.mark.1);
        Duration::from_secs_f64(ratio(bytes, target)) > self.mark.0.elapsed()
    }

    /// After a unit: pauses so that the unit took `bytes / limit` at least (the minimum
    /// while clients do I/O, the maximum otherwise, looked at again every 100 ms so a
    /// pause ends early when clients stop, and at once when the work is asked to stop),
    /// and updates the job's speed.
    pub(crate) fn step(&mut self, array: &Array, job: Option<&Job>, done: u64) {
        self.paused = false;
        if let Some(limits) = self.limits {
            let bytes = done.saturating_sub(self.mark.1);
            let mut busy = self.busy(array);
            loop {
                let target = if busy { limits.min } else { limits.max }.max(1);
                let due = Duration::from_secs_f64(ratio(bytes, target));
                let elapsed = self.mark.0.elapsed();
                if due <= elapsed || array.stopping() {
                    break;
                }
                self.paused = true;
                thread::sleep((due - elapsed).min(Duration::from_millis(100)));
                busy = self.busy(array);
            }
        }
        self.mark = (Instant::now(), done);
        let moved = done.saturating_sub(self.window.1);
        let elapsed = self.window.0.elapsed();
        if let Some(j) = job {
            if elapsed >= Duration::from_millis(200) {
                let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                j.speed.store(
                    moved.saturating_mul(1000) / millis.max(1),
                    Ordering::Relaxed,
                );
            }
        }
        if elapsed >= Duration::from_secs(2) {
            self.window = (Instant::now(), done);
        }
        array.job_progress(job);
    }
}

/// The unit of resync work: where it starts, in the terms each layout resyncs by.
#[derive(Debug, Clone, Copy)]
enum Units {
    /// RAID4/5/6: stripes `[from, to)`, each `bytes` of array data.
    Stripes { from: u64, to: u64, bytes: u64 },
    /// RAID1/10: array bytes `[from, to)` in steps.
    Bytes { from: u64, to: u64 },
    /// Nothing to make agree (linear, RAID0).
    None,
}

pub(crate) const MIRROR_STEP: u64 = 1 << 20;

/// Job numbers (process-wide, so they never repeat for an array).
static JOB_IDS: AtomicU64 = AtomicU64::new(0);

/// What the worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Copy the member of a role onto its replacement.
    Replace(usize),
    /// Rebuild the member of a role (a spare that took it over, or a re-added member).
    Recover(usize),
    Resync,
    /// A scrub: `true` repairs.
    Scrub(bool),
}

impl Array {
    fn manager(&self) -> std::sync::MutexGuard<'_, Manager> {
        self.manager.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn resync_units(&self, from: Sectors) -> Units {
        match &self.layout {
            ArrayLayout::Parity(pl) => {
                let c = pl.chunk().0;
                let bytes = c * SECTOR_SIZE * pl.data_disks() as u64;
                Units::Stripes {
                    from: (from.0 / c).min(pl.stripes()),
                    to: pl.stripes(),
                    bytes,
                }
            }
            ArrayLayout::Raid1(_) => Units::Bytes {
                from: (from.0 * SECTOR_SIZE).min(self.size_bytes()),
                to: self.size_bytes(),
            },
            ArrayLayout::Raid10(_) => Units::Bytes {
                from: 0,
                to: self.size_bytes(),
            },
            ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => Units::None,
        }
    }

    /// Sectors per chunk of a parity layout (1 otherwise).
    fn resync_chunk_sectors(&self) -> u64 {
        match &self.layout {
            ArrayLayout::Parity(pl) => pl.chunk().0,
            _ => 1,
        }
    }

    /// Resyncs one unit; returns the array bytes it worked on (none where the bitmap
    /// guides the resync and says the unit is clean) and the checkpoint (member
    /// sectors) after it.
    fn resync_unit(&self, units: Units, i: u64) -> Result<(u64, Sectors)> {
        match (units, &self.layout) {
            (Units::Stripes { bytes, .. }, ArrayLayout::Parity(pl)) => {
                let did = self.resync_stripe_if_dirty(pl, i)?;
                Ok((if did { bytes } else { 0 }, Sectors((i + 1) * pl.chunk().0)))
            }
            (Units::Bytes { to, .. }, layout) => {
                let n = MIRROR_STEP.min(to - i);
                let worked = self.resync_mirrors_if_dirty(i, n)?;
                let cp = match layout {
                    ArrayLayout::Raid1(_) => Sectors((i + n) / SECTOR_SIZE),
                    _ => Sectors::ZERO,
                };
                Ok((worked, cp))
            }
            _ => Ok((0, Sectors::ZERO)),
        }
    }

    /// The array bytes a resync works on before its starting unit and from it to the
    /// end: every unit's, or only the dirty ones' when the bitmap guides the resync.
    /// Progress and the speed limits count these, so that the resync of a few dirty
    /// chunks (and the window in which losing a member loses data) is as short as
    /// those chunks, not as the array.
    fn resync_work(&self, units: Units) -> (u64, u64) {
        if !self.bitmap_guides_resync() {
            return match units {
                Units::Stripes { from, to, bytes } => (from * bytes, (to - from) * bytes),
                Units::Bytes { from, to } => (from, to - from),
                Units::None => (0, 0),
            };
        }
        match (units, &self.layout) {
            (Units::Stripes { from, to, bytes }, ArrayLayout::Parity(pl)) => {
                let count = |r: std::ops::Range<u64>| {
                    crate::units::wide(r.filter(|&i| self.resync_stripe_needed(pl, i)).count())
                        * bytes
                };
                (count(0..from), count(from..to))
            }
            (Units::Bytes { from, to }, _) => {
                let sum = |a: u64, b: u64| -> u64 {
                    self.mirror_resync_pieces(a, b - a)
                        .iter()
                        .map(|p| p.1)
                        .sum()
                };
                (sum(0, from), sum(from, to))
            }
            _ => (0, 0),
        }
    }

    /// Whether background work was asked to stop (the array is closing).
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Runs the resync from the checkpoint to the end, pacing with `limits` (`None`:
    /// as fast as possible). Returns false when stopped early.
    pub(crate) fn run_resync(
        &self,
        limits: Option<SpeedLimits>,
        job: Option<&Job>,
    ) -> Result<bool> {
        let from = self.meta_lock().resync_from;
        let units = self.resync_units(from);
        let (start, end, step) = match units {
            Units::Stripes { from, to, .. } => (from, to, 1),
            Units::Bytes { from, to } => (from, to, MIRROR_STEP),
            Units::None => (0, 0, 1),
        };
        let (before, work) = self.resync_work(units);
        let mut done = before;
        if let Some(j) = job {
            j.total.store(before + work, Ordering::Relaxed);
            j.done.store(done, Ordering::Relaxed);
        }
        let mut pacer = Pacer::new(self, limits, done);
        let mut last_cp = Instant::now();
        let mut i = start;
        let mut cp = from;
        // Windows of units (stripes, or MIRROR_STEP of mirrors), the next one read
        // meanwhile (pipeline.rs). A unit of the walk is `(i - start) / step`.
        let mut pipe: Option<Box<dyn Walk + '_>> = match (&self.layout, units) {
            (ArrayLayout::Parity(pl), Units::Stripes { to, .. }) => Some(Box::new(Pipe::new(
                self,
                Resync { array: self, pl },
                pl.chunk().0 * SECTOR_SIZE,
                to,
            ))),
            (ArrayLayout::Raid1(_) | ArrayLayout::Raid10(_), Units::Bytes { from, to }) => {
                let stage = MirrorResync {
                    array: self,
                    from,
                    to,
                    step: MIRROR_STEP,
                };
                let count = (to - from).div_ceil(MIRROR_STEP);
                Some(Box::new(Pipe::new(self, stage, MIRROR_STEP, count)))
            }
            _ => None,
        };
        while i < end {
            if self.stopping() {
                drop(pipe);
                self.meta_lock().resync_from = cp;
                return Ok(false);
            }
            let (worked, at, n) = match (pipe.as_mut(), units) {
                (Some(pipe), Units::Stripes { .. }) => {
                    let (count, worked) = pipe.step(i, pacer.unhindered(self))?;
                    let c = self.resync_chunk_sectors();
                    (worked, Sectors((i + count) * c), count)
                }
                (Some(pipe), Units::Bytes { .. }) => {
                    let (count, worked) = pipe.step((i - start) / step, pacer.unhindered(self))?;
                    let n = (count * step).min(end - i);
                    let cp = match self.layout {
                        ArrayLayout::Raid1(_) => Sectors((i + n) / SECTOR_SIZE),
                        _ => Sectors::ZERO,
                    };
                    (worked, cp, n)
                }
                _ => {
                    let (worked, at) = self.resync_unit(units, i)?;
                    (worked, at, step)
                }
            };
            cp = at;
            done += worked;
            i += n;
            if let Some(j) = job {
                // Writes during the resync can dirty more than was counted at its start.
                j.total.fetch_max(done, Ordering::Relaxed);
                j.done.store(done, Ordering::Relaxed);
                j.worked.fetch_add(worked, Ordering::Relaxed);
            }
            if last_cp.elapsed() >= Duration::from_secs(1) || i >= end {
                self.meta_lock().resync_from = cp;
                last_cp = Instant::now();
            }
            if pacer.pause_due(self, done) {
                // A pause for the speed limits holds no stripe lock.
                if let Some(pipe) = pipe.as_mut() {
                    pipe.drop_ahead();
                }
            }
            pacer.step(self, job, done);
        }
        drop(pipe);
        self.finish_resync()?;
        Ok(true)
    }

    /// Lets the array run its own background work from now on: rebuilds onto spares
    /// when a member fails or one is added, replacements, a pending resync, and scrubs
    /// asked for with [`Array::request_scrub`], each paced by `limits`. Starts whatever
    /// is pending now. From then on an idle array is also marked clean after the
    /// safe-mode delay (safemode.rs).
    pub fn manage(self: &Arc<Self>, limits: SpeedLimits) {
        let first = {
            let mut m = self.manager();
            let first = m.me.is_none();
            m.me = Some(Arc::downgrade(self));
            m.limits = Some(limits);
            first
        };
        if first && self.bitmap_chunk().is_some() {
            self.start_bitmap_daemon();
        }
        if first {
            self.start_safe_mode();
        }
        self.kick();
    }

    /// md's bitmap daemon: every second, clears the bits of chunks that have been idle
    /// and flushed for the daemon sleep, so they do not wait for the next client flush
    /// or the stop.
    fn start_bitmap_daemon(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let spawned = thread::Builder::new()
            .name("md-bitmap".into())
            .spawn(move || loop {
                thread::sleep(Duration::from_secs(1));
                let Some(array) = weak.upgrade() else { return };
                if array.stopping() {
                    return;
                }
                if let Err(e) = array.bitmap_daemon_work() {
                    tracing::warn!("{}: clearing bitmap bits: {e}", array.array_label());
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "{}: cannot start the bitmap daemon: {e}",
                self.array_label()
            );
        }
    }

    /// Starts resyncing in the background when a resync is pending (and lets the array
    /// manage its background work, [`Array::manage`]). Returns whether a resync is now
    /// running.
    pub fn start_resync(self: &Arc<Self>, limits: SpeedLimits) -> Result<bool> {
        if !self.meta_lock().resync_pending {
            return Ok(false);
        }
        self.check_resync_possible()?;
        self.manage(limits);
        Ok(self
            .background()
            .is_some_and(|s| s.action == "resync" && s.state == "running"))
    }

    /// Starts the worker thread if the array is managed, work is pending and no worker
    /// runs. Safe to call from anywhere, the I/O path included.
    pub(crate) fn kick(&self) {
        if self.stopping() {
            return;
        }
        let mut m = self.manager();
        let Some(me) = m.me.clone() else { return };
        if m.thread.as_ref().is_some_and(|(_, h)| !h.is_finished()) {
            return;
        }
        // Claim the first job now, so that status shows it as soon as this returns.
        let Some(work) = self.next_work(&mut m) else {
            return;
        };
        let first = self.job_for(work);
        m.job = Some(first.clone());
        let limits = m.limits;
        let spawned = thread::Builder::new()
            .name("md-background".into())
            .spawn(move || {
                let Some(array) = me.upgrade() else { return };
                array.worker(limits, work, first);
            });
        match spawned {
            Ok(h) => m.thread = Some((h.thread().id(), h)),
            Err(e) => tracing::warn!("{}: cannot start background work: {e}", self.array_label()),
        }
    }

    fn job_for(&self, work: Work) -> Arc<Job> {
        let (action, member, total) = match work {
            Work::Replace(r) => (
                "replace",
                self.slots[r].replacement().map(|m| m.name.clone()),
                self.member_extent_bytes(),
            ),
            Work::Recover(r) => (
                "recovery",
                self.slots[r].member().map(|m| m.name.clone()),
                self.member_extent_bytes(),
            ),
            Work::Resync => {
                let from = self.meta_lock().resync_from;
                let (before, work) = self.resync_work(self.resync_units(from));
                ("resync", None, before + work)
            }
            Work::Scrub(repair) => (
                if repair { "repair" } else { "check" },
                None,
                self.size_bytes(),
            ),
        };
        let id = JOB_IDS.fetch_add(1, Ordering::Relaxed) + 1;
        Arc::new(Job::new(id, action, member, total))
    }

    fn worker(&self, limits: Option<SpeedLimits>, first: Work, job: Arc<Job>) {
        let mut next = Some((first, job));
        while let Some((work, job)) = next.take() {
            let label = self.array_label().to_string();
            let what = match &job.member {
                Some(m) => format!("{} of {m}", job.action),
                None => job.action.to_string(),
            };
            tracing::info!("{label}: {what} started");
            let _told = crate::observe::JobWatch::new(self, &job);
            let r = self.run_work(work, limits, &job);
            match r {
                Ok(true) => {
                    job.set_state("finished");
                    tracing::info!("{label}: {what} finished");
                }
                Ok(false) => {
                    job.set_state("stopped");
                    tracing::info!("{label}: {what} stopped; it resumes at the next start");
                    return;
                }
                Err(e) => {
                    job.set_state(format!("failed: {e}"));
                    tracing::warn!("{label}: {what} failed: {e}");
                    if matches!(work, Work::Resync | Work::Scrub(_)) {
                        return;
                    }
                }
            }
            if self.stopping() {
                return;
            }
            let mut m = self.manager();
            if let Some(w) = self.next_work(&mut m) {
                let j = self.job_for(w);
                m.job = Some(j.clone());
                next = Some((w, j));
            }
        }
    }

    fn run_work(&self, work: Work, limits: Option<SpeedLimits>, job: &Job) -> Result<bool> {
        match work {
            Work::Replace(role) => self.run_replace(role, limits, Some(job)),
            Work::Recover(role) => self.run_recovery(role, limits, Some(job)),
            Work::Resync => {
                self.check_resync_possible()?;
                self.run_resync(limits, Some(job))
            }
            Work::Scrub(repair) => self.run_scrub(repair, limits, Some(job)),
        }
    }

    /// The next piece of work, in md's order: replacements and rebuilds first, then a
    /// spare for a role that is down, then a pending resync, then a scrub.
    fn next_work(&self, m: &mut Manager) -> Option<Work> {
        if !self.layout_is_redundant() {
            return None;
        }
        for role in 0..self.slots.len() {
            if self.slots[role].replacement().is_some() && self.is_writable(role) {
                return Some(Work::Replace(role));
            }
        }
        for role in 0..self.slots.len() {
            if self.is_writable(role) && !self.is_up(role) {
                return Some(Work::Recover(role));
            }
        }
        if let Some(role) = self.take_spare() {
            return Some(Work::Recover(role));
        }
        let resync = self.meta_lock().resync_pending;
        if resync && self.check_resync_possible().is_ok() {
            return Some(Work::Resync);
        }
        if let Some(repair) = m.scrub.take() {
            return Some(Work::Scrub(repair));
        }
        None
    }

    /// Asks for a check (`repair` false) or repair of the whole array in the background
    /// (the array must be managed, [`Array::manage`]). Progress and the result show in
    /// [`Array::background`] and [`Array::last_scrub`].
    pub fn request_scrub(&self, repair: bool) -> Result<()> {
        self.check_scrub_possible(repair)?;
        {
            let mut m = self.manager();
            if m.me.is_none() {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{}: background work is not enabled on this array",
                        self.array_label()
                    ),
                ));
            }
            if m.job
                .as_ref()
                .is_some_and(|j| j.status().state == "running")
            {
                let running = m.job.as_ref().map(|j| j.action).unwrap_or("work");
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{}: a {running} is running; try again when it has finished",
                        self.array_label()
                    ),
                ));
            }
            m.scrub = Some(repair);
            m.last_scrub = None;
        }
        self.kick();
        Ok(())
    }

    /// Runs every pending piece of work (rebuilds, spares taking over, resync) in this
    /// thread, as fast as possible. For tests and offline tools.
    pub fn run_pending(&self) -> Result<()> {
        loop {
            let work = {
                let mut m = self.manager();
                self.next_work(&mut m)
            };
            let Some(work) = work else { return Ok(()) };
            let job = self.job_for(work);
            self.manager().job = Some(job.clone());
            match self.run_work(work, None, &job) {
                Ok(true) => job.set_state("finished"),
                Ok(false) => {
                    job.set_state("stopped");
                    return Ok(());
                }
                Err(e) => {
                    job.set_state(format!("failed: {e}"));
                    return Err(e);
                }
            }
        }
    }

    /// A check or repair of the whole array (scrub.rs does each unit), paced like the
    /// rest; the report so far is kept for [`Array::last_scrub`].
    fn run_scrub(
        &self,
        repair: bool,
        limits: Option<SpeedLimits>,
        job: Option<&Job>,
    ) -> Result<bool> {
        self.check_scrub_possible(repair)?;
        let units = self.scrub_units()?;
        let stage = ScrubStage::new(self, repair, units);
        let unit = stage.member_unit();
        // Windows of units, the next one read while the current one is compared and
        // repaired (pipeline.rs); only while unpaced, and given up before a pause.
        let mut pipe = Pipe::new(self, stage, unit, units.count);
        let mut pacer = Pacer::new(self, limits, 0);
        let mut published = Instant::now();
        let mut done = 0;
        let mut i = 0;
        while i < units.count {
            if self.stopping() {
                pipe.drop_ahead();
                self.manager().last_scrub = Some(pipe.stage().report());
                return Ok(false);
            }
            let (count, bytes) = pipe.step(i, pacer.unhindered(self))?;
            i += count;
            done += bytes;
            if let Some(j) = job {
                j.done.store(done, Ordering::Relaxed);
                j.worked.store(done, Ordering::Relaxed);
            }
            if published.elapsed() >= Duration::from_secs(1) {
                self.manager().last_scrub = Some(pipe.stage().report());
                published = Instant::now();
            }
            if pacer.pause_due(self, done) {
                // A pause for the speed limits holds no lock.
                pipe.drop_ahead();
            }
            pacer.step(self, job, done);
        }
        pipe.drop_ahead();
        let mut report = pipe.stage().report();
        drop(pipe);
        if repair {
            self.flush()?;
        }
        report.complete = true;
        let regions = report.regions.len() as u64 + report.regions_omitted;
        if report.mismatch_sectors > 0 || report.read_errors > 0 {
            tracing::warn!(
                "{}: {} found {} mismatched sectors in {regions} regions and {} read errors{}",
                self.array_label(),
                if repair { "repair" } else { "check" },
                report.mismatch_sectors,
                report.read_errors,
                if repair { " (repaired)" } else { "" }
            );
        }
        self.manager().last_scrub = Some(report);
        Ok(true)
    }

    /// The report of the check or repair running now or last run, if any.
    pub fn last_scrub(&self) -> Option<ScrubReport> {
        self.manager().last_scrub.clone()
    }

    /// The background work, running or last finished.
    pub fn background(&self) -> Option<BackgroundStatus> {
        self.manager().job.as_ref().map(|j| j.status())
    }

    /// Asks the background work to stop and waits for it (unless called from it).
    pub(crate) fn stop_background(&self) {
        self.stopping.store(true, Ordering::Release);
        let t = self.manager().thread.take();
        if let Some((id, handle)) = t {
            if id != thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
