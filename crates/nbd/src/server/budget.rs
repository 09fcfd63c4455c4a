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

    /// Takes `n` units for a connection that holds `mine` (`n` included) of its own
    /// budget, waiting while they do not fit or while that connection holds more than
    /// `share` and something besides this request: so one connection's first request
    /// always gets in when there is room, but its further ones leave the rest to others.
    /// A connection's units go back before the server's (see `Holds`), which wakes this.
    pub(super) fn take_share(self: &Arc<Self>, n: usize, mine: &Budget, share: usize) -> Held {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let room = st.held == 0 || st.held.saturating_add(n) <= self.limit;
            let own = mine.held_now();
            if room && (own <= n || own <= share) {
                break;
            }
            st.waiting += 1;
            st = crate::cork::wait(&self.state, &self.freed, st);
            st.waiting -= 1;
        }
        st.held += n;
        Held {
            budget: self.clone(),
            n,
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    fn held_now(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).held
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
    fn a_connection_past_its_share_waits_and_another_goes() {
        let server = Budget::new(100);
        let (a, b) = (Budget::new(1000), Budget::new(1000));
        // A's first request goes whatever its size; its second would pass its share (50).
        let a1 = a.take(40);
        let a1s = server.take_share(40, &a, 50);
        let a2 = a.take(40);
        let (tx, rx) = std::sync::mpsc::channel();
        let (server2, a2b) = (server.clone(), a.clone());
        let t = thread::spawn(move || {
            let h = server2.take_share(40, &a2b, 50);
            tx.send(()).unwrap();
            h
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "A went past its share"
        );
        // B gets in meanwhile: the server has room, and B holds nothing else.
        let b1 = b.take(40);
        let _b1s = server.take_share(40, &b, 50);
        drop(b1);
        // A's first reply goes out: A is back within its share.
        drop(a1);
        drop(a1s);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("A's second request went");
        drop(t.join().unwrap());
        drop(a2);
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
