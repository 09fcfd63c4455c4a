//! The rate controller of resync and online verify (md's `speed_limit_min`/`max`, the idea
//! of DRBD's `c-min-rate`): background copies run up to the maximum while the volume is
//! idle, and fall back to the minimum while the application does I/O, so its requests keep
//! the disks and the link.
//!
//! ```text
//!   Volume::read_at, Node::write ── +1 per request ──> app counter (AtomicU64, node.rs)
//!                                                          │ read at every admission
//!   resync / verify thread, per range:                     v
//!     Pacer::admit(bytes) ──> Controller::admit(now, counter, bytes)
//!       sleeps in slices      ├─ the counter moved in the last HOLD: min   (throttled)
//!       of at most WINDOW     │  otherwise:                         max   (0: unlimited)
//!       while it owes bytes   └─ a token bucket at that target: a range goes when nothing
//!                                is owed and is charged in full; the debt is paid at the
//!                                target of the moment, the credit is one WINDOW at most
//! ```
//!
//! [`Controller`] is pure: time and the counter come in as arguments, so the tests drive
//! it without sleeping. [`Pacer`] puts it behind a mutex, with the real clock, for the
//! threads of one job; `status` reads the target from it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How often a waiting job looks at the counter again, and the most credit a job saves up
/// (one window of bytes at its target): after a stall it does not burst.
pub const WINDOW: Duration = Duration::from_millis(100);

/// Application I/O seen this recently holds the job at the minimum: a busy application's
/// short pauses (between two commits) do not let a burst of copies into its next request,
/// and an application that stopped gets the full speed back half a second later.
pub const HOLD: Duration = Duration::from_millis(500);

/// The default minimum, `--resync-min-rate`: 32 MiB/s (docs/replication.md says why).
pub const DEFAULT_MIN_MIB: u64 = 32;

/// Nanoseconds per second: the credit's unit is bytes times this.
const NANOS: i128 = 1_000_000_000;

/// The two limits, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    /// Kept while the application does I/O (at most `max`; at least 1).
    pub min_bytes_per_sec: u64,
    /// While it does not; 0: unlimited.
    pub max_bytes_per_sec: u64,
}

impl Default for RateLimits {
    fn default() -> RateLimits {
        RateLimits {
            min_bytes_per_sec: DEFAULT_MIN_MIB << 20,
            max_bytes_per_sec: 0,
        }
    }
}

impl RateLimits {
    /// The target under application I/O: the minimum, never above the maximum (a
    /// maximum below the minimum is a fixed rate).
    fn floor(self) -> u64 {
        let min = self.min_bytes_per_sec.max(1);
        match self.ceiling() {
            Some(max) => min.min(max),
            None => min,
        }
    }

    /// The target when the application is idle; `None`: unlimited.
    fn ceiling(self) -> Option<u64> {
        (self.max_bytes_per_sec > 0).then_some(self.max_bytes_per_sec)
    }
}

/// What the controller paces to at the moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Bytes per second; `None`: unlimited.
    pub bytes_per_sec: Option<u64>,
    /// Application I/O holds the job at the minimum, below what it would run at otherwise.
    pub throttled: bool,
}

/// One job's controller (a resync or a verify against one peer).
#[derive(Clone, Debug)]
pub struct Controller {
    limits: RateLimits,
    /// The application counter at the last look, and when it last moved.
    seen: u64,
    last_app: Option<Instant>,
    /// Bytes the job may still move before it waits, times 10^9 (a rate in bytes per
    /// second times nanoseconds then adds up exactly); negative: bytes it owes.
    credit: i128,
    /// When `credit` was brought up to date.
    at: Instant,
    target: Target,
}

impl Controller {
    /// A job starting at `now`; `app` is the application counter then (I/O before the
    /// job does not count).
    pub fn new(limits: RateLimits, now: Instant, app: u64) -> Controller {
        Controller {
            limits,
            seen: app,
            last_app: None,
            credit: 0,
            at: now,
            target: Target {
                bytes_per_sec: limits.ceiling(),
                throttled: false,
            },
        }
    }

