//! VG operations over MemDisks: allocation like lvm, the data mapping against the §4.5
//! formulas, the block-device contract, alignment, and refusals.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{self, conformance};
use cairn_block::{BlockDevice, ErrorKind, Geometry, MemDisk, WriteFlags};
use cairn_lvm::meta::SegKind;
use cairn_lvm::{pvcreate, LvCreate, PvCreateOptions, PvDevice, Vg};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn lvc(name: &str, extents: u64, stripes: u32, stripe_size: Option<u64>) -> LvCreate {
    LvCreate {
        name: name.into(),
        extents,
        stripes,
        stripe_size,
    }
}

fn ranges(vg: &Vg, lv: &str) -> Vec<(u64, u64, String)> {
    vg.report()
        .lvs
        .iter()
        .find(|l| l.name == lv)
        .unwrap()
        .segments
        .iter()
        .map(|s| (s.start_extent, s.extent_count, s.seg_pe_ranges.clone()))
        .collect()
}

/// The same sequence lvm ran for tests/data (see metadata.rs) gives lvm's placement.
#[test]
fn allocation_matches_lvm() {
    let (_d, pvs) = mem_pvs(2, 64 * MIB);
    let mut vg = Vg::create("vgtest", pvs.clone(), 4 * MIB).unwrap();
    assert_eq!(vg.report().pvs[0].pe_count, 15);
    vg.lv_create(&lvc("lin", 5, 1, None)).unwrap();
    vg.lv_create(&lvc("str", 4, 2, Some(64 << 10))).unwrap();
    vg.lv_extend("lin", 2).unwrap();
    assert_eq!(
        ranges(&vg, "lin"),
        vec![(0, 5, "pv0.img:0-4".into()), (5, 2, "pv0.img:7-8".into())]
    );
    assert_eq!(
        ranges(&vg, "str"),
        vec![(0, 4, "pv0.img:5-6 pv1.img:0-1".into())]
    );
    // Contiguous extension merges into the last segment.
    vg.lv_extend("lin", 1).unwrap();
    assert_eq!(ranges(&vg, "lin")[1], (5, 3, "pv0.img:7-9".into()));
    // Striped rounding; stripes go on distinct PVs in PV order.
    let c = vg.lv_create(&lvc("s3", 3, 2, None)).unwrap();
    assert_eq!(c.extents, 4);
    assert!(
        c.notes[0].contains("Rounding size (3 extents) up"),
        "{:?}",
        c.notes
    );
    assert_eq!(
        ranges(&vg, "s3"),
        vec![(0, 4, "pv0.img:10-11 pv1.img:2-3".into())]
    );
    // Too big for one free run: spread over runs in PV order.
    vg.lv_create(&lvc("big", 13, 1, None)).unwrap();
    assert_eq!(
        ranges(&vg, "big"),
        vec![
            (0, 3, "pv0.img:12-14".into()),
            (3, 10, "pv1.img:4-13".into())
        ]
    );
    let e = vg.lv_create(&lvc("s4", 4, 3, None)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace);
    assert!(e.to_string().contains("3 stripes need 3 PVs"), "{e}");
    let e = vg.lv_create(&lvc("huge", 2, 1, None)).unwrap_err();
    assert!(e.to_string().contains("insufficient free space"), "{e}");
    assert_eq!(vg.report().free_count, 1);
    // Everything survives a reopen.
    let again = Vg::open(pvs).unwrap();
    assert_eq!(again.report(), vg.report());
}

