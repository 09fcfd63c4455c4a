//! Every image in `../shared/vectors/luks-images/`, with the result its README expects:
//! OPEN (volume key and payload hash), UNLOCK-ONLY (key recovered, data and header
//! changes refused), HEADER-OK (loads, from the copy stated), REJECT (a clean error) and
//! UNSUPPORTED (a clean "unsupported" error, never wrong plaintext).
//!
//! Images are opened read-only, so nothing can be "repaired" into them; their SHA-256 is
//! checked against SHA256SUMS before and after.

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind};
use cairn_luks::ondisk::Which;
use cairn_luks::{open_any, Luks, Luks1, Luks2, NO_KEY};
use common::{file_disk, image, sha256_hex, to_hex, vectors_dir};
use sha2::Digest;

#[derive(Debug, Clone, Copy)]
enum Expect {
    Open {
        pass: Pass,
        vk: &'static str,
        payload: Option<&'static str>,
    },
    UnlockOnly {
        pass: Pass,
        vk: &'static str,
    },
    HeaderOk(Option<Which>),
    Reject(&'static str),
    Unsupported(Pass),
}

#[derive(Debug, Clone, Copy)]
enum Pass {
    Text(&'static str),
    KeyFile1,
}

const TEST_IMAGE_VK: &str = "b67647946b62ded9d65983a92cd2c0f4c08923473deb44741da5ba675e8bde82";
const TEST_IMAGE_PAYLOAD: &str = "e187fdce3c4309544505fe845b34166151b52be209572f4936ec590e67ab22f8";
const REQ_VK: &str = "07459b841ad76fcbc2b27e6d20195359dbfa6ba3aaf3abb25477c03a6fc936bd";

fn cases() -> Vec<(&'static str, Expect)> {
    use Expect::*;
    let ti = |_: u32| Open {
        pass: Pass::Text("Qx3qn46vq0v"),
        vk: TEST_IMAGE_VK,
        payload: Some(TEST_IMAGE_PAYLOAD),
    };
    vec![
        ("test_image_16", ti(16)),
        ("test_image_32", ti(32)),
        ("test_image_128", ti(128)),
        ("test_image_512", ti(512)),
        ("test_image_2048", ti(2048)),
        ("test_image_4096", ti(4096)),
        (
            "luks2_header_requirements_free",
            Open {
                pass: Pass::Text("blablabl"),
                vk: REQ_VK,
                payload: None,
            },
        ),
        (
            "luks2_header_requirements",
            UnlockOnly {
                pass: Pass::Text("blablabl"),
                vk: REQ_VK,
            },
        ),
        (
            "luks2_invalid_cipher.img",
            UnlockOnly {
                pass: Pass::Text("93R4P4pIqAH8"),
                vk: "edaa40709797973715e572bf7d86fcbb9cfe2051083c33c28d58fe4e1e7ff642",
            },
        ),
        ("luks2_valid_hdr.img", HeaderOk(Some(Which::Primary))),
        (
            "luks2-invalid-checksum-hdr0.img",
            HeaderOk(Some(Which::Secondary)),
        ),
        ("luks2-invalid-checksum-both-hdrs.img", Reject("checksum")),
        (
            "luks2-corrupted-hdr0-with-correct-chks.img",
            HeaderOk(Some(Which::Secondary)),
        ),
        ("luks2-non-null-byte-beyond-json0.img", Reject("")),
        ("luks2-missing-trailing-null-byte-json0.img", Reject("NUL")),
        ("luks2-overlapping-areas-c0-json0.img", Reject("overlap")),
        (
            "luks2-area-in-json-hdr-space-json0.img",
            Reject("keyslots area"),
        ),
        ("luks2-keyslot-missing-digest.img", Reject("no digest")),
        (
            "luks2-uint64-overflow-segment-size.img",
            Reject("segment size"),
        ),
        (
            "luks2-uint64-max-segment-size.img",
            HeaderOk(Some(Which::Primary)),
        ),
        (
            "luks2-segment-crypt-wrong-sectorsize-0.img",
            Reject("sector_size"),
        ),
        ("luks2-invalid-keyslots-size-c0.img", Reject("data offset")),
        (
            "luks2-invalid-keyslots-size-c1.img",
            Reject("keyslots_size"),
        ),
        ("luks2-invalid-json-size-c2.img", Reject("json_size")),
        (
            "luks2-metadata-size-64k.img",
            HeaderOk(Some(Which::Primary)),
        ),
        (
            "luks2-metadata-size-64k-inv-area-c1.img",
            Reject("keyslots area"),
        ),
        ("luks2-keyslot-invalid-area-size.img", Reject("overflows")),
        (
            "compatimage.img",
            Open {
                pass: Pass::Text("compatkey"),
                vk: "e1a851c034ed7993b276608a45842b7b",
                payload: Some("7428e8f2436882a07eb32765086f5c899474c08b5576f556b573d2aabdf923e8"),
            },
        ),
        ("valid_header_file", HeaderOk(None)),
        (
            "luks1_aes-xts-plain64-sha256.img",
            Open {
                pass: Pass::KeyFile1,
                vk: "b1c4a7c0f69cbfd1ef32ec65ada15a0aa41fa940ade5289911a64d31bcd07b30",
                payload: Some("b42c93fc807d8c40cc05c932ae5c27fc56af96a0a3d5f53d215f63e4c59e7577"),
            },
        ),
        (
            "luks1_aes-cbc-essiv-sha256-sha1.img",
            Open {
                pass: Pass::KeyFile1,
                vk: "582a935a5bc5418a481a08644784206398846696680b8edfa55826b969bb4438",
                payload: Some("15898285e6c9ad576729cc01e5a557ebddfe562ea855bae0a2aba4fb8439eb1a"),
            },
        ),
        (
            "luks1_serpent-xts-plain64-sha256.img",
            Unsupported(Pass::KeyFile1),
        ),
        (
            "luks1_aes-lrw-plain64-sha1.img",
            Unsupported(Pass::KeyFile1),
        ),
        ("evil_hdr-keyslot_overlap", Reject("keyslot 1 is invalid")),
        ("evil_hdr-luks_hdr_damage", Reject("keyslot 2 is invalid")),
        ("evil_hdr-payload_overwrite", Reject("keyslot 3 is invalid")),
    ]
}

fn passphrase(p: Pass) -> Option<Vec<u8>> {
    Some(match p {
        Pass::Text(t) => t.as_bytes().to_vec(),
        Pass::KeyFile1 => std::fs::read(image("keyfile1")?).unwrap(),
    })
}

/// SHA-256 of a whole device, read in 1 MiB pieces.
fn device_sha(dev: &dyn BlockDevice) -> String {
    let size = dev.geometry().size;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = usize::try_from((size - off).min(1 << 20)).unwrap();
        dev.read_at(&mut buf[..n], off).unwrap();
        h.update(&buf[..n]);
        off += n as u64;
    }
    to_hex(&h.finalize())
}

fn check(name: &str, expect: Expect) -> Result<(), String> {
    let Some(path) = image(name) else {
        return Ok(());
    };
    let dev: Arc<dyn BlockDevice> = file_disk(&path, false);
    // Nothing can be written ("repaired") into the image through a read-only FileDisk.
    assert!(dev.capabilities().read_only);
    let r = match expect {
        Expect::Open { pass, vk, payload } => {
            let Some(pass) = passphrase(pass) else {
                return Ok(());
            };
            let l = Luks::load(dev.clone()).map_err(|e| format!("load: {e}"))?;
            let u = l.unlock(&pass, None).map_err(|e| format!("unlock: {e}"))?;
            if to_hex(u.volume_key.as_bytes()) != vk {
                return Err("wrong volume key".into());
            }
            // Each unlock costs a KDF run (slow in debug builds): the wrong-passphrase and
            // open_any paths are checked on one image of each version.
            let c = if matches!(name, "test_image_16" | "compatimage.img") {
                let e = l.unlock(b"not the passphrase", None).unwrap_err();
                if e.kind() != ErrorKind::AuthFailed || !e.to_string().contains(NO_KEY) {
                    return Err(format!("wrong passphrase gave: {e}"));
                }
                open_any(dev.clone(), &pass).map_err(|e| format!("open_any: {e}"))?
            } else {
                l.activate(&u.volume_key)
                    .map_err(|e| format!("activate: {e}"))?
            };
            if let Some(want) = payload {
                let got = device_sha(&c);
                if got != want {
                    return Err(format!("payload hash {got}, want {want}"));
                }
            }
            let _ = l.dump_text();
            if let Luks::V2(l2) = &l {
                // Tokens and unknown fields survive a rewrite of the JSON.
                let json = cairn_luks::ondisk::metadata_json(l2.metadata()).unwrap();
                let back: cairn_luks::ondisk::Metadata = serde_json::from_str(&json).unwrap();
                if &back != l2.metadata() {
                    return Err("metadata does not survive a JSON round trip".into());
                }
                if name == "luks2_header_requirements_free" && l2.metadata().tokens.0.len() != 3 {
                    return Err("tokens lost".into());
                }
            }
            Ok(())
        }
        Expect::UnlockOnly { pass, vk } => {
            let Some(pass) = passphrase(pass) else {
                return Ok(());
            };
            let mut l = Luks2::load(dev.clone()).map_err(|e| format!("load: {e}"))?;
            let u = l.unlock(&pass, None).map_err(|e| format!("unlock: {e}"))?;
            if to_hex(u.volume_key.as_bytes()) != vk {
                return Err("wrong volume key".into());
            }
            let e = l.activate(&u.volume_key).map(|_| ()).unwrap_err();
            if e.kind() != ErrorKind::Unsupported {
                return Err(format!("activation should be unsupported, got {e}"));
            }
            if open_any(dev.clone(), &pass).is_ok() {
                return Err("open_any served the data".into());
            }
            let _ = l.dump();
            // Header changes are refused before anything is written.
            if name == "luks2_header_requirements" {
                let e = l.add_key(&pass, b"new", &Default::default()).unwrap_err();
                if e.kind() != ErrorKind::Unsupported
                    || !e.to_string().contains("unmet requirements")
                {
                    return Err(format!("add_key should be refused: {e}"));
                }
                let dir = common::TempDir::new("backup");
                l.header_backup(&dir.path("hdr.bak"))
                    .map_err(|e| format!("header backup should be allowed: {e}"))?;
            }
            if name == "luks2_invalid_cipher.img" {
                // For information: the payload as aes-xts-plain64 under this key.
                let mut b = vec![0u8; 4096];
                dev.read_at(&mut b, 16 << 20).unwrap();
                cairn_luks::xts::SectorCipher::new("aes-xts-plain64", u.volume_key.as_bytes())
                    .unwrap()
                    .decrypt(&mut b, 512, 0);
                if sha256_hex(&b)
                    != "328ba089325c82f866ca615b421cc085d0c81ae1aa80347ed7e4548d7ae8f095"
                {
                    return Err("payload as aes-xts-plain64 differs".into());
                }
            }
            Ok(())
        }
        Expect::HeaderOk(which) => match which {
            None => {
                let l = Luks1::load(dev.clone()).map_err(|e| format!("load: {e}"))?;
                let e = l.unlock(b"anything", None).unwrap_err();
                if e.kind() != ErrorKind::AuthFailed || !e.to_string().contains("no usable keyslot")
                {
                    return Err(format!("expected 'no usable keyslot', got {e}"));
                }
                Ok(())
            }
            Some(w) => {
                let l = Luks2::load(dev.clone()).map_err(|e| format!("load: {e}"))?;
                let (used, p, s) = l.copies();
                if used != w {
                    return Err(format!("loaded from the {used} copy, want {w}"));
                }
                if (p.is_valid() && s.is_valid()) != l.warnings().is_empty() {
                    return Err(format!(
                        "warnings {:?} with copies {p:?} {s:?}",
                        l.warnings()
                    ));
                }
                let _ = l.dump().to_string();
                let _ = l.check_activatable();
                if name == "luks2_valid_hdr.img"
                    && (l.binary().seqid != 10
                        || l.uuid() != "12a3a118-7039-4575-a649-3f559d8d87ee"
                        || l.keyslots().len() != 8
                        || !l.warnings().is_empty())
                {
                    return Err(format!("unexpected header {:?}", l.binary()));
                }
                Ok(())
            }
        },
        Expect::Reject(words) => match Luks::load(dev.clone()) {
            Ok(_) => Err("loaded, but must be rejected".into()),
            Err(e) if e.kind() != ErrorKind::Corrupt => {
                Err(format!("rejected as {:?}: {e}", e.kind()))
            }
            Err(e) if !e.to_string().contains(words) => {
                Err(format!("rejected, but not for {words:?}: {e}"))
            }
            Err(e) => {
                eprintln!("{name}: rejected: {e}");
                if open_any(dev.clone(), b"x").is_ok() {
                    return Err("open_any opened it".into());
                }
                Ok(())
            }
        },
        Expect::Unsupported(pass) => {
            let Some(pass) = passphrase(pass) else {
                return Ok(());
            };
            match open_any(dev.clone(), &pass) {
                Ok(_) => Err("opened a cipher cairn does not implement".into()),
                Err(e) if e.kind() == ErrorKind::Unsupported => {
                    eprintln!("{name}: {e}");
                    Ok(())
                }
                Err(e) => Err(format!("expected Unsupported, got {e}")),
            }
        }
    };
    r
}

#[test]
fn every_cryptsetup_image_as_its_readme_says() {
    let mut failures = Vec::new();
    for (name, expect) in cases() {
        match check(name, expect) {
            Ok(()) => eprintln!("ok: {name}"),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    // Every image in the folder is covered by the table.
    let dir = vectors_dir().join("luks-images");
    let names: Vec<String> = cases().iter().map(|c| c.0.to_string()).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(base) = n.strip_suffix(".xz") {
            if base != "keyfile1" && !names.iter().any(|x| x == base) {
                failures.push(format!("{base}: not covered by the test table"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} image(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