    /// The target as of the last look.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Looks at the application counter at `now`: the target from now on. The credit
    /// earned since the last look is earned at the target that held meanwhile.
    pub fn observe(&mut self, now: Instant, app: u64) -> Target {
        if app != self.seen {
            self.seen = app;
            self.last_app = Some(now);
        }
        self.refill(now);
        let busy = self
            .last_app
            .is_some_and(|t| now.saturating_duration_since(t) < HOLD);
        let (floor, ceiling) = (self.limits.floor(), self.limits.ceiling());
        let throttled = busy && ceiling.is_none_or(|c| c > floor);
        self.target = Target {
            bytes_per_sec: if throttled { Some(floor) } else { ceiling },
            throttled,
        };
        match self.target.bytes_per_sec {
            Some(rate) => self.credit = self.credit.min(burst(rate)),
            None => self.credit = 0,
        }
        self.target
    }

    /// Before the job moves `bytes`: `Duration::ZERO` when they may go now (they are
    /// charged), else how long until the bytes owed are paid at the present target
    /// (nothing is charged; ask again then, or sooner).
    pub fn admit(&mut self, now: Instant, app: u64, bytes: u64) -> Duration {
        let Some(rate) = self.observe(now, app).bytes_per_sec else {
            return Duration::ZERO;
        };
        if self.credit < 0 {
            let owed = self.credit.unsigned_abs();
            let nanos = owed.div_ceil(u128::from(rate));
            return Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        }
        self.credit -= i128::from(bytes) * NANOS;
        Duration::ZERO
    }

    fn refill(&mut self, now: Instant) {
        // A second is far more than the burst: longer gaps add nothing more.
        let dt = now
            .saturating_duration_since(self.at)
            .min(Duration::from_secs(1));
        self.at = self.at.max(now);
        if let Some(rate) = self.target.bytes_per_sec {
            let earned = i128::from(rate) * i128::try_from(dt.as_nanos()).unwrap_or(0);
            self.credit = (self.credit + earned).min(burst(rate));
        }
    }
}

/// One window of bytes at `rate`, in the credit's unit.
fn burst(rate: u64) -> i128 {
    i128::from(rate) * i128::try_from(WINDOW.as_nanos()).unwrap_or(0)
}

/// A [`Controller`] with the real clock, shared by the threads of one job.
#[derive(Debug)]
pub struct Pacer {
    ctl: Mutex<Controller>,
}

impl Pacer {
    pub fn new(limits: RateLimits, app: &AtomicU64) -> Pacer {
        Pacer {
            ctl: Mutex::new(Controller::new(
                limits,
                Instant::now(),
                app.load(Ordering::Relaxed),
            )),
        }
    }

    fn ctl(&self) -> std::sync::MutexGuard<'_, Controller> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `bytes` may go, looking again at least every [`WINDOW`] (the target
    /// changes while it waits); returns early, charging nothing, once `stop` says so.
    /// Call it holding no lock a writer could need.
    pub fn admit(&self, bytes: u64, app: &AtomicU64, stop: impl Fn() -> bool) {
        loop {
            let wait = self
                .ctl()
                .admit(Instant::now(), app.load(Ordering::Relaxed), bytes);
            if wait.is_zero() || stop() {
                return;
            }
            thread::sleep(wait.min(WINDOW));
        }
    }

    /// The target now (for `status`).
    pub fn target(&self, app: &AtomicU64) -> Target {
        self.ctl()
            .observe(Instant::now(), app.load(Ordering::Relaxed))
    }
}

/// How far back a job's shown speed looks: long enough to smooth the controller's slices,
/// short enough that a new target shows within seconds.
pub const SPEED_SPAN: Duration = Duration::from_secs(10);

/// One sample of a job's progress kept per this much time.
const SPEED_STEP: Duration = Duration::from_millis(500);

/// A long job's speed over its last [`SPEED_SPAN`], which `status` shows and the finish
/// time divides by. An average since the start lags behind for minutes after the
/// controller changes its target (the application stops, a limit is raised); this follows
/// within the span. While the job is younger than the span it is the average since the
/// start. Time comes in as an argument, as for [`Controller`].
#[derive(Debug)]
pub struct Speed {
    /// (when, bytes done then), oldest first: every sample of the last span and the
    /// newest one before it.
    samples: Mutex<VecDeque<(Instant, u64)>>,
}

impl Speed {
    /// A job starting at `now` with nothing done.
    pub fn new(now: Instant) -> Speed {
        Speed {
            samples: Mutex::new(VecDeque::from([(now, 0)])),
        }
    }

    fn prune(samples: &mut VecDeque<(Instant, u64)>, now: Instant) {
        while samples.len() >= 2 && samples[1].0 + SPEED_SPAN <= now {
            samples.pop_front();
        }
    }

