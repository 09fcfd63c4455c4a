//! cairn against the real `cryptsetup` (verification.md §3.1 and §3.3), in userspace only:
//! there is no dm-crypt here, so data is checked with cryptsetup's offline reencryption.
//!
//! * cairn -> cryptsetup, for pbkdf2 and argon2id, 256/512-bit keys, 512/4096-byte
//!   sectors: `luksDump` exits 0 and `--debug` shows matching on-disk/in-memory checksums
//!   for both copies and no checksum error; `--dump-json-metadata` is exactly cairn's
//!   JSON; `open --test-passphrase` unlocks every keyslot (and refuses a wrong passphrase
//!   with exit 2); `--dump-volume-key` is cairn's key; the data segment cairn wrote
//!   decrypts with `reencrypt --decrypt` to exactly what was written. Keyslot add, change
//!   and remove are checked with `--test-passphrase` before and after.
//! * cryptsetup -> cairn: `luksFormat` with several header sizes, KDFs, sector and key
//!   sizes and several keyslots: cairn unlocks every keyslot and recovers the key that
//!   `--dump-volume-key` prints; data cryptsetup encrypted (`reencrypt --encrypt`, with a
//!   detached header and with `--reduce-device-size`) reads back byte-exact through cairn.
//!
//! Checkers run on read-only loop devices (cryptsetup repairs what it reads), created
//! and detached by a guard that also runs when a check panics. Without cryptsetup the
//! tests print SKIP (and fail when CI=true).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cairn_block::{BlockDevice, WriteFlags};
use cairn_luks::{FormatOptions, KeyslotOptions, Luks2, PbkdfOptions};
use common::{file_disk, pass_file, run, text, to_hex, Loop, TempDir, MIB};
use rand::{RngCore, SeedableRng};

const P0: &[u8] = b"first passphrase";
const P1: &[u8] = b"second \xff binary";

struct Cs(PathBuf);

