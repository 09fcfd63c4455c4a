//! Overlap: a request's member operations run at once, the request completes when the
//! last one is done.
//!
//! ```text
//!   layer (array, striped LV, crypt)  ── overlap(jobs, f) ──┐ blocks until all are done
//!     job 0 ............................ on the calling thread
//!     job 1..n ─► idle I/O worker (a shared, growing pool; one job per worker at a time)
//!                 none idle and the pool full ─► the calling thread runs it too
//! ```
//!
//! The [`BlockDevice`](crate::BlockDevice) trait stays synchronous: a member call blocks
//! its thread, so overlapping N member calls needs N threads. Workers are kept (started
//! on first need, reused, at most [`MAX_WORKERS`]) because starting a thread per member
//! operation costs 10–20 µs, more than a member in memory takes. A job never waits for a
//! worker: with none idle it runs on the caller, so nested layers (an LV over an array
//! over members) cannot deadlock on the pool, and a job never runs on a thread that holds
//! another request's locks (no work stealing).
//!
//! Handing a job over still costs a thread wake-up (a few µs), which is worth it only
//! when member operations take longer than that. [`Latency`] keeps a running estimate of a
//! layer's member latency so it can run small requests one after another on fast members
//! (memory, tmpfs) and overlap them on slow ones (disks, networks).

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Instant;

/// Workers the process keeps at most. Past this many jobs in flight, callers run their
/// own jobs (which still overlaps across callers).
pub const MAX_WORKERS: usize = 256;

/// Member operations slower than this (the [`Latency`] estimate) are worth handing to
/// workers even for small requests: about ten times a worker's wake-up.
pub const OVERLAP_ABOVE_NS: u64 = 30_000;

/// [`Latency::time`] counts an operation larger than this as if it were this large.
pub const LATENCY_UNIT: usize = 64 << 10;

/// [`Latency::time`] measures one call in this many (per thread).
pub const SAMPLE_EVERY: u32 = 4;

type Task = Box<dyn FnOnce() + Send + 'static>;

struct Worker {
    task: Mutex<Option<Task>>,
    ready: Condvar,
}

struct Pool {
    idle: Mutex<Vec<Arc<Worker>>>,
    started: AtomicUsize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        idle: Mutex::new(Vec::new()),
        started: AtomicUsize::new(0),
    })
}

impl Pool {
    /// Hands `task` to an idle worker (starting one if the pool may grow); gives it back
    /// when no worker can take it.
    fn submit(&'static self, task: Task) -> Option<Task> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let worker = match idle {
            Some(w) => w,
            None => {
                if self.started.fetch_add(1, Ordering::Relaxed) >= MAX_WORKERS {
                    self.started.fetch_sub(1, Ordering::Relaxed);
                    return Some(task);
                }
                let w = Arc::new(Worker {
                    task: Mutex::new(None),
                    ready: Condvar::new(),
                });
                let mine = w.clone();
                let spawned = std::thread::Builder::new()
                    .name("cairn-io".into())
                    .spawn(move || self.run(&mine));
                if spawned.is_err() {
                    self.started.fetch_sub(1, Ordering::Relaxed);
                    return Some(task);
                }
                w
            }
        };
        *worker.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        worker.ready.notify_one();
        None
    }

    fn run(&'static self, me: &Arc<Worker>) {
        loop {
            let task = {
                let mut slot = me.task.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    if let Some(t) = slot.take() {
                        break t;
                    }
                    slot = me.ready.wait(slot).unwrap_or_else(PoisonError::into_inner);
                }
            };
            // Tasks catch their own panics (see `overlap`).
            task();
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(me.clone());
        }
    }
}

/// Completion of one `overlap` call: jobs still running, and the first panic.
struct Done {
    state: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    all: Condvar,
}

impl Done {
    fn finish(&self, panic: Option<Box<dyn Any + Send>>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 -= 1;
        if s.1.is_none() {
            s.1 = panic;
        }
        if s.0 == 0 {
            self.all.notify_all();
        }
    }
}

