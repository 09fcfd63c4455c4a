//! The observer types, below the array's state (which holds an [`Observers`]) and its
//! report (which carries a [`Failure`]); observe.rs adds the array's side.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::background::job::BackgroundStatus;

/// Why a member was failed and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// The I/O error that failed it, or the operator's action ("marked faulty by the
    /// operator").
    pub reason: String,
    /// When, in seconds since the Unix epoch.
    pub since_unix: u64,
}

/// A change of an array's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MdEvent {
    /// A member was failed (by an I/O error or by the operator) and is out of the array.
    MemberFailed {
        member: String,
        role: Option<u32>,
        failure: Failure,
    },
    /// A member was added (as a spare, or re-added into its old role).
    MemberAdded { member: String, message: String },
    /// A faulty member, a spare or a replacement was taken out of the array.
    MemberRemoved { member: String },
    /// The array lost redundancy; `state` is md's words for it ("clean, degraded").
    Degraded { state: String },
    /// Background work started (resync, recovery, replace, check, repair).
    JobStarted(BackgroundStatus),
    /// Background work passed `percent` (20, 40, 60 or 80).
    JobProgress { job: BackgroundStatus, percent: u64 },
    /// Background work ended: its state says how ("finished", "stopped", "failed: ...");
    /// for a check or repair, the mismatched sectors it found.
    JobEnded {
        job: BackgroundStatus,
        mismatch_sectors: Option<u64>,
    },
}

/// What the layer above registers on an array ([`Array::observe`]).
pub trait Observer: Send + Sync {
    /// `array` is the array's name as its report gives it.
    fn md_event(&self, array: &str, event: &MdEvent);
}

/// The array's observers and what it remembers of failures.
#[derive(Default)]
pub(crate) struct Observers {
    pub(crate) sinks: Mutex<Vec<Arc<dyn Observer>>>,
    /// Failed members by name: why and since when (kept until the member is removed or
    /// added again).
    pub(crate) failures: Mutex<Vec<(String, Failure)>>,
    /// Whether the array was degraded when last looked at, for the Degraded event.
    pub(crate) degraded: AtomicBool,
    /// The job whose milestones are being told, and the last milestone told:
    /// `id << 8 | percent`.
    pub(crate) milestone: AtomicU64,
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
