//! The in-process measurements of one cell. Each runs for the plan's runtime against the
//! top of the stack, the way a client's requests reach it (the NBD server calls the same
//! `read_at`/`write_at`/`flush`):
//!
//! ```text
//!   seq write / seq read    1 MiB (or the full stripe, if larger) requests, QD1, from 0,
//!                           wrapping at the end; CPU seconds (getrusage) per GB moved
//!   sweep                   sequential writes of each request size, QD1: partial-stripe
//!                           writes pay read-modify-write, full stripes do not (the knee)
//!   sync write              4K random write + flush, QD1: the fsync-bound single job;
//!                           latency percentiles
//!   rand 4K                 random reads and writes, QD1 (one thread) and QD32 (32)
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, WriteFlags};
use serde::{Deserialize, Serialize};

use super::cell::Stack;
use super::{CellSpec, Plan, Progress};
use crate::error::{CliError, Result};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    /// From per-operation latencies in nanoseconds.
    pub fn from_ns(mut ns: Vec<u64>) -> Latency {
        if ns.is_empty() {
            return Latency::default();
        }
        ns.sort_unstable();
        let at = |permille: usize| {
            let last = ns.len() - 1;
            // The nearest rank: index q x last, rounded.
            let i = (permille.saturating_mul(last) + 500) / 1000;
            ns[i.min(last)] as f64 / 1000.0
        };
        Latency {
            p50: at(500),
            p90: at(900),
            p99: at(990),
            p999: at(999),
            max: at(1000),
        }
    }

    pub fn pairs(&self) -> [(&'static str, f64); 5] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p999),
            ("max", self.max),
        ]
    }
}

/// One point of the request-size sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Request size in bytes.
    pub request: u64,
    pub write_mbps: f64,
    /// Member operations (reads, writes, flushes of all members) per MiB written: the
    /// stack's cost whatever the machine's speed; in-process runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_ops_per_mib: Option<f64>,
}

/// Everything measured on one cell. Throughput in MB/s (10^6 bytes), IOPS per second,
/// latency in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    /// [`CellSpec::label`]: names the cell in tables, plots and --compare.
    pub cell: String,
    #[serde(flatten)]
    pub spec: CellSpec,
    /// "in-process" or "nbd+fio".
    pub mode: String,
    pub full_stripe: u64,
    /// Where the LUKS2 payload starts on the array (0 without LUKS).
    pub payload_offset: u64,
    pub seq_write_mbps: f64,
    pub seq_read_mbps: f64,
    pub randread_qd1_iops: f64,
    pub randwrite_qd1_iops: f64,
    pub randread_qd32_iops: f64,
    pub randwrite_qd32_iops: f64,
    /// 4K write + flush at QD1: operations per second and their latency.
    pub sync_write_iops: f64,
    pub sync_write_lat_us: Latency,
    pub cpu_s_per_gb_write: f64,
    pub cpu_s_per_gb_read: f64,
    pub sweep: Vec<SweepPoint>,
}

/// Progress steps of one cell: build, seq write, seq read, the sweep's sizes, sync write,
/// four random runs.
pub fn steps(plan: &Plan, spec: &CellSpec) -> u64 {
    let level = cairn_md::Level::parse(&spec.level).unwrap_or(cairn_md::Level::Raid0);
    let full = if spec.chunk == 0 {
        0
    } else {
        spec.chunk * u64::from(super::cell::data_members(level, spec.members))
    };
    let block = u64::from(spec.sector_size.max(512));
    7 + plan.sweep_sizes(full, block).len() as u64
}

/// User plus system CPU time of this process.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass; a zeroed rusage is valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A small fast generator (xorshift64*): random offsets without a dependency.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A `block`-aligned offset for a `len`-byte request inside `size`.
    fn offset(&mut self, size: u64, len: u64, block: u64) -> u64 {
        let slots = (size.saturating_sub(len) / block).max(1);
        self.next() % slots * block
    }
}

fn io_error(what: &str, e: &cairn_block::Error) -> CliError {
    CliError::new(format!("bench: {what} failed: {e}"))
}

/// Bytes per second as MB/s.
fn mbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9) / 1e6
}

/// A buffer of `len` bytes that does not compress to nothing.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        let x = r.next().to_le_bytes();
        let n = c.len();
        c.copy_from_slice(&x[..n]);
    }
    v
}

/// Sequential QD1 requests of `req` bytes from offset 0 for `runtime`, wrapping.
/// Returns (bytes, elapsed).
fn sequential(
    dev: &dyn BlockDevice,
    req: u64,
    write: bool,
    runtime: Duration,
) -> Result<(u64, Duration)> {
    let size = dev.geometry().size;
    let req = req.min(size);
    let len = usize::try_from(req).map_err(|_| CliError::new("bench: request too large"))?;
    let mut buf = pattern(len, req);
    let start = Instant::now();
    let mut off = 0u64;
    let mut bytes = 0u64;
    while start.elapsed() < runtime || bytes == 0 {
        if off + req > size {
            off = 0;
        }
        if write {
            dev.write_at(&buf, off, WriteFlags::NONE)
                .map_err(|e| io_error("a sequential write", &e))?;
        } else {
            dev.read_at(&mut buf, off)
                .map_err(|e| io_error("a sequential read", &e))?;
        }
        off += req;
        bytes += req;
    }
    if write {
        dev.flush().map_err(|e| io_error("a flush", &e))?;
    }
    Ok((bytes, start.elapsed()))
}

