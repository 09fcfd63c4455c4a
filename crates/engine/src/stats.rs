//! Per-device I/O statistics: a [`StatsDisk`] wrapper counts what passes through it.
//!
//! ```text
//!   caller ──> StatsDisk ──> inner device
//!                 │ in_flight += 1, t0 = now ... inner op ... record(op, len, now - t0)
//!                 └──> Arc<IoStats>: per op kind {ops, bytes, errors, latency sum,
//!                                    latency histogram}, in-flight gauge
//! ```
//!
//! Everything is a relaxed atomic: a sample may see one counter of an operation updated
//! and another not yet, which is fine for rates over seconds and never blocks I/O. The
//! time-weighted queue depth is derived as iostat derives `aqu-sz`: the growth of the
//! summed latencies over an interval divided by the interval (Little's law), so no lock
//! or timestamp bookkeeping is needed at submission time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cairn_block::{BlockDevice, ReadDone, Result, WriteDone, WriteFlags};
use serde::{Deserialize, Serialize};

/// Upper bounds of the latency histogram buckets, in nanoseconds (Prometheus `le`), from
/// 50 µs (a page-cache hit over a layer or two) to 10 s (a stuck disk). A last bucket
/// without bound (+Inf) follows.
pub const BUCKET_BOUNDS_NS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets including +Inf.
pub const BUCKETS: usize = BUCKET_BOUNDS_NS.len() + 1;

