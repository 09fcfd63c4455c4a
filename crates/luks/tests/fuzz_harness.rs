//! The LUKS header fuzz harness of `fuzz/` (`fuzz/luks_harness.rs`) on stable Rust: a few
//! thousand seeded inputs built from real headers (cairn-formatted LUKS2 with pbkdf2 and
//! argon2id keyslots, header sizes 16 KiB and 64 KiB, cryptsetup's LUKS1 compat image)
//! mutated with bit flips, JSON edits, hostile size and offset fields, truncation and
//! splices, plus plain random bytes. The harness fixes the checksums up, so the mutations
//! reach the JSON parser and the validator; none may panic.
//!
//! `CAIRN_SEED=N` replays a run. With `CAIRN_FUZZ_SEEDS_DIR=DIR`, the unmutated seeds are
//! written to `DIR/luks_header/` as a starting corpus for cargo-fuzz (`fuzz/run.sh`).

// Test code: sizes here are a few hundred KiB at most.
#![allow(clippy::cast_possible_truncation)]

#[path = "../../../fuzz/luks_harness.rs"]
mod harness;

mod common;

use std::sync::Arc;

use cairn_block::{testkit, BlockDevice, MemDisk};
use cairn_luks::ondisk::off;
use cairn_luks::{FormatOptions, KeyslotOptions, Luks2, PbkdfOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Real headers to start from: both copies of each, and LUKS1's first sector.
fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, (metadata_size, pbkdf)) in [
        (16u64 << 10, PbkdfOptions::pbkdf2(1000)),
        (64 << 10, PbkdfOptions::argon2id(1, 64, 1)),
    ]
    .into_iter()
    .enumerate()
    {
        let disk = Arc::new(MemDisk::new(4 << 20));
        let mut l = Luks2::format(
            disk.clone(),
            &FormatOptions {
                pbkdf: pbkdf.clone(),
                metadata_size,
                data_offset: Some(2 << 20),
                sector_size: Some(if i == 0 { 512 } else { 4096 }),
                label: format!("seed{i}"),
                ..Default::default()
            },
            b"p",
        )
        .unwrap();
        l.add_key(
            b"p",
            b"q",
            &KeyslotOptions {
                pbkdf,
                ..Default::default()
            },
        )
        .unwrap();
        let n = 2 * metadata_size as usize;
        let mut b = vec![0u8; n];
        disk.read_at(&mut b, 0).unwrap();
        out.push(b);
    }
    if let Some(p) = common::image("compatimage.img") {
        out.push(std::fs::read(p).unwrap()[..4096].to_vec());
    }
    out
}

const JSON_EDITS: &[(&[u8], &[u8])] = &[
    (b"\"dynamic\"", b"\"18446744073709551615\""),
    (b"\"2097152\"", b"\"0\""),
    (b"\"sector_size\":512", b"\"sector_size\":3"),
    (b"\"keyslots\":[\"0\"", b"\"keyslots\":[\"99\""),
    (b"\"pbkdf2\"", b"\"argon2id\""),
    (b"\"luks2\"", b"\"reencrypt\""),
    (
        b"\"tokens\":{}",
        b"\"tokens\":{\"0\":{\"type\":\"x\",\"keyslots\":[\"7\"]}}",
    ),
    (b"{", b"{{"),
    (b"\"", b""),
    (
        b"\"config\":{",
        b"\"config\":{\"requirements\":{\"mandatory\":[\"online-reencrypt\"]},",
    ),
];

fn mutate(rng: &mut SmallRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut img = seeds[rng.gen_range(0..seeds.len())].clone();
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..6) {
            0 => {
                for _ in 0..rng.gen_range(1..16) {
                    let at = rng.gen_range(0..img.len());
                    img[at] ^= 1 << rng.gen_range(0..8);
                }
            }
            1 => {
                let (a, b) = JSON_EDITS[rng.gen_range(0..JSON_EDITS.len())];
                if let Some(k) = img.windows(a.len()).position(|w| w == a) {
                    img.splice(k..k + a.len(), b.iter().copied());
                }
            }
            2 => {
                let v: u64 = match rng.gen_range(0..4) {
                    0 => u64::MAX,
                    1 => 1 << rng.gen_range(9..40),
                    2 => rng.gen(),
                    _ => 0,
                };
                let field = [off::HDR_SIZE, off::SEQID, off::HDR_OFFSET][rng.gen_range(0..3)];
                if field + 8 <= img.len() {
                    img[field..field + 8].copy_from_slice(&v.to_be_bytes());
                }
            }
            3 => {
                let n = rng.gen_range(0..img.len());
                img.truncate(n);
            }
            4 => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let a = rng.gen_range(0..other.len());
                let b = rng.gen_range(a..other.len().min(a + 8192));
                let at = rng.gen_range(0..img.len().max(1));
                let end = (at + (b - a)).min(img.len());
                img[at..end].copy_from_slice(&other[a..a + (end - at)]);
            }
            _ => {
                // The secondary goes, so only the mutated primary can load.
                if img.len() > 16390 {
                    img[16384..16390].copy_from_slice(b"VACUUM");
                }
            }
        }
        if img.is_empty() {
            break;
        }
    }
    img
}

#[test]
fn luks_header_harness_never_panics() {
    let seeds = seeds();
    if let Some(dir) = std::env::var_os("CAIRN_FUZZ_SEEDS_DIR") {
        let dir = std::path::PathBuf::from(dir).join("luks_header");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
    // Every seed loads as it is: the mutations start from valid headers.
    for s in &seeds[..2] {
        cairn_luks::ondisk::load_image(s).unwrap();
        harness::luks_header(s);
    }
    let mut rng = SmallRng::seed_from_u64(testkit::test_seed("luks header harness"));
    for i in 0..4000 {
        let input = if i % 8 == 0 {
            let n = rng.gen_range(0..40_000);
            let mut b = vec![0u8; n];
            rng.fill(&mut b[..]);
            // Half the random inputs get a magic, so they reach past the first check.
            if n >= 8 && rng.gen_bool(0.5) {
                b[..6].copy_from_slice(&cairn_luks::ondisk::MAGIC_PRIMARY);
                b[6..8].copy_from_slice(&[0, rng.gen_range(1..=2)]);
            }
            b
        } else {
            mutate(&mut rng, &seeds)
        };
        harness::luks_header(&input);
    }
    // Too large inputs are ignored, not parsed.
    harness::luks_header(&vec![0u8; harness::MAX_INPUT + 1]);
}
