//! What a request costs in member latencies: RAID6 over four members with 64 KiB chunks,
//! each member op delayed (testkit's `DelayDisk`, a sleep per call, so concurrent calls
//! overlap like a disk with a deep queue or a network member).
//!
//! ```text
//! cargo run --release -p cairn-md --example latency_bench [-- DELAY_US... ]
//! ```
//!
//! For each delay (default 0, 100 and 1000 µs): the QD1 latency of each request kind, as
//! a multiple of one member op's measured latency (a 1 ms sleep takes a little longer
//! than 1 ms) and in µs; then QD32 IOPS of 4 KiB random reads and writes, 32 threads
//! calling the array at once, and QD128 random reads (32 in flight per member). "bitmap" rows write to regions whose bit is clear, so each
//! request sets a bit first; "log" rows use an array with a partial-parity log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::testkit::DelayDisk;
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::{Array, BitmapChoice, CreateOptions, Level, Sectors};

const MEMBERS: usize = 4;
const MEMBER_BYTES: u64 = 64 << 20;
const CHUNK: u64 = 64 << 10;

struct Bench {
    members: Vec<Arc<DelayDisk>>,
    array: Array,
}

fn make(bitmap: BitmapChoice, log: bool) -> Bench {
    let members: Vec<Arc<DelayDisk>> = (0..MEMBERS)
        .map(|_| Arc::new(DelayDisk::new(Arc::new(MemDisk::new(MEMBER_BYTES)))))
        .collect();
    let mut o = CreateOptions::new(Level::Raid6, "latency");
    o.chunk = Some(Sectors(CHUNK / 512));
    o.members_zeroed = true;
    o.bitmap = bitmap;
    o.write_journal = log;
    let devs = members
        .iter()
        .map(|m| m.clone() as Arc<dyn BlockDevice>)
        .collect();
    let names = (0..MEMBERS).map(|i| format!("d{i}")).collect();
    let array = Array::create(devs, names, &o).expect("create");
    Bench { members, array }
}

impl Bench {
    fn set_delay(&self, d: Duration) {
        for m in &self.members {
            m.set_delay(d);
        }
    }
}

