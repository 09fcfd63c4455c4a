//! LUKS2 volumes made by cairn, on memory disks: the block-device conformance suite over
//! a CryptDevice (both sector sizes), round trips checked against an independent model
//! of the on-disk ciphertext, payload alignment, header corruption and recovery, keyslot
//! management, crash states of every metadata update, header backup/restore, and that
//! key material never shows up in Debug, Display or dumps.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{self, CrashPoint, LogWritesDisk};
use cairn_block::{BlockDevice, ErrorKind, Geometry, MemDisk, WriteFlags};
use cairn_luks::ondisk::Which;
use cairn_luks::xts::SectorCipher;
use cairn_luks::{FormatOptions, KeyslotOptions, Luks2, PbkdfOptions, VolumeKey, NO_KEY};
use common::{us, KIB, MIB};
use rand::{Rng, SeedableRng};

const PASS: &[u8] = b"correct horse battery staple";

fn fast() -> PbkdfOptions {
    PbkdfOptions::pbkdf2(1000)
}

fn opts(key_size: u32, sector_size: u32) -> FormatOptions {
    FormatOptions {
        key_size,
        sector_size: Some(sector_size),
        pbkdf: fast(),
        data_offset: Some(2 * MIB),
        ..FormatOptions::default()
    }
}

fn mem(size: u64) -> Arc<MemDisk> {
    Arc::new(MemDisk::new(size))
}

/// A formatted image and its volume key, cloned into fresh disks by the conformance suite.
fn template(sector_size: u32) -> (Vec<u8>, VolumeKey) {
    let disk = mem(2 * MIB + 6 * MIB);
    let l = Luks2::format(disk.clone(), &opts(512, sector_size), PASS).unwrap();
    let u = l.unlock(PASS, None).unwrap();
    (disk.to_vec(), u.volume_key)
}

#[test]
fn conformance_512_and_4096() {
    for ss in [512u32, 4096] {
        eprintln!("conformance: sector size {ss}");
        let (image, vk) = template(ss);
        let make = || -> Box<dyn BlockDevice> {
            let disk = Arc::new(MemDisk::from_bytes(&image));
            let l = Luks2::load(disk).unwrap();
            Box::new(l.activate(&vk).unwrap())
        };
        let g = make().geometry();
        assert_eq!(g.logical_block_size, ss);
        assert_eq!(g.size, 6 * MIB);
        testkit::conformance::run_with(
            &make,
            &testkit::conformance::Options {
                random_ops: 1500,
                ..Default::default()
            },
        );
    }
}

/// Writes random data through cairn, then checks the raw ciphertext against an
/// independent encryption of the same data (IV = offset / 512) and reads it back after a
/// fresh open with the passphrase.
#[test]
fn round_trips_match_the_ciphertext_model() {
    let seed = testkit::test_seed("round trip");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    for (key_size, ss, pbkdf) in [
        (512u32, 512u32, fast()),
        (512, 4096, fast()),
        (256, 512, PbkdfOptions::argon2id(1, 256, 1)),
        (256, 4096, PbkdfOptions::argon2id(2, 128, 2)),
    ] {
        let disk = mem(2 * MIB + 2 * MIB);
        let mut o = opts(key_size, ss);
        o.pbkdf = pbkdf;
        let l = Luks2::format(disk.clone(), &o, PASS).unwrap();
        let dev = Luks2::open(disk.clone(), PASS, None).unwrap();
        assert_eq!(dev.geometry().size, 2 * MIB);
        let mut model = vec![0u8; us(2 * MIB)];
        dev.read_at(&mut model, 0).unwrap();
        for _ in 0..40 {
            let blocks = 2 * MIB / u64::from(ss);
            let start = rng.gen_range(0..blocks);
            let n = rng.gen_range(1..=(blocks - start).min(64));
            let data = testkit::random_bytes(&mut rng, us(n * u64::from(ss)));
            let off = start * u64::from(ss);
            dev.write_at(&data, off, WriteFlags::NONE).unwrap();
            model[us(off)..us(off) + data.len()].copy_from_slice(&data);
        }
        dev.flush().unwrap();
        drop(dev);
        let vk = l.unlock(PASS, None).unwrap().volume_key;
        assert_eq!(vk.len() * 8, key_size as usize);
        let mut expect = model.clone();
        SectorCipher::new("aes-xts-plain64", vk.as_bytes())
            .unwrap()
            .encrypt(&mut expect, ss as usize, 0);
        let raw = disk.to_vec();
        if let Some(d) = testkit::first_difference(&raw[us(2 * MIB)..], &expect, 0) {
            panic!("key {key_size} sector {ss}: ciphertext on disk differs from the model: {d}");
        }
        let dev = Luks2::open(disk.clone(), PASS, Some(0)).unwrap();
        let mut back = vec![0u8; model.len()];
        dev.read_at(&mut back, 0).unwrap();
        assert!(
            back == model,
            "key {key_size} sector {ss}: read back differs"
        );
    }
}

