//! Crash safety of metadata commits: every PV under a `LogWritesDisk` sharing one clock;
//! at every instant of lv_create / lv_extend / lv_remove / vgextend (several random torn
//! states each), the PVs reopen as exactly the old or the new VG.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{self, CrashPoint, LogClock, LogOptions, LogWritesDisk};
use cairn_block::{BlockDevice, MemDisk};
use cairn_lvm::{LvCreate, PvDevice, Vg, VolumeGroup};
use common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// The parts of a VG that a change may touch (the trailer's time and host may not match).
fn state(vg: &VolumeGroup) -> (u64, String) {
    let lvs: Vec<String> = vg
        .lvs
        .iter()
        .map(|l| {
            let segs: Vec<String> = l
                .segments
                .iter()
                .map(|s| format!("{}+{} {:?}", s.start_extent, s.extent_count, s.kind))
                .collect();
            format!("{}:{segs:?}", l.name)
        })
        .collect();
    let pvs: Vec<String> = vg.pvs.iter().map(|p| p.id.clone()).collect();
    (vg.seqno, format!("{lvs:?} {pvs:?}"))
}

fn run(op: &str, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed ^ op.len() as u64);
    let (disks, pvs) = mem_pvs(3, 16 * MIB);
    let mut vg = Vg::create("vg", pvs[..2].to_vec(), MIB).unwrap();
    vg.lv_create(&LvCreate {
        name: "a".into(),
        extents: 3,
        stripes: 1,
        stripe_size: None,
    })
    .unwrap();
    vg.lv_create(&LvCreate {
        name: "b".into(),
        extents: 2,
        stripes: 2,
        stripe_size: None,
    })
    .unwrap();
    drop(vg);
    let clock = LogClock::new();
    let logged: Vec<Arc<LogWritesDisk<MemDisk>>> = disks
        .iter()
        .map(|d| {
            Arc::new(
                LogWritesDisk::with_options(
                    MemDisk::from_bytes(&d.to_vec()),
                    LogOptions::with_clock(&clock),
                )
                .unwrap(),
            )
        })
        .collect();
    let lpvs: Vec<PvDevice> = logged
        .iter()
        .enumerate()
        .map(|(i, d)| PvDevice::new(format!("pv{i}.img"), d.clone() as Arc<dyn BlockDevice>))
        .collect();
    let mut vg = Vg::open(lpvs[..2].to_vec()).unwrap();
    let old = state(vg.metadata());
    let start = clock.now();
    match op {
        "lv_create" => drop(
            vg.lv_create(&LvCreate {
                name: "c".into(),
                extents: 4,
                stripes: 2,
                stripe_size: Some(4096),
            })
            .unwrap(),
        ),
        "lv_extend" => drop(vg.lv_extend("a", 5).unwrap()),
        "lv_remove" => vg.lv_remove("b").unwrap(),
        "vgextend" => vg.extend(vec![lpvs[2].clone()]).unwrap(),
        _ => unreachable!(),
    }
    let new = state(vg.metadata());
    assert_ne!(old, new);
    let end = clock.now();
    let (mut saw_old, mut saw_new) = (false, false);
    for t in start..=end {
        for round in 0..4 {
            let first = round == 0;
            let imgs: Vec<Vec<u8>> = logged
                .iter()
                .map(|d| d.crash_image(&mut rng, CrashPoint::AtTime(t)))
                .collect();
            // The new PV of vgextend: given whenever it has a label (as a user would);
            // if the old VG does not know it yet, the open without it must work.
            let mut given = pvs_from_images(&imgs[..2]);
            if op == "vgextend" {
                let third = PvDevice::new(
                    "pv2.img",
                    Arc::new(MemDisk::from_bytes(&imgs[2])) as Arc<dyn BlockDevice>,
                );
                let info = cairn_lvm::probe(&*third.dev).unwrap();
                if info.is_some() {
                    given.push(third);
                }
            }
            let mut used = given.len();
            let reopened = Vg::open(given.clone())
                .or_else(|e| {
                    if given.len() == 3 && e.to_string().contains("is not a PV of VG") {
                        used = 2;
                        Vg::open(given[..2].to_vec())
                    } else {
                        Err(e)
                    }
                })
                .unwrap_or_else(|e| panic!("{op}: crash at {t} ({start}..{end}): {e}"));
            let got = state(reopened.metadata());
            if first {
                export_for_lvm(op, t, &imgs[..used], reopened.metadata());
            }
            if got == old {
                saw_old = true;
            } else if got == new {
                saw_new = true;
            } else {
                panic!(
                    "{op}: crash at {t}: neither old nor new:\n{got:?}\nold {old:?}\nnew {new:?}"
                );
            }
            if t == end {
                assert_eq!(got, new, "{op}: after the last flush the change is durable");
            }
            // Every LV opens and the free space adds up.
            for lv in reopened.exportable_lvs() {
                reopened.lv(&lv).unwrap();
            }
            reopened.metadata().used_extents().unwrap();
        }
    }
    assert!(
        saw_old && saw_new,
        "{op}: crash points did not cover both states"
    );
}

/// With `CAIRN_LVM_CRASH_DIR` set, each instant's first crash state is written there as
/// PV files (`OP-T/pvN.img`, sparse beyond the metadata) with `expect`: the seqno and LV
/// names cairn read, so that tests/interop/lvm.sh can check lvm's `vgs`/`lvs` read the
/// same state.
fn export_for_lvm(op: &str, t: u64, imgs: &[Vec<u8>], vg: &VolumeGroup) {
    use std::io::Write as _;
    let Some(dir) = std::env::var_os("CAIRN_LVM_CRASH_DIR") else {
        return;
    };
    let dir = std::path::Path::new(&dir).join(format!("{op}-{t:05}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, img) in imgs.iter().enumerate() {
        let mut f = std::fs::File::create(dir.join(format!("pv{i}.img"))).unwrap();
        // The label and metadata area live in the first MiB; the rest stays a hole.
        f.write_all(&img[..img.len().min(1 << 20)]).unwrap();
        f.set_len(img.len() as u64).unwrap();
    }
    let mut names: Vec<&str> = vg.lvs.iter().map(|l| l.name.as_str()).collect();
    names.sort_unstable();
    std::fs::write(
        dir.join("expect"),
        format!("{} {}\n", vg.seqno, names.join(",")),
    )
    .unwrap();
}

#[test]
fn metadata_commits_are_crash_safe() {
    let seed = testkit::test_seed("lvm crash");
    for op in ["lv_create", "lv_extend", "lv_remove", "vgextend"] {
        run(op, seed);
    }
}
