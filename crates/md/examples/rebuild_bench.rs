//! Rebuild speed in process: RAID6 and RAID5 over four members in memory (512 KiB
//! chunks), filled with data; role 1 failed and removed, a fresh member added, and the
//! rebuild run to the end (`Array::run_pending`, no pacing). GB/s of member bytes rebuilt.
//!
//! ```text
//! cargo run --release -p cairn-md --example rebuild_bench [-- MEMBER_MIB [ROUNDS [DELAY_US [DIR]]]]
//! ```
//!
//! With DELAY_US, every member operation of the rebuild (not of the fill) waits that long
//! first (testkit's `DelayDisk`). With DIR the members are sparse files in DIR (say
//! `/dev/shm`, as `bench/rebuild.sh` has them; removed at the end of each round) instead
//! of `MemDisk`s.
//!
//! Beside the wall-clock speed it prints member bytes per CPU second of the whole process
//! (`getrusage`, all threads): on a busy machine the wall figure depends on how much of
//! the second core the rebuild gets, the CPU figure much less. `RAID=5` or `RAID=6` in
//! the environment runs that level only (for `perf stat` of one level).

use std::sync::Arc;
use std::time::Instant;

use cairn_block::testkit::DelayDisk;
use cairn_block::{BlockDevice, FileDisk, MemDisk, OpenOptions, WriteFlags};
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

/// CPU seconds this process has used (user + system, every thread), from `getrusage`
/// (microseconds; 0 where it fails).
fn cpu_secs() -> f64 {
    // SAFETY: `getrusage` fills the zeroed `rusage` it is given and keeps no pointer.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// A member of `size` bytes: in memory, or a sparse file in `dir` (`name` in it).
fn member_dev(dir: Option<&str>, name: &str, size: u64) -> Arc<dyn BlockDevice> {
    match dir {
        None => Arc::new(MemDisk::new(size)),
        Some(dir) => {
            let path = format!("{dir}/{name}");
            let _ = std::fs::remove_file(&path);
            let opts = OpenOptions {
                create_size: Some(size),
                ..OpenOptions::default()
            };
            Arc::new(FileDisk::open(&path, &opts).expect("member file"))
        }
    }
}

/// Seconds (wall, CPU) to rebuild role 1 of a filled array of `level`, and the member
/// bytes rebuilt.
fn rebuild(level: Level, member: u64, delay: Duration, dir: Option<&str>) -> (f64, f64, u64) {
    let n = 4;
    let file = |i: usize| format!("cairn-rebuild-bench-{}-{i}.img", std::process::id());
    let slow: Vec<Arc<DelayDisk>> = (0..=n)
        .map(|i| Arc::new(DelayDisk::new(member_dev(dir, &file(i), member))))
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
    if let Some(dir) = dir {
        for i in 0..=n {
            let _ = std::fs::remove_file(format!("{dir}/{}", file(i)));
        }
    }
    (secs, cpu, size / (n as u64 - level.parity_members() as u64))
}

fn main() {
    let member = arg(1, 256) << 20;
    let rounds = arg(2, 3);
    let delay = Duration::from_micros(arg(3, 0));
    let dir = std::env::args().nth(4);
    let only = std::env::var("RAID").ok();
    println!(
        "rebuild of one member of 4, {} MiB members {}, 512 KiB chunks, {delay:?} per \
         member op; best of {rounds}",
        member >> 20,
        dir.as_deref()
            .map_or("in memory".to_string(), |d| format!("in files in {d}"))
    );
    for level in [Level::Raid6, Level::Raid5] {
        if only
            .as_deref()
            .is_some_and(|o| format!("raid{o}") != level.to_string())
        {
            continue;
        }
        let mut best = 0f64;
        let mut best_cpu = 0f64;
        for _ in 0..rounds {
            let (secs, cpu, bytes) = rebuild(level, member, delay, dir.as_deref());
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