#[test]
fn defaults_and_alignment() {
    // cryptsetup's layout: 16 KiB header, data at 16 MiB, keyslots fill the gap.
    let disk = mem(20 * MIB);
    let l = Luks2::format(
        disk.clone(),
        &FormatOptions {
            pbkdf: fast(),
            sector_size: Some(512),
            ..Default::default()
        },
        PASS,
    )
    .unwrap();
    assert_eq!(l.data_offset(), Some(16 * MIB));
    assert_eq!(l.metadata().config.keyslots_size.0, 16 * MIB - 32 * KIB);
    assert_eq!(l.metadata().keyslots.0[&0].area.size.0, 258048);
    assert_eq!(l.metadata().keyslots.0[&0].area.offset.0, 32768);
    assert_eq!(l.binary().hdr_size, 16384);
    // Default sector size follows the device's physical block (MemDisk: 4096).
    let disk = mem(20 * MIB);
    let l = Luks2::format(
        disk.clone(),
        &FormatOptions {
            pbkdf: fast(),
            ..Default::default()
        },
        PASS,
    )
    .unwrap();
    assert_eq!(l.metadata().segments.0[&0].sector_size, Some(4096));

    // A RAID stripe of 3 x 64 KiB: the data offset is a multiple of 1 MiB and 192 KiB,
    // and the layer passes the stripe up as its optimal I/O size.
    let g = Geometry {
        size: 40 * MIB,
        logical_block_size: 512,
        physical_block_size: 64 * 1024,
        optimal_io_size: 192 * 1024,
        max_io_size: 1 << 20,
    };
    let disk = Arc::new(MemDisk::with_geometry(g));
    let l = Luks2::format(
        disk.clone(),
        &FormatOptions {
            pbkdf: fast(),
            sector_size: Some(4096),
            ..Default::default()
        },
        PASS,
    )
    .unwrap();
    let off = l.data_offset().unwrap();
    assert_eq!(off, 18 * MIB, "16 MiB rounded up to a multiple of 3 MiB");
    let dev = l
        .activate(&l.unlock(PASS, None).unwrap().volume_key)
        .unwrap();
    let cg = dev.geometry();
    assert_eq!(cg.logical_block_size, 4096);
    assert_eq!(cg.optimal_io_size, 192 * 1024);
    assert_eq!(cg.physical_block_size, 64 * 1024);
    assert_eq!(cg.size, 40 * MIB - off);

    // A larger header and a device too small for it.
    let disk = mem(8 * MIB);
    let mut o = opts(512, 512);
    o.metadata_size = 64 * KIB;
    o.data_offset = None;
    let e = Luks2::format(disk, &o, PASS).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    let disk = mem(24 * MIB);
    let l = Luks2::format(disk, &o, PASS).unwrap();
    assert_eq!(l.binary().hdr_size, 64 * KIB);
    assert_eq!(l.metadata().config.json_size.0, 64 * KIB - 4096);
}

