//! The LVM fuzz harnesses of `fuzz/` (`fuzz/lvm_harness.rs`) on stable Rust: seeded
//! mutations of real metadata (the §4.3 example, texts and PV heads lvm 2.03 wrote, a
//! cairn-made VG) with bit flips, byte and token edits, hostile numbers, deep nesting,
//! truncation and splices, plus plain random bytes. None may panic.
//!
//! `CAIRN_SEED=N` replays a run. With `CAIRN_FUZZ_SEEDS_DIR=DIR`, the unmutated seeds are
//! written to `DIR/lvm_text/` and `DIR/lvm_label/` as a corpus for cargo-fuzz.

#[path = "../../../fuzz/lvm_harness.rs"]
mod harness;

mod common;

use cairn_block::testkit;
use cairn_lvm::{LvCreate, Vg};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn lvm_head(i: usize) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/data/lvm-vgtest-pv{i}.head",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn cairn_image() -> Vec<u8> {
    let (disks, pvs) = mem_pvs(2, 16 * MIB);
    let mut vg = Vg::create("vg", pvs, MIB).unwrap();
    for (n, s) in [("a", 1), ("b", 2)] {
        vg.lv_create(&LvCreate {
            name: n.into(),
            extents: 4,
            stripes: s,
            stripe_size: None,
        })
        .unwrap();
    }
    vg.lv_extend("a", 2).unwrap();
    let mut img = disks[0].to_vec();
    img.truncate(64 << 10);
    img
}

/// Label seeds: sectors 0-3, the mda header, then the text area (the harness layout).
fn label_seed(img: &[u8]) -> Vec<u8> {
    let end = img.len().min(4608 + 40_000);
    [&img[..2048], &img[4096..end]].concat()
}

fn text_seeds() -> Vec<Vec<u8>> {
    let mut out = vec![EXAMPLE.as_bytes().to_vec()];
    for img in [lvm_head(0), cairn_image()] {
        let h = cairn_lvm::mda::MdaHeader::parse(
            &img[4096..4608],
            cairn_lvm::label::DiskLocn {
                offset: 4096,
                size: cairn_lvm::mda::DEFAULT_MDA_SIZE,
            },
        )
        .unwrap();
        let mut full = img.clone();
        full.resize(8 << 20, 0);
        let dev = cairn_block::MemDisk::from_bytes(&full);
        out.push(h.read_text(&dev, &h.committed).unwrap());
    }
    out
}

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "=",
    ",",
    "\"",
    "\\",
    "#",
    "\n",
    "\0",
    "-1",
    "0",
    "9223372036854775807",
    "18446744073709551616",
    "\"striped\"",
    "\"raid1\"",
    "\"pv9\"",
    "segment_count = 99999999",
    "stripe_count = 0",
    "extent_size = 0",
    "a {",
    "x = [",
];

fn mutate(rng: &mut SmallRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.gen_range(0..seeds.len())].clone();
    for _ in 0..rng.gen_range(1..5) {
        if v.is_empty() {
            v.push(b'x');
        }
        let at = rng.gen_range(0..v.len());
        match rng.gen_range(0..7) {
            0 => v[at] ^= 1 << rng.gen_range(0..8),
            1 => v[at] = rng.gen(),
            2 => {
                let t = TOKENS[rng.gen_range(0..TOKENS.len())].as_bytes();
                v.splice(at..at, t.iter().copied());
            }
            3 => {
                let n = rng.gen_range(1..32).min(v.len() - at);
                v.drain(at..at + n);
            }
            4 => v.truncate(at),
            5 => {
                // Replace a number with a hostile one.
                if let Some(p) = v[at..].iter().position(u8::is_ascii_digit) {
                    let t: &[u8] = match rng.gen_range(0..3) {
                        0 => b"18446744073709551615",
                        1 => b"4294967296",
                        _ => b"1099511627776",
                    };
                    v.splice(at + p..at + p + 1, t.iter().copied());
                }
            }
            _ => {
                let o = &seeds[rng.gen_range(0..seeds.len())];
                if !o.is_empty() {
                    let s = rng.gen_range(0..o.len());
                    let n = rng.gen_range(0..256).min(o.len() - s);
                    v.splice(at..at, o[s..s + n].iter().copied());
                }
            }
        }
    }
    v.truncate(harness::MAX_INPUT);
    v
}

fn write_seeds(name: &str, seeds: &[Vec<u8>]) {
    if let Some(dir) = std::env::var_os("CAIRN_FUZZ_SEEDS_DIR") {
        let dir = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
}

#[test]
fn lvm_text_harness_never_panics() {
    let seeds = text_seeds();
    write_seeds("lvm_text", &seeds);
    for s in &seeds {
        harness::lvm_text(s);
    }
    harness::lvm_text("a {".repeat(5000).as_bytes());
    let seed = testkit::test_seed("lvm_text fuzz");
    let mut rng = SmallRng::seed_from_u64(seed);
    for i in 0..1500 {
        let input = if i % 10 == 9 {
            {
                let n = rng.gen_range(0..2000);
                testkit::random_bytes(&mut rng, n)
            }
        } else {
            mutate(&mut rng, &seeds)
        };
        harness::lvm_text(&input);
    }
}

#[test]
fn lvm_label_harness_never_panics() {
    let seeds: Vec<Vec<u8>> = vec![
        label_seed(&lvm_head(0)),
        label_seed(&lvm_head(1)),
        label_seed(&cairn_image()),
    ];
    write_seeds("lvm_label", &seeds);
    for s in &seeds {
        harness::lvm_label(s);
    }
    let seed = testkit::test_seed("lvm_label fuzz");
    let mut rng = SmallRng::seed_from_u64(seed);
    for i in 0..800 {
        let input = if i % 10 == 9 {
            {
                let n = rng.gen_range(0..4000);
                testkit::random_bytes(&mut rng, n)
            }
        } else {
            // Mutate mostly the binary head, sometimes the text.
            let mut v = seeds[rng.gen_range(0..seeds.len())].clone();
            for _ in 0..rng.gen_range(1..4) {
                let at = if rng.gen_bool(0.7) {
                    rng.gen_range(0..2560)
                } else {
                    rng.gen_range(0..v.len())
                };
                match rng.gen_range(0..3) {
                    0 => v[at] ^= 1 << rng.gen_range(0..8),
                    1 => v[at] = rng.gen(),
                    _ => {
                        let b: [u8; 8] = rng.gen();
                        let end = (at + 8).min(v.len());
                        v[at..end].copy_from_slice(&b[..end - at]);
                    }
                }
            }
            if rng.gen_bool(0.1) {
                v = mutate(&mut rng, &[v]);
            }
            v
        };
        harness::lvm_label(&input);
    }
}
