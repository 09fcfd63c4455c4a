//! What the partial-parity log costs: 4 KiB random writes (each a partial-stripe write)
//! on RAID5 and RAID6 over FileDisk members in /dev/shm, with the log and without it.
//!
//! ```text
//! cargo run --release -p cairn-md --example ppl_bench [-- ARRAY_MIB [SECONDS] [ROUNDS]]
//! ```
//!
//! The members live in tmpfs, so a FUA write costs little more than a write: this
//! measures the CPU and the extra member write, not a disk's cache flush latency, which
//! on real disks dominates (docs/write-hole.md).

use std::path::Path;
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

/// CPU time of the calling thread (user + system), in seconds: on a shared machine
/// this moves far less than wall time.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Random 4 KiB writes on one thread for `secs`: (IOPS by wall time, CPU µs per write).
fn random_writes(dev: &dyn BlockDevice, secs: u64) -> (f64, f64) {
    let blocks = dev.geometry().size / 4096;
    let buf = vec![0x5au8; 4096];
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut n = 0u64;
    let t = Instant::now();
    let cpu = thread_cpu();
    while !n.is_multiple_of(64) || t.elapsed() < Duration::from_secs(secs) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        dev.write_at(&buf, (x % blocks) * 4096, WriteFlags::NONE)
            .unwrap();
        n += 1;
    }
    let cpu = thread_cpu() - cpu;
    (n as f64 / t.elapsed().as_secs_f64(), cpu / n as f64 * 1e6)
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
    let rounds = arg(3, 3);
    let dir = std::path::PathBuf::from(format!("/dev/shm/cairn-ppl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "4K random writes, one thread, 64K chunk, {array_mib} MiB arrays, members in tmpfs; \
         {rounds} rounds alternating, best of each"
    );
    println!(
        "{:<12} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}",
        "array", "none IOPS", "log IOPS", "ratio", "none µs", "log µs", "ratio"
    );
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let mut best = [(0f64, f64::MAX); 2];
        for _ in 0..rounds {
            for (i, log) in [false, true].into_iter().enumerate() {
                let a = make(&dir, level, n, array_mib, log);
                let (iops, us) = random_writes(&a, secs);
                a.close().unwrap();
                drop(a);
                best[i] = (best[i].0.max(iops), best[i].1.min(us));
            }
        }
        let [(ni, nu), (li, lu)] = best;
        println!(
            "{:<12} {ni:>10.0} {li:>10.0} {:>8.2}x {nu:>10.2} {lu:>10.2} {:>8.2}x",
            format!("{level} x{n}"),
            li / ni,
            lu / nu
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