/// Random 4K requests from `threads` threads for `runtime`; IOPS.
fn random(dev: &Arc<dyn BlockDevice>, write: bool, threads: u32, runtime: Duration) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = dev.clone();
            let stop = stop.clone();
            std::thread::spawn(move || -> std::result::Result<u64, String> {
                let size = dev.geometry().size;
                let block = u64::from(dev.geometry().logical_block_size).max(4096);
                let mut rng = Rng::new(u64::from(t) + 1 + u64::from(write) * 1000);
                let mut buf = pattern(4096, u64::from(t));
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) || ops == 0 {
                    let off = rng.offset(size, 4096, block);
                    let r = if write {
                        dev.write_at(&buf, off, WriteFlags::NONE)
                    } else {
                        dev.read_at(&mut buf, off)
                    };
                    r.map_err(|e| e.to_string())?;
                    ops += 1;
                }
                Ok(ops)
            })
        })
        .collect();
    std::thread::sleep(runtime);
    stop.store(true, Ordering::Relaxed);
    let mut ops = 0;
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => ops += n,
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some("a benchmark thread stopped".into()),
        }
    }
    let elapsed = start.elapsed();
    if write {
        dev.flush().map_err(|e| io_error("a flush", &e))?;
    }
    if let Some(e) = failure {
        return Err(CliError::new(format!("bench: random I/O failed: {e}")));
    }
    Ok(ops as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// 4K random write + flush at QD1: (ops per second, latency).
fn sync_writes(dev: &dyn BlockDevice, runtime: Duration) -> Result<(f64, Latency)> {
    let size = dev.geometry().size;
    let block = u64::from(dev.geometry().logical_block_size).max(4096);
    let buf = pattern(4096, 7);
    let mut rng = Rng::new(99);
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < runtime || lat.is_empty() {
        let t = Instant::now();
        let off = rng.offset(size, 4096, block);
        dev.write_at(&buf, off, WriteFlags::NONE)
            .map_err(|e| io_error("a sync write", &e))?;
        dev.flush().map_err(|e| io_error("a flush", &e))?;
        lat.push(
            u64::try_from(t.elapsed().as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
        );
    }
    let ops = lat.len() as f64 / start.elapsed().as_secs_f64().max(1e-9);
    Ok((ops, Latency::from_ns(lat)))
}

/// Runs every measurement on one cell.
pub fn run_cell(
    plan: &Plan,
    spec: &CellSpec,
    stack: &Stack,
    progress: &mut Progress,
) -> Result<CellResult> {
    let dev = &stack.top;
    let g = dev.geometry();
    let block = u64::from(g.logical_block_size).max(512);
    let seq_req = (1u64 << 20).max(stack.full_stripe);
    let rt = plan.runtime;

    progress.step("sequential write");
    let c0 = cpu_time();
    let (wb, wt) = sequential(dev.as_ref(), seq_req, true, rt)?;
    let wcpu = cpu_time().saturating_sub(c0);
    progress.step("sequential read");
    let c0 = cpu_time();
    let (rb, rtm) = sequential(dev.as_ref(), seq_req, false, rt)?;
    let rcpu = cpu_time().saturating_sub(c0);

    let mut sweep = Vec::new();
    for req in plan.sweep_sizes(stack.full_stripe, block) {
        progress.step(&format!("sweep {}", super::short_size(req)));
        let ops0 = stack.member_ops();
        let (b, t) = sequential(dev.as_ref(), req, true, rt / 2)?;
        let ops = stack.member_ops() - ops0;
        sweep.push(SweepPoint {
            request: req,
            write_mbps: mbps(b, t),
            member_ops_per_mib: Some(ops as f64 / (b as f64 / f64::from(1u32 << 20)).max(1e-9)),
        });
    }
    progress.step("QD1 write+flush");
    let (sync_iops, sync_lat) = sync_writes(dev.as_ref(), rt)?;
    progress.step("4K random read QD1");
    let rr1 = random(dev, false, 1, rt)?;
    progress.step("4K random write QD1");
    let rw1 = random(dev, true, 1, rt)?;
    progress.step("4K random read and write QD32");
    let rr32 = random(dev, false, 32, rt)?;
    let rw32 = random(dev, true, 32, rt)?;
    let gb = |b: u64| (b as f64 / 1e9).max(1e-12);
    Ok(CellResult {
        cell: spec.label(),
        spec: spec.clone(),
        mode: "in-process".into(),
        full_stripe: stack.full_stripe,
        payload_offset: stack.payload_offset,
        seq_write_mbps: mbps(wb, wt),
        seq_read_mbps: mbps(rb, rtm),
        randread_qd1_iops: rr1,
        randwrite_qd1_iops: rw1,
        randread_qd32_iops: rr32,
        randwrite_qd32_iops: rw32,
        sync_write_iops: sync_iops,
        sync_write_lat_us: sync_lat,
        // A floor of one microsecond per GB: a run too short for the clock's tick still
        // reports a figure, never zero.
        cpu_s_per_gb_write: (wcpu.as_secs_f64() / gb(wb)).max(1e-6),
        cpu_s_per_gb_read: (rcpu.as_secs_f64() / gb(rb)).max(1e-6),
        sweep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let l = Latency::from_ns((1..=1000).map(|i| i * 1000).collect());
        assert_eq!(l.p50, 501.0);
        assert_eq!(l.max, 1000.0);
        assert!(l.p99 >= 990.0 && l.p99 <= 991.0);
        assert_eq!(Latency::from_ns(Vec::new()), Latency::default());
    }

    #[test]
    fn random_offsets_stay_inside_and_aligned() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let o = r.offset(1 << 20, 4096, 4096);
            assert!(o + 4096 <= 1 << 20);
            assert_eq!(o % 4096, 0);
        }
    }
}
