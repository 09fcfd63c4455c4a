//! The stripe cache where reads cost something: a RAID5 of three 64 KiB-chunk members
//! in memory, each member op delayed by LATENCY_US (a stand-in for a disk), written
//! sequentially in PIECE_KIB requests by THREADS workers that take the next request in
//! order, as an NBD server's workers do with one client's queue.
//!
//! ```text
//! cargo run --release -p cairn-md --example stripe_cache_bench [-- LATENCY_US [PIECE_KIB [THREADS [HOLD_MS]]]]
//! ```
//!
//! Prints MiB/s and member reads with the cache off (size 0) and on (md's default 256).
//! The delay is a sleep per member op, so it models latency (seeks), not bandwidth.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, MemDisk, Result, WriteFlags};
use cairn_md::{Array, CreateOptions, Level, Sectors, StripeCache, StripeCacheOptions};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|s| s.parse().expect("numeric argument"))
        .unwrap_or(default)
}

/// A member whose every read and write waits `delay_ns` first; counts reads.
#[derive(Debug)]
struct Slow {
    inner: MemDisk,
    delay_ns: AtomicU64,
    reads: AtomicU64,
}

impl Slow {
    fn wait(&self) {
        let ns = self.delay_ns.load(Ordering::Relaxed);
        if ns > 0 {
            std::thread::sleep(Duration::from_nanos(ns));
        }
    }
}

/// Reads and writes wait; flushes pass as they are.
impl cairn_block::Filter for Slow {
    type Inner = MemDisk;
    fn inner(&self) -> impl std::ops::Deref<Target = MemDisk> + '_ {
        &self.inner
    }
    fn admit(&self, op: cairn_block::IoOp) -> Result<()> {
        match op {
            cairn_block::IoOp::Read => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.wait();
            }
            cairn_block::IoOp::Write => self.wait(),
            _ => {}
        }
        Ok(())
    }
}

cairn_block::filter_device!(Slow);

fn run(size: u32, hold: Duration, delay: Duration, piece: u64, threads: u64) -> (f64, u64) {
    let members: Vec<Arc<Slow>> = (0..3)
        .map(|_| {
            Arc::new(Slow {
                inner: MemDisk::new(66 << 20),
                delay_ns: AtomicU64::new(0),
                reads: AtomicU64::new(0),
            })
        })
        .collect();
    let mut o = CreateOptions::new(Level::Raid5, "bench");
    o.chunk = Some(Sectors(128));
    o.members_zeroed = true;
    let devs = members
        .iter()
        .map(|m| m.clone() as Arc<dyn BlockDevice>)
        .collect();
    let names = (0..3).map(|i| format!("d{i}")).collect();
    let array = Array::create(devs, names, &o).expect("create");
    // The superblocks are written; from here on every member op is slow.
    let ns = u64::try_from(delay.as_nanos()).expect("a short delay");
    for m in &members {
        m.delay_ns.store(ns, Ordering::Relaxed);
    }
    let array: Arc<dyn BlockDevice> = Arc::new(array);
    let dev = StripeCache::new(array, StripeCacheOptions { size, hold });
    let total = 32u64 << 20;
    let next = AtomicU64::new(0);
    let data = vec![0x5au8; usize::try_from(piece).expect("small")];
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let off = next.fetch_add(piece, Ordering::Relaxed);
                if off + piece > total {
                    break;
                }
                dev.write_at(&data, off, WriteFlags::NONE).expect("write");
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let reads = members
        .iter()
        .map(|m| m.reads.load(Ordering::Relaxed))
        .sum();
    (total as f64 / secs / f64::from(1u32 << 20), reads)
}

fn main() {
    let latency = Duration::from_micros(arg(1, 500));
    let piece = arg(2, 64) << 10;
    let threads = arg(3, 4);
    let hold = Duration::from_millis(arg(4, 2));
    for size in [0, 256] {
        let (mibs, reads) = run(size, hold, latency, piece, threads);
        println!(
            "stripe cache {size:>3}: {mibs:8.1} MiB/s, {reads} member reads \
             ({} KiB writes, {threads} workers, {latency:?} per member op, hold {hold:?})",
            piece >> 10
        );
    }
}
