//! Known answers from `../shared/vectors/crypto/` (README.md there): IEEE 1619 AES-XTS,
//! the LUKS2 data segment cryptsetup encrypted with a known volume key (both sector sizes,
//! through the raw cipher and through a CryptDevice), PBKDF2-SHA256 and Argon2.

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, Geometry, MemDisk, WriteFlags};
use cairn_luks::device::{CryptDevice, SegmentParams};
use cairn_luks::keyslot::{Argon2Variant, Hash, KdfParams};
use cairn_luks::xts::SectorCipher;
use common::{hex, load_json, sha256_hex};

fn s(v: &serde_json::Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} missing"))
        .to_string()
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing"))
}

#[test]
fn ieee1619_xts_vectors() {
    let j = load_json("crypto/ieee1619_aes_xts.json");
    let vs = j["vectors"].as_array().expect("vectors");
    assert!(vs.len() >= 4, "expected vectors 1, 2, 3, 10");
    for v in vs {
        let name = s(v, "name");
        let key = hex(&s(v, "key_hex_dm_crypt_order"));
        let plain = hex(&s(v, "plaintext_hex"));
        let want = hex(&s(v, "ciphertext_hex"));
        let du = u(v, "data_unit_sequence_number");
        let c = SectorCipher::new("aes-xts-plain64", &key).unwrap();
        let mut b = plain.clone();
        c.encrypt_unit(&mut b, du);
        assert_eq!(b, want, "{name}: encryption");
        c.decrypt_unit(&mut b, du);
        assert_eq!(b, plain, "{name}: decryption");
        // The same through the sector API when the unit is a whole sector (vector 10).
        if plain.len() == 512 {
            let mut b = plain.clone();
            c.encrypt(&mut b, 512, du);
            assert_eq!(b, want, "{name}: sector API");
        }
    }
}

fn segment_plaintext(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| u8::try_from((7 * i + 13 * (i >> 9)) % 256).unwrap())
        .collect()
}

/// The IV rule: IV = byte offset / 512 even with 4096-byte sectors. The "wrong variant"
/// hash (IV = offset / 4096) gets its own message.
#[test]
fn luks2_data_segment_matches_cryptsetup() {
    let j = load_json("crypto/luks2_data_segment_xts.json");
    let vk = hex(&s(&j, "volume_key_hex"));
    let n = usize::try_from(u(&j, "plaintext_bytes")).unwrap();
    let plain = segment_plaintext(n);
    assert_eq!(sha256_hex(&plain), s(&j, "plaintext_sha256"));
    let c = SectorCipher::new(&s(&j, "encryption"), &vk).unwrap();
    for case in j["cases"].as_array().unwrap() {
        let ss = usize::try_from(u(case, "sector_size")).unwrap();
        let tweak = u(case, "iv_tweak");
        let mut b = plain.clone();
        c.encrypt(&mut b, ss, tweak);
        let got = sha256_hex(&b);
        if let Some(wrong) = case
            .get("wrong_iv_off_div_4096_ciphertext_sha256")
            .and_then(|w| w.as_str())
        {
            assert_ne!(
                got, wrong,
                "sector size {ss}: IV computed as offset / 4096; LUKS2 uses offset / 512 (IVs 0, 8, 16, ...)"
            );
        }
        assert_eq!(
            got,
            s(case, "ciphertext_sha256"),
            "sector size {ss}: ciphertext"
        );
        assert_eq!(b, hex(&s(case, "ciphertext_hex")), "sector size {ss}");

        // Through the block layer: a detached-header layout (segment at 0).
        let disk = Arc::new(MemDisk::with_geometry(Geometry::simple(n as u64)));
        disk.write_at(&b, 0, WriteFlags::NONE).unwrap();
        let dev = CryptDevice::new(
            disk.clone(),
            SectorCipher::new("aes-xts-plain64", &vk).unwrap(),
            SegmentParams {
                offset: 0,
                size: n as u64,
                sector_size: u32::try_from(ss).unwrap(),
                iv_tweak: tweak,
                allow_discards: false,
            },
            "test".into(),
        )
        .unwrap();
        assert_eq!(dev.geometry().logical_block_size as usize, ss);
        let mut r = vec![0u8; n];
        dev.read_at(&mut r, 0).unwrap();
        assert_eq!(r, plain, "sector size {ss}: decrypt through CryptDevice");
        // Reads and writes of a piece in the middle use the right IVs too.
        let mut mid = vec![0u8; 2 * ss];
        dev.read_at(&mut mid, ss as u64).unwrap();
        assert_eq!(mid, plain[ss..3 * ss]);
        let disk2 = Arc::new(MemDisk::with_geometry(Geometry::simple(n as u64)));
        let dev2 = CryptDevice::new(
            disk2.clone(),
            SectorCipher::new("aes-xts-plain64", &vk).unwrap(),
            dev.segment(),
            "test".into(),
        )
        .unwrap();
        for (k, piece) in plain.chunks(ss).enumerate().rev() {
            dev2.write_at(piece, (k * ss) as u64, WriteFlags::NONE)
                .unwrap();
        }
        assert_eq!(
            disk2.to_vec(),
            b,
            "sector size {ss}: encrypt through CryptDevice"
        );
    }
}

