//! The worker pool every connection of a server shares.
//!
//! The device API is synchronous: a request occupies a thread for as long as the device
//! takes, one member latency or more. So the pool is sized for the requests running at
//! once, not for the cores: a worker starts when a request finds none idle (up to a
//! ceiling) and ends after [`IDLE`] with nothing to do. An idle server holds no workers; a
//! server with 32 requests waiting on a disk holds 32.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// How long a worker waits for work before it ends.
const IDLE: Duration = Duration::from_secs(10);

pub(super) type Job = Box<dyn FnOnce() + Send>;

pub(super) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    ready: Condvar,
    max: usize,
}

struct State {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job (a woken one counts until it takes the lock again).
    idle: usize,
    threads: usize,
    stop: bool,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Pool")
            .field("max", &self.inner.max)
            .field("threads", &st.threads)
            .field("idle", &st.idle)
            .field("queued", &st.jobs.len())
            .finish()
    }
}

impl Pool {
    pub(super) fn new(max: usize) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    jobs: VecDeque::new(),
                    idle: 0,
                    threads: 0,
                    stop: false,
                }),
                ready: Condvar::new(),
                max: max.max(1),
            }),
        }
    }

    /// Runs `job` on a worker. When no worker can be started and none exists, runs it
    /// on the calling thread: slower, never lost.
    pub(super) fn submit(&self, job: Job) {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.jobs.len() >= st.idle && st.threads < self.inner.max {
            let inner = self.inner.clone();
            match thread::Builder::new()
                .name("nbd-worker".into())
                .spawn(move || worker(&inner))
            {
                Ok(_) => st.threads += 1,
                Err(e) if st.threads == 0 => {
                    drop(st);
                    tracing::warn!("cannot start an NBD worker thread: {e}; running inline");
                    run(job);
                    return;
                }
                Err(e) => tracing::debug!("cannot start another NBD worker thread: {e}"),
            }
        }
        st.jobs.push_back(job);
        let wake = st.idle > 0;
        drop(st);
        if wake {
            self.inner.ready.notify_one();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop = true;
        self.inner.ready.notify_all();
    }
}

fn run(job: Job) {
    // A job answers its own request; a panic below it must not take the worker (and the
    // pool's count of workers) with it.
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("an NBD request panicked");
    }
}

fn worker(inner: &Inner) {
    let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(job) = st.jobs.pop_front() {
            drop(st);
            run(job);
            st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        if st.stop {
            break;
        }
        st.idle += 1;
        let (g, waited) = inner
            .ready
            .wait_timeout(st, IDLE)
            .unwrap_or_else(|p| p.into_inner());
        st = g;
        st.idle -= 1;
        if waited.timed_out() && st.jobs.is_empty() {
            break;
        }
    }
    st.threads -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    #[test]
    fn jobs_that_block_run_at_once() {
        let pool = Pool::new(64);
        let (tx, rx) = mpsc::channel();
        let start = Instant::now();
        for _ in 0..32 {
            let tx = tx.clone();
            pool.submit(Box::new(move || {
                thread::sleep(Duration::from_millis(100));
                tx.send(()).unwrap();
            }));
        }
        for _ in 0..32 {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        // One after another would take 3.2 s.
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn the_ceiling_bounds_the_workers_and_a_panic_does_not_lose_one() {
        let pool = Pool::new(2);
        pool.submit(Box::new(|| panic!("a job that panics")));
        let (tx, rx) = mpsc::channel();
        for i in 0..8 {
            let tx = tx.clone();
            pool.submit(Box::new(move || tx.send(i).unwrap()));
        }
        let mut got: Vec<i32> = (0..8)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        assert!(pool.inner.state.lock().unwrap().threads <= 2);
    }
}