#[test]
fn reduce_rename_remove() {
    let (_d, pvs) = mem_pvs(3, 64 * MIB);
    let mut vg = Vg::create("vg", pvs.clone(), 4 * MIB).unwrap();
    vg.lv_create(&lvc("a", 4, 1, None)).unwrap();
    vg.lv_create(&lvc("b", 2, 1, None)).unwrap();
    vg.lv_extend("a", 3).unwrap();
    assert_eq!(ranges(&vg, "a").len(), 2);
    let e = vg.lv_reduce("a", 4, false).unwrap_err().to_string();
    assert!(
        e.contains("from 7 to 3 extents") && e.contains("discard") && e.contains("force"),
        "{e}"
    );
    assert_eq!(vg.metadata().lv("a").unwrap().extents(), 7);
    let c = vg.lv_reduce("a", 4, true).unwrap();
    assert_eq!(c.extents, 3);
    assert_eq!(ranges(&vg, "a"), vec![(0, 3, "pv0.img:0-2".into())]);
    assert!(vg.lv_reduce("a", 3, true).is_err());
    // Striped reduce keeps whole rows.
    vg.lv_create(&lvc("s", 6, 3, None)).unwrap();
    assert!(vg.lv_reduce("s", 2, true).is_err());
    let c = vg.lv_reduce("s", 3, true).unwrap();
    assert_eq!(c.extents, 3);
    vg.lv_rename("b", "c").unwrap();
    assert!(vg.lv_rename("c", "a").is_err());
    assert!(vg.lv_rename("c", "bad name").is_err());
    vg.lv_remove("c").unwrap();
    assert!(vg.lv("c").is_err());
    let seq = vg.metadata().seqno;
    let again = Vg::open(pvs).unwrap();
    assert_eq!(again.metadata().seqno, seq);
    assert_eq!(again.exportable_lvs(), vec!["a".to_string(), "s".into()]);
}

#[test]
fn reduce_on_striped_rounds_to_rows() {
    let (_d, pvs) = mem_pvs(2, 64 * MIB);
    let mut vg = Vg::create("vg", pvs, 4 * MIB).unwrap();
    vg.lv_create(&lvc("s", 8, 2, None)).unwrap();
    let e = vg.lv_reduce("s", 1, true).unwrap_err().to_string();
    assert!(e.contains("less than one stripe row"), "{e}");
    let c = vg.lv_reduce("s", 3, true).unwrap();
    assert_eq!(c.extents, 6);
    assert!(!c.notes.is_empty());
}

#[test]
fn vgextend_and_extend_onto_new_pv() {
    let (_d, pvs) = mem_pvs(3, 32 * MIB);
    let mut vg = Vg::create("vg", pvs[..1].to_vec(), 4 * MIB).unwrap();
    vg.lv_create(&lvc("a", 7, 1, None)).unwrap();
    assert!(vg.lv_extend("a", 1).is_err());
    vg.extend(pvs[1..].to_vec()).unwrap();
    vg.lv_extend("a", 2).unwrap();
    assert_eq!(ranges(&vg, "a")[1], (7, 2, "pv1.img:0-1".into()));
    // Re-adding a member is refused; so is putting a PV of this VG into another.
    assert!(vg.extend(vec![pvs[1].clone()]).is_err());
    assert!(Vg::create("vg2", vec![pvs[2].clone()], 4 * MIB)
        .unwrap_err()
        .to_string()
        .contains("already in VG vg"));
    let again = Vg::open(pvs).unwrap();
    assert_eq!(again.report().pv_count, 3);
}

#[test]
fn pvcreate_aligns_to_the_full_stripe_and_refuses_signatures() {
    // An md RAID5 of 4 members with 64 KiB chunks: full stripe 192 KiB.
    let d = Arc::new(MemDisk::with_geometry(Geometry {
        optimal_io_size: 192 << 10,
        ..Geometry::simple(64 * MIB)
    }));
    let pv = PvDevice::new("md0", d.clone() as Arc<dyn BlockDevice>);
    let info = pvcreate(&pv, &PvCreateOptions::default()).unwrap();
    assert_eq!(info.pe_start, 3 * MIB);
    assert_eq!(info.pe_start % (192 << 10), 0);
    let e = pvcreate(&pv, &PvCreateOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("already an LVM2 physical volume"), "{e}");
    let info = pvcreate(
        &pv,
        &PvCreateOptions {
            data_alignment: Some(4 * MIB),
            force: true,
            uuid: None,
        },
    )
    .unwrap();
    assert_eq!(info.pe_start, 4 * MIB);
    // LUKS and md signatures are refused.
    let l = Arc::new(MemDisk::new(8 * MIB));
    l.write_at(
        &[b"LUKS\xba\xbe".as_slice(), &[0u8; 506]].concat(),
        0,
        WriteFlags::NONE,
    )
    .unwrap();
    let e = pvcreate(&PvDevice::new("luks.img", l), &PvCreateOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("luks.img holds a LUKS header"), "{e}");
    let m = Arc::new(MemDisk::new(8 * MIB));
    let mut sb = vec![0u8; 512];
    sb[..4].copy_from_slice(&0xa92b_4efcu32.to_le_bytes());
    m.write_at(&sb, 4096, WriteFlags::NONE).unwrap();
    assert!(pvcreate(&PvDevice::new("m", m), &PvCreateOptions::default()).is_err());
}

