//! Crafted LVM metadata with valid checksums that lvm refuses ("PV segments corrupted")
//! must be refused here too: one LV moved onto another LV's extents, or an LV past the
//! end of its PV. Served, the first gives two exports over the same bytes.

mod common;

use cairn_block::{BlockDevice, ErrorKind, WriteFlags};
use cairn_lvm::label::DiskLocn;
use cairn_lvm::mda::{MdaHeader, DEFAULT_MDA_SIZE, DEFAULT_MDA_START};
use cairn_lvm::{LvCreate, Vg, VolumeGroup};
use common::*;

fn lvc(name: &str, extents: u64) -> LvCreate {
    LvCreate {
        name: name.into(),
        extents,
        stripes: 1,
        stripe_size: None,
    }
}

#[test]
fn overlapping_or_out_of_range_extents_in_text_are_refused() {
    // EXAMPLE: lin on pv0 extents 0-1, str striped over pv0 2-3 and pv1 0-1.
    VolumeGroup::from_text(EXAMPLE.as_bytes()).unwrap();
    for (from, to, want) in [
        (
            "\"pv0\", 2,",
            "\"pv0\", 1,",
            "VG vgt: LVs lin and str both use extent 1 of PV pv0 (PV segments corrupted)",
        ),
        (
            "\"pv1\", 0",
            "\"pv1\", 14",
            "VG vgt: LV str uses extents 14..16 of PV pv1, which has only 15 (PV segments corrupted)",
        ),
    ] {
        assert_eq!(EXAMPLE.matches(from).count(), 1, "{from}");
        let text = EXAMPLE.replace(from, to);
        let e = VolumeGroup::from_text(text.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert_eq!(e.to_string(), format!("{want}: corrupt metadata"));
    }
}

/// Through the PVs: the committed metadata of a VG rewritten with valid CRCs so that LV
/// b lies on LV a's extents; opening the VG is refused and names both.
#[test]
fn a_vg_whose_lvs_share_extents_does_not_open() {
    let (disks, pvs) = mem_pvs(1, 64 * MIB);
    let mut vg = Vg::create("vgx", pvs.clone(), 4 * MIB).unwrap();
    vg.lv_create(&lvc("a", 3)).unwrap();
    vg.lv_create(&lvc("b", 2)).unwrap();
    let text = vg.metadata().to_text();
    drop(vg);
    let placed = "\"pv0\", 3\n";
    assert_eq!(text.matches(placed).count(), 1, "{text}");
    let crafted = text.replace(placed, "\"pv0\", 1\n");
    let area = DiskLocn {
        offset: DEFAULT_MDA_START,
        size: DEFAULT_MDA_SIZE,
    };
    let disk: &dyn BlockDevice = &*disks[0];
    let mut h = MdaHeader::read(disk, area).unwrap();
    h.committed = h.write_text(disk, crafted.as_bytes()).unwrap();
    h.write(disk, WriteFlags::FUA).unwrap();

    let e = Vg::open(pvs).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("LVs a and b both use extent 1 of PV pv0 (PV segments corrupted)"),
        "{msg}"
    );
}