/// The kinds of operation counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes];

    /// The label value in metrics: "read", "write", "flush", "discard", "write_zeroes".
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters for one kind of operation. Aligned to a cache line so reads and writes
/// counted on different cores do not bounce one line between them.
#[derive(Debug, Default)]
#[repr(align(64))]
struct OpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpCounters {
    fn snapshot(&self) -> OpSnapshot {
        OpSnapshot {
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            latency_ns: self.latency_ns.load(Relaxed),
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// The live counters of one device. Shared by the [`StatsDisk`] that updates them and
/// the [`Registry`] that reads them.
#[derive(Debug, Default)]
pub struct IoStats {
    ops: [OpCounters; 5],
    in_flight: AtomicU64,
}

/// The bucket an operation of `ns` nanoseconds falls in.
fn bucket_of(ns: u64) -> usize {
    BUCKET_BOUNDS_NS
        .iter()
        .position(|&b| ns <= b)
        .unwrap_or(BUCKET_BOUNDS_NS.len())
}

impl IoStats {
    pub fn new() -> IoStats {
        IoStats::default()
    }

    /// Records one completed operation (`ok`: it succeeded) of `bytes` taking `ns`.
    pub fn record(&self, op: Op, bytes: u64, ns: u64, ok: bool) {
        let c = &self.ops[op.index()];
        c.ops.fetch_add(1, Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Relaxed);
        } else {
            c.errors.fetch_add(1, Relaxed);
        }
        c.latency_ns.fetch_add(ns, Relaxed);
        c.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
    }

    /// Runs `f` as one operation of `op` over `bytes`, counting it.
    #[inline]
    pub fn track<T>(&self, op: Op, bytes: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = self.begin();
        let r = f();
        self.end(op, bytes, start, r.is_ok());
        r
    }

    /// The start of an operation that completes later ([`IoStats::end`] counts it).
    pub fn begin(&self) -> Instant {
        self.in_flight.fetch_add(1, Relaxed);
        Instant::now()
    }

    /// Counts an operation [`IoStats::begin`] started.
    pub fn end(&self, op: Op, bytes: u64, start: Instant, ok: bool) {
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.record(op, bytes, ns, ok);
        self.in_flight.fetch_sub(1, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let s = |op: Op| self.ops[op.index()].snapshot();
        Snapshot {
            read: s(Op::Read),
            write: s(Op::Write),
            flush: s(Op::Flush),
            discard: s(Op::Discard),
            write_zeroes: s(Op::WriteZeroes),
            in_flight: self.in_flight.load(Relaxed),
        }
    }
}

/// One kind of operation at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSnapshot {
    /// Completed operations, failed ones included.
    pub ops: u64,
    /// Bytes moved by the operations that succeeded.
    pub bytes: u64,
    pub errors: u64,
    /// Summed latency of all completed operations.
    pub latency_ns: u64,
    /// Operations per latency bucket (not cumulative), [`BUCKET_BOUNDS_NS`] then +Inf.
    pub buckets: Vec<u64>,
}

impl OpSnapshot {
    /// `self - earlier`, saturating (a counter that went backwards reads as 0).
    pub fn since(&self, earlier: &OpSnapshot) -> OpSnapshot {
        OpSnapshot {
            ops: self.ops.saturating_sub(earlier.ops),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            errors: self.errors.saturating_sub(earlier.errors),
            latency_ns: self.latency_ns.saturating_sub(earlier.latency_ns),
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, b)| b.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    fn plus(&self, other: &OpSnapshot) -> OpSnapshot {
        let n = self.buckets.len().max(other.buckets.len());
        OpSnapshot {
            ops: self.ops + other.ops,
            bytes: self.bytes + other.bytes,
            errors: self.errors + other.errors,
            latency_ns: self.latency_ns + other.latency_ns,
            buckets: (0..n)
                .map(|i| {
                    self.buckets.get(i).copied().unwrap_or(0)
                        + other.buckets.get(i).copied().unwrap_or(0)
                })
                .collect(),
        }
    }
}

/// A device's counters at one moment: what `/v1/stats` serves per node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub flush: OpSnapshot,
    pub discard: OpSnapshot,
    pub write_zeroes: OpSnapshot,
    /// Operations running now.
    pub in_flight: u64,
}

impl Snapshot {
    pub fn op(&self, op: Op) -> &OpSnapshot {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Discard => &self.discard,
            Op::WriteZeroes => &self.write_zeroes,
        }
    }

    /// Summed latency of every operation: the integral of the queue depth over time.
    pub fn queue_ns(&self) -> u64 {
        Op::ALL.iter().map(|&o| self.op(o).latency_ns).sum()
    }

    /// Rates between `earlier` and `self`, taken `secs` apart, as iostat -x shows them.
    pub fn rates_since(&self, earlier: &Snapshot, secs: f64) -> Rates {
        let r = self.read.since(&earlier.read);
        let w = self.write.since(&earlier.write);
        let others = [Op::Flush, Op::Discard, Op::WriteZeroes]
            .iter()
            .fold(OpSnapshot::default(), |acc, &o| {
                acc.plus(&self.op(o).since(earlier.op(o)))
            });
        let secs = if secs > 0.0 { secs } else { f64::INFINITY };
        let rw = r.plus(&w);
        let all = rw.plus(&others);
        let ms = |ns: u64| ns as f64 / 1e6;
        let avg = |s: &OpSnapshot| {
            if s.ops == 0 {
                0.0
            } else {
                ms(s.latency_ns) / s.ops as f64
            }
        };
        Rates {
            reads_per_sec: r.ops as f64 / secs,
            writes_per_sec: w.ops as f64 / secs,
            other_per_sec: others.ops as f64 / secs,
            read_mb_per_sec: r.bytes as f64 / 1e6 / secs,
            write_mb_per_sec: w.bytes as f64 / 1e6 / secs,
            read_await_ms: avg(&r),
            write_await_ms: avg(&w),
            await_ms: avg(&rw),
            p99_ms: quantile_ns(&rw.buckets, 0.99).map_or(0.0, ms),
            queue_depth: ms(all.latency_ns) / 1e3 / secs,
            read_percent: if rw.ops == 0 {
                0.0
            } else {
                100.0 * r.ops as f64 / rw.ops as f64
            },
            errors: all.errors,
            reads: r.ops,
            writes: w.ops,
        }
    }
}

/// What `cairn top` shows for one device over one interval.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// Flushes, discards and write-zeroes.
    pub other_per_sec: f64,
    pub read_mb_per_sec: f64,
    pub write_mb_per_sec: f64,
    pub read_await_ms: f64,
    pub write_await_ms: f64,
    /// Average latency of reads and writes.
    pub await_ms: f64,
    /// 99th percentile latency of reads and writes, estimated from the histogram.
    pub p99_ms: f64,
    /// Time-weighted average number of operations in flight (iostat's aqu-sz).
    pub queue_depth: f64,
    /// Reads as a share of reads + writes.
    pub read_percent: f64,
    pub errors: u64,
    /// Operations in the interval, for totals.
    pub reads: u64,
    pub writes: u64,
}