    /// The job has done `done` bytes in all at `now`.
    pub fn note(&self, now: Instant, done: u64) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if s.back().is_some_and(|b| now < b.0 + SPEED_STEP) {
            return;
        }
        s.push_back((now, done));
        Self::prune(&mut s, now);
    }

    /// Bytes per second at `now`, with `done` bytes done: since the oldest sample kept.
    /// A job that stalls slows down in the figure as the stall goes on.
    pub fn rate(&self, now: Instant, done: u64) -> u64 {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut s, now);
        let Some(&(t, d)) = s.front() else { return 0 };
        let secs = now.saturating_duration_since(t).as_secs_f64().max(0.001);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let r = (done.saturating_sub(d) as f64 / secs) as u64;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limits(min_mib: u64, max_mib: u64) -> RateLimits {
        RateLimits {
            min_bytes_per_sec: min_mib * MIB,
            max_bytes_per_sec: max_mib * MIB,
        }
    }

    /// A job copying `chunk`-byte ranges from `from` to `until`, each one as soon as the
    /// controller lets it (the copy itself takes no time); `app(t)` is the application
    /// counter at `t`. The bytes moved, and the time after the last admission.
    fn drive(
        c: &mut Controller,
        from: Instant,
        until: Instant,
        chunk: u64,
        app: impl Fn(Instant) -> u64,
    ) -> (u64, Instant) {
        let (mut now, mut moved) = (from, 0);
        while now < until {
            let wait = c.admit(now, app(now), chunk);
            if wait.is_zero() {
                moved += chunk;
            } else {
                // As Pacer: never more than a window at once.
                now += wait.min(WINDOW);
            }
        }
        (moved, now)
    }

    #[test]
    fn an_idle_volume_runs_at_the_maximum() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(32, 200), t0, 0);
        let (moved, _) = drive(&mut c, t0, t0 + Duration::from_secs(10), MIB, |_| 0);
        // 2000 MiB in 10 s, give or take the first range and one window of credit.
        assert!(
            (2000 * MIB..=2000 * MIB + MIB + 20 * MIB).contains(&moved),
            "{} MiB",
            moved / MIB
        );
        assert_eq!(
            c.target(),
            Target {
                bytes_per_sec: Some(200 * MIB),
                throttled: false
            }
        );
    }

    #[test]
    fn application_io_holds_the_job_at_the_minimum_until_it_stops() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(10, 100), t0, 0);
        // The application does a request every 10 ms for 5 s, then nothing.
        let busy_until = t0 + Duration::from_secs(5);
        let app = |t: Instant| {
            let t = t.min(busy_until);
            u64::try_from((t - t0).as_millis() / 10).unwrap()
        };
        let (moved, now) = drive(&mut c, t0, busy_until, MIB, app);
        assert_eq!(
            c.target(),
            Target {
                bytes_per_sec: Some(10 * MIB),
                throttled: true
            }
        );
        // 50 MiB in 5 s, give or take the first range (charged at the maximum's pace).
        assert!(
            (49 * MIB..=52 * MIB).contains(&moved),
            "{} MiB while busy",
            moved / MIB
        );
        // Held for HOLD after the last request is seen, then the maximum.
        assert!(c.observe(busy_until, app(now)).throttled);
        assert!(c.observe(busy_until + HOLD - ms(1), app(now)).throttled);
        let t = c.observe(busy_until + HOLD, app(now));
        assert_eq!(
            t,
            Target {
                bytes_per_sec: Some(100 * MIB),
                throttled: false
            }
        );
        let from = busy_until + HOLD;
        let (moved, _) = drive(&mut c, from, from + Duration::from_secs(5), MIB, app);
        assert!(
            (500 * MIB..=512 * MIB).contains(&moved),
            "{} MiB when idle again",
            moved / MIB
        );
    }

    #[test]
    fn unlimited_means_no_wait_until_the_application_comes() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(32, 0), t0, 7);
        for i in 0..1000 {
            assert_eq!(c.admit(t0 + ms(i), 7, 4 * MIB), Duration::ZERO);
        }
        assert_eq!(c.target().bytes_per_sec, None);
        // A request: from now on 32 MiB/s, and the credit starts at zero.
        let t1 = t0 + ms(1000);
        assert_eq!(c.admit(t1, 8, MIB), Duration::ZERO);
        assert_eq!(c.target().bytes_per_sec, Some(32 * MIB));
        assert!(c.target().throttled);
        assert_eq!(c.admit(t1, 8, MIB), ms(1000) / 32);
    }

    #[test]
    fn a_maximum_below_the_minimum_is_a_fixed_rate_and_never_throttled() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(64, 10), t0, 0);
        let t = c.observe(t0 + ms(1), 1);
        assert_eq!(
            t,
            Target {
                bytes_per_sec: Some(10 * MIB),
                throttled: false
            }
        );
        // Equal limits: the application changes nothing either.
        let mut c = Controller::new(limits(10, 10), t0, 0);
        assert!(!c.observe(t0 + ms(1), 1).throttled);
    }

    #[test]
    fn the_debt_is_paid_at_the_target_of_the_moment() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(1, 100), t0, 0);
        assert_eq!(c.admit(t0, 0, 10 * MIB), Duration::ZERO);
        // 10 MiB owed at 100 MiB/s.
        assert_eq!(c.admit(t0, 0, MIB), ms(100));
        // The application starts: what is left is owed at 1 MiB/s.
        assert_eq!(c.admit(t0 + ms(50), 1, MIB), ms(5000));
        // It stops: back at 100 MiB/s once HOLD is over; 5 MiB - 0.5 s x 1 MiB/s owed.
        let t = t0 + ms(50) + HOLD;
        assert_eq!(c.admit(t, 1, MIB), Duration::from_micros(45_000));
        assert_eq!(
            c.admit(t + Duration::from_micros(45_000), 1, MIB),
            Duration::ZERO
        );
    }

    #[test]
    fn a_stalled_job_saves_up_one_window_at_most() {
        let t0 = Instant::now();
        let mut c = Controller::new(limits(10, 100), t0, 0);
        // Nothing moved for a minute (the peer was slow, a range was held).
        let t1 = t0 + Duration::from_secs(60);
        let mut moved = 0;
        while c.admit(t1, 0, MIB).is_zero() {
            moved += MIB;
        }
        // 10 MiB of credit (100 ms at 100 MiB/s), plus the range that went into debt.
        assert_eq!(moved, 11 * MIB);
    }

    /// Drives a [`Speed`] from `t` for `secs` at `mib_per_sec`, noting every 100 ms.
    fn run(sp: &Speed, t: &mut Instant, done: &mut u64, secs: u64, mib_per_sec: u64) {
        for _ in 0..secs * 10 {
            *t += ms(100);
            *done += mib_per_sec * MIB / 10;
            sp.note(*t, *done);
        }
    }

    #[test]
    fn the_speed_shown_follows_a_new_target_within_its_span() {
        let mut t = Instant::now();
        let sp = Speed::new(t);
        let mut done = 0;
        run(&sp, &mut t, &mut done, 60, 100);
        assert_eq!(sp.rate(t, done) / MIB, 100);
        // The application starts: the controller holds the job at 10 MiB/s. The average
        // since the start would still say 82 MiB/s after 15 s.
        run(&sp, &mut t, &mut done, 15, 10);
        let r = sp.rate(t, done);
        assert!((10 * MIB..11 * MIB).contains(&r), "{r}");
        // Kept small: the samples of one span and one before it.
        assert!(sp.samples.lock().unwrap().len() <= 22);
    }

    #[test]
    fn a_young_job_shows_its_average_and_a_stalled_one_slows_down_to_nothing() {
        let t0 = Instant::now();
        let mut t = t0;
        let sp = Speed::new(t);
        let mut done = 0;
        run(&sp, &mut t, &mut done, 2, 50);
        assert_eq!(sp.rate(t, done), done / 2);
        run(&sp, &mut t, &mut done, 20, 50);
        // Nothing moves for 5 s: half the span.
        let r = sp.rate(t + Duration::from_secs(5), done);
        assert!((24 * MIB..26 * MIB).contains(&r), "{r}");
        // And after a whole span, nothing.
        assert_eq!(sp.rate(t + Duration::from_secs(11), done), 0);
        assert_eq!(Speed::new(t0).rate(t0, 0), 0);
    }

    #[test]
    fn a_pacer_without_a_limit_never_sleeps() {
        let app = AtomicU64::new(0);
        let p = Pacer::new(limits(32, 0), &app);
        for _ in 0..10_000 {
            p.admit(MIB, &app, || false);
        }
        assert_eq!(p.target(&app).bytes_per_sec, None);
        app.fetch_add(1, Ordering::Relaxed);
        assert_eq!(p.target(&app).bytes_per_sec, Some(32 * MIB));
        // A stop ends a wait at once, charging nothing.
        p.admit(64 * MIB, &app, || false);
        p.admit(MIB, &app, || true);
    }
}