/// Runs `f` on every job at once (the first on the calling thread, the others on I/O
/// workers) and returns the results in job order, when all are done. A panic in a job
/// is raised again on the caller once every job has finished.
pub fn overlap<J: Send, R: Send>(jobs: Vec<J>, f: impl Fn(J) -> R + Sync) -> Vec<R> {
    if jobs.len() < 2 {
        return jobs.into_iter().map(f).collect();
    }
    let n = jobs.len();
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let done = Arc::new(Done {
        state: Mutex::new((0, None)),
        all: Condvar::new(),
    });
    let mut jobs = jobs.into_iter().enumerate();
    let (_, first) = jobs.next().expect("two jobs or more");
    let mut first_result = None;
    let mut first_panic = None;
    {
        let f = &f;
        let results = &results;
        let mut unplaced: Vec<Task> = Vec::new();
        for (i, job) in jobs {
            done.state.lock().unwrap_or_else(PoisonError::into_inner).0 += 1;
            let d = done.clone();
            let task: Box<dyn FnOnce() + Send + '_> =
                Box::new(move || match catch_unwind(AssertUnwindSafe(|| f(job))) {
                    Ok(r) => {
                        *results[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
                        d.finish(None);
                    }
                    Err(p) => d.finish(Some(p)),
                });
            // SAFETY: the task borrows `f`, `results` and the job's data from this call.
            // This function does not return or unwind before `done` counts every task
            // finished (the wait below is reached on every path: the caller's own jobs
            // run under `catch_unwind`), and a task touches none of those borrows after
            // its `finish`. Only the lifetime changes, not the type.
            let task: Task =
                unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Task>(task) };
            if let Some(back) = pool().submit(task) {
                unplaced.push(back);
            }
        }
        match catch_unwind(AssertUnwindSafe(|| f(first))) {
            Ok(r) => first_result = Some(r),
            Err(p) => first_panic = Some(p),
        }
        // No worker could take these: they run here, after the others are on their way.
        for task in unplaced {
            task();
        }
        let mut s = done.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.0 > 0 {
            s = done.all.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if first_panic.is_none() {
            first_panic = s.1.take();
        }
    }
    if let Some(p) = first_panic {
        resume_unwind(p);
    }
    std::iter::once(first_result.expect("the first job ran"))
        .chain(results.into_iter().skip(1).map(|r| {
            r.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .expect("every job ran")
        }))
        .collect()
}

/// Called once with an operation's outcome by whoever completes it ([`start_all`]).
pub type Answer<R> = Box<dyn FnOnce(R) + Send>;

/// What [`start_all`] waits on: answers still due, and the answers in job order.
struct Due<R> {
    state: Mutex<(usize, Vec<Option<R>>)>,
    all: Condvar,
}

/// One job's answer slot. Dropped without an answer (a device that lost the callback,
/// a panic on the thread holding it), it still counts the job done, with no answer.
struct Slot<R> {
    due: Arc<Due<R>>,
    i: usize,
    answer: Option<R>,
}

impl<R> Drop for Slot<R> {
    fn drop(&mut self) {
        let mut s = self
            .due
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        s.1[self.i] = self.answer.take();
        s.0 -= 1;
        if s.0 == 0 {
            self.due.all.notify_all();
        }
    }
}

/// Starts every job from this thread with `start(job, answer)`, where `start` hands
/// `answer` to an operation that calls it when done (on any thread, or before `start`
/// returns), then waits once for all of them. Answers come back in job order; `None`
/// for a job whose `answer` was dropped without being called.
///
/// This is [`overlap`] for devices whose operations complete later by themselves
/// ([`crate::BlockDevice::completes_later`]): no worker thread is woken per job, and the
/// caller sleeps once however many operations it waits for.
pub fn start_all<J, R: Send + 'static>(
    jobs: Vec<J>,
    start: impl FnMut(J, Answer<R>),
) -> Vec<Option<R>> {
    start_all_while(jobs, start, || ()).0
}

