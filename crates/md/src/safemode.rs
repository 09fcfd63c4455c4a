//! md's safe mode: an array that no client has written for `safe_mode_delay` (md's
//! default 200 ms) is marked clean again while it keeps running, and dirty again before
//! the next write. Each switch is one event (`md_update_sb`), so the event count moves
//! whenever the array was written and went idle.
//!
//! ```text
//!   write ─► start_write: pending + 1; superblocks clean? ─► dirty, events + 1 (FUA)
//!   │        ... the level's path ...
//!   └─► end: pending - 1, last-write time; at 0 the safe-mode thread is woken
//!   safe-mode thread: pending 0 and idle for the delay ─► flush the members ─►
//!            still no write? ─► clean (resync_offset MAX), events + 1 (FUA)
//! ```
//!
//! Why it matters beyond a clean superblock after a crash: the bitmap records the events
//! when it last cleared bits (`events_cleared`, bitmap.rs), and a member coming back is
//! rebuilt only where the bitmap marks when its own events are at least that. Without
//! the switch, an idle array's events stood still across whole rounds of writes, so a
//! copy of a member taken before them (a file copied back, a disk host restored from a
//! snapshot) carried the current events and was taken back as in sync. With it, writes
//! followed by idleness move the events past any copy taken before those writes.
//!
//! One difference from the kernel, on purpose: md rolls a dirty-to-clean switch back
//! (`events - 1`) when nothing else happened since the clean-to-dirty one, to spare
//! idle spares a superblock write. That makes the events after a round of writes equal
//! to those before it, which is exactly what lets an old copy pass; cairn always counts
//! forward, as md itself does whenever spares or a degraded array are involved.
//! `mdadm --examine` reads either the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cairn_block::Result;

use crate::state::Array;

/// md's default `safe_mode_delay`.
pub const DEFAULT_SAFE_MODE_DELAY: Duration = Duration::from_millis(200);

/// The process default in ms, for arrays not given their own (`u64::MAX`: none).
static PROCESS_DELAY_MS: AtomicU64 = AtomicU64::new(200);

/// How long to wait before looking again when nothing is written.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// After a failed clean marking: not again before this, or before the next write.
const RETRY_WAIT: Duration = Duration::from_secs(30);

/// Sets the safe-mode delay of every array that has none of its own (`serve
/// --safe-mode-delay`). `None` turns safe mode off: arrays stay dirty from their first
/// write until they are stopped (md's `safe_mode_delay` 0).
pub fn set_default_safe_mode_delay(delay: Option<Duration>) {
    PROCESS_DELAY_MS.store(to_ms(delay), Ordering::Relaxed);
}

fn to_ms(delay: Option<Duration>) -> u64 {
    match delay {
        None => u64::MAX,
        // At least 1 ms: 0 is md's "off", said with `None` here.
        Some(d) => u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX - 1)
            .clamp(1, u64::MAX - 1),
    }
}

impl Array {
    /// Sets this array's safe-mode delay (`None`: off), overriding the process default.
    pub fn set_safe_mode_delay(&self, delay: Option<Duration>) {
        // u64::MAX in the field means "the process default"; off is stored as 0.
        let ms = match delay {
            None => 0,
            d => to_ms(d),
        };
        self.safe_mode_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// The delay in force, `None` when safe mode is off.
    fn safe_mode_delay(&self) -> Option<Duration> {
        let ms = match self.safe_mode_delay_ms.load(Ordering::Relaxed) {
            u64::MAX => PROCESS_DELAY_MS.load(Ordering::Relaxed),
            0 => u64::MAX,
            ms => ms,
        };
        (ms != u64::MAX).then(|| Duration::from_millis(ms))
    }

    /// One pass of md's safe-mode timer: marks the array clean when it is dirty, no
    /// client write is pending and the last ended at least the delay ago. Returns how
    /// long until it is worth looking again (`None`: not before the next write).
    pub fn safe_mode_work(&self) -> Result<Option<Duration>> {
        let Some(delay) = self.safe_mode_delay() else {
            return Ok(None);
        };
        if !self.dirty.load(Ordering::SeqCst)
            || self.caps.read_only
            || self.is_fenced()
            || self.is_closed()
        {
            return Ok(None);
        }
        if self.writes_pending.load(Ordering::SeqCst) > 0 {
            return Ok(Some(delay));
        }
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let idle =
            Duration::from_millis(now.saturating_sub(self.last_write_ms.load(Ordering::SeqCst)));
        if idle < delay {
            return Ok(Some(delay - idle));
        }
        if !self.meta_lock().sbs.iter().any(Option::is_some) {
            return Ok(None);
        }
        // Not while a member is rebuilt: the superblocks would carry its recovery
        // offset as it is now, past copies the rebuild has not flushed yet (it records
        // them itself, after its flush: checkpoint_recovery).
        if self
            .slots
            .iter()
            .any(|s| s.member().is_some() && s.synced.load(Ordering::Acquire) != u64::MAX)
        {
            return Ok(Some(delay));
        }
        let done = self.writes_done.load(Ordering::SeqCst);
        // md writes the clean superblock with a preflush: the data written so far is
        // durable before the superblocks say no resync is needed.
        cairn_block::BlockDevice::flush(self)?;
        let mut meta = self.meta_lock();
        if !meta.dirty || !meta.sbs.iter().any(Option::is_some) {
            return Ok(None);
        }
        self.dirty.store(false, Ordering::SeqCst);
        if self.writes_pending.load(Ordering::SeqCst) > 0
            || self.writes_done.load(Ordering::SeqCst) != done
        {
            // A write came meanwhile (it saw `dirty` still set): stay dirty.
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(Some(delay));
        }
        meta.dirty = false;
        meta.bump_events();
        if let Err(e) = self.write_superblocks(&mut meta) {
            meta.dirty = true;
            self.dirty.store(true, Ordering::SeqCst);
            return Err(e.context("marking the idle array clean"));
        }
        Ok(None)
    }

    /// Starts the safe-mode thread (once; from [`Array::manage`]): it sleeps until
    /// writes stop, then runs [`Array::safe_mode_work`] when the delay has passed.
    pub(crate) fn start_safe_mode(self: &Arc<Self>) {
        let has_superblocks = self.meta_lock().sbs.iter().any(Option::is_some);
        if self.caps.read_only || !self.layout_is_redundant() || !has_superblocks {
            // Nothing to mark: an array without superblocks (a RAID LV) keeps its state
            // in its bitmap alone.
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = thread::Builder::new()
            .name("md-safemode".into())
            .spawn(move || {
                let mut failed_at: Option<u64> = None;
                loop {
                    let wait = {
                        let Some(array) = weak.upgrade() else { return };
                        if array.stopping() {
                            return;
                        }
                        let done = array.writes_done.load(Ordering::SeqCst);
                        if failed_at == Some(done) {
                            // Said once; again after the next write.
                            RETRY_WAIT
                        } else {
                            match array.safe_mode_work() {
                                Ok(w) => {
                                    failed_at = None;
                                    w.unwrap_or(IDLE_WAIT)
                                }
                                Err(e) => {
                                    tracing::warn!("{}: {e}", array.array_label());
                                    failed_at = Some(done);
                                    RETRY_WAIT
                                }
                            }
                        }
                    };
                    thread::park_timeout(wait);
                }
            });
        match spawned {
            Ok(h) => {
                let _ = self.safe_mode_thread.set(h.thread().clone());
            }
            Err(e) => tracing::warn!(
                "{}: cannot start the safe-mode timer (the array stays dirty while it \
                 runs): {e}",
                self.array_label()
            ),
        }
    }
}
