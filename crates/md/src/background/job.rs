//! What background work reports and is paced by: md's speed limits, a job's progress
//! and its snapshot for status. Data only; the work itself is in background.rs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// md's `speed_limit_min` and `speed_limit_max`, in bytes per second of the work: member
/// bytes for rebuilds and replacements (as md counts them), array bytes for resyncs and
/// scrubs.
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
    /// Counts the array's jobs from 1: a new number is a new job, even one that started
    /// and finished between two looks.
    pub id: u64,
    /// "resync", "recovery", "replace", "check" or "repair".
    pub action: &'static str,
    /// The member a recovery or replacement writes to.
    pub member: Option<String>,
    /// "running", "finished", "stopped" or "failed: <reason>".
    pub state: String,
    /// Bytes done, counting from the start (a resumed job starts at its checkpoint):
    /// array bytes for resync and scrubs, member bytes for rebuilds. A resync the
    /// bitmap guides counts only the dirty regions, in `done_bytes` and `total_bytes`.
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Average speed over the last few seconds.
    pub bytes_per_sec: u64,
    /// Bytes actually rebuilt or resynced (a bitmap-driven job skips clean regions).
    pub worked_bytes: u64,
}

/// `a / b` as seconds, for pacing (exact enough: the result is a sleep).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// One piece of background work.
pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) action: &'static str,
    pub(crate) member: Option<String>,
    pub(crate) done: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) speed: AtomicU64,
    pub(crate) worked: AtomicU64,
    pub(crate) state: Mutex<String>,
}

impl Job {
    pub(crate) fn new(id: u64, action: &'static str, member: Option<String>, total: u64) -> Job {
        Job {
            id,
            action,
            member,
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            speed: AtomicU64::new(0),
            worked: AtomicU64::new(0),
            state: Mutex::new("running".into()),
        }
    }

    pub(crate) fn status(&self) -> BackgroundStatus {
        BackgroundStatus {
            id: self.id,
            action: self.action,
            member: self.member.clone(),
            state: self
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            done_bytes: self.done.load(Ordering::Relaxed),
            total_bytes: self.total.load(Ordering::Relaxed),
            bytes_per_sec: self.speed.load(Ordering::Relaxed),
            worked_bytes: self.worked.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set_state(&self, s: impl Into<String>) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = s.into();
    }
}
