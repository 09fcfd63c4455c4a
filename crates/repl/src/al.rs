//! The activity log: which extents of the data (4 MiB by default) may have writes in
//! flight, persisted before the first write into an extent.
//!
//! After a crash as primary, writes may have reached the local disk and not a peer (or
//! the other way round). The extents the log names are the only places that can differ,
//! so they, and not the whole device, are resynced. The log holds at most `capacity`
//! extents; to take a new one when full, the least recently used idle extent is evicted,
//! after a flush on every replica and a write-out of the bitmaps (node.rs), so nothing an
//! evicted extent held is left unaccounted for. No write begins in an extent while the
//! log that evicts it is being written: the log on disk names every extent with a write
//! in flight, at every moment.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

#[derive(Debug)]
pub struct ActivityLog {
    extent: u64,
    capacity: usize,
    st: Mutex<AlState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct AlState {
    /// Active extent -> (writes in flight, last use).
    active: HashMap<u64, (usize, u64)>,
    tick: u64,
    /// A thread is writing the log: others that need a change wait for it.
    updating: bool,
    /// The extents that transaction evicts. They stay in `active` until it is durable,
    /// but no write may begin in them meanwhile: the log being written no longer names
    /// them, so such a write would be in flight in an extent the log does not hold.
    evicting: Vec<u64>,
    /// Threads waiting on `changed`: with none, a change wakes nobody and makes no
    /// system call (every write ends here).
    waiting: usize,
}

/// A change of the log to persist before the writes that asked for it go ahead.
#[derive(Debug)]
pub struct Transaction {
    pub add: Vec<u64>,
    pub evict: Vec<u64>,
    /// Every extent active once the transaction is applied.
    pub after: Vec<u64>,
}

impl ActivityLog {
    /// A log of `capacity` extents of `extent` bytes, starting with `active` (read from
    /// disk; normally empty after a clean stop).
    pub fn new(extent: u64, capacity: usize, active: &[u64]) -> ActivityLog {
        let st = AlState {
            active: active.iter().map(|&e| (e, (0, 0))).collect(),
            ..AlState::default()
        };
        ActivityLog {
            extent,
            capacity: capacity.max(1),
            st: Mutex::new(st),
            changed: Condvar::new(),
        }
    }

    pub fn extent(&self) -> u64 {
        self.extent
    }

    fn extents(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.extent..(offset + len.max(1)).div_ceil(self.extent)
    }

    /// Makes the extents of `[offset, offset + len)` active and counts a write in each.
    /// When that changes the log, `persist` is called with the transaction (only one
    /// thread persists at a time); an error leaves the log as it was.
    pub fn begin<E>(
        &self,
        offset: u64,
        len: u64,
        persist: impl Fn(&Transaction) -> Result<(), E>,
    ) -> Result<(), E> {
        let want = self.extents(offset, len);
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if want
                .clone()
                .all(|e| st.active.contains_key(&e) && !st.evicting.contains(&e))
            {
                st.tick += 1;
                let tick = st.tick;
                for e in want {
                    let a = st.active.get_mut(&e).expect("checked");
                    a.0 += 1;
                    a.1 = tick;
                }
                return Ok(());
            }
            if st.updating {
                // Another thread is changing the log: an extent it adds is not durable
                // yet, one it evicts is about to be forgotten. Wait for it.
                st.waiting += 1;
                // Writes this thread held back (cairn_nbd::cork) may be what it waits for.
                st = cairn_nbd::cork::wait(&self.st, &self.changed, st);
                st.waiting -= 1;
                continue;
            }
            let add: Vec<u64> = want
                .clone()
                .filter(|e| !st.active.contains_key(e))
                .collect();
            let over = (st.active.len() + add.len()).saturating_sub(self.capacity);
            let mut idle: Vec<(u64, u64)> = st
                .active
                .iter()
                .filter(|(e, (n, _))| *n == 0 && !want.contains(e))
                .map(|(e, (_, t))| (*t, *e))
                .collect();
            let busy = st.active.values().any(|(n, _)| *n > 0);
            if idle.len() < over && busy {
                // Not enough idle extents: wait for writes to finish. (With nothing
                // busy, a request wider than the log takes more extents than the
                // capacity, rather than wait for ever.)
                st.waiting += 1;
                // Writes this thread held back (cairn_nbd::cork) may be what it waits for.
                st = cairn_nbd::cork::wait(&self.st, &self.changed, st);
                st.waiting -= 1;
                continue;
            }
            idle.sort_unstable();
            let evict: Vec<u64> = idle.iter().take(over).map(|(_, e)| *e).collect();
            let mut after: Vec<u64> = st
                .active
                .keys()
                .filter(|e| !evict.contains(e))
                .copied()
                .chain(add.iter().copied())
                .collect();
            after.sort_unstable();
            let tx = Transaction { add, evict, after };
            st.updating = true;
            st.evicting.clone_from(&tx.evict);
            drop(st);
            let r = persist(&tx);
            st = self.st.lock().unwrap_or_else(|p| p.into_inner());
            st.updating = false;
            st.evicting.clear();
            if r.is_ok() {
                for e in &tx.evict {
                    // Idle when chosen, and no write began in it since (`evicting`).
                    debug_assert_eq!(st.active.get(e).map(|a| a.0), Some(0));
                    st.active.remove(e);
                }
                for e in &tx.add {
                    st.active.insert(*e, (0, 0));
                }
            }
            self.changed.notify_all();
            r?;
        }
    }

