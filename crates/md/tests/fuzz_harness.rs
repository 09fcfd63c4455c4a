//! The md fuzz harnesses of `fuzz/` (`fuzz/md_harness.rs`) on stable Rust: seeded
//! mutations of a real superblock and of a real partial-parity log (header and ring of a
//! RAID5 written with partial stripes) with bit flips, hostile values in every field,
//! truncation and splices, plus plain random bytes. The harness fixes the checksums up,
//! so the mutations reach the validators, the start decision and the replay; none may
//! panic.
//!
//! `CAIRN_SEED=N` replays a run. With `CAIRN_FUZZ_SEEDS_DIR=DIR`, the unmutated seeds are
//! written to `DIR/md_superblock/` and `DIR/md_ppl/` as a corpus for cargo-fuzz.

#[path = "../../../fuzz/md_harness.rs"]
mod harness;

use cairn_block::testkit;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Superblock fields (offset, width): the ones validation and assembly size things by.
const SB_FIELDS: &[(usize, usize)] = &[
    (0, 4),   // magic
    (4, 4),   // major_version
    (8, 4),   // feature_map
    (72, 4),  // level
    (76, 4),  // layout
    (80, 8),  // size
    (88, 4),  // chunksize
    (92, 4),  // raid_disks
    (96, 4),  // bitmap_offset
    (104, 8), // reshape_position
    (112, 4), // delta_disks
    (120, 4), // new_chunk
    (124, 4), // new_offset
    (128, 8), // data_offset
    (136, 8), // data_size
    (144, 8), // super_offset
    (152, 8), // recovery_offset
    (160, 4), // dev_number
    (186, 2), // bblog_size
    (188, 4), // bblog_offset
    (200, 8), // events
    (208, 8), // resync_offset
    (220, 4), // max_dev
    (256, 2), // dev_roles[0]
    (258, 2), // dev_roles[1]
];

/// Log header fields, then entry header fields (relative to an entry block).
const LOG_FIELDS: &[(usize, usize)] = &[(8, 4), (12, 4), (16, 8), (24, 8), (32, 8), (40, 8)];
const ENTRY_FIELDS: &[(usize, usize)] = &[
    (12, 4), // kind
    (16, 8), // seq
    (24, 8), // log_id
    (32, 8), // stripe
    (40, 8), // stripe_hi
    (48, 8), // x
    (56, 8), // y
    (64, 4), // chunk
    (68, 4), // payload
];

fn hostile(rng: &mut SmallRng, width: usize) -> u64 {
    let max = if width == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    match rng.gen_range(0..7) {
        0 => 0,
        1 => max,
        2 => max / 2 + 1,
        3 => 1 << rng.gen_range(0..8 * width),
        4 => rng.gen_range(0..64),
        5 => max - rng.gen_range(0..4),
        _ => rng.gen::<u64>() & max,
    }
}

fn put(b: &mut [u8], at: usize, width: usize, v: u64) {
    if at + width <= b.len() {
        b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// Bit flips, hostile field values (fields at `fields`, repeated every `stride` bytes
/// when given), truncation and splices of `seed`.
fn mutate(
    rng: &mut SmallRng,
    seed: &[u8],
    fields: &[(usize, usize)],
    entry: Option<(usize, &[(usize, usize)])>,
) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.gen_range(1..4) {
        if b.is_empty() {
            break;
        }
        match rng.gen_range(0..5) {
            0 => {
                for _ in 0..rng.gen_range(1..8) {
                    let at = rng.gen_range(0..b.len());
                    b[at] ^= 1 << rng.gen_range(0..8);
                }
            }
            1 => {
                let (at, w) = fields[rng.gen_range(0..fields.len())];
                let v = hostile(rng, w);
                put(&mut b, at, w, v);
            }
            2 => {
                if let Some((stride, ef)) = entry {
                    let blocks = b.len() / stride;
                    if blocks > 1 {
                        let base = stride * rng.gen_range(1..blocks);
                        let (at, w) = ef[rng.gen_range(0..ef.len())];
                        let v = hostile(rng, w);
                        put(&mut b, base + at, w, v);
                    }
                }
            }
            3 => {
                let n = rng.gen_range(0..b.len());
                b.truncate(n);
            }
            _ => {
                // Copy one piece over another (an entry block over the header, ...).
                let len = rng.gen_range(1..=b.len().min(4096));
                let from = rng.gen_range(0..=b.len() - len);
                let to = rng.gen_range(0..=b.len() - len);
                let piece = b[from..from + len].to_vec();
                b[to..to + len].copy_from_slice(&piece);
            }
        }
    }
    b
}

fn write_seed(name: &str, seed: &[u8]) {
    if let Some(dir) = std::env::var_os("CAIRN_FUZZ_SEEDS_DIR") {
        let dir = std::path::PathBuf::from(dir).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("seed-0"), seed).unwrap();
    }
}

#[test]
fn md_superblock_harness_never_panics() {
    let (sb, _) = harness::seeds();
    write_seed("md_superblock", &sb);
    cairn_md::Superblock::parse(&sb, "seed").unwrap();
    harness::md_superblock(&sb);
    let mut rng = SmallRng::seed_from_u64(testkit::test_seed("md superblock harness"));
    for i in 0..600 {
        let input = if i % 10 == 0 {
            let mut b = vec![0u8; rng.gen_range(0..5000)];
            rng.fill(&mut b[..]);
            if b.len() >= 8 && rng.gen_bool(0.5) {
                b[..8].copy_from_slice(&sb[..8]); // magic and major version
            }
            b
        } else {
            mutate(&mut rng, &sb, SB_FIELDS, None)
        };
        harness::md_superblock(&input);
    }
    harness::md_superblock(&vec![0u8; harness::MAX_INPUT + 1]);
}

#[test]
fn md_ppl_harness_never_panics() {
    let (_, log) = harness::seeds();
    write_seed("md_ppl", &log);
    harness::md_ppl(&log);
    let mut rng = SmallRng::seed_from_u64(testkit::test_seed("md ppl harness"));
    for i in 0..400 {
        let input = if i % 10 == 0 {
            let mut b = vec![0u8; rng.gen_range(0..20_000)];
            rng.fill(&mut b[..]);
            if b.len() >= 8 && rng.gen_bool(0.5) {
                b[..8].copy_from_slice(&log[..8]);
            }
            b
        } else {
            mutate(&mut rng, &log, LOG_FIELDS, Some((4096, ENTRY_FIELDS)))
        };
        harness::md_ppl(&input);
    }
    harness::md_ppl(&vec![0u8; harness::MAX_INPUT + 1]);
}