/// The `q` quantile (0..=1) of a histogram of non-cumulative bucket counts, interpolated
/// linearly inside the bucket as Prometheus' `histogram_quantile` does. `None` when empty.
/// A quantile in the +Inf bucket reads as the last finite bound.
pub fn quantile_ns(buckets: &[u64], q: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = BUCKET_BOUNDS_NS.get(i) else {
                return BUCKET_BOUNDS_NS.last().copied();
            };
            let lower = if i == 0 { 0 } else { BUCKET_BOUNDS_NS[i - 1] };
            let frac = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            // frac is in [0, 1], so the product is in [0, upper - lower]: nothing to lose.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let within = ((upper - lower) as f64 * frac).round() as u64;
            return Some(lower + within);
        }
        below += n;
    }
    BUCKET_BOUNDS_NS.last().copied()
}

/// A block device that counts what passes through it into an [`IoStats`]. Implements
/// only the counting: every call goes to the device below unchanged.
#[derive(Debug)]
pub struct StatsDisk<D> {
    inner: D,
    stats: Arc<IoStats>,
}

impl<D: BlockDevice> StatsDisk<D> {
    pub fn new(inner: D, stats: Arc<IoStats>) -> StatsDisk<D> {
        StatsDisk { inner, stats }
    }

    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDevice> cairn_block::Filter for StatsDisk<D> {
    type Inner = D;
    fn inner(&self) -> impl std::ops::Deref<Target = D> + '_ {
        &self.inner
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.stats
            .track(Op::Read, len, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.stats.track(Op::Write, buf.len() as u64, || {
            self.inner.write_at(buf, offset, flags)
        })
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        let (stats, bytes) = (self.stats.clone(), buf.len() as u64);
        let start = stats.begin();
        self.inner.write_then(
            buf,
            offset,
            flags,
            Box::new(move |r| {
                stats.end(Op::Write, bytes, start, r.is_ok());
                done(r);
            }),
        );
    }
    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        let stats = self.stats.clone();
        let start = stats.begin();
        self.inner.read_then(
            len,
            offset,
            Box::new(move |r| {
                stats.end(Op::Read, len as u64, start, r.is_ok());
                done(r);
            }),
        );
    }
    fn flush_then(&self, done: WriteDone) {
        let stats = self.stats.clone();
        let start = stats.begin();
        self.inner.flush_then(Box::new(move |r| {
            stats.end(Op::Flush, 0, start, r.is_ok());
            done(r);
        }));
    }
    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        let stats = self.stats.clone();
        let start = stats.begin();
        self.inner.discard_then(
            offset,
            len,
            Box::new(move |r| {
                stats.end(Op::Discard, len, start, r.is_ok());
                done(r);
            }),
        );
    }
    fn flush(&self) -> Result<()> {
        self.stats.track(Op::Flush, 0, || self.inner.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.stats
            .track(Op::Discard, len, || self.inner.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.stats.track(Op::WriteZeroes, len, || {
            self.inner.write_zeroes(offset, len, flags)
        })
    }
}

cairn_block::filter_device!([D: BlockDevice] StatsDisk<D>);

/// The process's counters by stack node id ("export:home", "member:d0.img", ...).
///
/// Devices are opened in several places (exports, md members); each asks the registry
/// for its counters by id, so whoever reports (status, metrics) finds them in one place.
#[derive(Debug, Default)]
pub struct Registry {
    nodes: Mutex<BTreeMap<String, Arc<IoStats>>>,
}

impl Registry {
    /// The one registry of this process.
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(Registry::default)
    }

    /// The counters for `id`, made on first use. A device opened again under the same
    /// id (an export removed and added back) continues the same counters.
    pub fn get_or_insert(&self, id: &str) -> Arc<IoStats> {
        let mut m = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id.to_string()).or_default().clone()
    }

    pub fn get(&self, id: &str) -> Option<Arc<IoStats>> {
        let m = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        m.get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        let mut m = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(id);
    }

    /// Wraps `dev` so its I/O counts under `id`.
    pub fn wrap(&self, id: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        Arc::new(StatsDisk::new(dev, self.get_or_insert(id)))
    }

    /// Every node's counters now.
    pub fn snapshot(&self) -> BTreeMap<String, Snapshot> {
        let m = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect()
    }
}

