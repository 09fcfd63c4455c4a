//! Rebuild speed in process: RAID6 and RAID5 over four members in memory (512 KiB
//! chunks), filled with data; role 1 failed and removed, a fresh member added, and the
//! rebuild run to the end (`Array::run_pending`, no pacing). GB/s of member bytes rebuilt.
//!
//! ```text
//! cargo run --release -p cairn-md --example rebuild_bench [-- MEMBER_MIB [ROUNDS [DELAY_US]]]
//! ```
//!
//! With DELAY_US, every member operation of the rebuild (not of the fill) waits that long
//! first (testkit's `DelayDisk`).
//!
//! Beside the wall-clock speed it prints member bytes per CPU second of the whole process
//! (from /proc/self/stat, 10 ms ticks): on a busy machine the wall figure depends on how
//! much of the second core the rebuild gets, the CPU figure much less.

use std::sync::Arc;
use std::time::Instant;

use cairn_block::testkit::DelayDisk;
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::{Array, BitmapChoice, CreateOptions, Level, Sectors};
use std::time::Duration;

/// Fill request size: below the array's by-member threshold, so the fill runs on the
/// calling thread in every build compared (where member pages are allocated matters).
const FILL: u64 = 512 << 10;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map_or(default, |s| s.parse().expect("a number"))
}

/// CPU seconds this process has used (user + system), from /proc/self/stat (0 where
/// there is no /proc).
fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // After the command name in parentheses: fields 3.. ; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Seconds (wall, CPU) to rebuild role 1 of a filled array of `level`, and the member
/// bytes rebuilt.
fn rebuild(level: Level, member: u64, delay: Duration) -> (f64, f64, u64) {
    let n = 4;
    let slow: Vec<Arc<DelayDisk>> = (0..=n)
        .map(|_| Arc::new(DelayDisk::new(Arc::new(MemDisk::new(member)))))
        .collect();
    let devs: Vec<Arc<dyn BlockDevice>> = slow[..n]
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    let mut o = CreateOptions::new(level, "rebuild");
    o.chunk = Some(Sectors(1024));
    o.members_zeroed = true;
    o.bitmap = BitmapChoice::None;
    let names = (0..n).map(|i| format!("d{i}")).collect();
    let a = Array::create(devs, names, &o).expect("create");
    let size = a.geometry().size;
    let mut data = vec![0u8; 1 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes());
    }
    let mut off = 0;
    while off < size {
        let len = (size - off).min(FILL);
        a.write_at(
            &data[..usize::try_from(len).expect("small")],
            off,
            WriteFlags::NONE,
        )
        .expect("fill");
        data.rotate_left(4096);
        off += len;
    }
    a.flush().expect("flush");
    a.fail("d1").expect("fail");
    a.remove("d1").expect("remove");
    for d in &slow {
        d.set_delay(delay);
    }
    let t = Instant::now();
    let cpu = cpu_secs();
    a.add(slow[n].clone(), "spare".into(), false).expect("add");
    a.run_pending().expect("rebuild");
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu;
    a.close().expect("close");
    (secs, cpu, size / (n as u64 - level.parity_members() as u64))
}

fn main() {
    let member = arg(1, 256) << 20;
    let rounds = arg(2, 3);
    let delay = Duration::from_micros(arg(3, 0));
    println!(
        "rebuild of one member of 4, {} MiB members in memory, 512 KiB chunks, {delay:?} per \
         member op; best of {rounds}",
        member >> 20
    );
    for level in [Level::Raid6, Level::Raid5] {
        let mut best = 0f64;
        let mut best_cpu = 0f64;
        for _ in 0..rounds {
            let (secs, cpu, bytes) = rebuild(level, member, delay);
            best = best.max(bytes as f64 / secs / 1e9);
            if cpu > 0.0 {
                best_cpu = best_cpu.max(bytes as f64 / cpu / 1e9);
            }
        }
        println!(
            "{level}: {best:.2} GB/s of member bytes ({best_cpu:.2} GB per CPU second, \
             all threads)"
        );
    }
}
