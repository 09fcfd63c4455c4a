//! XTS throughput per core on 4 KiB data units: cairn's `SectorCipher` against
//! `openssl speed -evp aes-{256,128}-xts -bytes 4096` in the same run, interleaved round
//! by round so that load from other processes hits both alike (the best round of each is
//! reported, and the median). The `xts-mode` crate is measured once, for comparison.
//!
//! ```text
//! cargo run --release -p cairn-luks --example xts_bench [-- ROUNDS]
//! ```
//!
//! A cairn call encrypts one 4 KiB unit (what openssl's `-bytes 4096` does per EVP call,
//! and what a 4k random NBD request costs), unless the line says otherwise.

use std::process::Command;
use std::time::Instant;

use aes::cipher::KeyInit;
use cairn_luks::xts::{SectorCipher, XtsPath};

const UNIT: usize = 4096;
const ROUND_SECS: f64 = 0.5;

/// Runs `f` over a 1 MiB buffer for `secs`; returns MB/s.
fn measure(secs: f64, mut f: impl FnMut(&mut [u8], u64)) -> f64 {
    let mut buf = vec![0x5au8; 1 << 20];
    let mut iv = 0u64;
    f(&mut buf, iv);
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..8 {
            f(&mut buf, iv);
            iv = iv.wrapping_add(2048);
            bytes += buf.len() as u64;
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// `openssl speed` for one algorithm and direction at 4096-byte blocks; MB/s.
fn openssl(alg: &str, decrypt: bool) -> Option<f64> {
    let mut c = Command::new("openssl");
    c.args(["speed", "-elapsed", "-seconds", "1", "-bytes", "4096"]);
    if decrypt {
        c.arg("-decrypt");
    }
    let out = c.args(["-evp", alg]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // The result line: "AES-256-XTS   1234567.89k" (in 1000s of bytes per second).
    let line = text
        .lines()
        .rev()
        .find(|l| l.to_ascii_lowercase().starts_with(alg))?;
    let k = line.split_whitespace().last()?.trim_end_matches('k');
    k.parse::<f64>().ok().map(|k| k / 1000.0)
}

fn best_median(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!(
        "AES hardware acceleration: {}; {rounds} interleaved rounds, best (median) MB/s",
        if aes::hardware_accelerated() {
            "yes"
        } else {
            "NO (software AES)"
        }
    );
    for (bits, alg) in [(512usize, "aes-256-xts"), (256, "aes-128-xts")] {
        let key: Vec<u8> = (0..bits / 8)
            .map(|i| u8::try_from(i * 7 + 1).unwrap_or(0))
            .collect();
        let c = SectorCipher::new("aes-xts-plain64", &key).expect("valid key");
        println!(
            "\n(cairn XTS path on this CPU: {:?})",
            c.xts_path().expect("xts")
        );
        let (mut ce, mut cd, mut oe, mut od) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            ce.push(measure(ROUND_SECS, |b, iv| {
                for (k, u) in b.chunks_mut(UNIT).enumerate() {
                    c.encrypt(u, UNIT, iv + 8 * k as u64);
                }
            }));
            cd.push(measure(ROUND_SECS, |b, iv| {
                for (k, u) in b.chunks_mut(UNIT).enumerate() {
                    c.decrypt(u, UNIT, iv + 8 * k as u64);
                }
            }));
            if let Some(v) = openssl(alg, false) {
                oe.push(v);
            }
            if let Some(v) = openssl(alg, true) {
                od.push(v);
            }
        }
        let (ceb, cem) = best_median(&mut ce);
        let (cdb, cdm) = best_median(&mut cd);
        println!("\naes-xts-plain64, {bits}-bit key ({alg}), 4 KiB units:");
        println!("  cairn   encrypt {ceb:7.0} ({cem:.0})   decrypt {cdb:7.0} ({cdm:.0})");
        if oe.is_empty() || od.is_empty() {
            println!("  openssl speed -evp {alg}: not available");
        } else {
            let (oeb, oem) = best_median(&mut oe);
            let (odb, odm) = best_median(&mut od);
            println!("  openssl encrypt {oeb:7.0} ({oem:.0})   decrypt {odb:7.0} ({odm:.0})");
            println!(
                "  cairn / openssl: encrypt {:.2}x, decrypt {:.2}x (best rounds)",
                ceb / oeb,
                cdb / odb
            );
        }
        let big = measure(ROUND_SECS, |b, iv| {
            for (k, u) in b.chunks_mut(128 << 10).enumerate() {
                c.encrypt(u, UNIT, iv + 256 * k as u64);
            }
        });
        let small = measure(ROUND_SECS, |b, iv| {
            for (k, u) in b.chunks_mut(UNIT).enumerate() {
                c.encrypt(u, 512, iv + 8 * k as u64);
            }
        });
        println!("  cairn encrypt, 128 KiB calls of 4 KiB units: {big:7.0}");
        println!("  cairn encrypt, 4 KiB calls of 512-byte units: {small:6.0}");
        for path in [XtsPath::Vector, XtsPath::Scalar] {
            let slow = SectorCipher::new("aes-xts-plain64", &key)
                .expect("valid key")
                .with_xts_path(path);
            let v = measure(ROUND_SECS, |b, iv| {
                for (k, u) in b.chunks_mut(UNIT).enumerate() {
                    slow.encrypt(u, UNIT, iv + 8 * k as u64);
                }
            });
            println!(
                "  cairn encrypt with the {:?} path instead: {v:7.0}",
                slow.xts_path().expect("xts")
            );
        }
    }
    // The xts-mode crate processes one block at a time.
    let key = [7u8; 64];
    let x = xts_mode::Xts128::<aes::Aes256>::new(
        aes::Aes256::new_from_slice(&key[..32]).expect("key"),
        aes::Aes256::new_from_slice(&key[32..]).expect("key"),
    );
    let xm = measure(ROUND_SECS, |b, iv| {
        x.encrypt_area(b, UNIT, u128::from(iv), xts_mode::get_tweak_default)
    });
    println!("\nxts-mode crate 0.6, AES-256, 4 KiB units, encrypt: {xm:.0} MB/s");
}
