//! A striped LV over four PVs with latency (testkit's `DelayDisk`, a sleep per call):
//! the QD1 latency of reads and writes that span the PVs, in PV latencies.
//!
//! ```text
//! cargo run --release -p cairn-lvm --example striped_bench [-- DELAY_US...]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::testkit::DelayDisk;
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_lvm::lv::{LogicalVolume, MapArea, MapSegment};

const PVS: usize = 4;
const PV_BYTES: u64 = 64 << 20;
const STRIPE: u64 = 64 << 10;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn time(n: usize, mut op: impl FnMut(u64)) -> Duration {
    median(
        (0..n as u64)
            .map(|i| {
                let t = Instant::now();
                op(i);
                t.elapsed()
            })
            .collect(),
    )
}

fn lat(us: u64, t: Duration, unit: Duration) -> String {
    if us == 0 {
        String::new()
    } else {
        format!(
            " ({:.2} PV latencies)",
            t.as_secs_f64() / unit.as_secs_f64()
        )
    }
}

fn main() {
    let delays: Vec<u64> = {
        let v: Vec<u64> = std::env::args()
            .skip(1)
            .map(|s| s.parse().expect("a delay in µs"))
            .collect();
        if v.is_empty() {
            vec![0, 1000]
        } else {
            v
        }
    };
    let pvs: Vec<Arc<DelayDisk>> = (0..PVS)
        .map(|_| Arc::new(DelayDisk::new(Arc::new(MemDisk::new(PV_BYTES)))))
        .collect();
    let lv = LogicalVolume::new(
        "bench".into(),
        pvs.iter()
            .enumerate()
            .map(|(i, p)| (format!("pv{i}"), p.clone() as Arc<dyn BlockDevice>))
            .collect(),
        vec![MapSegment {
            start: 0,
            len: PV_BYTES * PVS as u64,
            stripe_size: STRIPE,
            areas: (0..PVS).map(|pv| MapArea { pv, offset: 0 }).collect(),
        }],
        false,
    )
    .expect("LV");
    let size = lv.geometry().size;
    let data = vec![0xa5u8; 1 << 20];
    let mut buf = vec![0u8; 1 << 20];
    println!(
        "striped LV, {PVS} PVs, {} KiB stripes; QD1 medians",
        STRIPE >> 10
    );
    for us in delays {
        let d = Duration::from_micros(us);
        for p in &pvs {
            p.set_delay(d);
        }
        let n = if us == 0 { 2000 } else { 50 };
        let unit = time(n.min(50), |_| {
            pvs[0].read_at(&mut buf[..4096], 0).expect("read");
        });
        println!(
            "\n-- PV delay {us} µs (one PV op measures {:.1} µs) --",
            unit.as_secs_f64() * 1e6
        );
        for (name, len) in [("4K", 4096usize), ("256K", 256 << 10), ("1M", 1 << 20)] {
            let slots = size / len as u64;
            let r = time(n, |i| {
                let off = (i * 7919 % slots) * len as u64;
                lv.read_at(&mut buf[..len], off).expect("read");
            });
            let w = time(n, |i| {
                let off = (i * 7919 % slots) * len as u64;
                lv.write_at(&data[..len], off, WriteFlags::NONE)
                    .expect("write");
            });
            println!(
                "read {name:<5} {:>9.1} µs{}   write {name:<5} {:>9.1} µs{}",
                r.as_secs_f64() * 1e6,
                lat(us, r, unit),
                w.as_secs_f64() * 1e6,
                lat(us, w, unit)
            );
        }
        let f = time(n, |_| lv.flush().expect("flush"));
        println!(
            "flush      {:>9.1} µs{}",
            f.as_secs_f64() * 1e6,
            lat(us, f, unit)
        );
    }
}