impl Cs {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.0);
        c.env("LC_ALL", "C");
        c
    }

    /// Runs cryptsetup and requires exit 0.
    fn ok(&self, args: &[&str], what: &str) -> String {
        let o = run(self.cmd().args(args));
        assert!(
            o.status.success(),
            "{what}: cryptsetup {args:?}: {}",
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn status(&self, args: &[&str]) -> (Option<i32>, String) {
        let o = run(self.cmd().args(args));
        (o.status.code(), text(&o))
    }

    /// The volume key as cryptsetup sees it.
    fn volume_key(&self, dev: &str, pass: &Path, dir: &TempDir) -> Vec<u8> {
        let vk = dir.path("vk.bin");
        let _ = std::fs::remove_file(&vk);
        self.ok(
            &[
                "luksDump",
                "-q",
                "--dump-volume-key",
                "--volume-key-file",
                s(&vk),
                "--key-file",
                s(pass),
                dev,
            ],
            "dump volume key",
        );
        std::fs::read(&vk).unwrap()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn rng() -> rand::rngs::SmallRng {
    rand::rngs::SmallRng::seed_from_u64(cairn_block::testkit::test_seed("cryptsetup interop"))
}

fn new_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

/// verification.md §3.3 (c): decrypt the segment cairn wrote with cryptsetup's offline
/// reencryption, through a detached header holding the same volume key.
fn decrypt_with_cryptsetup(
    cs: &Cs,
    img: &Path,
    pass: &Path,
    dir: &TempDir,
    expect: &[u8],
    what: &str,
) {
    let l = Loop::ro(img);
    let j: serde_json::Value =
        serde_json::from_str(&cs.ok(&["luksDump", "--dump-json-metadata", l.path()], what))
            .unwrap();
    let seg = &j["segments"]["0"];
    let off: u64 = seg["offset"].as_str().unwrap().parse().unwrap();
    let ss = seg["sector_size"].as_u64().unwrap();
    let cipher = seg["encryption"].as_str().unwrap().to_string();
    drop(l);
    decrypt_segment(cs, img, off, &cipher, ss, pass, dir, expect, what);
}

/// Decrypts `img` from `off` with cryptsetup (a detached LUKS2 header with the image's
/// volume key, offset 0, then `reencrypt --decrypt`) and compares the start with `expect`.
#[allow(clippy::too_many_arguments)]
fn decrypt_segment(
    cs: &Cs,
    img: &Path,
    off: u64,
    cipher: &str,
    ss: u64,
    pass: &Path,
    dir: &TempDir,
    expect: &[u8],
    what: &str,
) {
    let l = Loop::ro(img);
    let vk = cs.volume_key(l.path(), pass, dir);
    drop(l);
    let vk_file = dir.path("seg-vk.bin");
    std::fs::write(&vk_file, &vk).unwrap();
    let all = std::fs::read(img).unwrap();
    let seg_bin = dir.path("seg.bin");
    std::fs::write(&seg_bin, &all[usize::try_from(off).unwrap()..]).unwrap();
    let hdr = dir.path("seg.hdr");
    let _ = std::fs::remove_file(&hdr);
    let ks = (vk.len() * 8).to_string();
    let ss = ss.to_string();
    cs.ok(
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--header",
            s(&hdr),
            "--offset",
            "0",
            "--volume-key-file",
            s(&vk_file),
            "--key-size",
            &ks,
            "--cipher",
            cipher,
            "--sector-size",
            &ss,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(pass),
            s(&seg_bin),
        ],
        what,
    );
    cs.ok(
        &[
            "reencrypt",
            "--decrypt",
            "-q",
            "--force-offline-reencrypt",
            "--header",
            s(&hdr),
            "--key-file",
            s(pass),
            s(&seg_bin),
        ],
        what,
    );
    let got = std::fs::read(&seg_bin).unwrap();
    assert!(
        got.len() >= expect.len(),
        "{what}: decrypted segment too short"
    );
    if let Some(d) = cairn_block::testkit::first_difference(&got[..expect.len()], expect, off) {
        panic!("{what}: cryptsetup decrypts cairn's data segment differently: {d}");
    }
}

/// luksDump (plain and --debug) and --dump-json-metadata on a read-only loop device.
fn check_header_with_cryptsetup(cs: &Cs, img: &Path, what: &str) {
    let l = Loop::ro(img);
    let (code, out) = cs.status(&["isLuks", "--type", "luks2", l.path()]);
    assert_eq!(code, Some(0), "{what}: isLuks: {out}");
    cs.ok(&["luksDump", l.path()], what);
    let (code, dbg) = cs.status(&["luksDump", "--debug", l.path()]);
    assert_eq!(code, Some(0), "{what}: luksDump --debug: {dbg}");
    for line in dbg.lines() {
        assert!(
            !line.to_ascii_lowercase().contains("checksum error")
                && !line.contains("requires recovery"),
            "{what}: cryptsetup complains: {line}\n{dbg}"
        );
    }
    let on_disk: Vec<&str> = dbg.lines().filter(|l| l.ends_with("(on-disk)")).collect();
    let in_mem: Vec<&str> = dbg.lines().filter(|l| l.ends_with("(in-memory)")).collect();
    assert_eq!(
        on_disk.len(),
        2,
        "{what}: expected a checksum line per copy:\n{dbg}"
    );
    for (a, b) in on_disk.iter().zip(&in_mem) {
        assert_eq!(
            a.trim_end_matches("(on-disk)"),
            b.trim_end_matches("(in-memory)"),
            "{what}: checksum mismatch"
        );
    }
    let shown: serde_json::Value =
        serde_json::from_str(&cs.ok(&["luksDump", "--dump-json-metadata", l.path()], what))
            .unwrap();
    drop(l);
    let ours = Luks2::load(file_disk(img, false)).unwrap();
    let intended = serde_json::to_value(ours.metadata()).unwrap();
    assert_eq!(
        shown, intended,
        "{what}: cryptsetup's JSON differs from what cairn wrote"
    );
}

/// `open --test-passphrase` for each (passphrase file, keyslot); and a wrong one fails
/// with exit 2.
fn check_passphrases(cs: &Cs, img: &Path, slots: &[(&Path, u32)], absent: &[&Path], what: &str) {
    let l = Loop::ro(img);
    for (p, slot) in slots {
        let slot_s = slot.to_string();
        let out = cs.ok(
            &[
                "open",
                "--test-passphrase",
                "-v",
                "--key-file",
                s(p),
                "--key-slot",
                &slot_s,
                l.path(),
            ],
            what,
        );
        assert!(
            out.contains(&format!("Key slot {slot} unlocked")),
            "{what}: {out}"
        );
        cs.ok(
            &["open", "--test-passphrase", "--key-file", s(p), l.path()],
            what,
        );
    }
    for p in absent {
        let (code, out) = cs.status(&["open", "--test-passphrase", "--key-file", s(p), l.path()]);
        assert_eq!(
            code,
            Some(2),
            "{what}: a removed/wrong passphrase must fail with exit 2: {out}"
        );
        assert!(
            out.contains("No key available with this passphrase"),
            "{what}: {out}"
        );
    }
}

#[test]
fn cairn_volumes_pass_cryptsetup() {
    let Some(bin) = common::cryptsetup("cairn_volumes_pass_cryptsetup") else {
        return;
    };
    let cs = Cs(bin);
    let mut rng = rng();
    for pbkdf in ["pbkdf2", "argon2id"] {
        for key_size in [256u32, 512] {
            for ss in [512u32, 4096] {
                let what = format!("{pbkdf} key {key_size} sector {ss}");
                eprintln!("cairn -> cryptsetup: {what}");
                let dir = TempDir::new("cairn2cs");
                let img = dir.path("cairn.img");
                let payload = MIB;
                new_file(&img, 16 * MIB + payload);
                let kdf = if pbkdf == "pbkdf2" {
                    PbkdfOptions::pbkdf2(1000)
                } else {
                    PbkdfOptions::argon2id(4, 2048, if ss == 512 { 1 } else { 2 })
                };
                let dev = file_disk(&img, true);
                let mut l = Luks2::format(
                    dev.clone(),
                    &FormatOptions {
                        key_size,
                        sector_size: Some(ss),
                        pbkdf: kdf.clone(),
                        label: "cairn-test".into(),
                        subsystem: "interop".into(),
                        ..Default::default()
                    },
                    P0,
                )
                .unwrap();
                let ko = KeyslotOptions {
                    pbkdf: kdf,
                    ..Default::default()
                };
                assert_eq!(l.add_key(P0, P1, &ko).unwrap(), 1);
                let c = l.activate(&l.unlock(P1, None).unwrap().volume_key).unwrap();
                assert_eq!(c.geometry().size, payload);
                let mut plain = vec![0u8; usize::try_from(payload).unwrap()];
                rng.fill_bytes(&mut plain);
                c.write_at(&plain, 0, WriteFlags::NONE).unwrap();
                c.flush().unwrap();
                let vk = l.unlock(P0, None).unwrap().volume_key;
                drop((c, l, dev));

                check_header_with_cryptsetup(&cs, &img, &what);
                let p0 = pass_file(&dir, "p0", P0);
                let p1 = pass_file(&dir, "p1", P1);
                let wrong = pass_file(&dir, "wrong", b"first passphrasE");
                check_passphrases(&cs, &img, &[(&p0, 0), (&p1, 1)], &[&wrong], &what);
                let l = Loop::ro(&img);
                assert_eq!(
                    cs.volume_key(l.path(), &p1, &dir),
                    vk.as_bytes(),
                    "{what}: volume key"
                );
                drop(l);
                decrypt_with_cryptsetup(&cs, &img, &p1, &dir, &plain, &what);
            }
        }
    }
}

#[test]
fn cairn_keyslot_changes_pass_cryptsetup() {
    let Some(bin) = common::cryptsetup("cairn_keyslot_changes_pass_cryptsetup") else {
        return;
    };
    let cs = Cs(bin);
    let dir = TempDir::new("cairn-keys");
    let img = dir.path("keys.img");
    new_file(&img, 17 * MIB);
    let ko = KeyslotOptions {
        pbkdf: PbkdfOptions::pbkdf2(1000),
        ..Default::default()
    };
    let (pa, pb, pc) = (
        b"alpha".as_slice(),
        b"bravo".as_slice(),
        b"charlie".as_slice(),
    );
    let fa = pass_file(&dir, "a", pa);
    let fb = pass_file(&dir, "b", pb);
    let fc = pass_file(&dir, "c", pc);
    let mut l = Luks2::format(
        file_disk(&img, true),
        &FormatOptions {
            pbkdf: PbkdfOptions::pbkdf2(1000),
            sector_size: Some(4096),
            ..Default::default()
        },
        pa,
    )
    .unwrap();
    l.add_key(pa, pb, &ko).unwrap();
    check_passphrases(&cs, &img, &[(&fa, 0), (&fb, 1)], &[&fc], "after add");
    check_header_with_cryptsetup(&cs, &img, "after add");
    assert_eq!(l.change_key(pb, pc, &ko).unwrap(), 1);
    check_passphrases(&cs, &img, &[(&fa, 0), (&fc, 1)], &[&fb], "after change");
    check_header_with_cryptsetup(&cs, &img, "after change");
    assert_eq!(l.remove_key(pa).unwrap(), 0);
    check_passphrases(&cs, &img, &[(&fc, 1)], &[&fa, &fb], "after remove");
    check_header_with_cryptsetup(&cs, &img, "after remove");
}

#[test]
fn cryptsetup_volumes_open_in_cairn() {
    let Some(bin) = common::cryptsetup("cryptsetup_volumes_open_in_cairn") else {
        return;
    };
    let cs = Cs(bin);
    // (pbkdf args, key size, sector size, metadata size, keyslots size)
    type Case<'a> = (&'a [&'a str], u32, u32, &'a str, Option<&'a str>);
    let pb2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let a2: &[&str] = &[
        "--pbkdf",
        "argon2id",
        "--pbkdf-memory",
        "32768",
        "--pbkdf-parallel",
        "1",
        "--pbkdf-force-iterations",
        "4",
    ];
    let cases: Vec<Case> = vec![
        (pb2, 512, 4096, "16k", None),
        (a2, 256, 512, "16k", None),
        (pb2, 256, 4096, "32k", None),
        (pb2, 512, 512, "64k", Some("4194304")),
        (pb2, 512, 4096, "1m", None),
        (pb2, 256, 512, "4m", Some("16777216")),
    ];
    for (kdf, key_size, ss, md, kss) in cases {
        let what = format!("{} key {key_size} sector {ss} metadata {md}", kdf[1]);
        eprintln!("cryptsetup -> cairn: {what}");
        let dir = TempDir::new("cs2cairn");
        let img = dir.path("cs.img");
        new_file(&img, 48 * MIB);
        let passes: [&[u8]; 3] = [b"zero", b"one \x00 with nul", b"two"];
        let files: Vec<PathBuf> = passes
            .iter()
            .enumerate()
            .map(|(i, p)| pass_file(&dir, &format!("p{i}"), p))
            .collect();
        let ks = key_size.to_string();
        let sss = ss.to_string();
        let mut args: Vec<&str> = vec![
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--key-size",
            &ks,
            "--sector-size",
            &sss,
            "--luks2-metadata-size",
            md,
            "--key-file",
            s(&files[0]),
        ];
        if let Some(k) = kss {
            args.extend(["--luks2-keyslots-size", k]);
        }
        args.extend(kdf);
        args.push(s(&img));
        cs.ok(&args, &what);
        for (i, f) in files.iter().enumerate().skip(1) {
            let slot = (i * 2).to_string();
            let mut a: Vec<&str> = vec![
                "luksAddKey",
                "-q",
                "--key-file",
                s(&files[0]),
                "--key-slot",
                &slot,
            ];
            a.extend(kdf);
            a.extend([s(&img), s(f)]);
            cs.ok(&a, &what);
        }
        let l = Loop::ro(&img);
        let vk = cs.volume_key(l.path(), &files[2], &dir);
        drop(l);
        let luks = Luks2::load(file_disk(&img, false)).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(luks.warnings().is_empty(), "{what}: {:?}", luks.warnings());
        assert_eq!(luks.keyslots(), vec![0, 2, 4], "{what}");
        for (i, p) in passes.iter().enumerate() {
            let u = luks
                .unlock(p, None)
                .unwrap_or_else(|e| panic!("{what}: passphrase {i}: {e}"));
            assert_eq!(u.keyslot as usize, i * 2, "{what}");
            assert_eq!(
                to_hex(u.volume_key.as_bytes()),
                to_hex(&vk),
                "{what}: volume key"
            );
        }
        let c = luks
            .activate(&luks.unlock(passes[1], Some(2)).unwrap().volume_key)
            .unwrap();
        assert_eq!(c.geometry().logical_block_size, ss);
    }
}

/// verification.md §3.3 (a): ciphertext cryptsetup made from a known volume key, with a
/// detached header; cairn reads it through `activate_on`.
#[test]
fn cryptsetup_reencrypted_data_reads_back_through_cairn() {
    let Some(bin) = common::cryptsetup("cryptsetup_reencrypted_data_reads_back_through_cairn")
    else {
        return;
    };
    let cs = Cs(bin);
    let mut rng = rng();
    for (key_size, ss) in [(512usize, 4096u32), (256, 512), (512, 512), (256, 4096)] {
        let what = format!("detached key {key_size} sector {ss}");
        let dir = TempDir::new("reenc");
        let mut plain = vec![0u8; common::us(2 * MIB)];
        rng.fill_bytes(&mut plain);
        let data = dir.path("data.bin");
        std::fs::write(&data, &plain).unwrap();
        let mut vk = vec![0u8; key_size / 8];
        rng.fill_bytes(&mut vk);
        let vkf = dir.path("vk.bin");
        std::fs::write(&vkf, &vk).unwrap();
        let pass = pass_file(&dir, "p", b"detached");
        let hdr = dir.path("hdr.img");
        let (ks, sss) = (key_size.to_string(), ss.to_string());
        cs.ok(
            &[
                "reencrypt",
                "--encrypt",
                "--type",
                "luks2",
                "-q",
                "--header",
                s(&hdr),
                "--volume-key-file",
                s(&vkf),
                "--key-size",
                &ks,
                "--cipher",
                "aes-xts-plain64",
                "--sector-size",
                &sss,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                s(&pass),
                s(&data),
            ],
            &what,
        );
        assert_ne!(
            std::fs::read(&data).unwrap()[..4096],
            plain[..4096],
            "{what}: not encrypted"
        );
        let l = Luks2::load(file_disk(&hdr, false)).unwrap();
        let u = l.unlock(b"detached", None).unwrap();
        assert_eq!(u.volume_key.as_bytes(), &vk[..]);
        let c = l
            .activate_on(file_disk(&data, false), &u.volume_key)
            .unwrap();
        let mut got = vec![0u8; plain.len()];
        c.read_at(&mut got, 0).unwrap();
        if let Some(d) = cairn_block::testkit::first_difference(&got, &plain, 0) {
            panic!("{what}: {d}");
        }
    }

    // §3.3 (b): a whole image, header in front, made by `--reduce-device-size`.
    let dir = TempDir::new("reduce");
    let img = dir.path("plain.img");
    let mut plain = vec![0u8; common::us(8 * MIB)];
    rng.fill_bytes(&mut plain);
    std::fs::write(&img, &plain).unwrap();
    // As verification.md: the file is twice the reduction; its first half is kept.
    std::fs::File::options()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    let pass = pass_file(&dir, "p", b"reduce");
    cs.ok(
        &[
            "reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&pass),
            "--sector-size",
            "4096",
            "--reduce-device-size",
            "8M",
            s(&img),
        ],
        "reduce-device-size",
    );
    let c = cairn_luks::open_any(file_disk(&img, false), b"reduce").unwrap();
    assert_eq!(c.geometry().size, 12 * MIB, "data offset 4 MiB");
    let mut got = vec![0u8; plain.len()];
    c.read_at(&mut got, 0).unwrap();
    assert!(got == plain, "reduce-device-size image: data differs");
}

/// A copy of a cryptsetup image with a corrupted primary: cairn reads it from the
/// secondary, repairs it, and cryptsetup then finds both copies good.
#[test]
fn cairn_repairs_what_cryptsetup_accepts() {
    let Some(bin) = common::cryptsetup("cairn_repairs_what_cryptsetup_accepts") else {
        return;
    };
    let cs = Cs(bin);
    let dir = TempDir::new("repair");
    let img = dir.path("r.img");
    new_file(&img, 17 * MIB);
    let p = pass_file(&dir, "p", b"repair me");
    cs.ok(
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--sector-size",
            "512",
            "--key-file",
            s(&p),
            s(&img),
        ],
        "format",
    );
    let disk: Arc<dyn BlockDevice> = file_disk(&img, true);
    let mut b = vec![0u8; 4096];
    disk.read_at(&mut b, 4096).unwrap();
    b[1] ^= 0x01;
    disk.write_at(&b, 4096, WriteFlags::NONE).unwrap();
    let mut l = Luks2::load(disk.clone()).unwrap();
    assert_eq!(l.warnings().len(), 1);
    assert!(l.repair().unwrap());
    drop((l, disk));
    check_header_with_cryptsetup(&cs, &img, "after cairn's repair");
    check_passphrases(&cs, &img, &[(&p, 0)], &[], "after cairn's repair");
}

/// LUKS1 data written through cairn (XTS and CBC-ESSIV) reads back through cairn after a
/// reopen, and cryptsetup decrypts it to the same bytes.
#[test]
fn luks1_data_written_by_cairn_decrypts_with_cryptsetup() {
    let mut rng = rng();
    for (name, pass) in [
        ("compatimage.img", b"compatkey".to_vec()),
        ("luks1_aes-xts-plain64-sha256.img", Vec::new()),
        ("luks1_aes-cbc-essiv-sha256-sha1.img", Vec::new()),
    ] {
        let Some(src) = common::image(name) else {
            return;
        };
        let pass = if pass.is_empty() {
            let Some(k) = common::image("keyfile1") else {
                return;
            };
            std::fs::read(k).unwrap()
        } else {
            pass
        };
        let dir = TempDir::new("luks1");
        let img = dir.path("l1.img");
        std::fs::copy(&src, &img).unwrap();
        let mut plain = vec![0u8; 256 << 10];
        rng.fill_bytes(&mut plain);
        let at: u64 = 64 << 10;
        {
            let c = cairn_luks::open_any(file_disk(&img, true), &pass).unwrap();
            c.write_at(&plain, at, WriteFlags::FUA).unwrap();
        }
        let l = cairn_luks::Luks1::load(file_disk(&img, false)).unwrap();
        let c = l
            .activate(&l.unlock(&pass, None).unwrap().volume_key)
            .unwrap();
        let mut back = vec![0u8; plain.len()];
        c.read_at(&mut back, at).unwrap();
        assert!(back == plain, "{name}: read back through cairn differs");
        let Some(bin) = common::cryptsetup("luks1_data_written_by_cairn_decrypts_with_cryptsetup")
        else {
            return;
        };
        let cs = Cs(bin);
        let pf = pass_file(&dir, "pass", &pass);
        let h = l.header();
        // The expected plaintext from the payload start: what was there (read through
        // cairn before the write is not needed: compare only the written range).
        let mut expect = vec![0u8; common::us(at) + plain.len()];
        c.read_at(&mut expect, 0).unwrap();
        drop(c);
        decrypt_segment(
            &cs,
            &img,
            u64::from(h.payload_offset) * 512,
            &h.cipher_spec(),
            512,
            &pf,
            &dir,
            &expect,
            name,
        );
    }
}
