//! Byte ranges held exclusively: overlapping writes, and a resync copy and the writes it
//! overlaps, run one after the other.
//!
//! Two writes of one block in flight together could land in one order locally and in the
//! other on the peer, and the replicas would differ for good; a resync copy that read the
//! old data before a write and lands on the peer after it would put the old data back
//! there (what DRBD's ordering by "dagtags" prevents). Holding the range for the whole
//! request, on every replica, rules both out. Requests that do not overlap never wait.

use std::sync::{Arc, Condvar, Mutex};

#[derive(Debug, Default)]
pub struct RangeLocks {
    held: Mutex<Held>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Held {
    ranges: Vec<(u64, u64)>,
    /// Threads waiting on `freed`: a release wakes nobody, and makes no system call,
    /// when there are none (the common case, every write of a replicated volume).
    waiting: usize,
}

/// A held range; released on drop.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl RangeLocks {
    /// Waits until no held range overlaps `[offset, offset + len)`, then holds it.
    pub fn lock(&self, offset: u64, len: u64) -> RangeGuard<'_> {
        let range = (offset, offset + len.max(1));
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        while held.ranges.iter().any(|&(a, b)| a < range.1 && range.0 < b) {
            held.waiting += 1;
            // The write holding the range may be among the requests this thread held
            // back (cairn_nbd::cork): they are sent before waiting for it.
            held = cairn_nbd::cork::wait(&self.held, &self.freed, held);
            held.waiting -= 1;
        }
        held.ranges.push(range);
        RangeGuard { locks: self, range }
    }

    /// [`RangeLocks::lock`], held by a guard that owns its share of the locks, so it can
    /// be released on another thread (protocol A releases it when the peer answers).
    pub fn lock_owned(self: &Arc<Self>, offset: u64, len: u64) -> OwnedRangeGuard {
        let g = self.lock(offset, len);
        let range = g.range;
        std::mem::forget(g);
        OwnedRangeGuard {
            locks: self.clone(),
            range,
        }
    }

    fn release(&self, range: (u64, u64)) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.ranges.iter().position(|r| *r == range) {
            held.ranges.swap_remove(i);
        }
        let wake = held.waiting > 0;
        drop(held);
        if wake {
            self.freed.notify_all();
        }
    }

    /// Ranges held now.
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ranges
            .len()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.locks.release(self.range);
    }
}

/// A held range that owns its share of the locks; released on drop.
#[derive(Debug)]
pub struct OwnedRangeGuard {
    locks: Arc<RangeLocks>,
    range: (u64, u64),
}

impl Drop for OwnedRangeGuard {
    fn drop(&mut self) {
        self.locks.release(self.range);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_wait_and_disjoint_ones_do_not() {
        let locks = Arc::new(RangeLocks::default());
        let g = locks.lock(0, 4096);
        let _other = locks.lock(4096, 4096); // adjacent: no overlap
        let done = Arc::new(AtomicUsize::new(0));
        let t = {
            let (locks, done) = (locks.clone(), done.clone());
            std::thread::spawn(move || {
                let _g = locks.lock(2048, 512);
                done.store(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            done.load(Ordering::SeqCst),
            0,
            "an overlapping range went ahead"
        );
        drop(g);
        t.join().unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }
}
