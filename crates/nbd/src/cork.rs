//! Replies gathered while a thread has more work in hand, and sent with one write.
//!
//! A connection's reader that finds several requests in its buffer (a client with 32 in
//! flight sends them in bursts) runs the cheap ones itself, one after the other. Sent one
//! by one, their replies cost a system call each (and, over TLS, a record each), and wake
//! the client once per reply. While the reader *holds* (it knows more input is already
//! buffered), a small reply is appended to its connection's pending bytes instead, and
//! the thread remembers the connection; when the reader *releases* (its buffer is empty
//! and its next read may block), every remembered connection writes what it gathered, in
//! one call. The reader of an NBD client does the same with the replies its callbacks
//! send on (a replicated write's answer, a remote member's): a burst of answers from a
//! peer becomes one write to the client.
//!
//! The rule that keeps this from ever holding a reply for good: a thread releases before
//! every read that may wait for input, and when its loop ends (the [`Scope`] guard, also
//! on unwinding). A thread that is not holding writes at once, and sends any bytes
//! another thread gathered for the same connection with its own. Nothing a holding thread
//! waits for (budgets, range locks, a device) depends on a reply reaching the client.
//!
//! Requests to a peer can be gathered the same way, but only where the caller says so
//! ([`gathering`]: a replicated volume's protocol C writes): a request held back is one
//! whose answer nobody has yet, so a holding thread that waits for *anything* an answer
//! could be needed for (a budget of requests in flight, a range or activity-log extent
//! an earlier write holds, a reply) must [`release`] first. Those waits do.

use std::cell::RefCell;
use std::sync::Arc;

/// A writer that can gather replies: `uncork` sends what it gathered.
pub(crate) trait Corked: Send + Sync {
    fn uncork(&self);
}

thread_local! {
    /// `Some` while this thread holds: the writers it gathered replies in.
    static HELD: RefCell<Option<Vec<Arc<dyn Corked>>>> = const { RefCell::new(None) };
    /// Inside [`gathering`]: requests sent to a peer may be held back too.
    static GATHER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the requests it sends on NBD client pipelines gathered while this
/// thread holds (else sent at once, as always).
pub fn gathering<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            GATHER.with(|g| g.set(self.0));
        }
    }
    let _reset = Reset(GATHER.with(|g| g.replace(true)));
    f()
}

/// Whether a request sent now may be held back.
pub(crate) fn may_gather_requests() -> bool {
    GATHER.with(std::cell::Cell::get) && holding()
}

/// From now on, small replies written by this thread are gathered.
pub(crate) fn hold() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_none() {
            *h = Some(Vec::new());
        }
    });
}

/// Whether this thread is holding.
pub fn holding() -> bool {
    HELD.with(|h| h.borrow().is_some())
}

/// Remembers `w` (once) to be uncorked when this thread releases. Returns false when
/// the thread is not holding (the caller must send at once).
pub(crate) fn defer(w: &Arc<dyn Corked>) -> bool {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        let Some(list) = h.as_mut() else {
            return false;
        };
        let p = Arc::as_ptr(w).cast::<()>();
        if !list.iter().any(|x| Arc::as_ptr(x).cast::<()>() == p) {
            list.push(w.clone());
        }
        true
    })
}

/// Sends everything this thread gathered and stops holding. Call it before waiting for
/// anything that a request held back here could be needed for.
pub fn release() {
    let list = HELD.with(|h| h.borrow_mut().take());
    for w in list.into_iter().flatten() {
        w.uncork();
    }
}

/// `Condvar::wait` for a thread that may hold: it first sends what this thread held back
/// and returns at once, relocked, so the caller checks its condition again (what it
/// waited for may have been among the requests held back). Lock poisoning is ignored, as
/// everywhere in cairn's waits.
pub fn wait<'a, T>(
    lock: &'a std::sync::Mutex<T>,
    cv: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
) -> std::sync::MutexGuard<'a, T> {
    if holding() {
        drop(guard);
        release();
        return lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    cv.wait(guard)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Releases when dropped: a loop that holds keeps one for its whole life.
pub(crate) struct Scope;

impl Drop for Scope {
    fn drop(&mut self) {
        release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);
    impl Corked for Count {
        fn uncork(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_held_writer_is_uncorked_once_at_release_and_not_before() {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w: Arc<dyn Corked> = c.clone();
        assert!(!defer(&w), "not holding: the caller must send");
        {
            let _s = Scope;
            hold();
            assert!(holding());
            assert!(defer(&w));
            assert!(defer(&w));
            assert_eq!(c.0.load(Ordering::SeqCst), 0);
        }
        assert_eq!(c.0.load(Ordering::SeqCst), 1, "one uncork for two defers");
        assert!(!holding());
        release();
        assert_eq!(c.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn holding_is_per_thread() {
        hold();
        let other = std::thread::spawn(holding).join().unwrap();
        assert!(!other);
        release();
    }
}
