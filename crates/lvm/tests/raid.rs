//! RAID LVs over MemDisks: lvm's allocation (an image and its metadata LV per PV), the
//! data where md's layout puts it, the dm-raid superblock in each metadata LV, reads
//! with a PV missing, refusals, and the metadata text lvm reads back.

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_lvm::meta::SegKind;
use cairn_lvm::raid::DmRaidSuper;
use cairn_lvm::{OpenOptions, PvDevice, RaidCreate, Vg, VolumeGroup};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn rc(
    name: &str,
    segtype: &str,
    extents: u64,
    mirrors: Option<u32>,
    stripes: Option<u32>,
) -> RaidCreate {
    RaidCreate {
        name: name.into(),
        extents,
        segtype: segtype.into(),
        mirrors,
        stripes,
        ..Default::default()
    }
}

fn fill(lv: &dyn BlockDevice, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let size = usize::try_from(lv.geometry().size).unwrap();
    let mut data = vec![0u8; size];
    rng.fill(&mut data[..]);
    // Several request sizes, not all stripe-aligned.
    let mut off = 0usize;
    while off < size {
        let n = [4096usize, 65536, 12288, 1 << 20][off / 4096 % 4].min(size - off);
        lv.write_at(&data[off..off + n], off as u64, WriteFlags::NONE)
            .unwrap();
        off += n;
    }
    lv.flush().unwrap();
    data
}

fn check(lv: &dyn BlockDevice, data: &[u8]) {
    let mut got = vec![0u8; data.len()];
    for (i, chunk) in got.chunks_mut(1 << 20).enumerate() {
        lv.read_at(chunk, (i << 20) as u64).unwrap();
    }
    assert!(got == data, "data differs");
}

/// One test body over the RAID types cairn creates: write, reopen, read; drop each PV
/// in turn that the level tolerates and read again.
#[test]
fn raid_lvs_read_back_whole_and_degraded() {
    type Shape = (&'static str, Option<u32>, Option<u32>, usize, usize);
    let shapes: &[Shape] = &[
        // segtype, -m, -i, PVs, PVs that may go missing at once
        ("raid1", Some(1), None, 2, 1),
        ("raid1", Some(2), None, 3, 2),
        ("raid10", Some(1), Some(2), 4, 1),
        ("raid5", None, Some(2), 3, 1),
        ("raid6", None, Some(3), 5, 2),
        ("raid0", None, Some(3), 3, 0),
    ];
    for (i, &(t, m, s, npv, tolerate)) in shapes.iter().enumerate() {
        let (disks, pvs) = mem_pvs(npv, 64 * MIB);
        let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
        let c = vg.lv_create_raid(&rc("r", t, 5, m, s)).unwrap();
        let lv = vg.lv("r").unwrap();
        assert_eq!(lv.geometry().size, c.extents * 4 * MIB, "{t}");
        let data = fill(&*lv, i as u64);
        check(&*lv, &data);
        drop(lv);
        drop(vg);
        let vg = Vg::open(pvs.clone()).unwrap();
        check(&*vg.lv("r").unwrap(), &data);
        let meta = vg.metadata();
        let SegKind::Raid(r) = &meta.lv("r").unwrap().segments[0].kind else {
            panic!("{t}: not a RAID segment")
        };
        assert!(r.segtype.starts_with(t), "{t}: {}", r.segtype);
        // Each metadata LV holds dm-raid's superblock at its start, with its position.
        for (pos, m) in r.metas.iter().enumerate() {
            let Some(m) = m else { continue };
            let seg = &meta.lv(m).unwrap().segments[0];
            let a = &seg.areas()[0];
            let pv = meta.pvs.iter().position(|p| p.key == a.pv).unwrap();
            let mut b = vec![0u8; 512];
            let at = meta.pvs[pv].pe_start * 512 + a.pe * 4 * MIB;
            disks[pv].read_at(&mut b, at).unwrap();
            let sb = DmRaidSuper::parse(&b).unwrap_or_else(|| panic!("{t}: no superblock in {m}"));
            assert_eq!(sb.array_position as usize, pos);
            assert_eq!(sb.num_devices as usize, r.images.len());
            assert_eq!(
                sb.array_resync_offset,
                u64::MAX,
                "{t}: in sync after create"
            );
            // md's bitmap header follows at 4096, one bit per 2 MiB region.
            let mut bm = vec![0u8; 512];
            disks[pv].read_at(&mut bm, at + 4096).unwrap();
            assert_eq!(&bm[..4], b"bitm", "{t}: no bitmap in {m}");
            assert_eq!(u32::from_le_bytes(bm[52..56].try_into().unwrap()), 2 << 20);
        }
        // With PVs missing (as many as the level tolerates), the data is intact.
        for gone in 0..npv {
            if tolerate == 0 {
                break;
            }
            let left: Vec<PvDevice> = pvs
                .iter()
                .enumerate()
                .filter(|(j, _)| (*j + npv - gone) % npv >= tolerate)
                .map(|(_, p)| p.clone())
                .collect();
            let vg = Vg::open_with(
                left,
                OpenOptions {
                    partial: true,
                    read_only: true,
                },
            )
            .unwrap();
            check(&*vg.lv("r").unwrap(), &data);
        }
        // Degraded writes (lvm's activation_mode "degraded"): the data read back after
        // reopening degraded, and, whole again, from every image.
        if tolerate > 0 {
            let vg = Vg::open_with(
                pvs[1..].to_vec(),
                OpenOptions {
                    partial: true,
                    read_only: false,
                },
            )
            .unwrap();
            let lv = vg.lv("r").unwrap();
            assert!(!lv.capabilities().read_only, "{t}");
            let data = fill(&*lv, 100 + i as u64);
            drop(lv);
            drop(vg);
            let vg = Vg::open_with(
                pvs[1..].to_vec(),
                OpenOptions {
                    partial: true,
                    read_only: true,
                },
            )
            .unwrap();
            check(&*vg.lv("r").unwrap(), &data);
            // The PV comes back: its image is stale, recorded as failed by the others,
            // and not read from.
            let vg = Vg::open(pvs.clone()).unwrap();
            check(&*vg.lv("r").unwrap(), &data);
        }
        if tolerate > 0 {
            // One more missing than tolerated: a clear refusal.
            let left: Vec<PvDevice> = pvs[tolerate + 1..].to_vec();
            if !left.is_empty() {
                let vg = Vg::open_with(
                    left,
                    OpenOptions {
                        partial: true,
                        read_only: false,
                    },
                )
                .unwrap();
                let e = vg.lv("r").unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Degraded, "{t}: {e}");
            }
        }
    }
}

