//! Where a request runs: on its connection's reader, or on the shared worker pool.
//!
//! Handing a request to a worker costs a futex wake and a context switch on each side,
//! about 5-20 µs on a small machine. Over a device with latency (a disk, a network
//! member, a replica) that buys parallelism: the reader goes on reading while the device
//! works, so one connection keeps 32 requests in flight. Over the page cache a 4 KiB
//! request takes 1-5 µs, and the hand-off costs more than the work: the reader is better
//! off running the request itself (a connection then runs one request at a time, at the
//! speed of one core, which is what the hand-offs were taking anyway).
//!
//! So each export keeps a running estimate of what a request of each class costs, and a
//! request whose class is cheap runs on the reader. Classes are kept apart because they
//! differ by orders of magnitude on one device: a 4 KiB read from the page cache, a 1 MiB
//! copy, an fsync. The estimate starts high (every class on the pool) and falls as fast
//! requests are seen; a class switches to the reader below [`INLINE_BELOW`] and back to
//! the pool above [`POOL_ABOVE`], so a device near the line does not flap. One slow
//! sample (a page-cache miss, a preempted worker) moves the estimate by a bounded step;
//! a device that turns slow moves it past the line within a few requests.
//!
//! A write the device completes later, on another thread (`BlockDevice::write_then`: a
//! replicated volume answers when the replica has it), holds the reader only while it is
//! sent off, and its estimate counts only that. The pool would buy such a request
//! nothing but the reading of the next request during those microseconds, so its class
//! uses wider lines ([`INLINE_BELOW_ASYNC`], [`POOL_ABOVE_ASYNC`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::*;

/// A class's estimate below this: its requests run on the reader.
pub(super) const INLINE_BELOW: Duration = Duration::from_micros(15);
/// A class's estimate above this: its requests go to the pool.
pub(super) const POOL_ABOVE: Duration = Duration::from_micros(30);
/// The same lines for a class whose requests complete after the device call returns.
pub(super) const INLINE_BELOW_ASYNC: Duration = Duration::from_micros(50);
pub(super) const POOL_ABOVE_ASYNC: Duration = Duration::from_micros(100);
/// Where every estimate starts: on the pool, several samples away from the line.
const START: Duration = Duration::from_micros(120);
/// One sample counts at most this much (a 10 ms stall moves the estimate like a 160 µs
/// one, by 20 µs): a single outlier does not send a fast class to the pool, two in a
/// row do.
const SAMPLE_CAP: Duration = Duration::from_micros(160);
/// Requests up to this size are "small"; larger ones are a class of their own (they
/// are mostly copying, and overlapping the copies of several pays on more than one core).
const SMALL: u32 = 64 << 10;

const CLASSES: usize = 5;

/// The class of a request: small reads, small writes, large transfers, flushes, the rest.
fn class(kind: u16, length: u32) -> usize {
    match kind {
        CMD_READ | CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM if length > SMALL => 2,
        CMD_READ => 0,
        CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM => 1,
        CMD_FLUSH => 3,
        _ => 4,
    }
}

