//! Array data-path throughput: a 4-member RAID6 (64 KiB chunk) over FileDisk members
//! in /dev/shm, against one plain FileDisk of the same size, in one run.
//!
//! ```text
//! cargo run --release -p cairn-md --example array_bench [-- ARRAY_MIB [SECONDS] [THREADS]]
//! ```
//!
//! Sequential: 1 MiB requests (eight full stripes) over the whole device, write then
//! read. Random: 4 KiB requests at 4 KiB-aligned random offsets for SECONDS each, on
//! one thread and on THREADS threads (IOPS). MB/s is 10^6 bytes per second of wall time.
//! The members live in /dev/shm (tmpfs), so this measures cairn's CPU path, not disks.

use std::path::PathBuf;
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

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
}

fn seq(dev: &dyn BlockDevice, write: bool) -> f64 {
    let size = dev.geometry().size;
    let step: u64 = 1 << 20;
    let mut buf = vec![0u8; 1 << 20];
    fill(&mut buf, 1);
    let t = Instant::now();
    let mut pos = 0;
    while pos + step <= size {
        if write {
            dev.write_at(&buf, pos, WriteFlags::NONE).unwrap();
        } else {
            dev.read_at(&mut buf, pos).unwrap();
        }
        pos += step;
    }
    pos as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn random(dev: &dyn BlockDevice, write: bool, secs: u64, threads: u64) -> f64 {
    let size = dev.geometry().size;
    let blocks = size / 4096;
    let done = AtomicU64::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let done = &done;
            s.spawn(move || {
                let mut buf = vec![0u8; 4096];
                fill(&mut buf, th + 7);
                let mut x = (th + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                let deadline = Duration::from_secs(secs);
                let mut n = 0u64;
                while !n.is_multiple_of(64) || t.elapsed() < deadline {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x % blocks) * 4096;
                    if write {
                        dev.write_at(&buf, off, WriteFlags::NONE).unwrap();
                    } else {
                        dev.read_at(&mut buf, off).unwrap();
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let array_mib = arg(1, 512);
    let secs = arg(2, 3);
    let threads = arg(3, 4);
    let dir = PathBuf::from(format!("/dev/shm/cairn-array-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // RAID6 on 4 members holds two members' worth, after md's data offset (superblock,
    // bitmap space and reshape headroom: about 0.1% of the member, 1 MiB aligned).
    let data = (array_mib << 20) / 2;
    let member = (1..=128u64)
        .map(|mib| data + (mib << 20))
        .find(|&m| {
            cairn_md::create::default_data_offset(Sectors(m / 512), Sectors(128)).0 * 512 + data
                <= m
        })
        .expect("a data offset below 128 MiB");
    let mut members: Vec<Arc<dyn BlockDevice>> = Vec::new();
    let mut names = Vec::new();
    for i in 0..4 {
        let p = dir.join(format!("m{i}.img"));
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
    let mut o = CreateOptions::new(Level::Raid6, "bench");
    o.chunk = Some(Sectors(128));
    o.members_zeroed = true;
    let array = Array::create(members, names, &o).unwrap();
    let size = array.geometry().size;
    let plain_path = dir.join("plain.img");
    let plain = FileDisk::open(
        &plain_path,
        &OpenOptions {
            create_size: Some(size),
            ..OpenOptions::default()
        },
    )
    .unwrap();
    println!(
        "RAID6 4 x 64K chunk, {} MiB array (members in {}), parity kernel {}; plain FileDisk of the same size",
        size >> 20,
        dir.display(),
        cairn_md::parity::Parity::new().implementation().name()
    );
    println!(
        "{:<28} {:>14} {:>14} {:>7}",
        "test", "raid6", "plain file", "ratio"
    );
    let row = |name: &str, a: f64, p: f64, unit: &str| {
        println!(
            "{name:<28} {a:>10.0} {unit:<3} {p:>10.0} {unit:<3} {:>6.2}x",
            a / p
        );
    };
    let (a, p) = (seq(&array, true), seq(&plain, true));
    row("seq write 1M (full stripe)", a, p, "MB/s");
    let (a, p) = (seq(&array, false), seq(&plain, false));
    row("seq read 1M", a, p, "MB/s");
    for th in [1, threads] {
        let (a, p) = (
            random(&array, false, secs, th),
            random(&plain, false, secs, th),
        );
        row(&format!("rand read 4K, {th} thr"), a, p, "IOPS");
        let (a, p) = (
            random(&array, true, secs, th),
            random(&plain, true, secs, th),
        );
        row(&format!("rand write 4K, {th} thr"), a, p, "IOPS");
    }
    array.close().unwrap();
    drop(array);
    drop(plain);
    std::fs::remove_dir_all(&dir).unwrap();
}