/// raid1 images are whole copies; raid10 near copies pair up image 0/1 and 2/3.
#[test]
fn data_lands_where_md_puts_it() {
    let (disks, pvs) = mem_pvs(4, 64 * MIB);
    let mut vg = Vg::create("vgr", pvs, 4 * MIB).unwrap();
    vg.lv_create_raid(&rc("m", "raid1", 2, Some(1), None))
        .unwrap();
    vg.lv_create_raid(&RaidCreate {
        stripe_size: Some(64 << 10),
        ..rc("t", "raid10", 4, Some(1), Some(2))
    })
    .unwrap();
    let es = 4 * MIB;
    let meta = vg.metadata().clone();
    let at = |lv: &str| {
        let a = &meta.lv(lv).unwrap().segments[0].areas()[0];
        let pv = meta.pvs.iter().position(|p| p.key == a.pv).unwrap();
        (pv, meta.pvs[pv].pe_start * 512 + a.pe * es)
    };
    let m = vg.lv("m").unwrap();
    let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    m.write_at(&block, 8192, WriteFlags::NONE).unwrap();
    for img in ["m_rimage_0", "m_rimage_1"] {
        let (pv, off) = at(img);
        let mut b = vec![0u8; 4096];
        disks[pv].read_at(&mut b, off + 8192).unwrap();
        assert_eq!(b, block, "{img}");
    }
    // raid10 near 2 over 4 images: array chunk c lives on images 2c%4 and 2c%4+1, row
    // 2c/4. Chunk 3 (bytes 192 KiB..256 KiB) is on images 2 and 3, row 1.
    let t = vg.lv("t").unwrap();
    assert_eq!(t.geometry().optimal_io_size, 128 << 10);
    t.write_at(&block, 3 * (64 << 10), WriteFlags::NONE)
        .unwrap();
    for img in ["t_rimage_2", "t_rimage_3"] {
        let (pv, off) = at(img);
        let mut b = vec![0u8; 4096];
        disks[pv].read_at(&mut b, off + (64 << 10)).unwrap();
        assert_eq!(b, block, "{img}");
    }
    // The text carries lvm's keys and the sub-LVs, and parses back the same.
    let text = meta.to_text();
    for want in [
        "type = \"raid10\"",
        "device_count = 4",
        "data_copies = 2",
        "region_size = 4096",
        "stripe_size = 128",
        "\"t_rmeta_0\", \"t_rimage_0\"",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    let again = VolumeGroup::from_text(text.as_bytes()).unwrap();
    assert_eq!(again.lvs.len(), meta.lvs.len());
    assert!(again.lvs.iter().all(|l| l.unsupported.is_none()));
    assert_eq!(vg.exportable_lvs(), vec!["m".to_string(), "t".to_string()]);
}

#[test]
fn refusals_are_clear_and_change_nothing() {
    let (_d, pvs) = mem_pvs(3, 64 * MIB);
    let mut vg = Vg::create("vgr", pvs, 4 * MIB).unwrap();
    let seq = vg.metadata().seqno;
    // Four images need four PVs.
    let e = vg
        .lv_create_raid(&rc("x", "raid10", 4, Some(1), Some(2)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace);
    assert!(e.to_string().contains("4 different PVs"), "{e}");
    // Too big for any PV.
    let e = vg
        .lv_create_raid(&rc("x", "raid1", 100, Some(1), None))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace);
    assert!(vg
        .lv_create_raid(&rc("x", "mirror", 1, None, None))
        .is_err());
    assert_eq!(vg.metadata().seqno, seq);
    vg.lv_create_raid(&rc("r", "raid1", 2, Some(1), None))
        .unwrap();
    // Sub-LVs are not served or changed alone; RAID LVs are not resized yet.
    assert!(vg.lv("r_rimage_0").is_err());
    assert_eq!(
        vg.lv_remove("r_rmeta_1").unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    assert_eq!(
        vg.lv_extend("r", 1).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    // Removing the LV frees its sub-LVs.
    let free = vg.report().free_count;
    vg.lv_remove("r").unwrap();
    assert!(vg.metadata().lvs.is_empty());
    assert_eq!(vg.report().free_count, free + 6);
    let _ = Arc::new(MemDisk::new(1));
}

fn partial(pvs: Vec<PvDevice>, read_only: bool) -> Vg {
    Vg::open_with(
        pvs,
        OpenOptions {
            partial: true,
            read_only,
        },
    )
    .unwrap()
}

/// `lvconvert --repair` in place: an image that missed writes (its PV was away) is
/// rebuilt from the others and then serves alone.
#[test]
fn repair_rebuilds_a_stale_image_in_place() {
    for (t, s) in [("raid1", None), ("raid5", Some(2)), ("raid10", Some(2))] {
        let npv = if t == "raid1" {
            2
        } else if t == "raid5" {
            3
        } else {
            4
        };
        let (_d, pvs) = mem_pvs(npv, 64 * MIB);
        let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
        vg.lv_create_raid(&rc("r", t, 4, if t == "raid5" { None } else { Some(1) }, s))
            .unwrap();
        fill(&*vg.lv("r").unwrap(), 1);
        drop(vg);
        // pv0 away while the data changes: its image is stale and recorded failed.
        let vg = partial(pvs[1..].to_vec(), false);
        let data = fill(&*vg.lv("r").unwrap(), 2);
        drop(vg);
        let mut vg = Vg::open(pvs.clone()).unwrap();
        let p = vg.report().lvs[0].sync_percent.clone();
        assert_eq!(p.as_deref(), Some("100.00"), "{t}");
        let mut seen = 0;
        let rep = vg.lv_repair("r", None, &mut |d, _| seen = d).unwrap();
        assert_eq!(rep.rebuilt, vec!["r_rimage_0".to_string()], "{t}");
        assert!(rep.moved.is_empty());
        assert_eq!(seen, data.len() as u64);
        let lv = vg.lv("r").unwrap();
        assert!(
            lv.array().unwrap().down_roles().is_empty(),
            "{t}: still degraded"
        );
        check(&*lv, &data);
        drop(lv);
        drop(vg);
        // Now pv1 goes away: the rebuilt image 0 serves its share.
        let vg = partial([&pvs[..1], &pvs[2..]].concat(), true);
        check(&*vg.lv("r").unwrap(), &data);
    }
}

/// `lvconvert --repair` with a PV gone for good, and `--replace PV`: the image moves to
/// a free PV and is rebuilt there; refused clearly when no PV can take it.
#[test]
fn repair_and_replace_move_images() {
    let (_d, pvs) = mem_pvs(3, 64 * MIB);
    let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
    vg.lv_create_raid(&rc("r", "raid1", 4, Some(1), None))
        .unwrap();
    let data = fill(&*vg.lv("r").unwrap(), 3);
    let rep = vg.lv_repair("r", Some("pv0.img"), &mut |_, _| {}).unwrap();
    assert_eq!(
        rep.moved,
        vec![("r_rimage_0".into(), "pv0".into(), "pv2".into())]
    );
    assert_eq!(rep.rebuilt, vec!["r_rimage_0".to_string()]);
    check(&*vg.lv("r").unwrap(), &data);
    drop(vg);
    // pv0 holds nothing now: the LV reads whole without it.
    let vg = partial(pvs[1..].to_vec(), true);
    assert!(vg.lv("r").unwrap().array().unwrap().down_roles().is_empty());
    check(&*vg.lv("r").unwrap(), &data);
    drop(vg);
    // pv1 lost for good: --repair moves its image to the PV with room (pv0).
    let mut vg = partial(vec![pvs[0].clone(), pvs[2].clone()], false);
    let rep = vg.lv_repair("r", None, &mut |_, _| {}).unwrap();
    assert_eq!(
        rep.moved,
        vec![("r_rimage_1".into(), "missing".into(), "pv0".into())]
    );
    check(&*vg.lv("r").unwrap(), &data);
    assert!(vg.metadata().pvs[1].flags.contains(&"MISSING".to_string()));
    // No third PV for another move: a clear refusal.
    let e = vg
        .lv_repair("r", Some("pv2.img"), &mut |_, _| {})
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("needs another PV"), "{e}");
    drop(vg);
    let vg = partial(vec![pvs[0].clone(), pvs[2].clone()], true);
    let lv = vg.lv("r").unwrap();
    assert!(lv.array().unwrap().down_roles().is_empty());
    check(&*lv, &data);
}

/// md's write-intent bitmap in the metadata LVs, per region (2 MiB here): a write sets
/// the bits of the regions it touches and no others; a flush clears them once idle for
/// the daemon sleep, a close at once. A writer that stopped without either (a crash)
/// leaves exactly those bits, and the next writable open resyncs those regions only.
#[test]
fn an_unclean_close_resyncs_only_the_dirty_regions() {
    let (disks, pvs) = mem_pvs(2, 64 * MIB);
    let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
    vg.lv_create_raid(&rc("r", "raid1", 8, Some(1), None))
        .unwrap();
    let meta = vg.metadata().clone();
    let at = |lv: &str| {
        let a = &meta.lv(lv).unwrap().segments[0].areas()[0];
        let pv = meta.pvs.iter().position(|p| p.key == a.pv).unwrap();
        (pv, meta.pvs[pv].pe_start * 512 + a.pe * 4 * MIB)
    };
    // The first two bytes of bits (16 regions of 2 MiB), after the 256-byte header.
    let bits = |m: &str| {
        let (pv, off) = at(m);
        let mut h = vec![0u8; 512];
        disks[pv].read_at(&mut h, off + 4096).unwrap();
        u16::from_le_bytes([h[256], h[257]])
    };
    let region = 2 * MIB;
    let lv = vg.lv("r").unwrap();
    assert_eq!(bits("r_rmeta_0"), 0, "clean until written");
    lv.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    lv.write_at(&[1u8; 8192], 5 * region - 4096, WriteFlags::NONE)
        .unwrap();
    // Regions 0, 4 and 5, on both metadata LVs, before any flush.
    assert_eq!(bits("r_rmeta_0"), 0b11_0001, "only the touched regions");
    assert_eq!(bits("r_rmeta_1"), 0b11_0001);
    lv.flush().unwrap();
    assert_eq!(bits("r_rmeta_0"), 0b11_0001, "kept for the daemon sleep");
    lv.array()
        .unwrap()
        .set_bitmap_daemon_sleep(std::time::Duration::ZERO);
    lv.flush().unwrap();
    assert_eq!(bits("r_rmeta_0"), 0, "clean after a flush once idle");
    let data = fill(&*lv, 7);
    drop(lv);
    assert_eq!(bits("r_rmeta_0"), 0, "clean after close");
    // A "crash": writes in regions 1 and 6, never flushed or closed; meanwhile the
    // copies differ behind the LV's back in region 1 (dirty) and region 3 (clean).
    let lv = vg.lv("r").unwrap();
    lv.write_at(&data[..4096], region, WriteFlags::NONE)
        .unwrap();
    lv.write_at(&data[..4096], 6 * region + 8192, WriteFlags::NONE)
        .unwrap();
    std::mem::forget(lv);
    let (pv1, img1) = at("r_rimage_1");
    for r in [1, 3] {
        disks[pv1]
            .write_at(&[0x5a; 4096], img1 + r * region + 8192, WriteFlags::NONE)
            .unwrap();
    }
    assert_eq!(bits("r_rmeta_1"), 0b100_0010);
    drop(vg);
    let vg = Vg::open(pvs.clone()).unwrap();
    let lv = vg.lv("r").unwrap();
    // Two regions resynced (md counts member bytes for raid1), not the LV's 32 MiB.
    assert_eq!(lv.array().unwrap().resynced_bytes(), 2 * region);
    drop(lv);
    // Region 1 resynced from the first copy; region 3 not looked at.
    let mut b = vec![0u8; 4096];
    disks[pv1].read_at(&mut b, img1 + region + 8192).unwrap();
    let want = usize::try_from(region + 8192).unwrap();
    assert_eq!(&b[..], &data[want..want + 4096]);
    disks[pv1]
        .read_at(&mut b, img1 + 3 * region + 8192)
        .unwrap();
    assert_eq!(&b[..], &[0x5a; 4096][..]);
    assert_eq!(bits("r_rmeta_0"), 0, "clean after the resync and a close");
}

/// Broken RAID metadata makes the LV unavailable with the reason, never misread.
#[test]
fn broken_raid_metadata_is_named() {
    let (_d, pvs) = mem_pvs(2, 64 * MIB);
    let mut vg = Vg::create("vgr", pvs, 4 * MIB).unwrap();
    vg.lv_create_raid(&rc("r", "raid1", 2, Some(1), None))
        .unwrap();
    let text = vg.metadata().to_text();
    for (from, to, why) in [
        (
            "\"r_rmeta_1\", \"r_rimage_1\"",
            "\"r_rmeta_1\", \"r_rimage_9\"",
            "r_rimage_9 does not exist",
        ),
        (
            "region_size = 4096",
            "region_size = 3000",
            "invalid region_size",
        ),
        ("device_count = 2", "device_count = 3", "counts 3 devices"),
    ] {
        assert!(text.contains(from), "{from}");
        let t = text.replace(from, to);
        let vg = VolumeGroup::from_text(t.as_bytes()).unwrap();
        let u = vg.lv("r").unwrap().unsupported.clone().unwrap_or_default();
        assert!(u.contains(why), "{why}: {u}");
    }
}

/// A served RAID LV repaired while open (`lv_repair_live`): the image on the lost PV
/// moves to a free PV and md's background work rebuilds it while writes go on; the
/// superblocks then say in sync, and the LV reads whole without the lost PV.
#[test]
fn repair_while_served_rebuilds_in_the_background() {
    for (t, images, mirrors, stripes) in [("raid1", 2, 1, None), ("raid10", 4, 1, Some(2))] {
        let (_d, pvs) = mem_pvs(images + 1, 64 * MIB);
        let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
        vg.lv_create_raid(&rc("r", t, 4, Some(mirrors), stripes))
            .unwrap();
        let mut data = fill(&*vg.lv("r").unwrap(), 11);
        drop(vg);
        // pv1 is gone; the LV is served degraded.
        let less: Vec<PvDevice> = [&pvs[..1], &pvs[2..]].concat();
        let mut vg = partial(less.clone(), false);
        let lv = vg.lv("r").unwrap();
        let array = lv.array().unwrap().clone();
        assert_eq!(array.down_roles(), vec![1], "{t}");
        // 8 MiB/s over 16 MiB (raid1) or 8 MiB (raid10): running when written to.
        array.manage(cairn_md::SpeedLimits {
            min: 8 << 20,
            max: 8 << 20,
        });
        let rep = vg.lv_repair_live("r", None, &lv).unwrap();
        assert_eq!(rep.rebuilt, vec!["r_rimage_1".to_string()], "{t}");
        assert_eq!(rep.moved.len(), 1, "{t}");
        // Writes while it rebuilds.
        let bg = array.background().unwrap();
        assert_eq!(
            (bg.action, bg.state.as_str()),
            ("recovery", "running"),
            "{t}"
        );
        for i in 0..16u64 {
            let off = i * MIB + 4096;
            let b = vec![u8::try_from(i).unwrap(); 8192];
            lv.write_at(&b, off, WriteFlags::NONE).unwrap();
            let o = usize::try_from(off).unwrap();
            data[o..o + 8192].copy_from_slice(&b);
        }
        for _ in 0..600 {
            if array.background().is_some_and(|b| b.state != "running") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let bg = array.background().unwrap();
        assert_eq!(bg.state, "finished", "{t}: {bg:?}");
        assert!(array.down_roles().is_empty(), "{t}");
        check(&*lv, &data);
        drop(lv);
        drop(array);
        drop(vg);
        // Without the lost PV, whole: every superblock says nothing failed.
        let vg = partial(less, true);
        let lv = vg.lv("r").unwrap();
        assert!(lv.array().unwrap().down_roles().is_empty(), "{t}");
        check(&*lv, &data);
        let r = vg.report();
        let l = r.lvs.iter().find(|l| l.name == "r").unwrap();
        assert_eq!(l.sync_percent.as_deref(), Some("100.00"), "{t}");
    }
}