/// A small xorshift: offsets only need to be spread, not unpredictable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A random offset aligned to `align` with `len` bytes after it inside `size`.
    fn offset(&mut self, size: u64, len: u64, align: u64) -> u64 {
        (self.next() % ((size - len) / align + 1)) * align
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Runs `op` `n` times (at least 3) or for about `budget`, whichever comes first (after
/// 3); the median.
fn time(n: usize, budget: Duration, mut op: impl FnMut(usize)) -> Duration {
    let start = Instant::now();
    let mut v = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        op(i);
        v.push(t.elapsed());
        if i >= 2 && start.elapsed() > budget {
            break;
        }
    }
    median(v)
}

fn qd(array: &Array, depth: u64, write: bool, secs: f64) -> f64 {
    let size = array.geometry().size;
    let done = AtomicU64::new(0);
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..depth {
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + th * 7919);
                let mut buf = vec![0x5au8; 4096];
                while Instant::now() < stop {
                    let off = rng.offset(size, 4096, 4096);
                    if write {
                        array.write_at(&buf, off, WriteFlags::NONE).expect("write");
                    } else {
                        array.read_at(&mut buf, off).expect("read");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let delays: Vec<u64> = {
        let v: Vec<u64> = std::env::args()
            .skip(1)
            .map(|s| s.parse().expect("a delay in µs"))
            .collect();
        if v.is_empty() {
            vec![0, 100, 1000]
        } else {
            v
        }
    };
    let plain = make(BitmapChoice::None, false);
    let logged = make(BitmapChoice::None, true);
    let size = plain.array.geometry().size;
    let data = vec![0xa5u8; 1 << 20];
    let mut buf = vec![0u8; 1 << 20];
    // Fill the arrays once so reads and read-modify-writes see real data.
    for b in [&plain, &logged] {
        let mut off = 0;
        while off < size {
            b.array
                .write_at(&data, off, WriteFlags::NONE)
                .expect("fill");
            off += 1 << 20;
        }
        b.array.flush().expect("flush");
    }
    println!(
        "RAID6 x{MEMBERS}, {} KiB chunk, {} MiB members in memory; QD1 medians",
        CHUNK >> 10,
        MEMBER_BYTES >> 20
    );
    for &us in &delays {
        let delay = Duration::from_micros(us);
        // A fresh array with a bitmap per delay: its bits are all clear.
        let bitmap = make(
            BitmapChoice::Internal {
                chunk_bytes: Some(256 << 10),
            },
            false,
        );
        for b in [&plain, &bitmap, &logged] {
            b.set_delay(delay);
        }
        let budget = Duration::from_millis(if us == 0 { 300 } else { 1500 });
        let n = if us == 0 { 20_000 } else { 200 };
        // One member op as the members deliver it (a sleep overshoots a little).
        let unit = time(n.min(200), budget, |_| {
            plain.members[0]
                .read_at(&mut buf[..4096], 0)
                .expect("member read");
        });
        println!(
            "\n-- member delay {us} µs (one member op measures {:.1} µs) --",
            unit.as_secs_f64() * 1e6
        );
        println!("{:<34} {:>12} {:>14}", "request", "µs", "member lat.");
        let mut rng = Rng(12345);
        let row = |name: &str, d: Duration| {
            let lat = if us == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", d.as_secs_f64() / unit.as_secs_f64())
            };
            println!("{name:<34} {:>12.1} {lat:>14}", d.as_secs_f64() * 1e6);
        };
        for (name, len, align) in [
            ("read 4K", 4096u64, 4096u64),
            ("read 128K (full stripe)", 128 << 10, 128 << 10),
            ("read 1M", 1 << 20, 1 << 20),
        ] {
            let d = time(n, budget, |_| {
                let off = rng.offset(size, len, align);
                plain
                    .array
                    .read_at(&mut buf[..usize::try_from(len).expect("small")], off)
                    .expect("read");
            });
            row(name, d);
        }
        for (name, arr, len, align) in [
            ("write 4K (partial stripe)", &plain, 4096u64, 4096u64),
            ("write 4K, partial-parity log", &logged, 4096, 4096),
            ("write 128K (full stripe)", &plain, 128 << 10, 128 << 10),
            ("write 1M", &plain, 1 << 20, 1 << 20),
        ] {
            let d = time(n, budget, |_| {
                let off = rng.offset(size, len, align);
                arr.array
                    .write_at(
                        &data[..usize::try_from(len).expect("small")],
                        off,
                        WriteFlags::NONE,
                    )
                    .expect("write");
            });
            row(name, d);
        }
        // Each request lands in a region whose bit is clear (256 KiB per bit, the array
        // holds 512 of them; bits clear only seconds after a flush).
        let regions = size / (256 << 10);
        let mut next = 0u64;
        let mut fresh = || {
            let off = (next % regions) * (256 << 10);
            next += 1;
            off
        };
        let d = time(regions as usize / 3, budget, |_| {
            bitmap
                .array
                .write_at(&data[..128 << 10], fresh(), WriteFlags::NONE)
                .expect("write");
        });
        row("write 128K, bitmap bit set first", d);
        let d = time(n, budget, |_| {
            plain.array.flush().expect("flush");
        });
        row("flush", d);
        let secs = if us == 0 { 1.0 } else { 2.0 };
        let r = qd(&plain.array, 32, false, secs);
        let w = qd(&plain.array, 32, true, secs);
        // The issue's read goal, 0.8 x 4 x 32 / latency, counts 32 reads in flight on
        // each of the 4 members: 128 requests, as 32 threads cannot give more than 32.
        let r128 = qd(&plain.array, 128, false, secs);
        let bound = 32.0 / unit.as_secs_f64();
        println!(
            "QD32 4K random read  {r:>10.0} IOPS{}",
            if us == 0 {
                String::new()
            } else {
                format!("  ({:.2} x 32/latency)", r / bound)
            }
        );
        println!(
            "QD32 4K random write {w:>10.0} IOPS{}",
            if us == 0 {
                String::new()
            } else {
                format!("  ({:.2} x 32/latency)", w / bound)
            }
        );
        println!(
            "QD128 4K random read {r128:>10.0} IOPS{}",
            if us == 0 {
                String::new()
            } else {
                format!(
                    "  ({:.2} x 4 x 32/latency: 32 in flight per member)",
                    r128 / (4.0 * bound)
                )
            }
        );
        bitmap.set_delay(Duration::ZERO);
        bitmap.array.close().expect("close");
    }
    for b in [plain, logged] {
        b.set_delay(Duration::ZERO);
        b.array.close().expect("close");
    }
}
