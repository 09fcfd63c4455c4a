//! Background work on a running array: resync (parity and mirrors made to agree with
//! the data) while the array goes on serving I/O, with md's speed limits, progress for
//! `cairn status`, and a checkpoint so that a clean stop resumes where it left off.
//!
//! ```text
//!   Array::start_resync(limits) ── thread ──> for each unit (a stripe, or 1 MiB of
//!        │                                    mirrors) from the checkpoint:
//!        │                                      resync it under the write locks
//!        │                                      done += unit; pace to min/max speed
//!        │                                      every 1 s: checkpoint = position
//!   Array::background() <── progress ──────── Job { done, total, speed, state }
//!   Array::close() ── stop flag, join ──────> the checkpoint goes into resync_offset
//! ```
//!
//! Pacing follows md's `speed_limit_min`/`speed_limit_max`: while clients are doing
//! I/O the resync runs at the minimum speed, so foreground requests keep the members;
//! when the array is idle it runs up to the maximum.
//!
//! The checkpoint is md's `recovery_cp` (`resync_offset` in the superblock): written
//! only by a clean stop, as md does (a dirty array records 0, so a crash resyncs all).
//! It is in member sectors for RAID1 and RAID4/5/6; for RAID10 cairn always records 0,
//! since md counts RAID10 resync progress differently.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use cairn_block::Result;

use crate::array::Array;
use crate::layout::ArrayLayout;
use crate::units::{Sectors, SECTOR_SIZE};

/// md's `speed_limit_min` and `speed_limit_max`, in bytes per second of array data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeedLimits {
    /// The speed kept while clients are doing I/O (md's default: 1000 KiB/s).
    pub min: u64,
    /// The ceiling when the array is otherwise idle (md's default: 200000 KiB/s).
    pub max: u64,
}

impl Default for SpeedLimits {
    fn default() -> SpeedLimits {
        SpeedLimits {
            min: 1000 * 1024,
            max: 200_000 * 1024,
        }
    }
}

/// A snapshot of the background work, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackgroundStatus {
    /// "resync".
    pub action: &'static str,
    /// "running", "finished", "stopped" or "failed: <reason>".
    pub state: String,
    /// Array bytes done, counting from the array's start (a resumed resync starts at
    /// its checkpoint).
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Average speed over the last few seconds.
    pub bytes_per_sec: u64,
}

/// `a / b` as seconds, for pacing (exact enough: the result is a sleep).
#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// One piece of background work.
pub(crate) struct Job {
    action: &'static str,
    done: AtomicU64,
    total: u64,
    speed: AtomicU64,
    stop: AtomicBool,
    state: Mutex<String>,
    thread: Mutex<Option<(ThreadId, JoinHandle<()>)>>,
}

impl Job {
    fn status(&self) -> BackgroundStatus {
        BackgroundStatus {
            action: self.action,
            state: self
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            done_bytes: self.done.load(Ordering::Relaxed),
            total_bytes: self.total,
            bytes_per_sec: self.speed.load(Ordering::Relaxed),
        }
    }

    fn set_state(&self, s: impl Into<String>) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = s.into();
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

const MIRROR_STEP: u64 = 1 << 20;

impl Array {
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

    /// Resyncs one unit; returns the array bytes it covered and the checkpoint (member
    /// sectors) after it.
    fn resync_unit(&self, units: Units, i: u64) -> Result<(u64, Sectors)> {
        match (units, &self.layout) {
            (Units::Stripes { bytes, .. }, ArrayLayout::Parity(pl)) => {
                self.resync_stripe_if_dirty(pl, i)?;
                Ok((bytes, Sectors((i + 1) * pl.chunk().0)))
            }
            (Units::Bytes { to, .. }, layout) => {
                let n = MIRROR_STEP.min(to - i);
                self.resync_mirrors_if_dirty(i, n)?;
                let cp = match layout {
                    ArrayLayout::Raid1(_) => Sectors((i + n) / SECTOR_SIZE),
                    _ => Sectors::ZERO,
                };
                Ok((n, cp))
            }
            _ => Ok((0, Sectors::ZERO)),
        }
    }

