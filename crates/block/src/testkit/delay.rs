//! A member with latency: every operation waits a set time before it is passed on.
//!
//! Benchmarks use it to see how many member latencies a request costs above it (a disk's
//! seek, a network member's round trip). The wait is a sleep per call, so concurrent
//! callers overlap, as they do on a device with a deep queue; it models latency, not
//! bandwidth.
//!
//! [`DelayDisk::completing_later`] makes one that behaves as a network device does: its
//! `read_then`, `write_then`, `flush_then` and `discard_then` return at once and answer
//! from another thread after the delay ([`BlockDevice::completes_later`]), so layers take
//! the path that starts every member operation from one thread and waits once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{BlockDevice, ReadDone, Result, WriteDone, WriteFlags};

/// Wraps a device and delays each read, write, flush, discard and write-zeroes by
/// [`DelayDisk::set_delay`] (zero at first). Counts the operations it passed on.
#[derive(Debug)]
pub struct DelayDisk {
    inner: Arc<dyn BlockDevice>,
    delay_ns: Arc<AtomicU64>,
    ops: AtomicU64,
    later: bool,
}

impl DelayDisk {
    pub fn new(inner: Arc<dyn BlockDevice>) -> DelayDisk {
        DelayDisk {
            inner,
            delay_ns: Arc::new(AtomicU64::new(0)),
            ops: AtomicU64::new(0),
            later: false,
        }
    }

    /// One whose `*_then` operations answer later, from a thread of their own.
    pub fn completing_later(inner: Arc<dyn BlockDevice>) -> DelayDisk {
        DelayDisk {
            later: true,
            ..DelayDisk::new(inner)
        }
    }

    /// Runs `op` on another thread after the delay (the device's `*_then` when it
    /// completes later), or here.
    fn then(&self, op: impl FnOnce(&dyn BlockDevice) + Send + 'static) {
        if !self.later {
            self.wait();
            return op(&*self.inner);
        }
        self.ops.fetch_add(1, Ordering::Relaxed);
        let (inner, delay) = (self.inner.clone(), self.delay_ns.clone());
        std::thread::spawn(move || {
            let ns = delay.load(Ordering::Relaxed);
            if ns > 0 {
                std::thread::sleep(Duration::from_nanos(ns));
            }
            op(&*inner);
        });
    }

    /// From now on every operation waits `delay` first.
    pub fn set_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.delay_ns.store(ns, Ordering::Relaxed);
    }

    /// Operations passed on so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn wait(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let ns = self.delay_ns.load(Ordering::Relaxed);
        if ns > 0 {
            std::thread::sleep(Duration::from_nanos(ns));
        }
    }
}

/// Every operation waits first; the `*_then` forms of one that completes later wait on
/// a thread of their own.
impl crate::Filter for DelayDisk {
    type Inner = dyn BlockDevice;

    fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
        &*self.inner
    }

    fn admit(&self, _op: crate::IoOp) -> Result<()> {
        self.wait();
        Ok(())
    }

    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        self.then(move |d| {
            let mut buf = vec![0u8; len];
            done(d.read_at(&mut buf, offset).map(|()| buf));
        });
    }

    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        let buf = buf.to_vec();
        self.then(move |d| done(d.write_at(&buf, offset, flags)));
    }

    fn flush_then(&self, done: WriteDone) {
        self.then(move |d| done(d.flush()));
    }

    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        self.then(move |d| done(d.discard(offset, len)));
    }

    fn completes_later(&self) -> bool {
        self.later
    }
}

crate::filter_device!(DelayDisk);
