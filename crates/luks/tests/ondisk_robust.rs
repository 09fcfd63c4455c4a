//! The header parsers are pure functions of bytes (`ondisk::load_image`,
//! `luks1::parse_header`): random mutations of real headers, with the LUKS2 checksum fixed
//! up so that the mutations reach the JSON parser and the validator, must give a header
//! or an error, never a panic, a hang or a huge allocation. (A cargo-fuzz target can call
//! the same two functions.)

mod common;

use std::sync::Arc;

use cairn_block::testkit;
use cairn_block::MemDisk;
use cairn_luks::ondisk::{self, checksum};
use cairn_luks::{luks1, FormatOptions, Luks2, PbkdfOptions};
use rand::{Rng, SeedableRng};

/// Recomputes the checksum of the copy at `off` (if its size field is sane).
fn fix_checksum(img: &mut [u8], off: usize) {
    let size = u64::from_be_bytes(img[off + 8..off + 16].try_into().unwrap());
    let Ok(size) = usize::try_from(size) else {
        return;
    };
    if !ondisk::HDR_SIZES.contains(&(size as u64)) || off + size > img.len() {
        return;
    }
    let c = checksum("sha256", &img[off..off + size]).unwrap();
    img[off + ondisk::off::CSUM..off + ondisk::off::CSUM + 64].copy_from_slice(&c);
}

const JSON_EDITS: &[(&str, &str)] = &[
    ("\"dynamic\"", "\"18446744073709551615\""),
    ("\"0\"", "\"18446744073709551616\""),
    ("\"0\"", "\"-1\""),
    ("4000", "4294967295"),
    ("\"sector_size\":512", "\"sector_size\":0"),
    ("\"keyslots\":[\"0\"]", "\"keyslots\":[\"31\"]"),
    ("\"segments\":[\"0\"]", "\"segments\":[]"),
    ("\"luks2\"", "\"reencrypt\""),
    ("\"raw\"", "\"none\""),
    ("\"aes-xts-plain64\"", "\"capi:xts(aes)-plain64\""),
    ("\"pbkdf2\"", "\"argon2id\""),
    ("{", "[{"),
    ("\"config\":{", "\"config\":{\"requirements\":{\"mandatory\":[1]},"),
    ("\"tokens\":{}", "\"tokens\":{\"0\":{\"type\":\"x\",\"keyslots\":[\"9\"]}}"),
    ("\"tokens\":{}", "\"tokens\":[]"),
    (":", ":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["),
];

#[test]
fn mutated_luks2_headers_never_panic() {
    let disk = Arc::new(MemDisk::new(3 << 20));
    Luks2::format(
        disk.clone(),
        &FormatOptions {
            pbkdf: PbkdfOptions::pbkdf2(1000),
            data_offset: Some(2 << 20),
            sector_size: Some(512),
            ..Default::default()
        },
        b"p",
    )
    .unwrap();
    // The two header copies: loading reads nothing else.
    let base = disk.to_vec()[..32 << 10].to_vec();
    ondisk::load_image(&base).unwrap();
    let seed = testkit::test_seed("luks2 header mutation");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let json_len = base[4096..16384].iter().position(|&b| b == 0).unwrap();
    let (mut ok, mut err) = (0, 0);
    for i in 0..3000 {
        let mut img = base.clone();
        match i % 4 {
            // Random bytes anywhere in the primary binary header or JSON.
            0 => {
                for _ in 0..rng.gen_range(1..8) {
                    let at = rng.gen_range(0..4096 + json_len + 1);
                    img[at] = rng.gen();
                }
            }
            // Textual edits of the JSON.
            1 | 2 => {
                let text = String::from_utf8(img[4096..4096 + json_len].to_vec()).unwrap();
                let (a, b) = JSON_EDITS[rng.gen_range(0..JSON_EDITS.len())];
                let hits: Vec<usize> = text.match_indices(a).map(|(k, _)| k).collect();
                if hits.is_empty() {
                    continue;
                }
                let k = hits[rng.gen_range(0..hits.len())];
                let new = format!("{}{}{}", &text[..k], b, &text[k + a.len()..]);
                let area = &mut img[4096..16384];
                area.fill(0);
                let n = new.len().min(area.len());
                area[..n].copy_from_slice(&new.as_bytes()[..n]);
            }
            // Header sizes and offsets.
            _ => {
                let v: u64 = match rng.gen_range(0..4) {
                    0 => u64::MAX,
                    1 => 1 << rng.gen_range(10..30),
                    2 => rng.gen(),
                    _ => 16384,
                };
                let field = [
                    ondisk::off::HDR_SIZE,
                    ondisk::off::HDR_OFFSET,
                    ondisk::off::SEQID,
                ][rng.gen_range(0..3)];
                img[field..field + 8].copy_from_slice(&v.to_be_bytes());
            }
        }
        fix_checksum(&mut img, 0);
        // Half the time the secondary is gone, so only the mutated primary can load.
        if rng.gen_bool(0.5) {
            img[16384..16390].copy_from_slice(b"VACUUM");
        }
        match ondisk::load_image(&img) {
            Ok(l) => {
                ok += 1;
                // Whatever loads must also serialise and validate again.
                let json = ondisk::metadata_json(&l.metadata).unwrap();
                let back: ondisk::Metadata = serde_json::from_str(&json).unwrap();
                back.validate(l.binary.hdr_size).unwrap();
            }
            Err(_) => err += 1,
        }
    }
    eprintln!("mutated LUKS2 headers: {ok} loaded, {err} rejected");
    assert!(err > 0 && ok > 0);
}

#[test]
fn mutated_luks1_headers_never_panic() {
    let Some(p) = common::image("compatimage.img") else {
        return;
    };
    let base = std::fs::read(p).unwrap()[..4096].to_vec();
    luks1::parse_header(&base, 10240000).unwrap();
    let seed = testkit::test_seed("luks1 header mutation");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    for _ in 0..5000 {
        let mut h = base.clone();
        for _ in 0..rng.gen_range(1..6) {
            let at = rng.gen_range(0..luks1::HEADER_SIZE);
            h[at] = rng.gen();
        }
        let size = if rng.gen_bool(0.2) {
            rng.gen()
        } else {
            10240000
        };
        let _ = luks1::parse_header(&h, size);
        let _ = luks1::parse_header(&h[..rng.gen_range(0..h.len())], size);
    }
}
