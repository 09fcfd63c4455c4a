//! The replication fuzz harness of `fuzz/` (`fuzz/repl_harness.rs`) on stable Rust:
//! seeded mutations of real superblocks, internal and external (bit flips, hostile
//! values in every field, truncation) plus plain random bytes. The harness fixes the checksum up, so the
//! mutations reach the validators; none may panic, and every superblock accepted must
//! encode back to the same bytes.
//!
//! `CAIRN_SEED=N` replays a run.

#[path = "../../../fuzz/repl_harness.rs"]
mod harness;

use cairn_block::MemDisk;
use cairn_repl::meta::{CreateParams, MetaStore, PeerSlot};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// (offset, width) of every field the validation sizes things by.
const FIELDS: &[(usize, usize)] = &[
    (8, 4),   // version
    (12, 4),  // length
    (32, 4),  // node_id
    (36, 4),  // max_peers
    (40, 4),  // flags
    (44, 4),  // bm_block
    (48, 4),  // al_extent
    (52, 4),  // reserved
    (56, 8),  // data_size
    (64, 8),  // bitmap_offset
    (72, 8),  // al_offset
    (80, 8),  // current
    (88, 8),  // history[0]
    (96, 8),  // history[1]
    (112, 4), // slot 0 node_id
    (116, 4), // slot 0 flags
    (120, 8), // slot 0 bitmap uuid
    (208, 4), // slot 1 node_id
    (212, 4), // slot 1 flags
    (304, 4), // slot 2 node_id
    (104, 8), // fence_epoch
    (432, 8), // fence_instance
    (440, 8), // fence_generation
];

fn hostile(rng: &mut SmallRng, width: usize) -> u64 {
    let max = if width == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    match rng.gen_range(0..6) {
        0 => 0,
        1 => max,
        2 => 1 << rng.gen_range(0..8 * width),
        3 => rng.gen_range(0..64),
        4 => max - rng.gen_range(0..4),
        _ => rng.gen::<u64>() & max,
    }
}

/// A real superblock: internal (on a 256 MiB device), or external (on a 1 MiB metadata
/// device for 256 MiB of data).
fn seed_super(external: bool) -> Vec<u8> {
    let dev = MemDisk::new(if external { 1 << 20 } else { 256 << 20 });
    let mut p = CreateParams::new(*b"0123456789abcdef", 0, 3);
    p.peers.push(PeerSlot {
        in_use: true,
        node_id: 2,
        bitmap_uuid: 0x10,
        name: "peer-two".into(),
    });
    let (store, mut sb) = if external {
        MetaStore::create_external(&dev, 256 << 20, &p).unwrap()
    } else {
        MetaStore::create(&dev, &p).unwrap()
    };
    sb.fence_epoch = 6;
    sb.fence_generation = 5;
    sb.fence_instance = 0x77;
    sb.fence_owner = "node-a".into();
    store.write_super(&dev, &sb).unwrap();
    sb.encode().to_vec()
}

#[test]
fn repl_super_mutations_never_panic() {
    let seed = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("CAIRN_SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let good = [seed_super(false), seed_super(true)];
    for g in &good {
        harness::repl_super(g);
    }
    for round in 0..20_000 {
        let mut b = good[round % 2].clone();
        match rng.gen_range(0..4) {
            0 => {
                for _ in 0..rng.gen_range(1..8) {
                    let i = rng.gen_range(0..b.len() * 8);
                    b[i / 8] ^= 1 << (i % 8);
                }
            }
            1 => {
                for _ in 0..rng.gen_range(1..4) {
                    let (at, w) = FIELDS[rng.gen_range(0..FIELDS.len())];
                    let v = hostile(&mut rng, w);
                    b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
            2 => b.truncate(rng.gen_range(0..b.len())),
            _ => rng.fill(&mut b[8..512]),
        }
        harness::repl_super(&b);
    }
}
