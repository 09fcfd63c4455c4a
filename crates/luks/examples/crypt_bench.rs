//! LUKS2 data path throughput over memory: the same bytes read and written through a
//! `CryptDevice` in 128 KiB requests (below `PARALLEL_CRYPT_MIN`: one core) and in 1 MiB
//! requests (split over the machine's cores), interleaved round by round so that load
//! from other processes hits both alike; the best round of each.
//!
//! ```text
//! cargo run --release -p cairn-luks --example crypt_bench [-- ROUNDS]
//! ```

use std::sync::Arc;
use std::time::Instant;

use cairn_block::{BlockDevice, Geometry, MemDisk, WriteFlags};
use cairn_luks::device::{CryptDevice, SegmentParams};
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
    let disk = Arc::new(MemDisk::with_geometry(Geometry::simple(SIZE)));
    let dev = CryptDevice::new(
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
    .expect("device");
    let mut best = [[0f64; 2]; 2];
    for _ in 0..rounds {
        for (i, req) in [128usize << 10, 1 << 20].into_iter().enumerate() {
            for (j, write) in [false, true].into_iter().enumerate() {
                best[i][j] = best[i][j].max(pass(&dev, req, write));
            }
        }
    }
    println!(
        "aes-xts-plain64, 4096-byte sectors, {} MiB in memory, best of {rounds} rounds ({} cores)",
        SIZE >> 20,
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!("{:<22} {:>10} {:>10}", "request", "read MB/s", "write MB/s");
    for (i, name) in ["128 KiB (one core)", "1 MiB (split)"].iter().enumerate() {
        println!("{name:<22} {:>10.0} {:>10.0}", best[i][0], best[i][1]);
    }
    println!(
        "ratio 1 MiB / 128 KiB  {:>10.2} {:>10.2}",
        best[1][0] / best[0][0],
        best[1][1] / best[0][1]
    );
}