    /// The write counted by [`ActivityLog::begin`] for this range is done.
    pub fn end(&self, offset: u64, len: u64) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        for e in self.extents(offset, len) {
            if let Some(a) = st.active.get_mut(&e) {
                a.0 = a.0.saturating_sub(1);
            }
        }
        let wake = st.waiting > 0;
        drop(st);
        if wake {
            self.changed.notify_all();
        }
    }

    /// Extents active now, sorted.
    pub fn active(&self) -> Vec<u64> {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<u64> = st.active.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Forgets every idle extent (after a clean stop wrote everything out); returns
    /// whether any write is still counted.
    pub fn clear_idle(&self) -> bool {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.active.retain(|_, (n, _)| *n > 0);
        !st.active.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_persists_before_a_new_extent_and_evicts_the_oldest_idle() {
        let al = ActivityLog::new(4 << 20, 2, &[]);
        let seen = std::cell::RefCell::new(Vec::new());
        let begin = |off: u64| {
            al.begin(off, 4096, |tx: &Transaction| {
                seen.borrow_mut()
                    .push((tx.add.clone(), tx.evict.clone(), tx.after.clone()));
                Ok::<(), ()>(())
            })
            .unwrap();
            al.end(off, 4096);
        };
        begin(0);
        begin(4096); // same extent: no transaction
        begin(5 << 20);
        begin(9 << 20); // full: evicts extent 0, the older
        assert_eq!(
            seen.into_inner(),
            vec![
                (vec![0], vec![], vec![0]),
                (vec![1], vec![], vec![0, 1]),
                (vec![2], vec![0], vec![1, 2]),
            ]
        );
        assert_eq!(al.active(), vec![1, 2]);
    }

    #[test]
    fn a_failed_persist_changes_nothing() {
        let al = ActivityLog::new(4 << 20, 4, &[]);
        assert!(al.begin(0, 4096, |_| Err::<(), _>("disk full")).is_err());
        assert!(al.active().is_empty());
    }

    /// Issue 17: a write into an extent that a transaction is evicting used to go ahead
    /// while the log without that extent was being written, and the extent was then
    /// forgotten with the write in flight. A primary killed at that moment came back
    /// with a block written here and not on its peers (or the reverse) outside its log,
    /// so its resync missed it. The log on disk must name every extent with a write in
    /// flight.
    #[test]
    fn no_write_begins_in_an_extent_being_evicted() {
        use std::sync::mpsc::channel;
        use std::sync::Arc;
        let mib = 1u64 << 20;
        let al = Arc::new(ActivityLog::new(mib, 1, &[]));
        // The log as persisted ("on disk").
        let disk = Arc::new(Mutex::new(Vec::<u64>::new()));
        let save = |disk: &Arc<Mutex<Vec<u64>>>, tx: &Transaction| {
            disk.lock().unwrap().clone_from(&tx.after);
            Ok::<(), ()>(())
        };
        al.begin(0, 4096, |tx| save(&disk, tx)).unwrap();
        al.end(0, 4096);
        assert_eq!(*disk.lock().unwrap(), vec![0]);
        // A write into extent 1 evicts extent 0; its log write is held up.
        let (in_persist, wait_in_persist) = channel();
        let (go, wait_go) = channel::<()>();
        let first = {
            let (al, disk) = (al.clone(), disk.clone());
            std::thread::spawn(move || {
                al.begin(mib, 4096, |tx| {
                    assert_eq!(tx.evict, vec![0]);
                    in_persist.send(()).unwrap();
                    wait_go.recv().unwrap();
                    save(&disk, tx)
                })
            })
        };
        wait_in_persist.recv().unwrap();
        // Meanwhile a write into extent 0.
        let second = {
            let (al, disk) = (al.clone(), disk.clone());
            std::thread::spawn(move || al.begin(4096, 4096, |tx| save(&disk, tx)))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let early = second.is_finished();
        go.send(()).unwrap();
        first.join().unwrap().unwrap();
        assert!(
            !early,
            "a write began in extent 0 while the log without it was being written"
        );
        // The write into extent 1 is done: the one into extent 0 takes it back.
        al.end(mib, 4096);
        second.join().unwrap().unwrap();
        assert_eq!(
            *disk.lock().unwrap(),
            vec![0],
            "the log on disk lacks the extent a write is in flight in"
        );
        assert_eq!(al.active(), vec![0]);
        al.end(4096, 4096);
    }

    #[test]
    fn a_busy_extent_is_not_evicted() {
        let al = ActivityLog::new(1 << 20, 1, &[]);
        al.begin(0, 512, |_| Ok::<(), ()>(())).unwrap(); // extent 0 busy
        let al = std::sync::Arc::new(al);
        let t = {
            let al = al.clone();
            std::thread::spawn(move || {
                al.begin(1 << 20, 512, |tx| {
                    assert_eq!(tx.evict, vec![0]);
                    Ok::<(), ()>(())
                })
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "evicted an extent with a write in flight");
        al.end(0, 512);
        t.join().unwrap().unwrap();
        assert_eq!(al.active(), vec![1]);
    }
}
