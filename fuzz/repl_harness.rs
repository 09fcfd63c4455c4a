//! The replication superblock fuzz harness, shared by the cargo-fuzz target
//! (`fuzz_targets/repl_super.rs`) and the deterministic run on stable Rust in
//! `crates/repl/tests/fuzz_harness.rs`, so CI exercises it too.
//!
//! ```text
//!   bytes ─ first 4096, zero padded ─┬─> Super::decode as is
//!                                    └─ fix the CRC32C ─> Super::decode ─> encode ─>
//!                                       decode again (must round-trip), layout maths
//!                                       (internal and external)
//! ```
//!
//! A random mutation almost never keeps the checksum right, so the harness recomputes it
//! and the mutations reach the field validation. Every input must give a superblock or
//! an error: never a panic.

use cairn_repl::meta::{checksum, Layout, Super, CHECKSUM_AT, FLAG_EXTERNAL, SUPER_SIZE};

/// Recomputes the checksum over bytes `0..508`.
pub fn fix_checksum(b: &mut [u8; SUPER_SIZE]) {
    let crc = checksum(b);
    b[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

pub fn repl_super(data: &[u8]) {
    let mut b = [0u8; SUPER_SIZE];
    let n = data.len().min(SUPER_SIZE);
    b[..n].copy_from_slice(&data[..n]);
    let _ = Super::decode(&b);
    fix_checksum(&mut b);
    if let Ok(s) = Super::decode(&b) {
        let again = s.encode();
        assert_eq!(again, b, "a valid superblock encodes back to its bytes");
        assert_eq!(Super::decode(&again).as_ref(), Ok(&s));
        // The recorded geometry is valid: the layout maths must not panic on it.
        let l = Layout::internal(
            s.al_offset.saturating_add(1 << 30),
            s.bm_block,
            s.al_extent,
            s.max_peers,
        );
        if let Ok(l) = l {
            let _ = (
                l.bits(),
                l.al_extents(),
                l.bytes_of_bit(u64::MAX),
                l.bits_of_extent(u64::MAX),
            );
        }
        // And external metadata for the recorded data size: it must derive the recorded
        // offsets when the superblock says EXTERNAL.
        let need = Layout::external_meta_size(s.data_size, s.bm_block, s.al_extent, s.max_peers);
        if let Ok(need) = need {
            let l = Layout::external(s.data_size, need, s.bm_block, s.al_extent, s.max_peers)
                .expect("the size external_meta_size gives fits");
            if s.has(FLAG_EXTERNAL) {
                assert_eq!(
                    (l.bitmap_offset, l.al_offset),
                    (s.bitmap_offset, s.al_offset)
                );
            }
        }
    }
}
