//! How long a client may take its replies: every connection's writer is timed, and the
//! accept thread (accept.rs, every 200 ms) cuts a connection whose reply is overdue.
//!
//! ```text
//!   send_reply ── begin(bytes) ── Timed::write (progress) … ── end()
//!   accept loop ── overdue(now)? ── shutdown both ways: the writer fails, the holds go
//! ```
//!
//! A reply is overdue when, after `client_timeout` and over each `client_timeout` since,
//! the client took less than [`MIN_DRAIN_RATE`] of it: one that does not read at all, and
//! one that reads a trickle (64 KiB every 10 s would hold a 32 MiB reply's memory for an
//! hour and a half). Bytes the socket buffers take count as taken, so over TCP, whose
//! buffers can take megabytes of a reply the client never reads, the cut may come one
//! window later. The socket's own send timeout is no help: over TCP the kernel keeps
//! making room for a few bytes at a time, so a write never waits that long.

use std::io::{self, IoSlice, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The slowest a client may take a reply, measured over each `client_timeout` while one
/// is pending: 256 KiB/s (2 Mbit/s).
pub const MIN_DRAIN_RATE: u64 = 256 << 10;

/// Milliseconds since the first call, never 0 (0 means "not sending").
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// The state of the reply a connection is writing, shared with the accept thread.
#[derive(Debug, Default)]
pub(super) struct SendClock {
    /// When the reply being written started (0: none is).
    since: AtomicU64,
    /// When the current window started (the reply's start, then each check).
    window: AtomicU64,
    /// Bytes the client took in the current window.
    taken: AtomicU64,
}

impl SendClock {
    /// A reply starts going out (under the connection's writer lock).
    pub(super) fn begin(&self) {
        let now = now_ms();
        self.taken.store(0, Ordering::Relaxed);
        self.window.store(now, Ordering::Relaxed);
        self.since.store(now, Ordering::Release);
    }

    /// The reply went out (or failed).
    pub(super) fn end(&self) {
        self.since.store(0, Ordering::Release);
    }

    fn took(&self, n: usize) {
        self.taken
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Why the connection must be cut now, if its reply is overdue; called by the one
    /// watching thread, which also starts each window after the first.
    pub(super) fn overdue(&self, timeout: Duration) -> Option<String> {
        if self.since.load(Ordering::Acquire) == 0 {
            return None;
        }
        let now = now_ms();
        let window = now.saturating_sub(self.window.load(Ordering::Relaxed));
        if u128::from(window) < timeout.as_millis() {
            return None;
        }
        let taken = self.taken.swap(0, Ordering::Relaxed);
        self.window.store(now, Ordering::Relaxed);
        let needed = MIN_DRAIN_RATE.saturating_mul(window) / 1000;
        (taken < needed).then(|| {
            format!(
                "took {} KiB of a reply in {:.1} s, less than {} KiB/s (--client-timeout)",
                taken >> 10,
                Duration::from_millis(window).as_secs_f64(),
                MIN_DRAIN_RATE >> 10
            )
        })
    }
}

/// A connection's writer that counts the bytes the client takes.
pub(super) struct Timed {
    pub(super) w: Box<dyn Write + Send>,
    pub(super) clock: std::sync::Arc<SendClock>,
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.w.write(buf)?;
        self.clock.took(n);
        Ok(n)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = self.w.write_vectored(bufs)?;
        self.clock.took(n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_overdue_when_a_window_moves_less_than_the_rate() {
        let c = SendClock::default();
        let t = Duration::from_millis(300);
        assert!(c.overdue(t).is_none(), "idle");
        c.begin();
        assert!(c.overdue(t).is_none(), "just started");
        // A window with enough bytes: 256 KiB/s over 0.3 s is 77 KiB.
        c.took(100 << 10);
        std::thread::sleep(Duration::from_millis(320));
        assert!(c.overdue(t).is_none(), "fast enough");
        // The next window: a trickle.
        c.took(10 << 10);
        std::thread::sleep(Duration::from_millis(320));
        let why = c.overdue(t).expect("a trickle");
        assert!(why.contains("less than 256 KiB/s"), "{why}");
        // Nothing at all, after a new reply starts.
        c.begin();
        std::thread::sleep(Duration::from_millis(320));
        assert!(c.overdue(t).is_some(), "no byte taken");
        c.end();
        assert!(c.overdue(t).is_none(), "done");
    }
}
