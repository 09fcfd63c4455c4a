//! Budgets of what requests in flight hold: bytes of payload and reply buffers, and
//! requests running at once.

use std::sync::{Arc, Condvar, Mutex};

/// A count of units held (bytes, or requests), with a ceiling: `take` waits until the
/// units fit. One request larger than the whole ceiling still goes when nothing else is
/// held, so a budget below the maximum request size slows requests down instead of
/// stopping them.
#[derive(Debug)]
pub(super) struct Budget {
    limit: usize,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    held: usize,
    /// Threads waiting on `freed`: a release wakes nobody (no syscall) when there are
    /// none, which is the common case on every request.
    waiting: usize,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit: limit.max(1),
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        })
    }

    /// Takes `n` units, waiting while they do not fit. The units go back when the
    /// returned [`Held`] is dropped, on whatever thread that happens.
    pub(super) fn take(self: &Arc<Self>, n: usize) -> Held {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.held > 0 && st.held.saturating_add(n) > self.limit {
            st.waiting += 1;
            // What this thread held back (crate::cork) may be what frees the budget.
            st = crate::cork::wait(&self.state, &self.freed, st);
            st.waiting -= 1;
        }
        st.held += n;
        Held {
            budget: self.clone(),
            n,
        }
    }

    /// Waits until nothing is held.
    pub(super) fn wait_empty(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.held > 0 {
            st.waiting += 1;
            st = crate::cork::wait(&self.state, &self.freed, st);
            st.waiting -= 1;
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.lock().unwrap().held
    }
}

/// Units taken from a [`Budget`], given back on drop.
#[derive(Debug)]
pub(super) struct Held {
    budget: Arc<Budget>,
    n: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut st = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        st.held -= self.n;
        if st.waiting > 0 {
            self.budget.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn budget_waits_until_bytes_are_given_back() {
        let b = Budget::new(100);
        let first = b.take(80);
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let _h = b2.take(30);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "did not wait"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("woke when bytes came back");
        t.join().unwrap();
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_request_larger_than_the_budget_goes_alone() {
        let b = Budget::new(10);
        let h = b.take(50);
        assert_eq!(b.held(), 50);
        drop(h);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn wait_empty_returns_when_the_last_unit_comes_back() {
        let b = Budget::new(4);
        let a = b.take(1);
        let c = b.take(1);
        let b2 = b.clone();
        let t = thread::spawn(move || b2.wait_empty());
        thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished());
        drop(a);
        thread::sleep(Duration::from_millis(20));
        assert!(!t.is_finished());
        drop(c);
        t.join().unwrap();
    }
}
