//! The LVM fuzz harnesses, shared by the cargo-fuzz targets (`fuzz_targets/lvm_text.rs`,
//! `fuzz_targets/lvm_label.rs`) and the deterministic run on stable Rust in
//! `crates/lvm/tests/fuzz_harness.rs`.
//!
//! ```text
//!   lvm_text:  bytes ─> text::parse ─> print ─> parse (printing reaches a fixed point)
//!                    └> VolumeGroup::from_tree ─> to_text ─> from_text (same text)
//!                    └> committed text of a real PV (CRC fixed) ─> Vg::open, report, lv,
//!                       lv_create: errors allowed, panics not
//!   lvm_label: bytes ─> sectors 0-3, mda header at 4096, text at 4608 (every CRC fixed
//!                       so mutations get past the checksums) ─> probe, Vg::open
//! ```

#![allow(dead_code)]

use std::sync::Arc;

use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_lvm::crc::crc;
use cairn_lvm::label::DiskLocn;
use cairn_lvm::mda::MdaHeader;
use cairn_lvm::{text, LvCreate, PvCreateOptions, PvDevice, Vg, VolumeGroup};

/// Larger inputs say nothing new.
pub const MAX_INPUT: usize = 64 << 10;
const DEV_SIZE: u64 = 8 << 20;

fn exercise(vg: &mut Vg) {
    let r = vg.report();
    for lv in &r.lvs {
        if let Ok(dev) = vg.lv(&lv.name) {
            let g = dev.geometry();
            let mut buf = vec![0u8; 512];
            if g.size >= 512 {
                let _ = dev.read_at(&mut buf, g.size - 512);
            }
        }
    }
    let _ = vg.lv_create(&LvCreate {
        name: "fuzz".into(),
        extents: 1,
        stripes: 1,
        stripe_size: None,
    });
    let _ = vg.report();
}

pub fn lvm_text(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(tree) = text::parse(data) else {
        return;
    };
    let p1 = text::print(&tree);
    let t2 = text::parse(p1.as_bytes()).expect("printed text parses");
    let p2 = text::print(&t2);
    let t3 = text::parse(p2.as_bytes()).expect("printed text parses");
    assert_eq!(text::print(&t3), p2, "printing is not a fixed point");
    if let Ok(vg) = VolumeGroup::from_tree(&tree) {
        let out = vg.to_text();
        let again = VolumeGroup::from_text(out.as_bytes())
            .unwrap_or_else(|e| panic!("cairn's own text does not parse: {e}\n{out}"));
        assert_eq!(again.to_text(), out, "model round trip changed the text");
        let _ = vg.used_extents();
        let _ = cairn_lvm::alloc::FreeMap::of(&vg);
    }
    // The same text as the committed metadata of a real PV.
    let disk = Arc::new(MemDisk::new(DEV_SIZE));
    let pv = PvDevice::new("fuzz.img", disk.clone() as Arc<dyn BlockDevice>);
    cairn_lvm::pvcreate(&pv, &PvCreateOptions::default()).expect("pvcreate on a blank disk");
    let area = DiskLocn {
        offset: cairn_lvm::mda::DEFAULT_MDA_START,
        size: cairn_lvm::mda::DEFAULT_MDA_SIZE,
    };
    let mut h = MdaHeader::read(&*disk, area).expect("fresh header");
    let Ok(l) = h.write_text(&*disk, data) else {
        return;
    };
    h.committed = l;
    h.write(&*disk, WriteFlags::NONE).expect("header write");
    if let Ok(mut vg) = Vg::open(vec![pv]) {
        exercise(&mut vg);
    }
}

fn fix_label(img: &mut [u8]) {
    for s in 0..4 {
        let b = &mut img[s * 512..(s + 1) * 512];
        if &b[..8] == b"LABELONE" {
            let c = crc(&b[20..]);
            b[16..20].copy_from_slice(&c.to_le_bytes());
        }
    }
}

pub fn lvm_label(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    // Only the head is ever looked at; the device behind it is sparse.
    let mut img = vec![0u8; 4608 + MAX_INPUT];
    let n = data.len().min(2048);
    img[..n].copy_from_slice(&data[..n]);
    if data.len() > 2048 {
        let m = (data.len() - 2048).min(512);
        img[4096..4096 + m].copy_from_slice(&data[2048..2048 + m]);
        let rest = &data[2048 + m..];
        img[4608..4608 + rest.len()].copy_from_slice(rest);
        // raw_locns[0]: make its checksum match whatever it points at inside the image.
        let off = u64::from_le_bytes(img[4096 + 40..4096 + 48].try_into().unwrap_or([0; 8]));
        let size = u64::from_le_bytes(img[4096 + 48..4096 + 56].try_into().unwrap_or([0; 8]));
        if let (Ok(o), Ok(s)) = (usize::try_from(off), usize::try_from(size)) {
            if o.checked_add(4096)
                .and_then(|a| a.checked_add(s))
                .is_some_and(|e| e <= img.len())
            {
                let c = crc(&img[4096 + o..4096 + o + s]);
                img[4096 + 56..4096 + 60].copy_from_slice(&c.to_le_bytes());
            }
        }
        let c = crc(&img[4096 + 4..4096 + 512]);
        img[4096..4100].copy_from_slice(&c.to_le_bytes());
    }
    fix_label(&mut img);
    let disk = Arc::new(MemDisk::new(DEV_SIZE));
    if disk.write_at(&img, 0, WriteFlags::NONE).is_err() {
        return;
    }
    let _ = cairn_lvm::label::read(&*disk);
    let _ = cairn_lvm::probe(&*disk);
    if let Ok(mut vg) = Vg::open(vec![PvDevice::new(
        "fuzz.img",
        disk as Arc<dyn BlockDevice>,
    )]) {
        exercise(&mut vg);
    }
}