    /// Runs the resync from the checkpoint to the end, pacing with `limits` (`None`:
    /// as fast as possible) and stopping early when `stop` is set.
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
        let mut done = match units {
            Units::Stripes { from, bytes, .. } => from * bytes,
            Units::Bytes { from, .. } => from,
            Units::None => 0,
        };
        if let Some(j) = job {
            j.done.store(done, Ordering::Relaxed);
        }
        let mut window = (Instant::now(), done);
        let mut last_fg = self.foreground_ops();
        let mut last_cp = Instant::now();
        let mut i = start;
        let mut cp = from;
        while i < end {
            if job.is_some_and(|j| j.stop.load(Ordering::Acquire)) {
                self.meta_lock().resync_from = cp;
                return Ok(false);
            }
            let (bytes, at) = self.resync_unit(units, i)?;
            cp = at;
            done += bytes;
            i += step;
            if let Some(j) = job {
                j.done.store(done, Ordering::Relaxed);
            }
            if last_cp.elapsed() >= Duration::from_secs(1) || i >= end {
                self.meta_lock().resync_from = cp;
                last_cp = Instant::now();
            }
            let Some(limits) = limits else { continue };
            // Pace: at the minimum while clients did I/O since the last unit.
            let fg = self.foreground_ops();
            let busy = fg != last_fg;
            last_fg = fg;
            let target = if busy { limits.min } else { limits.max }.max(1);
            let elapsed = window.0.elapsed();
            let moved = done - window.1;
            let due = Duration::from_secs_f64(ratio(moved, target));
            if due > elapsed {
                thread::sleep((due - elapsed).min(Duration::from_millis(500)));
            }
            let elapsed = window.0.elapsed();
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
                window = (Instant::now(), done);
            }
        }
        self.finish_resync()?;
        Ok(true)
    }

    /// Starts resyncing in the background when a resync is pending. Returns whether a
    /// job was started (false: nothing pending, or one is running already).
    pub fn start_resync(self: &Arc<Self>, limits: SpeedLimits) -> Result<bool> {
        if !self.meta_lock().resync_pending {
            return Ok(false);
        }
        self.check_resync_possible()?;
        let mut slot = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|j| j.status().state == "running") {
            return Ok(false);
        }
        let job = Arc::new(Job {
            action: "resync",
            done: AtomicU64::new(0),
            total: self.size_bytes(),
            speed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            state: Mutex::new("running".into()),
            thread: Mutex::new(None),
        });
        let weak: Weak<Array> = Arc::downgrade(self);
        let j = job.clone();
        let label = self.array_label().to_string();
        tracing::info!("{label}: resync started in the background");
        let handle = thread::Builder::new()
            .name("md-resync".into())
            .spawn(move || {
                let Some(array) = weak.upgrade() else { return };
                match array.run_resync(Some(limits), Some(&j)) {
                    Ok(true) => {
                        j.set_state("finished");
                        tracing::info!("{label}: resync finished");
                    }
                    Ok(false) => {
                        j.set_state("stopped");
                        tracing::info!("{label}: resync stopped; it resumes at the next start");
                    }
                    Err(e) => {
                        j.set_state(format!("failed: {e}"));
                        tracing::warn!("{label}: resync failed: {e}");
                    }
                }
            })
            .map_err(|e| {
                cairn_block::Error::new(
                    cairn_block::ErrorKind::Io,
                    format!("starting the resync thread: {e}"),
                )
            })?;
        *job.thread.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((handle.thread().id(), handle));
        *slot = Some(job);
        Ok(true)
    }

    /// The background work, running or last finished.
    pub fn background(&self) -> Option<BackgroundStatus> {
        self.background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|j| j.status())
    }

    /// Asks the background work to stop and waits for it (unless called from it).
    pub(crate) fn stop_background(&self) {
        let job = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(job) = job else { return };
        job.stop.store(true, Ordering::Release);
        let t = job
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((id, handle)) = t {
            if id != thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
