//! LUKS2 data path throughput over memory: 1 MiB requests read and written through a
//! `CryptDevice` that en/decrypts each on one core, and through one that splits each over
//! the machine's cores (the default from `PARALLEL_CRYPT_MIN` up), interleaved round by
//! round so that load from other processes hits both alike; the best round of each.
//!
//! ```text
//! cargo run --release -p cairn-luks --example crypt_bench [-- ROUNDS]
//! ```

use std::sync::Arc;
use std::time::Instant;

use cairn_block::{BlockDevice, Geometry, MemDisk, WriteFlags};
use cairn_luks::device::{CryptDevice, SegmentParams, PARALLEL_CRYPT_MIN};
use cairn_luks::xts::SectorCipher;

const SIZE: u64 = 64 << 20;

/// MB/s moving all of the device in `req`-byte requests.
fn pass(dev: &CryptDevice, req: usize, write: bool) -> f64 {
    let mut buf = vec![0x5au8; req];
    let t = Instant::now();
    let mut off = 0u64;
    while off < SIZE {
        if write {
            dev.write_at(&buf, off, WriteFlags::NONE).expect("write");
        } else {
            dev.read_at(&mut buf, off).expect("read");
        }
        off += req as u64;
    }
    SIZE as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(5, |s| s.parse().expect("a round count"));
    let make = |split_min: usize| {
        let disk = Arc::new(MemDisk::with_geometry(Geometry::simple(SIZE)));
        CryptDevice::new(
            disk,
            SectorCipher::new("aes-xts-plain64", &[7u8; 64]).expect("cipher"),
            SegmentParams {
                offset: 0,
                size: SIZE,
                sector_size: 4096,
                iv_tweak: 0,
                allow_discards: false,
            },
            "bench".into(),
        )
        .expect("device")
        .with_split_min(split_min)
    };
    let devs = [make(usize::MAX), make(PARALLEL_CRYPT_MIN)];
    let mut best = [[0f64; 2]; 2];
    for _ in 0..rounds {
        for (i, dev) in devs.iter().enumerate() {
            for (j, write) in [false, true].into_iter().enumerate() {
                best[i][j] = best[i][j].max(pass(dev, 1 << 20, write));
            }
        }
    }
    println!(
        "aes-xts-plain64, 4096-byte sectors, 1 MiB requests, {} MiB in memory, best of {rounds} rounds ({} cores)",
        SIZE >> 20,
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!("{:<22} {:>10} {:>10}", "crypt", "read MB/s", "write MB/s");
    for (i, name) in ["one core", "split over cores"].iter().enumerate() {
        println!("{name:<22} {:>10.0} {:>10.0}", best[i][0], best[i][1]);
    }
    println!(
        "ratio split / one core {:>10.2} {:>10.2}",
        best[1][0] / best[0][0],
        best[1][1] / best[0][1]
    );
}
