//! Arbitrary and mutated superblock bytes: `parse` never panics, and whatever it accepts
//! re-encodes to the same checksummed bytes and builds a layout or refuses cleanly.
//! The seed is printed; rerun with `CAIRN_SEED=<seed>`.

use cairn_md::layout::ArrayLayout;
use cairn_md::ondisk::{checksum, FeaturePolicy};
use cairn_md::{create, examine::Examine, CreateParams, Level, MdTime, Sectors, Superblock, Uuid};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

fn rng(test: &str) -> SmallRng {
    SmallRng::seed_from_u64(cairn_block::testkit::test_seed(test))
}

fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 4),
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Linear, 2),
    ] {
        let p = CreateParams {
            level,
            layout: None,
            chunk: None,
            member_sectors: (0..n).map(|i| Sectors(131_072 + 4096 * i)).collect(),
            name: "fuzz".into(),
            homehost: Some("h".into()),
            uuid: Uuid([9; 16]),
            device_uuids: (0..n)
                .map(|i| Uuid([u8::try_from(i).unwrap(); 16]))
                .collect(),
            ctime: MdTime::from_secs(1_700_000_000),
            assume_clean: false,
            bitmap: cairn_md::BitmapChoice::None,
        };
        for sb in create(&p).unwrap().superblocks {
            v.push(sb.encode().unwrap());
        }
    }
    v
}

/// Everything a caller might do with an accepted superblock must not panic.
fn exercise(bytes: &[u8]) {
    for policy in [FeaturePolicy::Supported, FeaturePolicy::KnownToMd] {
        let Ok(sb) = Superblock::parse_with(bytes, "fuzz.img", policy) else {
            continue;
        };
        let again = sb.encode().expect("an accepted superblock re-encodes");
        let used = sb.superblock_bytes();
        assert_eq!(
            &again[..used],
            &bytes[..used],
            "encode(parse(b)) differs in the checksummed bytes"
        );
        let _ = Examine::new(&sb, Some(Sectors(1 << 20))).to_string();
        let _ = sb.check_member_size(Sectors(1 << 20), "fuzz.img");
        let n = usize::try_from(sb.raid_disks).unwrap();
        if let Ok(layout) = ArrayLayout::from_superblock(&sb, &vec![sb.data_size; n]) {
            let size = layout.array_sectors();
            for s in [0, 1, size.0 / 2, size.0.saturating_sub(1), size.0] {
                let _ = layout.primary(Sectors(s));
            }
        }
    }
}

fn fix_checksum(b: &mut [u8]) {
    let max_dev = u32::from_le_bytes(b[220..224].try_into().unwrap());
    if max_dev <= 1920 {
        let c = checksum(b, max_dev);
        b[216..220].copy_from_slice(&c.to_le_bytes());
    }
}

#[test]
fn mutated_superblocks_never_panic() {
    let mut r = rng("mutated_superblocks_never_panic");
    let seeds = seeds();
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut b = seeds[r.gen_range(0..seeds.len())].clone();
        for _ in 0..r.gen_range(1..4) {
            // Favour the fixed part, where the interesting fields are.
            let at = if r.gen_bool(0.8) {
                r.gen_range(0..256)
            } else {
                r.gen_range(0..b.len())
            };
            match r.gen_range(0..4) {
                0 => b[at] ^= 1 << r.gen_range(0..8),
                1 => b[at] = r.gen(),
                2 => b[at] = 0xff,
                _ => b[at] = 0,
            }
        }
        if r.gen_bool(0.9) {
            fix_checksum(&mut b);
        }
        let cut = if r.gen_bool(0.05) {
            r.gen_range(0..b.len())
        } else {
            b.len()
        };
        exercise(&b[..cut]);
        if Superblock::parse_with(&b[..cut], "f", FeaturePolicy::KnownToMd).is_ok() {
            accepted += 1;
        }
    }
    eprintln!("accepted {accepted} of 20000 mutated superblocks");
}

#[test]
fn random_bytes_never_panic() {
    let mut r = rng("random_bytes_never_panic");
    for _ in 0..2_000 {
        let len = r.gen_range(0..5000);
        let mut b = vec![0u8; len];
        r.fill_bytes(&mut b);
        if len >= 256 {
            b[..4].copy_from_slice(&0xa92b_4efcu32.to_le_bytes());
            b[4..8].copy_from_slice(&1u32.to_le_bytes());
            b[144..152].copy_from_slice(&8u64.to_le_bytes());
            b[220..224].copy_from_slice(&r.gen_range(0u32..2000).to_le_bytes());
            if len >= 4096 {
                fix_checksum(&mut b);
            }
        }
        exercise(&b);
    }
}