#[test]
fn pbkdf2_sha256_vectors() {
    let j = load_json("crypto/kdf.json");
    for v in j["pbkdf2_hmac_sha256"].as_array().unwrap() {
        let mut out = vec![0u8; usize::try_from(u(v, "dklen")).unwrap()];
        Hash::Sha256.pbkdf2(
            s(v, "password").as_bytes(),
            s(v, "salt").as_bytes(),
            u32::try_from(u(v, "iterations")).unwrap(),
            &mut out,
        );
        assert_eq!(common::to_hex(&out), s(v, "dk_hex"));
    }
}

#[test]
fn argon2_rfc9106_vectors() {
    let j = load_json("crypto/kdf.json");
    let v = &j["argon2_rfc9106"];
    let pwd = hex(&s(v, "password_hex"));
    let salt = hex(&s(v, "salt_hex"));
    let secret = hex(&s(v, "secret_hex"));
    let ad = hex(&s(v, "associated_data_hex"));
    for (alg, key) in [
        (argon2::Algorithm::Argon2d, "argon2d_hex"),
        (argon2::Algorithm::Argon2i, "argon2i_hex"),
        (argon2::Algorithm::Argon2id, "argon2id_hex"),
    ] {
        let params = argon2::ParamsBuilder::new()
            .m_cost(u32::try_from(u(v, "memory_kib")).unwrap())
            .t_cost(u32::try_from(u(v, "time_cost")).unwrap())
            .p_cost(u32::try_from(u(v, "lanes")).unwrap())
            .data(argon2::AssociatedData::new(&ad).unwrap())
            .output_len(32)
            .build()
            .unwrap();
        let a =
            argon2::Argon2::new_with_secret(&secret, alg, argon2::Version::V0x13, params).unwrap();
        let mut out = [0u8; 32];
        a.hash_password_into(&pwd, &salt, &mut out).unwrap();
        assert_eq!(common::to_hex(&out), s(v, key), "{key}");
    }
}

/// The LUKS2 keyslot form, through cairn's own KDF path.
#[test]
fn argon2_luks_style_vectors() {
    let j = load_json("crypto/kdf.json");
    for v in j["argon2_luks_style"].as_array().unwrap() {
        let variant = match s(v, "type").as_str() {
            "argon2i" => Argon2Variant::Argon2i,
            "argon2id" => Argon2Variant::Argon2id,
            t => panic!("type {t}"),
        };
        let p = KdfParams::Argon2 {
            variant,
            time: u32::try_from(u(v, "time_cost")).unwrap(),
            memory_kib: u32::try_from(u(v, "memory_kib")).unwrap(),
            parallel: u32::try_from(u(v, "lanes")).unwrap(),
        };
        let out = p
            .derive(s(v, "password").as_bytes(), s(v, "salt").as_bytes(), 32)
            .unwrap();
        assert_eq!(
            common::to_hex(out.as_bytes()),
            s(v, "tag_hex"),
            "{}",
            s(v, "type")
        );
    }
}