/// One export's estimates, shared by its connections.
#[derive(Debug)]
pub(super) struct Costs {
    /// Running mean of each class's time on the device, in nanoseconds (1/8 weight for
    /// each new sample). Updated without a lock: concurrent updates may lose a sample.
    nanos: [AtomicU64; CLASSES],
    inline: [AtomicBool; CLASSES],
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            nanos: std::array::from_fn(|_| AtomicU64::new(nanos(START))),
            inline: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Costs {
    /// Whether a request of this kind and length should run on the reader.
    pub(super) fn inline(&self, kind: u16, length: u32) -> bool {
        self.inline[class(kind, length)].load(Ordering::Relaxed)
    }

    /// Counts one request's time on the device (for a request that completes later,
    /// `deferred`, the time until the device call returned).
    pub(super) fn record(&self, kind: u16, length: u32, took: Duration, deferred: bool) {
        let c = class(kind, length);
        let (below, above) = if deferred {
            (INLINE_BELOW_ASYNC, POOL_ABOVE_ASYNC)
        } else {
            (INLINE_BELOW, POOL_ABOVE)
        };
        let sample = nanos(took.min(SAMPLE_CAP));
        let old = self.nanos[c].load(Ordering::Relaxed);
        let new = old - old / 8 + sample / 8;
        self.nanos[c].store(new, Ordering::Relaxed);
        let inline = self.inline[c].load(Ordering::Relaxed);
        if inline && new > nanos(above) {
            self.inline[c].store(false, Ordering::Relaxed);
        } else if !inline && new < nanos(below) {
            self.inline[c].store(true, Ordering::Relaxed);
        }
    }

    /// The current estimate of a class (for tests and diagnostics).
    #[cfg(test)]
    fn estimate(&self, kind: u16, length: u32) -> Duration {
        Duration::from_nanos(self.nanos[class(kind, length)].load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn every_class_starts_on_the_pool() {
        let c = Costs::default();
        for kind in [CMD_READ, CMD_WRITE, CMD_FLUSH, CMD_TRIM, CMD_BLOCK_STATUS] {
            assert!(!c.inline(kind, 4096));
            assert!(!c.inline(kind, 1 << 20));
        }
    }

    #[test]
    fn fast_requests_move_their_class_to_the_reader_within_a_few_dozen() {
        let c = Costs::default();
        let mut n = 0;
        while !c.inline(CMD_READ, 4096) {
            c.record(CMD_READ, 4096, 3 * US, false);
            n += 1;
            assert!(n < 40, "still on the pool after {n} fast reads");
        }
        assert!(n > 4, "one sample must not be enough: {n}");
        // Only that class moved.
        assert!(!c.inline(CMD_WRITE, 4096));
        assert!(!c.inline(CMD_READ, 1 << 20));
        assert!(!c.inline(CMD_FLUSH, 0));
    }

    #[test]
    fn one_stall_does_not_move_a_fast_class_but_a_slow_device_does() {
        let c = Costs::default();
        for _ in 0..100 {
            c.record(CMD_WRITE, 4096, 2 * US, false);
        }
        assert!(c.inline(CMD_WRITE, 4096));
        c.record(CMD_WRITE, 4096, Duration::from_millis(50), false);
        assert!(
            c.inline(CMD_WRITE, 4096),
            "{:?}",
            c.estimate(CMD_WRITE, 4096)
        );
        for _ in 0..100 {
            c.record(CMD_WRITE, 4096, 2 * US, false);
        }
        let mut n = 0;
        while c.inline(CMD_WRITE, 4096) {
            c.record(CMD_WRITE, 4096, Duration::from_millis(1), false);
            n += 1;
            assert!(n < 10, "still inline after {n} slow writes");
        }
    }

    #[test]
    fn a_device_near_the_line_does_not_flap() {
        let c = Costs::default();
        for _ in 0..100 {
            c.record(CMD_READ, 4096, 20 * US, false);
        }
        // Between the two thresholds: stays where it was (on the pool).
        assert!(!c.inline(CMD_READ, 4096));
        for _ in 0..100 {
            c.record(CMD_READ, 4096, 5 * US, false);
        }
        assert!(c.inline(CMD_READ, 4096));
        for _ in 0..100 {
            c.record(CMD_READ, 4096, 20 * US, false);
        }
        assert!(c.inline(CMD_READ, 4096));
    }

    #[test]
    fn a_write_that_completes_later_is_judged_by_its_sending_with_wider_lines() {
        let c = Costs::default();
        // 30 µs to send off: too slow for a request done in place, not for one that
        // completes later.
        for _ in 0..100 {
            c.record(CMD_WRITE, 4096, 30 * US, false);
        }
        assert!(!c.inline(CMD_WRITE, 4096));
        for _ in 0..100 {
            c.record(CMD_WRITE, 4096, 30 * US, true);
        }
        assert!(c.inline(CMD_WRITE, 4096));
        // A local disk behind it that takes a millisecond still sends it to the pool.
        let mut n = 0;
        while c.inline(CMD_WRITE, 4096) {
            c.record(CMD_WRITE, 4096, Duration::from_millis(1), true);
            n += 1;
            assert!(n < 10, "still inline after {n} slow sends");
        }
    }

    #[test]
    fn classes_split_by_size_and_kind() {
        assert_eq!(class(CMD_READ, 4096), 0);
        assert_eq!(class(CMD_READ, SMALL), 0);
        assert_eq!(class(CMD_READ, SMALL + 512), 2);
        assert_eq!(class(CMD_WRITE, 4096), 1);
        assert_eq!(class(CMD_WRITE_ZEROES, 1 << 30), 2);
        assert_eq!(class(CMD_FLUSH, 0), 3);
        assert_eq!(class(CMD_CACHE, 4096), 4);
    }
}
