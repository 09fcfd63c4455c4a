//! A gate for the answers of operations that complete later: tests that must show a
//! layer sends several operations before it waits for any hold the answers back until
//! that many are outstanding together.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An answer held back: calling it completes the operation.
pub type Answer = Box<dyn FnOnce() + Send>;

/// Holds answers while fewer than `expect` are outstanding; once `expect` are, answers
/// all of them from another thread. A watchdog answers whatever is still held two
/// seconds after the first one came, and records it, so a path that waits for each
/// operation in turn shows as [`Gate::timed_out`] rather than as a hang. With `expect`
/// 0 each answer is given from a thread of its own after [`Gate::set_delay_us`].
#[derive(Default)]
pub struct Gate {
    held: Mutex<Vec<Answer>>,
    expect: AtomicUsize,
    most: AtomicUsize,
    timed_out: AtomicBool,
    delay_us: AtomicU64,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("expect", &self.expect.load(Ordering::SeqCst))
            .field("most", &self.most.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// From now on, hold answers until `expect` are outstanding (0: answer each after
    /// the delay); the most held at once starts again from 0.
    pub fn reset(&self, expect: usize) {
        self.most.store(0, Ordering::SeqCst);
        self.expect.store(expect, Ordering::SeqCst);
    }

    /// How long an answer waits while `expect` is 0.
    pub fn set_delay_us(&self, us: u64) {
        self.delay_us.store(us, Ordering::SeqCst);
    }

    /// See [`Gate::set_delay_us`].
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::SeqCst))
    }

    /// The most answers held at once since the last [`Gate::reset`].
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// Whether the watchdog had to answer held operations (the caller never had
    /// `expect` of them outstanding together).
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::SeqCst)
    }

    /// Holds `answer` as the gate says (see [`Gate`]).
    pub fn hold(self: &Arc<Gate>, answer: Answer) {
        let expect = self.expect.load(Ordering::SeqCst);
        if expect == 0 {
            let delay = self.delay();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                answer();
            });
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.push(answer);
        self.most.fetch_max(held.len(), Ordering::SeqCst);
        if held.len() >= expect {
            let all = std::mem::take(&mut *held);
            std::thread::spawn(move || all.into_iter().for_each(|a| a()));
        } else if held.len() == 1 {
            let gate = self.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                let all = std::mem::take(&mut *gate.held.lock().unwrap_or_else(|p| p.into_inner()));
                if !all.is_empty() {
                    gate.timed_out.store(true, Ordering::SeqCst);
                }
                all.into_iter().for_each(|a| a());
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn answers_come_once_expect_are_held_and_the_watchdog_tells_a_wait_per_operation() {
        let gate = Arc::new(Gate::default());
        gate.reset(3);
        let (tx, rx) = mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            gate.hold(Box::new(move || tx.send(i).unwrap()));
        }
        let mut got: Vec<i32> = (0..3).map(|_| rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(gate.most(), 3);
        assert!(!gate.timed_out());
        // One held where two are expected: only the watchdog answers it.
        gate.reset(2);
        let tx2 = tx.clone();
        gate.hold(Box::new(move || tx2.send(9).unwrap()));
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 9);
        assert!(gate.timed_out());
    }
}
