//! Telling the layer above the moment an array's state changes, instead of leaving it
//! to look for changes: a member fails or is removed or added, the array becomes
//! degraded, background work starts, passes 20/40/60/80 % or ends.
//!
//! ```text
//!   fail_member, fail/remove/add (members.rs) ─┐
//!   worker start/end, Pacer::step (background) ─┼─ Array::notify ─ each Observer (the daemon:
//!                                                │                  events, --on-event hooks)
//!   failures: member name -> why and since when ─┴─ report(): MemberReport::failure
//! ```
//!
//! Observers are called on the thread that made the change, in the order the changes
//! happened, never with the metadata lock held, but possibly inside the data path: an
//! observer returns quickly and does not call back into the array.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::background::job::Job;
use crate::state::Array;

pub(crate) mod types;
pub(crate) use types::now_unix;
pub use types::{Failure, MdEvent, Observer};

impl Array {
    /// Registers `observer`: from now on it hears of every state change as it happens.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        let degraded = self.down_mask().iter().any(|&d| d);
        self.observers.degraded.store(degraded, Ordering::Release);
        self.observers
            .sinks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(observer);
    }

    /// Tells every observer; then, after a change of members or the end of a job, tells
    /// them too when the array has just become degraded. Not to be called with the
    /// metadata lock held.
    pub(crate) fn notify(&self, event: MdEvent) {
        let sinks = self
            .observers
            .sinks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if sinks.is_empty() {
            return;
        }
        let name = self.identity.set_name.to_string_lossy();
        for s in &sinks {
            s.md_event(&name, &event);
        }
        if matches!(
            event,
            MdEvent::MemberFailed { .. } | MdEvent::MemberRemoved { .. } | MdEvent::JobEnded { .. }
        ) {
            let degraded = self.down_mask().iter().any(|&d| d);
            let was = self.observers.degraded.swap(degraded, Ordering::AcqRel);
            if degraded && !was {
                let state = MdEvent::Degraded {
                    state: self.report().state_text,
                };
                for s in &sinks {
                    s.md_event(&name, &state);
                }
            }
        }
    }

    /// Records why and since when the member `name` failed, and tells the observers.
    pub(crate) fn member_failed(&self, name: &str, role: Option<usize>, reason: String) {
        let failure = Failure {
            reason,
            since_unix: now_unix(),
        };
        {
            let mut f = self
                .observers
                .failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            f.retain(|(n, _)| n != name);
            f.push((name.to_string(), failure.clone()));
        }
        self.notify(MdEvent::MemberFailed {
            member: name.to_string(),
            role: role.and_then(|r| u32::try_from(r).ok()),
            failure,
        });
    }

    /// Records a failure without telling anyone (the metadata lock is held).
    pub(crate) fn record_failure(&self, name: &str, reason: String) {
        let mut f = self
            .observers
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f.retain(|(n, _)| n != name);
        f.push((
            name.to_string(),
            Failure {
                reason,
                since_unix: now_unix(),
            },
        ));
    }

    /// The member in `role` failed (role members have names; a missing one is skipped).
    pub(crate) fn role_failed(&self, role: usize, err: &cairn_block::Error) {
        if let Some(m) = self.slots[role].member() {
            self.member_failed(&m.name, Some(role), err.to_string());
        }
    }

    /// Why and since when the member `name` failed, if it did.
    pub(crate) fn failure_of(&self, name: &str) -> Option<Failure> {
        self.observers
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
    }

    /// The member `name` left the array: its failure is forgotten, observers are told.
    pub(crate) fn member_removed(&self, name: &str) {
        self.observers
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(n, _)| n != name);
        self.notify(MdEvent::MemberRemoved {
            member: name.to_string(),
        });
    }

    /// The member `name` was added (or re-added): its old failure is forgotten.
    pub(crate) fn member_added(&self, name: &str, message: &str) {
        self.observers
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(n, _)| n != name);
        self.notify(MdEvent::MemberAdded {
            member: name.to_string(),
            message: message.to_string(),
        });
    }

    /// Called as background work moves: tells its 20/40/60/80 % milestones once each.
    pub(crate) fn job_progress(&self, job: Option<&Job>) {
        let Some(job) = job else { return };
        let total = job.total.load(Ordering::Relaxed);
        if total == 0 {
            return;
        }
        let done = job.done.load(Ordering::Relaxed).min(total);
        let pct = u64::try_from(u128::from(done) * 100 / u128::from(total)).unwrap_or(100);
        let nn = (pct / 20 * 20).min(80);
        if nn == 0 {
            return;
        }
        let status = job.status();
        let key = (status.id << 8) | nn;
        let old = self.observers.milestone.load(Ordering::Acquire);
        let same_job = old >> 8 == status.id;
        if same_job && old & 0xff >= nn {
            return;
        }
        if self
            .observers
            .milestone
            .compare_exchange(old, key, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // Every milestone passed since the last one told, in order.
        let from = if same_job { (old & 0xff) + 20 } else { 20 };
        for percent in (from..=nn).step_by(20) {
            self.notify(MdEvent::JobProgress {
                job: status.clone(),
                percent,
            });
        }
    }
}

/// Tells the observers that a job started, and (when dropped, after the job's state is
/// set, whichever way the worker leaves) that it ended.
pub(crate) struct JobWatch<'a> {
    array: &'a Array,
    job: Arc<Job>,
}

impl<'a> JobWatch<'a> {
    pub(crate) fn new(array: &'a Array, job: &Arc<Job>) -> JobWatch<'a> {
        array.notify(MdEvent::JobStarted(job.status()));
        JobWatch {
            array,
            job: job.clone(),
        }
    }
}

impl Drop for JobWatch<'_> {
    fn drop(&mut self) {
        let job = self.job.status();
        let mismatch_sectors = if matches!(job.action, "check" | "repair") {
            self.array
                .last_scrub()
                .filter(|s| s.complete)
                .map(|s| s.mismatch_sectors)
        } else {
            None
        };
        self.array.notify(MdEvent::JobEnded {
            job,
            mismatch_sectors,
        });
    }
}