/// Random LV offsets land where §4.5 says, computed from the metadata alone.
#[test]
fn mapping_matches_the_formula() {
    let seed = testkit::test_seed("lvm mapping");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (disks, pvs) = mem_pvs(3, 64 * MIB);
    let mut vg = Vg::create("vg", pvs, MIB).unwrap();
    vg.lv_create(&lvc("pad", 3, 1, None)).unwrap();
    vg.lv_create(&lvc("s", 6, 3, Some(16 << 10))).unwrap();
    vg.lv_create(&lvc("l", 5, 1, None)).unwrap();
    vg.lv_extend("s", 9).unwrap();
    vg.lv_remove("pad").unwrap();
    vg.lv_extend("l", 40).unwrap();
    let meta = vg.metadata().clone();
    let es = meta.extent_size;
    for name in ["s", "l"] {
        let lvm = meta.lv(name).unwrap();
        let lv = vg.lv(name).unwrap();
        assert!(lvm.segments.len() >= 2, "{name}: want several segments");
        for _ in 0..300 {
            let x = rng.gen_range(0..lv.geometry().size / 512); // LV sector
            let seg = lvm
                .segments
                .iter()
                .find(|s| x >= s.start_extent * es && x < (s.start_extent + s.extent_count) * es)
                .unwrap();
            let SegKind::Striped {
                stripe_size,
                stripes,
            } = &seg.kind
            else {
                panic!()
            };
            let o = x - seg.start_extent * es;
            let (area, within) = if stripes.len() == 1 {
                (&stripes[0], o)
            } else {
                let z = *stripe_size;
                let k = stripes.len() as u64;
                let chunk = o / z;
                (
                    &stripes[usize::try_from(chunk % k).unwrap()],
                    (chunk / k) * z + o % z,
                )
            };
            let pv = meta.pv(&area.pv).unwrap();
            let pv_sector = pv.pe_start + area.pe * es + within;
            let (got_pv, got_off) = lv.locate(x * 512).unwrap();
            assert_eq!(
                (got_pv, got_off),
                (format!("{}.img", area.pv).as_str(), pv_sector * 512),
                "{name} sector {x}"
            );
            // And data written there really lands there.
            let data = testkit::random_bytes(&mut rng, 512);
            lv.write_at(&data, x * 512, WriteFlags::NONE).unwrap();
            let i: usize = area.pv[2..].parse().unwrap();
            let mut back = vec![0u8; 512];
            disks[i].read_at(&mut back, pv_sector * 512).unwrap();
            assert_eq!(back, data, "{name} sector {x}");
        }
    }
    let s = vg.lv("s").unwrap();
    assert_eq!(s.geometry().optimal_io_size, 48 << 10);
}