#[test]
fn wrong_passphrase_is_auth_failed() {
    let disk = mem(4 * MIB);
    Luks2::format(disk.clone(), &opts(512, 512), PASS).unwrap();
    let e = Luks2::open(disk.clone(), b"wrong", None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AuthFailed);
    assert!(e.to_string().contains(NO_KEY), "{e}");
    assert!(
        !e.to_string().contains("wrong"),
        "the passphrase leaked into {e}"
    );
    let e = Luks2::open(disk.clone(), PASS, Some(5)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // Not LUKS at all.
    let e = Luks2::load(mem(4 * MIB)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    let e = cairn_luks::open_any(mem(4 * MIB), PASS).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
}

fn flip(disk: &MemDisk, off: u64) {
    let mut b = [0u8; 512];
    let at = off - off % 512;
    disk.read_at(&mut b, at).unwrap();
    b[us(off - at)] ^= 0x20;
    disk.write_at(&b, at, WriteFlags::NONE).unwrap();
}

#[test]
fn header_corruption_is_recovered_from_the_other_copy() {
    for (bad, good) in [
        (Which::Primary, Which::Secondary),
        (Which::Secondary, Which::Primary),
    ] {
        let disk = mem(4 * MIB);
        Luks2::format(disk.clone(), &opts(512, 512), PASS).unwrap();
        let base = if bad == Which::Primary { 0 } else { 16 * KIB };
        // A byte in the JSON area: the checksum no longer matches.
        flip(&disk, base + 4096 + 10);
        let mut l = Luks2::load(disk.clone()).unwrap();
        assert_eq!(l.copies().0, good);
        assert_eq!(l.warnings().len(), 1, "{:?}", l.warnings());
        assert!(
            l.warnings()[0].contains(&format!("{bad} LUKS2 header")),
            "{:?}",
            l.warnings()
        );
        // Data still opens, and nothing was written by loading or opening.
        let before = disk.to_vec();
        Luks2::open(disk.clone(), PASS, None).unwrap();
        assert!(before == disk.to_vec(), "loading wrote to the device");
        // Repair rewrites both copies.
        assert!(l.repair().unwrap());
        let l = Luks2::load(disk.clone()).unwrap();
        assert!(l.warnings().is_empty(), "{:?}", l.warnings());
        assert!(l.copies().1.is_valid() && l.copies().2.is_valid());
        Luks2::open(disk.clone(), PASS, None).unwrap();
    }
    // Both copies bad: a clear error.
    let disk = mem(4 * MIB);
    Luks2::format(disk.clone(), &opts(512, 512), PASS).unwrap();
    flip(&disk, 4096 + 10);
    flip(&disk, 16 * KIB + 4096 + 10);
    let e = Luks2::open(disk.clone(), PASS, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(
        e.to_string().contains("primary header") && e.to_string().contains("secondary header"),
        "{e}"
    );

    // The binary header destroyed by another format's label: readable from the
    // secondary, but no automatic repair over the foreign signature.
    let disk = mem(4 * MIB);
    Luks2::format(disk.clone(), &opts(512, 512), PASS).unwrap();
    let mut sector = [0u8; 512];
    sector[..8].copy_from_slice(b"LABELONE");
    disk.write_at(&[0u8; 512], 0, WriteFlags::NONE).unwrap();
    disk.write_at(&sector, 512, WriteFlags::NONE).unwrap();
    let mut l = Luks2::load(disk.clone()).unwrap();
    assert_eq!(l.copies().0, Which::Secondary);
    let e = l.repair().unwrap_err();
    assert!(e.to_string().contains("ambiguous signatures"), "{e}");
    let e = l
        .add_key(
            PASS,
            b"x",
            &KeyslotOptions {
                pbkdf: fast(),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("ambiguous signatures"), "{e}");
}

#[test]
fn keyslot_management() {
    let disk = mem(4 * MIB);
    let mut l = Luks2::format(disk.clone(), &opts(512, 4096), PASS).unwrap();
    let ko = KeyslotOptions {
        pbkdf: fast(),
        ..Default::default()
    };
    let seq0 = l.binary().seqid;
    let s1 = l.add_key(PASS, b"second", &ko).unwrap();
    assert_eq!(s1, 1);
    assert_eq!(l.binary().seqid, seq0 + 1);
    let s5 = l
        .add_key(
            b"second",
            b"fifth",
            &KeyslotOptions {
                keyslot: Some(5),
                pbkdf: PbkdfOptions::argon2id(1, 64, 1),
                priority: Some(2),
            },
        )
        .unwrap();
    assert_eq!(s5, 5);
    let e = l
        .add_key(
            PASS,
            b"x",
            &KeyslotOptions {
                keyslot: Some(5),
                ..ko.clone()
            },
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = l.add_key(b"nope", b"x", &ko).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AuthFailed);
    // Every passphrase opens its own slot; areas do not overlap (validated on load).
    let l2 = Luks2::load(disk.clone()).unwrap();
    assert_eq!(l2.keyslots(), vec![0, 1, 5]);
    assert_eq!(l2.test_passphrase(PASS, None).unwrap(), 0);
    assert_eq!(l2.test_passphrase(b"second", None).unwrap(), 1);
    assert_eq!(l2.test_passphrase(b"fifth", Some(5)).unwrap(), 5);
    assert_eq!(
        l2.test_passphrase(b"second", Some(0)).unwrap_err().kind(),
        ErrorKind::AuthFailed
    );
    // Data written before survives all of it.
    let dev = Luks2::open(disk.clone(), b"fifth", None).unwrap();
    let data = vec![0x5au8; 8192];
    dev.write_at(&data, 4096, WriteFlags::FUA).unwrap();

    // Change: same id, old passphrase gone, new one works, old area wiped.
    let old_area = l.metadata().keyslots.0[&1].area.clone();
    assert_eq!(l.change_key(b"second", b"changed", &ko).unwrap(), 1);
    assert_eq!(l.test_passphrase(b"changed", None).unwrap(), 1);
    assert_eq!(
        l.test_passphrase(b"second", None).unwrap_err().kind(),
        ErrorKind::AuthFailed
    );
    assert_ne!(l.metadata().keyslots.0[&1].area.offset, old_area.offset);
    // Remove and kill.
    assert_eq!(l.remove_key(b"changed").unwrap(), 1);
    assert!(Luks2::load(disk.clone())
        .unwrap()
        .test_passphrase(b"changed", None)
        .is_err());
    l.kill_slot(5).unwrap();
    assert_eq!(l.keyslots(), vec![0]);
    assert_eq!(l.kill_slot(5).unwrap_err().kind(), ErrorKind::NotFound);
    let dev = Luks2::open(disk.clone(), PASS, None).unwrap();
    let mut back = vec![0u8; 8192];
    dev.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, data);
    // Fill all 32 keyslots? The 2 MiB layout has room for only a few 512-bit slots.
    let mut n = 1;
    loop {
        match l.add_key(PASS, format!("p{n}").as_bytes(), &ko) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
                break;
            }
        }
    }
    assert_eq!(n as u64, (2 * MIB - 32 * KIB) / 258048);
}

/// Every crash state of add_key and change_key opens with the passphrases of the old or
/// of the new header, never neither.
#[test]
fn metadata_updates_are_crash_safe() {
    let seed = testkit::test_seed("luks crash");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let base = mem(3 * MIB);
    Luks2::format(base.clone(), &opts(256, 512), PASS).unwrap();
    let image = base.to_vec();
    let ko = KeyslotOptions {
        pbkdf: fast(),
        ..Default::default()
    };
    for op in ["add", "change", "remove"] {
        let log = Arc::new(LogWritesDisk::new(MemDisk::from_bytes(&image)).unwrap());
        let mut l = Luks2::load(log.clone()).unwrap();
        if op == "remove" {
            // Start from two keyslots; the recorded operation removes the first.
            l.add_key(PASS, b"new", &ko).unwrap();
        }
        let start = log.log_len();
        match op {
            "add" => drop(l.add_key(PASS, b"new", &ko).unwrap()),
            "change" => drop(l.change_key(PASS, b"new", &ko).unwrap()),
            _ => drop(l.remove_key(PASS).unwrap()),
        }
        let wl = log.log();
        let end = wl.len();
        for n in start..=end {
            for _ in 0..3 {
                let img = wl.crash_image(&mut rng, CrashPoint::AfterEntries(n));
                let disk = Arc::new(MemDisk::from_bytes(&img));
                let l = Luks2::load(disk.clone())
                    .unwrap_or_else(|e| panic!("{op}: crash after {n}/{end} entries: {e}"));
                let old = l.test_passphrase(PASS, None).is_ok();
                let new = l.test_passphrase(b"new", None).is_ok();
                match op {
                    "add" => assert!(old, "{op}: crash after {n}: old passphrase lost"),
                    "change" => assert!(old || new, "{op}: crash after {n}: no passphrase opens"),
                    _ => assert!(new, "{op}: crash after {n}: the other keyslot was lost"),
                }
                if n == end {
                    assert_eq!(new, op != "remove" || new);
                    assert_eq!(old, op == "add", "{op}: final state");
                }
            }
        }
    }
}

#[test]
fn header_backup_and_restore() {
    let dir = common::TempDir::new("backup");
    let disk = mem(4 * MIB);
    let mut l = Luks2::format(disk.clone(), &opts(512, 512), PASS).unwrap();
    let dev = Luks2::open(disk.clone(), PASS, None).unwrap();
    let data = vec![0xa5u8; 4096];
    dev.write_at(&data, 0, WriteFlags::NONE).unwrap();
    let bak = dir.path("hdr.img");
    l.header_backup(&bak).unwrap();
    assert_eq!(std::fs::metadata(&bak).unwrap().len(), 2 * MIB);
    assert!(
        l.header_backup(&bak).is_err(),
        "must not overwrite a backup"
    );
    // The backup is itself a valid LUKS2 image.
    let b = Luks2::load(common::mem_copy(&bak)).unwrap();
    assert!(b.warnings().is_empty());
    assert_eq!(b.test_passphrase(PASS, None).unwrap(), 0);
    // Destroy the header and keyslots, then restore.
    l.add_key(
        PASS,
        b"later",
        &KeyslotOptions {
            pbkdf: fast(),
            ..Default::default()
        },
    )
    .unwrap();
    disk.write_at(&vec![0u8; us(2 * MIB)], 0, WriteFlags::NONE)
        .unwrap();
    assert!(Luks2::load(disk.clone()).is_err());
    let r = Luks2::header_restore(disk.clone(), &bak, false).unwrap();
    assert_eq!(r.keyslots(), vec![0]);
    let dev = Luks2::open(disk.clone(), PASS, None).unwrap();
    let mut back = vec![0u8; 4096];
    dev.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data);
    // Restoring onto another volume needs force.
    let other = mem(4 * MIB);
    Luks2::format(other.clone(), &opts(512, 512), b"other").unwrap();
    let e = Luks2::header_restore(other.clone(), &bak, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    Luks2::header_restore(other.clone(), &bak, true).unwrap();
    assert_eq!(
        Luks2::load(other)
            .unwrap()
            .test_passphrase(PASS, None)
            .unwrap(),
        0
    );
}

#[test]
fn no_key_material_in_debug_or_dumps() {
    let disk = mem(4 * MIB);
    let pass = b"S3cret-passphrase-xyz";
    let l = Luks2::format(disk.clone(), &opts(512, 512), pass).unwrap();
    let u = l.unlock(pass, None).unwrap();
    let vk_hex = common::to_hex(u.volume_key.as_bytes());
    let dev = l.activate(&u.volume_key).unwrap();
    let texts = [
        format!("{l:?}"),
        format!("{u:?}"),
        format!("{dev:?}"),
        l.dump().to_string(),
        serde_json::to_string(&l.dump()).unwrap(),
        format!("{:?}", l.dump()),
    ];
    for t in &texts {
        assert!(!t.contains(&vk_hex), "volume key in {t}");
        assert!(!t.contains(&vk_hex[..16]), "volume key prefix in {t}");
        assert!(!t.contains("S3cret"), "passphrase in {t}");
    }
    let dump = l.dump().to_string();
    for want in [
        "Version:       \t2",
        "aes-xts-plain64",
        "sector: 512 [bytes]",
        "PBKDF:      pbkdf2",
        "Key:        512 bits",
    ] {
        assert!(dump.contains(want), "dump lacks {want:?}:\n{dump}");
    }
}

/// The benchmarked defaults (cryptsetup's `--iter-time`): costs within bounds, and a
/// keyslot made with them unlocks.
#[test]
fn benchmarked_kdf_costs() {
    use cairn_luks::keyslot::KdfParams;
    use cairn_luks::PbkdfKind;
    use std::time::Duration;
    let argon = PbkdfOptions {
        kind: PbkdfKind::Argon2id,
        memory_kib: Some(8192),
        parallel: Some(2),
        time: Duration::from_millis(200),
        ..Default::default()
    };
    match argon.resolve(64).unwrap() {
        KdfParams::Argon2 {
            time,
            memory_kib,
            parallel,
            ..
        } => {
            assert!(time >= 4, "at least 4 passes, got {time}");
            assert!((16..=8192).contains(&memory_kib), "memory {memory_kib}");
            assert_eq!(parallel, 2);
        }
        p => panic!("{p:?}"),
    }
    let pb = PbkdfOptions {
        kind: PbkdfKind::Pbkdf2,
        time: Duration::from_millis(50),
        ..Default::default()
    };
    match pb.resolve(64).unwrap() {
        KdfParams::Pbkdf2 { iterations, .. } => assert!(iterations >= 1000),
        p => panic!("{p:?}"),
    }
    assert!(PbkdfOptions::pbkdf2(999).resolve(64).is_err());
    let disk = mem(4 * MIB);
    let mut o = opts(256, 512);
    o.pbkdf = argon;
    o.pbkdf.time = Duration::from_millis(50);
    let l = Luks2::format(disk, &o, PASS).unwrap();
    let kdf = l.metadata().keyslots.0[&0].kdf.clone().unwrap();
    assert_eq!(kdf.kind, "argon2id");
    assert_eq!(l.test_passphrase(PASS, None).unwrap(), 0);
}
