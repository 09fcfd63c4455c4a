//! A PV that goes away under a served LV (a remote PV whose server stopped), with
//! `FaultyDisk` PVs: a RAID LV fails only the image on that PV, whether its write or its
//! flush failed, goes on degraded, records the failure in the metadata LVs left, and
//! re-adds the image from its bitmap when the PV answers again; a linear or striped LV
//! fails only the extents on that PV.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cairn_block::testkit::{FaultyDisk, Op};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_lvm::{LvCreate, OpenOptions, PvDevice, RaidCreate, Vg};
use common::MIB;

/// `n` PVs over FaultyDisks, named `pv{i}.img`.
fn faulty_pvs(n: usize, size: u64) -> (Vec<Arc<FaultyDisk<MemDisk>>>, Vec<PvDevice>) {
    let disks: Vec<Arc<FaultyDisk<MemDisk>>> = (0..n)
        .map(|_| Arc::new(FaultyDisk::new(MemDisk::new(size))))
        .collect();
    let pvs = disks
        .iter()
        .enumerate()
        .map(|(i, d)| PvDevice::new(format!("pv{i}.img"), d.clone() as Arc<dyn BlockDevice>))
        .collect();
    (disks, pvs)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add(u8::try_from(i % 251).unwrap()))
        .collect()
}

fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    dev.read_at(&mut b, off).unwrap();
    b
}