/// [`start_all`] that runs `meanwhile` on this thread once every job is started and
/// before it waits: other work (the writes of a window whose next reads these are) is
/// done while the operations are out. Nothing a job borrows is held by its operation
/// (a device copies what it sends), so `meanwhile` may panic: the answers still arrive
/// into their own slots.
pub fn start_all_while<J, R: Send + 'static, T>(
    jobs: Vec<J>,
    mut start: impl FnMut(J, Answer<R>),
    meanwhile: impl FnOnce() -> T,
) -> (Vec<Option<R>>, T) {
    let n = jobs.len();
    let due = Arc::new(Due {
        state: Mutex::new((n, (0..n).map(|_| None).collect())),
        all: Condvar::new(),
    });
    for (i, job) in jobs.into_iter().enumerate() {
        let mut slot = Slot {
            due: due.clone(),
            i,
            answer: None,
        };
        start(
            job,
            Box::new(move |r| {
                slot.answer = Some(r);
                drop(slot);
            }),
        );
    }
    let other = meanwhile();
    let mut s = due.state.lock().unwrap_or_else(PoisonError::into_inner);
    while s.0 > 0 {
        s = due.all.wait(s).unwrap_or_else(PoisonError::into_inner);
    }
    (std::mem::take(&mut s.1), other)
}

/// How a layer issues a request's member operations ([`fan_out`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// One after another on the calling thread (members in memory: a hand-over to a
    /// worker costs more than the operation).
    No,
    /// Different members at once, one member's operations in order (large requests on
    /// fast members: the point is a second core for the copying).
    ByMember,
    /// Every operation at once (members with latency, which take concurrent calls).
    Each,
}

/// Runs `f` on every job (tagged with its member: a role, a PV) as `how` says. Results
/// come back in job order.
pub fn fan_out<J: Send, R: Send>(
    jobs: Vec<(usize, J)>,
    how: Overlap,
    f: impl Fn(J) -> R + Sync,
) -> Vec<R> {
    if how == Overlap::No || jobs.len() < 2 {
        return jobs.into_iter().map(|(_, job)| f(job)).collect();
    }
    if how == Overlap::Each {
        return overlap(jobs.into_iter().map(|(_, j)| j).collect(), f);
    }
    let mut groups: std::collections::BTreeMap<usize, Vec<(usize, J)>> = Default::default();
    let n = jobs.len();
    for (i, (member, job)) in jobs.into_iter().enumerate() {
        groups.entry(member).or_default().push((i, job));
    }
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    let groups: Vec<Vec<(usize, J)>> = groups.into_values().collect();
    let done = overlap(groups, |g| {
        g.into_iter().map(|(i, j)| (i, f(j))).collect::<Vec<_>>()
    });
    for (i, r) in done.into_iter().flatten() {
        out[i] = Some(r);
    }
    out.into_iter().map(|r| r.expect("every job ran")).collect()
}

/// A running estimate of how long one member operation takes, to decide whether a small
/// request's member operations are worth handing to workers ([`OVERLAP_ABOVE_NS`]).
/// [`Latency::default`] starts at "slow" so that the first requests overlap; a few fast
/// ones bring it down.
#[derive(Debug)]
pub struct Latency {
    ns: AtomicU64,
}

impl Default for Latency {
    fn default() -> Latency {
        Latency::starting_at(OVERLAP_ABOVE_NS * 4)
    }
}

impl Latency {
    /// An estimate that starts at `ns`.
    pub fn starting_at(ns: u64) -> Latency {
        Latency {
            ns: AtomicU64::new(ns),
        }
    }

    /// Times `op`, an operation moving `bytes`, and folds it into the estimate: one call
    /// in [`SAMPLE_EVERY`] per thread (many threads storing to one estimate on every call
    /// would fight over its cache line). An operation larger than [`LATENCY_UNIT`] counts
    /// as its time scaled down to that size, so that a member in memory copying 1 MiB
    /// does not look slow, while one that moves large requests slower than about
    /// 2 GB/s does (overlapping then pays for its bandwidth). Concurrent updates may
    /// lose a sample, which does not matter.
    pub fn time<T>(&self, bytes: usize, op: impl FnOnce() -> T) -> T {
        if !Self::sample_due() {
            return op();
        }
        let t = Instant::now();
        let r = op();
        self.fold(bytes, t.elapsed());
        r
    }