fn conformance_on(stripes: u32, multi: bool) {
    conformance::run_all(&|| {
        let (_d, pvs) = mem_pvs(3, 24 * MIB);
        let mut vg = Vg::create("vg", pvs, MIB).unwrap();
        if multi {
            vg.lv_create(&lvc("lv", 3, stripes, Some(8 << 10))).unwrap();
            vg.lv_create(&lvc("gap", 3, 1, None)).unwrap();
            vg.lv_extend("lv", 6).unwrap();
            assert!(vg.metadata().lv("lv").unwrap().segments.len() >= 2);
        } else {
            vg.lv_create(&lvc("lv", 6, stripes, Some(8 << 10))).unwrap();
        }
        let lv = vg.lv("lv").unwrap();
        Box::new(lv) as Box<dyn BlockDevice>
    });
}

#[test]
fn conformance_linear() {
    conformance_on(1, false);
}

#[test]
fn conformance_striped() {
    conformance_on(3, false);
}

#[test]
fn conformance_multi_segment() {
    conformance_on(1, true);
    conformance_on(3, true);
}

#[test]
fn read_only_and_unavailable() {
    let (_d, pvs) = mem_pvs(2, 32 * MIB);
    let mut vg = Vg::create("vg", pvs.clone(), 4 * MIB).unwrap();
    vg.lv_create(&lvc("a", 2, 1, None)).unwrap();
    let ro = Vg::open_with(
        pvs,
        cairn_lvm::OpenOptions {
            partial: false,
            read_only: true,
        },
    )
    .unwrap();
    let lv = ro.lv("a").unwrap();
    assert!(lv.capabilities().read_only);
    assert_eq!(
        lv.write_at(&[0u8; 512], 0, WriteFlags::NONE)
            .unwrap_err()
            .kind(),
        ErrorKind::ReadOnly
    );
    let mut ro = ro;
    assert_eq!(
        ro.lv_create(&lvc("b", 1, 1, None)).unwrap_err().kind(),
        ErrorKind::ReadOnly
    );
    assert_eq!(vg.lv("nope").unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn the_default_extent_size_keeps_every_extent_on_a_full_stripe() {
    // RAID5 of 4 members with 64 KiB chunks: full stripe 192 KiB, so 4 MiB extents
    // would drift off it; 12 MiB (the least common multiple) keeps every LV aligned.
    let d = Arc::new(MemDisk::with_geometry(Geometry {
        optimal_io_size: 192 << 10,
        ..Geometry::simple(256 * MIB)
    }));
    let pv = PvDevice::new("md0", d.clone() as Arc<dyn BlockDevice>);
    let e = cairn_lvm::aligned_extent_size(4 * MIB, std::slice::from_ref(&pv)).unwrap();
    assert_eq!(e, 12 * MIB);
    // A power-of-two stripe leaves lvm's 4 MiB alone.
    let p2 = PvDevice::new(
        "p2",
        Arc::new(MemDisk::with_geometry(Geometry {
            optimal_io_size: 128 << 10,
            ..Geometry::simple(64 * MIB)
        })) as Arc<dyn BlockDevice>,
    );
    assert_eq!(
        cairn_lvm::aligned_extent_size(4 * MIB, std::slice::from_ref(&p2)),
        Some(4 * MIB)
    );
    // lvm's rule: not a power of two needs a multiple of 128 KiB.
    assert!(cairn_lvm::extent_size_ok(12 * MIB));
    assert!(!cairn_lvm::extent_size_ok(192 << 10));
    let mut vg = Vg::create("vgs", vec![pv], e).unwrap();
    vg.lv_create(&LvCreate {
        name: "a".into(),
        extents: 1,
        stripes: 1,
        stripe_size: None,
    })
    .unwrap();
    vg.lv_create(&LvCreate {
        name: "b".into(),
        extents: 2,
        stripes: 1,
        stripe_size: None,
    })
    .unwrap();
    for name in ["a", "b"] {
        let (_, at) = vg.lv(name).unwrap().locate(0).unwrap();
        assert_eq!(at % (192 << 10), 0, "LV {name} starts at {at}");
    }
    assert!(Vg::create(
        "bad",
        vec![PvDevice::new(
            "x",
            Arc::new(MemDisk::new(64 * MIB)) as Arc<dyn BlockDevice>
        )],
        192 << 10
    )
    .is_err());
}