/// Nanoseconds since this process first asked: a monotonic clock for rates.
pub fn monotonic_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::{ErrorKind, MemDisk};

    #[test]
    fn a_stats_disk_passes_everything_through() {
        cairn_block::testkit::conformance::check_pass_through(
            &|d| Arc::new(StatsDisk::new(d, Arc::new(IoStats::new()))),
            &[],
        );
    }

    #[test]
    fn counts_every_kind_with_bytes_and_errors() {
        let stats = Arc::new(IoStats::new());
        let d = StatsDisk::new(MemDisk::new(1 << 20), stats.clone());
        let mut buf = vec![0u8; 4096];
        d.write_at(&buf, 0, WriteFlags::NONE).unwrap();
        d.write_at(&buf[..512], 4096, WriteFlags::FUA).unwrap();
        d.read_at(&mut buf, 0).unwrap();
        d.flush().unwrap();
        d.write_zeroes(0, 8192, WriteFlags::NONE).unwrap();
        let _ = d.discard(0, 4096);
        let s = stats.snapshot();
        assert_eq!((s.write.ops, s.write.bytes), (2, 4608));
        assert_eq!((s.read.ops, s.read.bytes), (1, 4096));
        assert_eq!(s.flush.ops, 1);
        assert_eq!((s.write_zeroes.ops, s.write_zeroes.bytes), (1, 8192));
        // MemDisk may or may not discard; either way the op is counted once.
        assert_eq!(s.discard.ops, 1);
        assert_eq!(s.in_flight, 0);
        for op in Op::ALL {
            let o = s.op(op);
            assert_eq!(o.buckets.iter().sum::<u64>(), o.ops, "{op:?}");
        }
    }

    #[test]
    fn errors_count_but_move_no_bytes() {
        let stats = IoStats::new();
        let r: Result<()> = stats.track(Op::Read, 4096, || {
            Err(cairn_block::Error::new(ErrorKind::Io, "boom"))
        });
        assert!(r.is_err());
        let s = stats.snapshot();
        assert_eq!((s.read.ops, s.read.bytes, s.read.errors), (1, 0, 1));
    }

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(50_000), 0);
        assert_eq!(bucket_of(50_001), 1);
        assert_eq!(bucket_of(10_000_000_000), 16);
        assert_eq!(bucket_of(u64::MAX), 17);
    }

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        let mut b = vec![0u64; BUCKETS];
        assert_eq!(quantile_ns(&b, 0.99), None);
        // 100 ops, all in (1 ms, 2.5 ms]: p50 is half way through that bucket.
        b[5] = 100;
        assert_eq!(quantile_ns(&b, 0.5), Some(1_750_000));
        assert_eq!(quantile_ns(&b, 1.0), Some(2_500_000));
        // 99 fast ops and one slow: p99 lands at the top of the fast bucket.
        let mut b = vec![0u64; BUCKETS];
        b[0] = 99;
        b[12] = 1;
        assert_eq!(quantile_ns(&b, 0.99), Some(50_000));
        assert_eq!(quantile_ns(&b, 0.999), Some(475_000_000));
        // In +Inf: the last finite bound.
        let mut b = vec![0u64; BUCKETS];
        b[17] = 3;
        assert_eq!(quantile_ns(&b, 0.5), Some(10_000_000_000));
    }

    #[test]
    fn rates_follow_iostat() {
        let stats = IoStats::new();
        let before = stats.snapshot();
        for _ in 0..30 {
            stats.record(Op::Read, 4096, 2_000_000, true);
        }
        for _ in 0..10 {
            stats.record(Op::Write, 1 << 20, 4_000_000, true);
        }
        let r = stats.snapshot().rates_since(&before, 2.0);
        assert_eq!(r.reads_per_sec, 15.0);
        assert_eq!(r.writes_per_sec, 5.0);
        assert!((r.write_mb_per_sec - 10.0 * 1048576.0 / 1e6 / 2.0).abs() < 1e-9);
        assert_eq!(r.read_await_ms, 2.0);
        assert_eq!(r.write_await_ms, 4.0);
        assert_eq!(r.await_ms, 2.5);
        assert_eq!(r.read_percent, 75.0);
        // 30 x 2 ms + 10 x 4 ms = 100 ms of queue time in 2 s.
        assert!((r.queue_depth - 0.05).abs() < 1e-12, "{}", r.queue_depth);
        assert!(r.p99_ms > 2.5 && r.p99_ms <= 5.0, "{}", r.p99_ms);
        assert_eq!((r.reads, r.writes), (30, 10));
    }

    #[test]
    fn registry_keeps_counters_by_id() {
        let reg = Registry::default();
        let d = reg.wrap("file:/x", Arc::new(MemDisk::new(1 << 16)));
        d.write_at(&[1u8; 512], 0, WriteFlags::NONE).unwrap();
        assert_eq!(reg.snapshot()["file:/x"].write.ops, 1);
        assert!(Arc::ptr_eq(
            &reg.get_or_insert("file:/x"),
            &reg.get("file:/x").unwrap()
        ));
        let json = serde_json::to_value(reg.snapshot()).unwrap();
        // One write in some latency bucket (which one depends on how busy the machine is).
        let buckets = json["file:/x"]["write"]["buckets"].as_array().unwrap();
        assert_eq!(buckets.iter().filter_map(|b| b.as_u64()).sum::<u64>(), 1);
        reg.remove("file:/x");
        assert!(reg.snapshot().is_empty());
    }

    #[test]
    fn counts_exactly_under_concurrency() {
        let stats = Arc::new(IoStats::new());
        let d = Arc::new(StatsDisk::new(MemDisk::new(1 << 20), stats.clone()));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![t; 512];
                    for i in 0..1000u64 {
                        d.write_at(&buf, (i % 64) * 512, WriteFlags::NONE).unwrap();
                        d.read_at(&mut buf, (i % 64) * 512).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = stats.snapshot();
        assert_eq!((s.read.ops, s.write.ops), (4000, 4000));
        assert_eq!(s.write.bytes, 4000 * 512);
        assert_eq!(s.in_flight, 0);
    }

    /// The cost of counting, per operation: 512-byte reads from memory with and without
    /// the wrapper. Prints the figure; `cargo test --release -p cairn-engine overhead --
    /// --nocapture` gives the number docs/operator.md quotes.
    #[test]
    fn overhead_per_op_is_small() {
        const N: u32 = 200_000;
        let plain = MemDisk::new(1 << 20);
        let wrapped = StatsDisk::new(MemDisk::new(1 << 20), Arc::new(IoStats::new()));
        let mut buf = vec![0u8; 512];
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..N {
                    f();
                }
                best = best.min(t.elapsed().as_nanos() as f64 / f64::from(N));
            }
            best
        };
        let base = time(&mut || plain.read_at(&mut buf, 4096).unwrap());
        let counted = time(&mut || wrapped.read_at(&mut buf, 4096).unwrap());
        let overhead = counted - base;
        println!("StatsDisk overhead: {overhead:.1} ns/op ({base:.1} -> {counted:.1} ns/op)");
        // Generous, for unoptimised test builds on a busy machine; release is ~50 ns.
        assert!(overhead < 5_000.0, "{overhead} ns/op");
    }
}