    /// Folds in `took`, the time of operations of `bytes` each started together (see
    /// [`Latency::time`]; one call in [`SAMPLE_EVERY`] per thread counts).
    pub fn sample(&self, bytes: usize, took: std::time::Duration) {
        if Self::sample_due() {
            self.fold(bytes, took);
        }
    }

    fn sample_due() -> bool {
        thread_local!(static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        let n = CALLS.with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        });
        n.is_multiple_of(SAMPLE_EVERY)
    }

    fn fold(&self, bytes: usize, took: std::time::Duration) {
        let ns = u128::from(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        let unit = LATENCY_UNIT as u128;
        let sample = u64::try_from(ns * unit / (bytes as u128).max(unit)).unwrap_or(u64::MAX);
        let old = self.ns.load(Ordering::Relaxed);
        // Down fast, up slowly: a thread preempted in the middle of an operation (more
        // threads than cores) makes one sample long, but a member that really is slow
        // makes all of them long.
        let new = if sample < old {
            old - (old - sample) / 4
        } else {
            old + (sample - old) / 16
        };
        // At a steady latency the estimate barely moves: leave the line shared.
        if new.abs_diff(old) > old / 32 {
            self.ns.store(new, Ordering::Relaxed);
        }
    }

    /// The current estimate, in nanoseconds.
    pub fn nanos(&self) -> u64 {
        self.ns.load(Ordering::Relaxed)
    }

    /// Whether member operations take long enough that overlapping them pays.
    pub fn slow(&self) -> bool {
        self.nanos() >= OVERLAP_ABOVE_NS
    }

    /// How a request of `bytes` issues its member operations: every one at once when
    /// members are slow, by member when the request is at least `large` bytes (a second
    /// core for the copying), one after another otherwise.
    pub fn choose(&self, bytes: usize, large: usize) -> Overlap {
        if self.slow() {
            Overlap::Each
        } else if bytes >= large {
            Overlap::ByMember
        } else {
            Overlap::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn results_come_back_in_order_and_jobs_overlap() {
        let t = Instant::now();
        let out = overlap((0..8u64).collect(), |i| {
            std::thread::sleep(Duration::from_millis(50));
            i * 10
        });
        assert_eq!(out, (0..8).map(|i| i * 10).collect::<Vec<_>>());
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn jobs_may_borrow_and_nest() {
        let mut bufs = vec![vec![0u8; 16]; 4];
        let jobs: Vec<(usize, &mut Vec<u8>)> = bufs.iter_mut().enumerate().collect();
        let sums = overlap(jobs, |(i, b)| {
            let inner = overlap(vec![1u8, 2], |x| x);
            b.fill(u8::try_from(i).unwrap() + inner[1]);
            b.len()
        });
        assert_eq!(sums, vec![16; 4]);
        assert_eq!(bufs[3][0], 5);
    }

    #[test]
    fn a_panic_reaches_the_caller_after_every_job() {
        let finished = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            overlap(vec![0, 1, 2, 3], |i| {
                if i == 2 {
                    panic!("job {i}");
                }
                std::thread::sleep(Duration::from_millis(20));
                finished.fetch_add(1, Ordering::SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(finished.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn start_all_waits_for_answers_from_other_threads_and_dropped_ones() {
        let t = Instant::now();
        let out = start_all((0..6u64).collect(), |i, answer: Answer<u64>| {
            if i == 4 {
                drop(answer); // lost: counts as done, no answer
                return;
            }
            if i == 0 {
                return answer(0); // answered before `start` returns
            }
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30 * i));
                answer(i * 10);
            });
        });
        assert_eq!(
            out,
            vec![Some(0), Some(10), Some(20), Some(30), None, Some(50)]
        );
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }
}
