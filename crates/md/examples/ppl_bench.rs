//! What the partial-parity log costs: 4 KiB random writes (each a partial-stripe write)
//! on RAID5 and RAID6 over FileDisk members in /dev/shm, with the log and without it.
//!
//! ```text
//! cargo run --release -p cairn-md --example ppl_bench [-- ARRAY_MIB [SECONDS] [THREADS]]
//! ```
//!
//! The members live in tmpfs, so a FUA write costs little more than a write: this
//! measures the CPU and the extra member write, not a disk's cache flush latency, which
//! on real disks dominates (docs/write-hole.md).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, FileDisk, OpenOptions, WriteFlags};
use cairn_md::{Array, CreateOptions, Level, Sectors};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|s| s.parse().expect("numeric argument"))
        .unwrap_or(default)
}

fn random_writes(dev: &dyn BlockDevice, secs: u64, threads: u64) -> f64 {
    let blocks = dev.geometry().size / 4096;
    let done = AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let done = &done;
            s.spawn(move || {
                let buf = vec![th.to_le_bytes()[0] ^ 0x5a; 4096];
                let mut x = (th + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let mut n = 0u64;
                while !n.is_multiple_of(64) || t.elapsed() < Duration::from_secs(secs) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    dev.write_at(&buf, (x % blocks) * 4096, WriteFlags::NONE)
                        .unwrap();
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn make(dir: &Path, level: Level, n: u64, array_mib: u64, log: bool) -> Array {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let data = (array_mib << 20) / (n - level.parity_members() as u64);
    let member = data + (4 << 20);
    let mut members: Vec<Arc<dyn BlockDevice>> = Vec::new();
    let mut names = Vec::new();
    for i in 0..n {
        let p = dir.join(format!("{level}-{log}-{i}.img"));
        let d = FileDisk::open(
            &p,
            &OpenOptions {
                create_size: Some(member),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        members.push(Arc::new(d));
        names.push(p.display().to_string());
    }
    let mut o = CreateOptions::new(level, "bench");
    o.chunk = Some(Sectors(128));
    o.members_zeroed = true;
    o.write_journal = log;
    Array::create(members, names, &o).unwrap()
}

fn main() {
    let array_mib = arg(1, 256);
    let secs = arg(2, 3);
    let threads = arg(3, 2);
    let dir = std::path::PathBuf::from(format!("/dev/shm/cairn-ppl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!("4K random writes, 64K chunk, {array_mib} MiB arrays, members in tmpfs");
    println!(
        "{:<22} {:>12} {:>12} {:>7}",
        "array", "none IOPS", "log IOPS", "log/none"
    );
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        for th in [1, threads] {
            let none = make(&dir, level, n, array_mib, false);
            let a = random_writes(&none, secs, th);
            none.close().unwrap();
            drop(none);
            let logged = make(&dir, level, n, array_mib, true);
            let b = random_writes(&logged, secs, th);
            logged.close().unwrap();
            drop(logged);
            println!(
                "{:<22} {a:>12.0} {b:>12.0} {:>6.2}x",
                format!("{level} x{n}, {th} thr"),
                b / a
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
