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

/// The committed metadata rewritten with valid CRCs so that every PV's extents start at
/// sector 0, 8 or 1024 (over the label, or inside the metadata area at 4096..1 MiB):
/// a write to the first LV would wipe the label and the VG metadata. Opening is refused
/// with the PV and the overlap named; nothing is written.
#[test]
fn extents_over_the_label_or_a_metadata_area_do_not_open() {
    for (pe_start, over) in [
        (0u64, "its LVM label at bytes 512..1024"),
        (8, "its metadata area 1 at bytes 4096..1048576"),
        (1024, "its metadata area 1 at bytes 4096..1048576"),
    ] {
        let (disks, pvs) = mem_pvs(2, 64 * MIB);
        let mut vg = Vg::create("vgp", pvs.clone(), 4 * MIB).unwrap();
        vg.lv_create(&lvc("a", 3)).unwrap();
        let text = vg.metadata().to_text();
        drop(vg);
        let placed = "pe_start = 2048\n";
        assert_eq!(text.matches(placed).count(), 2, "{text}");
        let crafted = text.replace(placed, &format!("pe_start = {pe_start}\n"));
        let area = DiskLocn {
            offset: DEFAULT_MDA_START,
            size: DEFAULT_MDA_SIZE,
        };
        let mut before = Vec::new();
        for d in &disks {
            let disk: &dyn BlockDevice = &**d;
            let mut h = MdaHeader::read(disk, area).unwrap();
            h.committed = h.write_text(disk, crafted.as_bytes()).unwrap();
            h.write(disk, WriteFlags::FUA).unwrap();
            let mut head = vec![0u8; 1 << 20];
            disk.read_at(&mut head, 0).unwrap();
            before.push(head);
        }

        let e = Vg::open(pvs.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        let msg = e.to_string();
        let start = pe_start * 512;
        assert!(
            msg.contains(&format!(
                "pv0.img (pv0): the VG metadata puts the PV's extents at bytes {start}.."
            )) && msg.contains(&format!("(pe_start {pe_start} sectors), over {over}")),
            "{msg}"
        );
        for (d, b) in disks.iter().zip(&before) {
            let mut head = vec![0u8; 1 << 20];
            d.read_at(&mut head, 0).unwrap();
            assert!(
                head == *b,
                "pe_start {pe_start}: the PV's first MiB changed"
            );
        }
    }
}
