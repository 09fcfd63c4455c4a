//! The LUKS header fuzz harness, shared by the cargo-fuzz target
//! (`fuzz_targets/luks_header.rs`) and the deterministic run on stable Rust in
//! `crates/luks/tests/fuzz_harness.rs`, so CI exercises it too.
//!
//! ```text
//!   bytes ─ fix up both LUKS2 checksums ─┬─> ondisk::load_image           (LUKS2 parse + validate)
//!                                        ├─> Luks::load(MemDisk) + dump   (either version, the CLI's path)
//!                                        └─> luks1::parse_header          (LUKS1, two device sizes)
//! ```
//!
//! A random mutation almost never keeps a SHA-256 checksum right, so without the fix-up
//! the fuzzer would only ever test the checksum comparison. The harness recomputes the
//! checksum of each copy whose size field is one of LUKS2's header sizes, so mutations
//! reach the JSON parser and the metadata validator. Every input must give a header or an
//! error: never a panic, a hang or an allocation beyond the bounds the parser promises.
//! No key derivation runs: its costs come from the header and are bounded elsewhere.

#![allow(dead_code)] // the fuzz target uses only `luks_header`

use std::sync::Arc;

use cairn_block::{BlockDevice, MemDisk};
use cairn_luks::ondisk::{self, checksum};
use cairn_luks::{luks1, Luks};

/// The largest input worth trying: both copies of a 16 KiB header and some keyslot area.
pub const MAX_INPUT: usize = 1 << 20;

/// Recomputes the checksum of the LUKS2 copy at `off`, if its size field is a valid
/// header size that fits in `img`.
pub fn fix_checksum(img: &mut [u8], off: usize) {
    let Some(field) = img.get(off + 8..off + 16) else {
        return;
    };
    let size = u64::from_be_bytes(field.try_into().expect("8 bytes"));
    if !ondisk::HDR_SIZES.contains(&size) {
        return;
    }
    let Ok(size) = usize::try_from(size) else {
        return;
    };
    let Some(end) = off.checked_add(size).filter(|&e| e <= img.len()) else {
        return;
    };
    let Ok(c) = checksum("sha256", &img[off..end]) else {
        return;
    };
    img[off + ondisk::off::CSUM..off + ondisk::off::CSUM + 64].copy_from_slice(&c);
}

/// One fuzz input: a device image starting with a LUKS header (or not).
pub fn luks_header(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let mut img = data.to_vec();
    // Primary at 0; the secondary where the primary's size field says, or at any of the
    // standard offsets when the primary is unreadable (as the loader searches).
    fix_checksum(&mut img, 0);
    if let Some(f) = img.get(8..16) {
        let size = u64::from_be_bytes(f.try_into().expect("8 bytes"));
        if ondisk::HDR_SIZES.contains(&size) {
            if let Ok(s) = usize::try_from(size) {
                fix_checksum(&mut img, s);
            }
        }
    }
    for off in ondisk::HDR_SIZES {
        if let Ok(o) = usize::try_from(off) {
            if img.get(o..o + 6) == Some(&ondisk::MAGIC_SECONDARY[..]) {
                fix_checksum(&mut img, o);
            }
        }
    }

    let _ = ondisk::load_image(&img);

    // LUKS1: the parser is a pure function of the first 592 bytes and the device size.
    let _ = luks1::parse_header(&img, img.len() as u64);
    let _ = luks1::parse_header(&img, 1 << 40);

    // The path `cairn luks dump` and `cairn serve --luks` take, over a device.
    if img.len() >= 4096 {
        let mut padded = img.clone();
        padded.resize(img.len().div_ceil(4096) * 4096, 0);
        let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::from_bytes(&padded));
        if let Ok(l) = Luks::load(disk) {
            let _ = l.dump_text();
            let _ = l.dump_json();
            if let Luks::V2(v2) = &l {
                let _ = v2.check_activatable();
                let _ = v2.data_offset();
                let _ = v2.metadata_area_size();
            }
        }
    }
}