fn wait_idle(array: &cairn_md::Array) -> cairn_md::BackgroundStatus {
    for _ in 0..600 {
        if let Some(b) = array.background().filter(|b| b.state != "running") {
            return b;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the rebuild did not end within 30 s");
}

/// One body over the ways a PV fails (its writes, its flushes, everything): the image
/// on it fails alone, the LV takes writes and flushes, the failure is recorded, and the
/// image comes back with only the regions written meanwhile copied.
#[test]
fn one_images_pv_failing_fails_that_image_only_and_it_is_readded_from_the_bitmap() {
    for how in ["write", "flush", "everything"] {
        let (disks, pvs) = faulty_pvs(2, 64 * MIB);
        let mut vg = Vg::create("vgr", pvs.clone(), 4 * MIB).unwrap();
        vg.lv_create_raid(&RaidCreate {
            name: "mir".into(),
            extents: 8,
            segtype: "raid1".into(),
            mirrors: Some(1),
            ..Default::default()
        })
        .unwrap();
        let lv = vg.lv("mir").unwrap();
        let array = lv.array().unwrap().clone();
        assert_eq!(
            array.member_names(),
            vec![
                Some("vgr/mir_rimage_0".to_string()),
                Some("vgr/mir_rimage_1".to_string())
            ],
            "{how}: the images are named as lvm names them"
        );
        let before = pattern(1, 1 << 20);
        lv.write_at(&before, 0, WriteFlags::NONE).unwrap();
        lv.flush().unwrap();

        // pv1 goes.
        let h = disks[1].handle();
        match how {
            "write" => h.fail_after(Op::Write, 0),
            "flush" => h.fail_after(Op::Flush, 0),
            _ => h.fail_always(),
        }
        let during = pattern(2, 1 << 20);
        let at = 20 * MIB;
        lv.write_at(&during, at, WriteFlags::NONE)
            .unwrap_or_else(|e| panic!("{how}: a write with one image's PV gone: {e}"));
        lv.flush()
            .unwrap_or_else(|e| panic!("{how}: a flush with one image's PV gone: {e}"));
        lv.write_at(&during, at + (1 << 20), WriteFlags::FUA)
            .unwrap_or_else(|e| panic!("{how}: a FUA write with one image's PV gone: {e}"));
        assert_eq!(array.down_roles(), vec![1], "{how}: only image 1 failed");
        let r = array.report();
        assert!(r.state.degraded && !r.state.failed, "{how}: {:?}", r.state);
        let failed = r
            .members
            .iter()
            .find(|m| m.state == cairn_md::MemberState::Faulty)
            .unwrap_or_else(|| panic!("{how}: no faulty member in {r:?}"));
        assert_eq!(failed.name.as_deref(), Some("vgr/mir_rimage_1"), "{how}");
        assert_eq!(read(&*lv, 0, 1 << 20), before, "{how}");
        assert_eq!(read(&*lv, at, 1 << 20), during, "{how}");
        assert_eq!(
            lv.raid_image_pvs(),
            vec![vec!["pv0.img".to_string()], vec!["pv1.img".to_string()]]
        );

        // The metadata LV left records the failure: opened afresh (as after a crash),
        // the stale image is not read.
        {
            let vg2 = Vg::open_with(
                vec![pvs[0].clone()],
                OpenOptions {
                    partial: true,
                    read_only: true,
                },
            )
            .unwrap();
            let sb = vg2.lv("mir").unwrap();
            assert_eq!(sb.array().unwrap().down_roles(), vec![1], "{how}");
        }

        // pv1 answers again: image 1 is re-added, only the regions written meanwhile
        // (2 MiB regions: the 2 MiB at 20 MiB) are copied.
        h.heal();
        array.manage(cairn_md::SpeedLimits {
            min: 1 << 30,
            max: 1 << 30,
        });
        let back = disks[1].clone() as Arc<dyn BlockDevice>;
        let msgs = lv.raid_pv_returned("pv1.img", &back).unwrap();
        assert_eq!(msgs.len(), 1, "{how}: {msgs:?}");
        assert!(
            msgs[0].contains("re-added") && msgs[0].contains("only the"),
            "{how}: {msgs:?}"
        );
        // Nothing waits for pv0.
        assert!(lv
            .raid_pv_returned("pv0.img", &(disks[0].clone() as Arc<dyn BlockDevice>))
            .unwrap()
            .is_empty());
        let bg = wait_idle(&array);
        assert_eq!(
            (bg.action, bg.state.as_str()),
            ("recovery", "finished"),
            "{how}"
        );
        assert!(
            bg.total_bytes <= 4 * MIB,
            "{how}: the re-add copied {} bytes of a 32 MiB LV",
            bg.total_bytes
        );
        assert!(array.down_roles().is_empty(), "{how}");
        drop(lv);
        drop(array);
        drop(vg);

        // Image 1 alone holds everything, and the superblocks say it is in sync.
        let vg = Vg::open_with(
            vec![pvs[1].clone()],
            OpenOptions {
                partial: true,
                read_only: true,
            },
        )
        .unwrap();
        let lv = vg.lv("mir").unwrap();
        assert_eq!(lv.array().unwrap().down_roles(), vec![0], "{how}");
        assert_eq!(read(&*lv, 0, 1 << 20), before, "{how}");
        assert_eq!(read(&*lv, at, 1 << 20), during, "{how}");
        assert_eq!(read(&*lv, at + (1 << 20), 1 << 20), during, "{how}");
    }
}

/// Linear (spanning two PVs) and striped LVs: with pv1 gone, I/O to extents on pv0
/// works and I/O to pv1's extents fails with an I/O error; nothing panics.
#[test]
fn a_lost_pv_fails_only_the_extents_on_it() {
    for stripes in [1u32, 2] {
        // 16 MiB PVs of 4 MiB extents: a 5-extent linear LV runs from pv0 onto pv1.
        let (disks, pvs) = faulty_pvs(2, 16 * MIB);
        let mut vg = Vg::create("vgl", pvs, 4 * MIB).unwrap();
        vg.lv_create(&LvCreate {
            name: "l".into(),
            extents: if stripes == 1 { 5 } else { 4 },
            stripes,
            stripe_size: Some(64 << 10),
        })
        .unwrap();
        let lv = vg.lv("l").unwrap();
        let size = lv.geometry().size;
        let b = pattern(3, 64 << 10);
        let mut on = [Vec::new(), Vec::new()];
        let mut off = 0;
        while off < size {
            let (pv, _) = lv.locate(off).unwrap();
            let i = usize::from(pv == "pv1.img");
            on[i].push(off);
            lv.write_at(&b, off, WriteFlags::NONE).unwrap();
            off += 64 << 10;
        }
        assert!(!on[0].is_empty() && !on[1].is_empty(), "stripes {stripes}");
        disks[1].handle().fail_always();
        for &o in &on[0] {
            assert_eq!(read(&*lv, o, 64 << 10), b, "stripes {stripes} at {o}");
            lv.write_at(&b, o, WriteFlags::NONE).unwrap();
        }
        for &o in &on[1] {
            let mut got = vec![0u8; 64 << 10];
            let e = lv.read_at(&mut got, o).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Io, "stripes {stripes} at {o}: {e}");
            let e = lv.write_at(&b, o, WriteFlags::NONE).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Io, "stripes {stripes} at {o}: {e}");
        }
        // A flush must reach pv1 too, and says it could not.
        let e = lv.flush().unwrap_err();
        assert!(e.to_string().contains("pv1.img"), "{e}");
    }
}
