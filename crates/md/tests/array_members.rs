//! Members coming and going on a running array: fail, spare takeover and rebuild,
//! replace, remove, re-add, rebuild checkpoints, and failures during a rebuild. Every
//! check reads back through the array and, where it matters, through a fresh assembly
//! of the member images with another member missing (which only works if the rebuilt
//! member really holds its data).

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::testkit::{test_seed, DelayDisk, FaultyDisk};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_md::{Array, AssembleOptions, Level, MemberState, Raid10Layout, SpeedLimits};
use common::{create, dyn_members, names, Shape};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn shapes() -> Vec<Shape> {
    vec![
        Shape::new(Level::Raid1, None, 64, 2).rows(16),
        Shape::new(Level::Raid5, None, 16, 4).rows(16),
        Shape::new(Level::Raid6, None, 16, 5).rows(16),
        Shape::new(
            Level::Raid10,
            Some(
                Raid10Layout {
                    near: 2,
                    far: 1,
                    offset: false,
                }
                .to_raw(),
            ),
            16,
            4,
        )
        .rows(16),
        Shape::new(
            Level::Raid10,
            Some(
                Raid10Layout {
                    near: 1,
                    far: 2,
                    offset: false,
                }
                .to_raw(),
            ),
            16,
            4,
        )
        .rows(16),
    ]
}

fn spare_like(m: &[Arc<MemDisk>]) -> Arc<MemDisk> {
    Arc::new(MemDisk::new(m[0].geometry().size))
}

/// Fills the array with random data; returns the model.
fn fill(a: &Array, rng: &mut SmallRng) -> Vec<u8> {
    let size = a.geometry().size;
    let mut model = vec![0u8; usize::try_from(size).unwrap()];
    rng.fill(&mut model[..]);
    a.write_at(&model, 0, WriteFlags::NONE).unwrap();
    model
}

fn check(a: &dyn BlockDevice, model: &[u8], what: &str) {
    let mut back = vec![0u8; model.len()];
    a.read_at(&mut back, 0).unwrap();
    if back != model {
        let at = back.iter().zip(model).position(|(x, y)| x != y).unwrap();
        panic!("{what}: array data differs from the model at byte {at}");
    }
}

/// Assembles the images with `role`'s member left out and checks the data: proves
/// the other members (the rebuilt one included) are right.
fn check_without(images: &[Arc<MemDisk>], leave_out: usize, model: &[u8], what: &str) {
    let devs: Vec<Arc<dyn BlockDevice>> = images
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leave_out)
        .map(|(_, d)| Arc::new(MemDisk::from_bytes(&d.to_vec())) as Arc<dyn BlockDevice>)
        .collect();
    let n = devs.len();
    let a = Array::assemble(devs, names(n), AssembleOptions::default())
        .unwrap_or_else(|e| panic!("{what}: assembling without member {leave_out}: {e}"));
    check(&a, model, &format!("{what}, without member {leave_out}"));
}

/// Which of `images` fills each role, by their superblocks.
fn roles_of(a: &Array) -> Vec<Option<String>> {
    a.member_names()
}

#[test]
fn fail_spare_takes_over_and_rebuilds() {
    let seed = test_seed("array_members");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in shapes() {
        let name = shape.name();
        let (a, mut m) = create(&shape);
        let model = fill(&a, &mut rng);
        let victim = rng.gen_range(0..shape.members);
        let msg = a.fail(&format!("disk{victim}.img")).unwrap();
        assert!(
            msg.message.contains("faulty") && msg.changed,
            "{name}: {msg}"
        );
        assert!(a.report().state.degraded, "{name}");
        // Asked twice: nothing changes, and the answer says so in its type.
        let again = a.fail(&format!("disk{victim}.img")).unwrap();
        assert!(!again.changed, "{name}: {again}");
        // Refused: failing one more than the level tolerates.
        if matches!(shape.level, Level::Raid1 | Level::Raid5) {
            let other = (victim + 1) % shape.members;
            let e = a.fail(&format!("disk{other}.img")).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{name}");
        }
        check(&a, &model, &format!("{name} degraded"));
        let spare = spare_like(&m);
        let msg = a
            .add(
                spare.clone() as Arc<dyn BlockDevice>,
                "spare.img".into(),
                false,
            )
            .unwrap();
        assert!(msg.message.contains("spare"), "{name}: {msg}");
        a.run_pending().unwrap();
        let r = a.report();
        assert!(
            !r.state.degraded,
            "{name}: still degraded after the rebuild: {r:?}"
        );
        assert_eq!(roles_of(&a)[victim].as_deref(), Some("spare.img"), "{name}");
        let faulty: Vec<_> = r
            .members
            .iter()
            .filter(|x| x.state == MemberState::Faulty)
            .collect();
        assert_eq!(faulty.len(), 1, "{name}: {r:?}");
        check(&a, &model, &format!("{name} rebuilt"));
        a.close().unwrap();
        drop(a);
        m[victim] = spare;
        // Every other member may now go missing: the rebuilt one carries its part.
        for leave_out in 0..shape.members {
            if leave_out != victim {
                check_without(&m, leave_out, &model, &name);
            }
        }
        println!("{name}: rebuilt role {victim}");
    }
    println!("seed {seed}");
}

/// The rebuild at the chunk size the benches use (512 KiB, where the other tests use
/// 16 KiB): every role of RAID5 and RAID6 rebuilt in turn (as data, P and Q chunk across
/// the stripes), the data checked through the array and without another member.
#[test]
fn rebuild_every_role_with_512k_chunks() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid5, None, 512, 4).rows(4),
        Shape::new(Level::Raid6, None, 512, 5).rows(5),
    ] {
        let name = shape.name();
        for victim in 0..shape.members {
            let (a, mut m) = create(&shape);
            let model = fill(&a, &mut rng);
            a.fail(&format!("disk{victim}.img")).unwrap();
            let spare = spare_like(&m);
            a.add(
                spare.clone() as Arc<dyn BlockDevice>,
                "spare.img".into(),
                false,
            )
            .unwrap();
            a.run_pending().unwrap();
            assert!(!a.report().state.degraded, "{name}");
            check(&a, &model, &format!("{name} rebuilt role {victim}"));
            a.close().unwrap();
            drop(a);
            m[victim] = spare;
            // Reading without another member needs the rebuilt one everywhere.
            check_without(&m, (victim + 1) % shape.members, &model, &name);
        }
    }
}

/// The rebuild with no speed limits reads the next stripes ahead while it writes the
/// current ones (pipeline.rs), holding their locks; a client writing all the while must
/// still find every byte it wrote, and every member must carry its part afterwards.
#[test]
fn unpaced_rebuild_under_concurrent_writes() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    for shape in shapes() {
        let name = shape.name();
        let mut rng = SmallRng::seed_from_u64(seed);
        let (a, mut m) = create(&shape);
        let a = Arc::new(a);
        let model = Arc::new(std::sync::Mutex::new(fill(&a, &mut rng)));
        let victim = rng.gen_range(0..shape.members);
        a.fail(&format!("disk{victim}.img")).unwrap();
        // The spare's writes wait a little, so that the writer overlaps the rebuild.
        let spare = spare_like(&m);
        let slow = Arc::new(DelayDisk::new(spare.clone() as Arc<dyn BlockDevice>));
        slow.set_delay(Duration::from_millis(2));
        a.add(slow as Arc<dyn BlockDevice>, "spare.img".into(), false)
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
            let mut rng = SmallRng::seed_from_u64(seed ^ 0xfeed);
            std::thread::spawn(move || {
                let size = a.geometry().size;
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    let len = rng.gen_range(1..=32u64) * 512;
                    let off = rng.gen_range(0..(size - len) / 512) * 512;
                    let mut buf = vec![0u8; len as usize];
                    rng.fill(&mut buf[..]);
                    let mut model = model.lock().unwrap();
                    a.write_at(&buf, off, WriteFlags::NONE).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                    drop(model);
                    n += 1;
                }
                n
            })
        };
        // On this thread, unpaced, while the writer runs.
        a.run_pending().unwrap();
        stop.store(true, Ordering::Release);
        let writes = writer.join().unwrap();
        assert!(!a.report().state.degraded, "{name}");
        let model = model.lock().unwrap().clone();
        check(
            &*a,
            &model,
            &format!("{name} after an unpaced rebuild under writes"),
        );
        a.close().unwrap();
        drop(a);
        m[victim] = spare;
        for leave_out in 0..shape.members {
            if leave_out != victim {
                check_without(&m, leave_out, &model, &name);
            }
        }
        println!("{name}: {writes} writes during the unpaced rebuild");
    }
}

#[test]
fn rebuild_under_concurrent_writes() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    for shape in shapes() {
        let name = shape.name();
        let mut rng = SmallRng::seed_from_u64(seed);
        let (a, mut m) = create(&shape);
        let a = Arc::new(a);
        let model = Arc::new(std::sync::Mutex::new(fill(&a, &mut rng)));
        // Slow enough that the writer overlaps the rebuild.
        a.manage(SpeedLimits {
            min: 2 << 20,
            max: 4 << 20,
        });
        let victim = rng.gen_range(0..shape.members);
        a.fail(&format!("disk{victim}.img")).unwrap();
        let spare = spare_like(&m);
        a.add(
            spare.clone() as Arc<dyn BlockDevice>,
            "spare.img".into(),
            false,
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
            std::thread::spawn(move || {
                let size = a.geometry().size;
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    let len = rng.gen_range(1..=32u64) * 512;
                    let off = rng.gen_range(0..(size - len) / 512) * 512;
                    let mut buf = vec![0u8; len as usize];
                    rng.fill(&mut buf[..]);
                    let mut model = model.lock().unwrap();
                    a.write_at(&buf, off, WriteFlags::NONE).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                    drop(model);
                    let mut back = vec![0u8; len as usize];
                    a.read_at(&mut back, off).unwrap();
                    assert_eq!(back, buf);
                    n += 1;
                }
                n
            })
        };
        let t0 = Instant::now();
        loop {
            let st = a.background().expect("a rebuild");
            if st.state == "finished" && !a.report().state.degraded {
                break;
            }
            assert!(
                !st.state.starts_with("failed"),
                "{name}: rebuild failed: {}",
                st.state
            );
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{name}: rebuild too slow: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Release);
        let writes = writer.join().unwrap();
        assert!(writes > 0, "{name}");
        let model = model.lock().unwrap().clone();
        check(&*a, &model, &format!("{name} after rebuild under writes"));
        a.close().unwrap();
        drop(a);
        m[victim] = spare;
        for leave_out in 0..shape.members {
            if leave_out != victim {
                check_without(&m, leave_out, &model, &name);
            }
        }
        println!("{name}: {writes} writes during the rebuild");
    }
}

#[test]
fn rebuild_checkpoint_resumes_after_restart() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid5, None, 16, 4).rows(64),
        Shape::new(Level::Raid1, None, 64, 2).rows(64),
    ] {
        let name = shape.name();
        let (a, mut m) = create(&shape);
        let a = Arc::new(a);
        let model = fill(&a, &mut rng);
        a.fail("disk1.img").unwrap();
        let spare = spare_like(&m);
        a.add(
            spare.clone() as Arc<dyn BlockDevice>,
            "spare.img".into(),
            false,
        )
        .unwrap();
        a.manage(SpeedLimits {
            min: 256 << 10,
            max: 256 << 10,
        });
        std::thread::sleep(Duration::from_millis(700));
        a.close().unwrap();
        let st = a.background().unwrap();
        assert_eq!(st.state, "stopped", "{name}: {st:?}");
        assert!(
            st.done_bytes > 0 && st.done_bytes < st.total_bytes,
            "{name}: {st:?}"
        );
        drop(a);
        m[1] = spare;
        let devs = dyn_members(&m);
        let a =
            Arc::new(Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap());
        let r = a.report();
        assert_eq!(r.members[1].state, MemberState::Rebuilding, "{name}: {r:?}");
        a.run_pending().unwrap();
        let st = a.background().unwrap();
        assert_eq!(st.state, "finished");
        // Resumed: the second run did not start from zero.
        assert!(
            st.worked_bytes < st.total_bytes,
            "{name}: resumed rebuild redid everything: {st:?}"
        );
        check(&*a, &model, &name);
        a.close().unwrap();
        drop(a);
        check_without(&m, 0, &model, &name);
        println!(
            "{name}: resumed with {} of {} bytes left",
            st.worked_bytes, st.total_bytes
        );
    }
}

#[test]
fn replace_copies_then_hands_over() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in shapes() {
        let name = shape.name();
        let (a, mut m) = create(&shape);
        let model = fill(&a, &mut rng);
        let new = spare_like(&m);
        let msg = a
            .replace(
                "disk0.img",
                Some((new.clone() as Arc<dyn BlockDevice>, "new.img".into())),
                false,
            )
            .unwrap();
        assert!(msg.message.contains("replaced by new.img"), "{name}: {msg}");
        assert!(
            !a.report().state.degraded,
            "{name}: replace must not degrade"
        );
        let r = a.report();
        assert!(
            r.members
                .iter()
                .any(|x| x.state == MemberState::Replacement),
            "{name}: {r:?}"
        );
        // A write during the replacement lands on both.
        let mut extra = vec![0u8; 8192];
        rng.fill(&mut extra[..]);
        a.write_at(&extra, 4096, WriteFlags::NONE).unwrap();
        let mut model = model;
        model[4096..4096 + 8192].copy_from_slice(&extra);
        a.run_pending().unwrap();
        assert_eq!(roles_of(&a)[0].as_deref(), Some("new.img"), "{name}");
        let r = a.report();
        assert!(
            r.members
                .iter()
                .any(|x| x.state == MemberState::Faulty && x.name.as_deref() == Some("disk0.img")),
            "{name}: {r:?}"
        );
        assert_eq!(
            a.remove("disk0.img").unwrap(),
            cairn_md::Change::done("disk0.img removed".into())
        );
        check(&a, &model, &name);
        a.close().unwrap();
        drop(a);
        m[0] = new;
        for leave_out in 1..shape.members {
            check_without(&m, leave_out, &model, &name);
        }
    }
}

#[test]
fn re_add_takes_the_old_role_back() {
    let mut rng = SmallRng::seed_from_u64(test_seed("array_members"));
    let shape = Shape::new(Level::Raid5, None, 16, 3).rows(16);
    let (a, m) = create(&shape);
    let model = fill(&a, &mut rng);
    a.fail("disk2.img").unwrap();
    assert!(
        a.remove("disk0.img").is_err(),
        "an active member cannot be removed"
    );
    a.remove("disk2.img").unwrap();
    assert_eq!(a.report().members[2].state, MemberState::Missing);
    let msg = a
        .add(
            m[2].clone() as Arc<dyn BlockDevice>,
            "disk2.img".into(),
            false,
        )
        .unwrap();
    assert!(msg.message.contains("re-added into role 2"), "{msg}");
    a.run_pending().unwrap();
    assert!(!a.report().state.degraded);
    check(&a, &model, "re-added");
    a.close().unwrap();
    drop(a);
    check_without(&m, 0, &model, "re-added");
}

#[test]
fn add_refuses_foreign_devices() {
    let shape = Shape::new(Level::Raid1, None, 64, 2).rows(16);
    let (a, m) = create(&shape);
    let (other, _) = create(&shape);
    drop(other);
    // A member of another array.
    let (b, bm) = create(&shape);
    b.close().unwrap();
    let e = a
        .add(
            bm[0].clone() as Arc<dyn BlockDevice>,
            "foreign.img".into(),
            false,
        )
        .unwrap_err();
    assert!(e.to_string().contains("belongs to md array"), "{e}");
    // Too small.
    let small = Arc::new(MemDisk::new(m[0].geometry().size / 2));
    let e = a
        .add(small as Arc<dyn BlockDevice>, "small.img".into(), false)
        .unwrap_err();
    assert!(e.to_string().contains("need at least"), "{e}");
    // Unknown names.
    assert_eq!(a.fail("nope.img").unwrap_err().kind(), ErrorKind::NotFound);
    // RAID0 takes no members.
    let (z, zm) = create(&Shape::new(Level::Raid0, None, 16, 2));
    let e = z
        .add(
            spare_like(&zm) as Arc<dyn BlockDevice>,
            "s.img".into(),
            false,
        )
        .unwrap_err();
    assert!(e.to_string().contains("no redundancy"), "{e}");
}

#[test]
fn spare_persists_and_mdadm_roles_stay_consistent() {
    // A spare added and the array closed: reassembly finds the spare again.
    let shape = Shape::new(Level::Raid5, None, 16, 3).rows(16);
    let (a, mut m) = create(&shape);
    let spare = spare_like(&m);
    a.add(
        spare.clone() as Arc<dyn BlockDevice>,
        "spare.img".into(),
        false,
    )
    .unwrap();
    assert_eq!(a.report().spare_devices, 1);
    a.close().unwrap();
    drop(a);
    m.push(spare);
    let mut n = names(3);
    n.push("spare.img".into());
    let a = Array::assemble(dyn_members(&m), n, AssembleOptions::default()).unwrap();
    let r = a.report();
    assert_eq!(r.spare_devices, 1, "{r:?}");
    assert!(!r.state.degraded);
}

#[test]
fn raid6_second_failure_during_rebuild() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let shape = Shape::new(Level::Raid6, None, 16, 5).rows(64);
    let (a, m) = create(&shape);
    let a = Arc::new(a);
    let model = fill(&a, &mut rng);
    a.fail("disk1.img").unwrap();
    let spare = spare_like(&m);
    a.add(spare as Arc<dyn BlockDevice>, "spare.img".into(), false)
        .unwrap();
    a.manage(SpeedLimits {
        min: 1 << 20,
        max: 1 << 20,
    });
    std::thread::sleep(Duration::from_millis(300));
    let st = a.background().unwrap();
    assert_eq!(st.state, "running", "{st:?}");
    a.fail("disk3.img").unwrap();
    // Reads stay right while the rebuild goes on with two members down.
    check(&*a, &model, "raid6 with a second failure");
    let t0 = Instant::now();
    while a.background().unwrap().state == "running" {
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.background().unwrap().state, "finished");
    check(&*a, &model, "raid6 after the rebuild");
    let r = a.report();
    assert!(r.state.degraded, "disk3 is still out: {r:?}");
    assert!(!r.state.failed);
}

#[test]
fn raid5_losing_the_rebuild_source_gives_clean_errors() {
    let seed = test_seed("array_members");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let shape = Shape::new(Level::Raid5, None, 16, 4).rows(64);
    let (a, m) = create(&shape);
    let model = fill(&a, &mut rng);
    a.close().unwrap();
    drop(a);
    let faulty: Vec<Arc<FaultyDisk<MemDisk>>> = m
        .iter()
        .map(|d| Arc::new(FaultyDisk::new(MemDisk::from_bytes(&d.to_vec()))))
        .collect();
    let handle = faulty[2].handle();
    let devs = faulty
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = Arc::new(Array::assemble(devs, names(4), AssembleOptions::default()).unwrap());
    a.fail("disk1.img").unwrap();
    let spare = spare_like(&m);
    a.add(spare as Arc<dyn BlockDevice>, "spare.img".into(), false)
        .unwrap();
    a.manage(SpeedLimits {
        min: 1 << 20,
        max: 1 << 20,
    });
    std::thread::sleep(Duration::from_millis(300));
    // The operator cannot fail it (it would lose data) ... but an I/O error can.
    assert!(a.fail("disk2.img").is_err());
    handle.fail_always();
    let t0 = Instant::now();
    loop {
        let st = a.background().unwrap();
        if st.state != "running" {
            assert!(st.state.starts_with("failed"), "{st:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
        // Trigger the failure with a read somewhere on disk2.
        let mut b = vec![0u8; 64 << 10];
        let _ = a.read_at(&mut b, 0);
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every read either fails cleanly or returns the right bytes.
    let (mut good, mut bad) = (0, 0);
    let unit = 16 << 10;
    for off in (0..model.len() as u64).step_by(unit) {
        let mut b = vec![0u8; unit];
        match a.read_at(&mut b, off) {
            Ok(()) => {
                assert_eq!(
                    b,
                    model[off as usize..off as usize + unit],
                    "wrong data at {off}"
                );
                good += 1;
            }
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::Degraded | ErrorKind::Io),
                    "unexpected error kind at {off}: {e}"
                );
                bad += 1;
            }
        }
    }
    assert!(good > 0 && bad > 0, "good {good} bad {bad}");
    println!("{good} chunks read right, {bad} refused cleanly");
}

#[test]
fn bitmap_guided_re_add_rebuilds_only_dirty_chunks() {
    let seed = test_seed("array_members");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid5, None, 16, 4).rows(256),
        Shape::new(Level::Raid6, None, 16, 5).rows(256),
        Shape::new(Level::Raid1, None, 64, 2).rows(64),
        Shape::new(
            Level::Raid10,
            Some(
                Raid10Layout {
                    near: 2,
                    far: 1,
                    offset: false,
                }
                .to_raw(),
            ),
            16,
            4,
        )
        .rows(256),
    ] {
        let name = shape.name();
        let mut opts = shape.create_options();
        opts.bitmap = cairn_md::BitmapChoice::Internal {
            chunk_bytes: Some(64 << 10),
        };
        let m = common::mem_members(&shape);
        let a = Array::create(dyn_members(&m), names(m.len()), &opts).unwrap();
        let mut model = fill(&a, &mut rng);
        a.close().unwrap();
        drop(a);
        let a =
            Array::assemble(dyn_members(&m), names(m.len()), AssembleOptions::default()).unwrap();
        a.set_bitmap_daemon_sleep(Duration::ZERO);
        assert_eq!(a.bitmap_info().unwrap().dirty, 0, "{name}: clean start");
        a.fail("disk1.img").unwrap();
        a.remove("disk1.img").unwrap();
        // A known amount written while it is out: a few scattered 4 KiB writes.
        let writes = 5;
        for _ in 0..writes {
            let off = rng.gen_range(0..model.len() as u64 / 4096) * 4096;
            let mut b = vec![0u8; 4096];
            rng.fill(&mut b[..]);
            a.write_at(&b, off, WriteFlags::NONE).unwrap();
            model[off as usize..off as usize + 4096].copy_from_slice(&b);
        }
        a.flush().unwrap();
        let info = a.bitmap_info().unwrap();
        assert!(info.dirty >= 1, "{name}: {info:?}");
        let msg = a
            .add(
                m[1].clone() as Arc<dyn BlockDevice>,
                "disk1.img".into(),
                false,
            )
            .unwrap();
        assert!(
            msg.message.contains("only the"),
            "{name}: not bitmap-guided: {msg}"
        );
        a.run_pending().unwrap();
        let st = a.background().unwrap();
        assert_eq!(st.state, "finished");
        // Parity levels rebuild whole stripes: a chunk of member bytes per stripe. RAID10
        // counts member units of its walk; bound both by the dirty bits.
        let bound = (info.dirty + 1) * info.chunk_bytes;
        assert!(
            st.worked_bytes <= bound,
            "{name}: rebuilt {} bytes for {} dirty bits of {} ({st:?})",
            st.worked_bytes,
            info.dirty,
            info.chunk_bytes
        );
        assert!(st.worked_bytes > 0, "{name}");
        check(&a, &model, &name);
        a.close().unwrap();
        assert_eq!(
            a.bitmap_info().unwrap().dirty,
            0,
            "{name}: clean stop leaves bits"
        );
        drop(a);
        for leave_out in 0..shape.members {
            if leave_out != 1 {
                check_without(&m, leave_out, &model, &name);
            }
        }
        println!(
            "{name}: {} dirty bits of {} KiB, rebuilt {} KiB of {} KiB",
            info.dirty,
            info.chunk_bytes >> 10,
            st.worked_bytes >> 10,
            st.total_bytes >> 10
        );
    }
}

/// Client writes in `pipelined_mirror_rebuild_and_resync_over_slow_members` are at most
/// this large; a larger member operation is the background work's.
const CLIENT_MAX: usize = 32 << 10;

/// Makes the background work and a client write overlap by construction: once armed,
/// the client writes only at the end of the array (no unit the work locks first), and
/// the work's first member operation waits until such a write has finished since
/// [`Gate::hold_from`]. The wait gives up after 10 s (`timed_out`), so a broken
/// assumption fails the test instead of hanging it.
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    released: AtomicBool,
    timed_out: AtomicBool,
    /// Client writes finished at the end of the array since arming.
    end_writes: AtomicU64,
    /// What `end_writes` must pass before the work goes on.
    from: AtomicU64,
}

impl Gate {
    /// Whether the client must keep to the end of the array.
    fn holding(&self) -> bool {
        self.armed.load(Ordering::Acquire) && !self.released.load(Ordering::Acquire)
    }

    /// Holds the work's first operation until `end_writes` passes its value now.
    fn hold_from(&self) {
        self.from
            .store(self.end_writes.load(Ordering::Acquire), Ordering::Release);
    }

    /// A member operation of `len` bytes is about to start.
    fn pass(&self, len: usize) {
        if len <= CLIENT_MAX || !self.holding() {
            return;
        }
        let t = Instant::now();
        while self.end_writes.load(Ordering::Acquire) <= self.from.load(Ordering::Acquire) {
            if t.elapsed() > Duration::from_secs(10) {
                self.timed_out.store(true, Ordering::Release);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.released.store(true, Ordering::Release);
    }
}

/// A member behind a [`Gate`].
#[derive(Debug)]
struct Gated(Arc<DelayDisk>, Arc<Gate>);

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl BlockDevice for Gated {
    fn geometry(&self) -> cairn_block::Geometry {
        self.0.geometry()
    }
    fn capabilities(&self) -> cairn_block::Capabilities {
        self.0.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_block::Result<()> {
        self.1.pass(buf.len());
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        self.1.pass(buf.len());
        self.0.write_at(buf, offset, flags)
    }
    fn flush(&self) -> cairn_block::Result<()> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> cairn_block::Result<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        self.0.write_zeroes(offset, len, flags)
    }
}

/// RAID1/10 over members with latency: the rebuild and the resync read the next window
/// of 1 MiB units while the current one is written (pipeline.rs), holding its locks. A
/// client writing (and reading back) all the while must find every byte it wrote; the
/// rebuilt member must carry the survivors' data, and after the resync every copy must
/// hold the model.
#[test]
fn pipelined_mirror_rebuild_and_resync_over_slow_members() {
    let seed = test_seed("array_members pipelined mirrors");
    println!("seed {seed}");
    let r10 = Raid10Layout {
        near: 2,
        far: 1,
        offset: false,
    }
    .to_raw();
    for shape in [
        Shape::new(Level::Raid1, None, 64, 2).rows(96),
        Shape::new(Level::Raid10, Some(r10), 64, 4).rows(64),
    ] {
        for resync in [false, true] {
            let name = format!("{}{}", shape.name(), if resync { " resync" } else { "" });
            let mut rng = SmallRng::seed_from_u64(seed);
            // Members over old data (different on each) for the resync: the array
            // starts with a resync pending.
            let m: Vec<Arc<MemDisk>> = shape
                .member_bytes()
                .into_iter()
                .map(|b| {
                    let mut img = vec![0u8; usize::try_from(b).unwrap()];
                    if resync {
                        rng.fill(&mut img[..]);
                    }
                    Arc::new(MemDisk::from_bytes(&img))
                })
                .collect();
            let mut o = shape.create_options();
            o.members_zeroed = !resync;
            o.force = true;
            drop(Array::create(dyn_members(&m), names(m.len()), &o).unwrap());
            let slow: Vec<Arc<DelayDisk>> = m
                .iter()
                .map(|d| Arc::new(DelayDisk::new(d.clone() as Arc<dyn BlockDevice>)))
                .collect();
            for d in &slow {
                d.set_delay(Duration::from_millis(1));
            }
            let gate = Arc::new(Gate::default());
            let devs = slow
                .iter()
                .map(|d| Arc::new(Gated(d.clone(), gate.clone())) as Arc<dyn BlockDevice>)
                .collect();
            let a = Arc::new(
                Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap(),
            );
            assert_eq!(a.report().state.resync_pending, resync, "{name}");
            let model = Arc::new(std::sync::Mutex::new(fill(&a, &mut rng)));
            let mut m = m;
            let mut victim = None;
            if !resync {
                let v = rng.gen_range(0..shape.members);
                a.fail(&format!("disk{v}.img")).unwrap();
                let spare = spare_like(&m);
                let s = Arc::new(DelayDisk::new(spare.clone() as Arc<dyn BlockDevice>));
                s.set_delay(Duration::from_millis(1));
                let s = Arc::new(Gated(s, gate.clone()));
                a.add(s as Arc<dyn BlockDevice>, "spare.img".into(), false)
                    .unwrap();
                m[v] = spare;
                victim = Some(v);
            }
            let stop = Arc::new(AtomicBool::new(false));
            let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let writer = {
                let (a, model, stop, count, gate) = (
                    a.clone(),
                    model.clone(),
                    stop.clone(),
                    count.clone(),
                    gate.clone(),
                );
                let mut rng = SmallRng::seed_from_u64(seed ^ 0xabcd);
                std::thread::spawn(move || {
                    let size = a.geometry().size;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Acquire) || n < 20 {
                        let len = rng.gen_range(1..=64u64) * 512;
                        // While the gate holds, in the last 64 KiB: away from the unit
                        // the work holds first.
                        let holding = gate.holding();
                        let lo = if holding {
                            (size - (64 << 10)) / 512
                        } else {
                            0
                        };
                        let off = rng.gen_range(lo..(size - len) / 512) * 512;
                        let mut buf = vec![0u8; len as usize];
                        rng.fill(&mut buf[..]);
                        let mut model = model.lock().unwrap();
                        a.write_at(&buf, off, WriteFlags::NONE).unwrap();
                        model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                        drop(model);
                        let mut back = vec![0u8; len as usize];
                        a.read_at(&mut back, off).unwrap();
                        assert_eq!(back, buf, "a write read back");
                        n += 1;
                        count.store(n, Ordering::Release);
                        if holding {
                            gate.end_writes.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    n
                })
            };
            while count.load(Ordering::Acquire) < 2 {
                std::thread::sleep(Duration::from_millis(1));
            }
            // The writer keeps to the end of the array from its next write on; once one
            // such write is done, none of its writes can wait for the work's first unit.
            gate.armed.store(true, Ordering::Release);
            let armed = gate.end_writes.load(Ordering::Acquire);
            while gate.end_writes.load(Ordering::Acquire) == armed {
                std::thread::sleep(Duration::from_millis(1));
            }
            gate.hold_from();
            // Unpaced, on this thread, while the writer runs; its first member operation
            // waits for a client write to finish.
            let before = count.load(Ordering::Acquire);
            a.run_pending().unwrap();
            let during = count.load(Ordering::Acquire) - before;
            stop.store(true, Ordering::Release);
            let writes = writer.join().unwrap();
            assert!(
                gate.released.load(Ordering::Acquire),
                "{name}: the work never reached a member"
            );
            assert!(
                !gate.timed_out.load(Ordering::Acquire),
                "{name}: no client write finished while the work waited"
            );
            assert!(during > 0, "{name}: no write overlapped the work");
            let r = a.report();
            assert!(
                !r.state.degraded && !r.state.resync_pending,
                "{name}: {r:?}"
            );
            let model = model.lock().unwrap().clone();
            check(&*a, &model, &format!("{name} after the pipelined work"));
            a.close().unwrap();
            drop(a);
            // Every copy holds the model: whichever member is left out, the rest read it
            // (the rebuilt one among them).
            for leave_out in 0..shape.members {
                if Some(leave_out) != victim || resync {
                    check_without(&m, leave_out, &model, &name);
                }
            }
            if let Some(v) = victim {
                // The rebuilt member alone with the copies it pairs with: RAID1 x2
                // leaves it alone.
                let others: Vec<usize> = (0..shape.members).filter(|&i| i != v).collect();
                if shape.members == 2 {
                    check_without(&m, others[0], &model, &format!("{name} rebuilt alone"));
                }
            }
            println!("{name}: {writes} writes, {during} during the pipelined work");
        }
    }
}

/// What the member operations of a copy did, in the members' data areas: the bytes
/// written to the device copied to, and whether one of its writes was ever in flight
/// while a read of another member was. A pipelined copy reads the next window while it
/// writes the current one; a unit-by-unit copy never has both in flight at once.
#[derive(Debug, Default)]
struct Gauge {
    reads: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
    overlapped: AtomicBool,
    written: std::sync::atomic::AtomicU64,
}

/// A member (or the device copied to, `target`) counted by a [`Gauge`]; operations
/// below `data_offset` (superblock, bitmap) are not counted.
#[derive(Debug)]
struct Gauged {
    inner: Arc<dyn BlockDevice>,
    gauge: Arc<Gauge>,
    data_offset: u64,
    target: bool,
}

impl BlockDevice for Gauged {
    fn geometry(&self) -> cairn_block::Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> cairn_block::Capabilities {
        self.inner.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_block::Result<()> {
        if self.target || offset < self.data_offset {
            return self.inner.read_at(buf, offset);
        }
        let g = &self.gauge;
        g.reads.fetch_add(1, Ordering::SeqCst);
        if g.writes.load(Ordering::SeqCst) > 0 {
            g.overlapped.store(true, Ordering::SeqCst);
        }
        let r = self.inner.read_at(buf, offset);
        g.reads.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        if !self.target || offset < self.data_offset {
            return self.inner.write_at(buf, offset, flags);
        }
        let g = &self.gauge;
        g.written.fetch_add(buf.len() as u64, Ordering::SeqCst);
        g.writes.fetch_add(1, Ordering::SeqCst);
        if g.reads.load(Ordering::SeqCst) > 0 {
            g.overlapped.store(true, Ordering::SeqCst);
        }
        let r = self.inner.write_at(buf, offset, flags);
        g.writes.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> cairn_block::Result<()> {
        self.inner.flush()
    }
}

/// `dev` behind a 1 ms DelayDisk, counted by `gauge`.
fn gauged(
    dev: Arc<dyn BlockDevice>,
    gauge: &Arc<Gauge>,
    data_offset: u64,
    target: bool,
) -> Arc<dyn BlockDevice> {
    let slow = DelayDisk::new(dev);
    slow.set_delay(Duration::from_millis(1));
    Arc::new(Gauged {
        inner: Arc::new(slow),
        gauge: gauge.clone(),
        data_offset,
        target,
    })
}

fn data_offset_of(dev: &dyn BlockDevice) -> u64 {
    cairn_md::Superblock::read_from(dev, "m", cairn_md::FeaturePolicy::Supported)
        .unwrap()
        .data_offset
        .0
        * 512
}

/// Shapes for the pipelined copies over slow members: enough units that the walk takes
/// several windows (parity: 16 stripes; mirrors: 4 units of 1 MiB).
fn slow_copy_shapes() -> Vec<Shape> {
    let r10 = Raid10Layout {
        near: 2,
        far: 1,
        offset: false,
    }
    .to_raw();
    vec![
        Shape::new(Level::Raid5, None, 16, 4).rows(256),
        Shape::new(Level::Raid6, None, 16, 5).rows(256),
        Shape::new(Level::Raid1, None, 64, 2).rows(256),
        // 64 KiB chunks: a window's lock keys (one per chunk) and the next window's
        // fit the lock table together, so the read-ahead gets its locks.
        Shape::new(Level::Raid10, Some(r10), 64, 4).rows(256),
    ]
}

/// A client writing (and reading back) random pieces of `a` until `stop` (at least 10),
/// updating `model`; returns its count. Every other write lands near the array byte
/// `near` gives for the background job's progress (0 to 1), where the copy is.
fn racing_writer(
    a: &Arc<Array>,
    model: &Arc<std::sync::Mutex<Vec<u8>>>,
    stop: &Arc<AtomicBool>,
    seed: u64,
    near: fn(f64, u64) -> u64,
) -> std::thread::JoinHandle<u64> {
    let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
    let mut rng = SmallRng::seed_from_u64(seed);
    std::thread::spawn(move || {
        let size = a.geometry().size;
        let mut n = 0u64;
        while !stop.load(Ordering::Acquire) || n < 10 {
            let len = rng.gen_range(1..=16u64) * 512;
            let progress = a
                .background()
                .filter(|st| st.total_bytes > 0)
                .map(|st| st.done_bytes as f64 / st.total_bytes as f64);
            let off = match progress {
                Some(p) if n.is_multiple_of(2) => {
                    let at = near(p, size) + rng.gen_range(0..256u64 << 10);
                    at.min(size - len) / 512 * 512
                }
                _ => rng.gen_range(0..(size - len) / 512) * 512,
            };
            let mut buf = vec![0u8; len as usize];
            rng.fill(&mut buf[..]);
            let mut model = model.lock().unwrap();
            a.write_at(&buf, off, WriteFlags::NONE).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&buf);
            drop(model);
            let mut back = vec![0u8; len as usize];
            a.read_at(&mut back, off).unwrap();
            assert_eq!(back, buf, "a write read back");
            n += 1;
        }
        n
    })
}

/// `cairn md replace` over slow members, pipelined (pipeline.rs): the member replaced
/// has a bad range, which the copy rebuilds from the others (parity) or reads from
/// another copy (mirrors). Alone, the replacement ends byte for byte equal to the member
/// and the copy overlaps its reads with its writes; with a client writing all the
/// while, every write is kept, and the new member carries its part.
#[test]
fn a_pipelined_replace_over_slow_members() {
    let seed = test_seed("array_members pipelined replace");
    println!("seed {seed}");
    for shape in slow_copy_shapes() {
        for racing in [false, true] {
            let name = format!("{}{}", shape.name(), if racing { " racing" } else { "" });
            let mut rng = SmallRng::seed_from_u64(seed);
            let (a, m) = create(&shape);
            a.close().unwrap();
            drop(a);
            let off = data_offset_of(&*m[0]);
            let extent = shape.rows * shape.chunk_kib * 1024;
            // Member 0, the one replaced, fails reads of 64 KiB in the middle of its data.
            let bad = Arc::new(FaultyDisk::new(MemDisk::from_bytes(&m[0].to_vec())));
            let bad_at = off + extent / 2;
            bad.handle()
                .fail_range(cairn_block::testkit::Op::Read, bad_at..bad_at + (64 << 10));
            let gauge = Arc::new(Gauge::default());
            let devs = (0..shape.members)
                .map(|i| {
                    let d = if i == 0 {
                        bad.clone() as Arc<dyn BlockDevice>
                    } else {
                        m[i].clone() as Arc<dyn BlockDevice>
                    };
                    gauged(d, &gauge, off, false)
                })
                .collect();
            let a = Arc::new(
                Array::assemble(devs, names(shape.members), AssembleOptions::default()).unwrap(),
            );
            let model = Arc::new(std::sync::Mutex::new(fill(&a, &mut rng)));
            let new = spare_like(&m);
            let target = gauged(new.clone() as Arc<dyn BlockDevice>, &gauge, off, true);
            a.replace("disk0.img", Some((target, "new.img".into())), false)
                .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let writer = racing.then(|| {
                racing_writer(&a, &model, &stop, seed ^ 0x7e91, |p, size| {
                    (p * size as f64) as u64
                })
            });
            a.run_pending().unwrap();
            stop.store(true, Ordering::Release);
            let writes = writer.map(|w| w.join().unwrap());
            assert_eq!(roles_of(&a)[0].as_deref(), Some("new.img"), "{name}");
            let model = model.lock().unwrap().clone();
            check(&*a, &model, &name);
            a.close().unwrap();
            drop(a);
            assert_eq!(data_offset_of(&*new), off, "{name}");
            if !racing {
                let old = bad.inner().to_vec();
                let copy = new.to_vec();
                let range = off as usize..(off + extent) as usize;
                assert!(
                    old[range.clone()] == copy[range],
                    "{name}: the replacement differs from the member"
                );
                assert!(
                    gauge.overlapped.load(Ordering::SeqCst),
                    "{name}: no replacement write overlapped a member read"
                );
            }
            let mut m = m;
            m[0] = new;
            for leave_out in 1..shape.members {
                check_without(&m, leave_out, &model, &name);
            }
            println!(
                "{name}: {} KiB written to the replacement, {writes:?} racing writes",
                gauge.written.load(Ordering::SeqCst) >> 10
            );
        }
    }
}

/// A bitmap-guided re-add over slow members, pipelined: it writes to the member only the
/// bitmap's dirty chunks (parity levels and RAID1 count member bytes: exactly the dirty
/// bits times the bitmap chunk; RAID10's bitmap counts array bytes, of which the member
/// holds a part), reads ahead within a long dirty run (a read overlaps a write to the
/// member), and jumps the clean ones; with a client writing all the while every write is
/// kept. Either way the re-added member carries its part afterwards.
#[test]
fn a_pipelined_guided_re_add_over_slow_members() {
    let seed = test_seed("array_members pipelined re-add");
    println!("seed {seed}");
    for shape in slow_copy_shapes() {
        for racing in [false, true] {
            let name = format!("{}{}", shape.name(), if racing { " racing" } else { "" });
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut opts = shape.create_options();
            let bitmap_chunk = 64 << 10;
            opts.bitmap = cairn_md::BitmapChoice::Internal {
                chunk_bytes: Some(bitmap_chunk),
            };
            let m = common::mem_members(&shape);
            let a = Array::create(dyn_members(&m), names(m.len()), &opts).unwrap();
            let model = fill(&a, &mut rng);
            a.close().unwrap();
            drop(a);
            let off = data_offset_of(&*m[0]);
            let gauge = Arc::new(Gauge::default());
            let devs = m
                .iter()
                .map(|d| gauged(d.clone() as Arc<dyn BlockDevice>, &gauge, off, false))
                .collect();
            let a = Arc::new(
                Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap(),
            );
            a.set_bitmap_daemon_sleep(Duration::ZERO);
            a.fail("disk1.img").unwrap();
            a.remove("disk1.img").unwrap();
            // While it is out: a long run (several windows of units) and a few
            // scattered 4 KiB writes.
            let mut model = model;
            let size = model.len() as u64;
            let long = (size / 5 / bitmap_chunk * bitmap_chunk, size * 3 / 5);
            let mut writes = vec![long];
            for _ in 0..5 {
                writes.push((rng.gen_range(0..size / 4096) * 4096, 4096));
            }
            for (at, len) in writes {
                let mut b = vec![0u8; len as usize];
                rng.fill(&mut b[..]);
                a.write_at(&b, at, WriteFlags::NONE).unwrap();
                model[at as usize..(at + len) as usize].copy_from_slice(&b);
            }
            a.flush().unwrap();
            let info = a.bitmap_info().unwrap();
            let target = gauged(m[1].clone() as Arc<dyn BlockDevice>, &gauge, off, true);
            let msg = a.add(target, "disk1.img".into(), false).unwrap();
            assert!(msg.message.contains("only the"), "{name}: {msg}");
            let model = Arc::new(std::sync::Mutex::new(model));
            let stop = Arc::new(AtomicBool::new(false));
            // The dirty work is mostly the long run.
            let writer = racing.then(|| {
                racing_writer(&a, &model, &stop, seed ^ 0x2ead, |p, size| {
                    size / 5 + (p * size as f64 * 0.6) as u64
                })
            });
            a.run_pending().unwrap();
            stop.store(true, Ordering::Release);
            let racing_writes = writer.map(|w| w.join().unwrap());
            let st = a.background().unwrap();
            assert_eq!(st.state, "finished", "{name}");
            assert!(!a.report().state.degraded, "{name}");
            let written = gauge.written.load(Ordering::SeqCst);
            if !racing {
                let dirty_bytes = info.dirty * info.chunk_bytes;
                assert!(written > 0, "{name}");
                if shape.level == Level::Raid10 {
                    assert!(
                        written <= dirty_bytes && st.worked_bytes <= dirty_bytes,
                        "{name}: {written} bytes written, {} worked, for {} dirty bits",
                        st.worked_bytes,
                        info.dirty
                    );
                } else {
                    assert_eq!(
                        (written, st.worked_bytes),
                        (dirty_bytes, dirty_bytes),
                        "{name}: bytes written and worked for {} dirty bits",
                        info.dirty
                    );
                }
                assert!(
                    gauge.overlapped.load(Ordering::SeqCst),
                    "{name}: no write to the member overlapped a read of the others"
                );
            }
            let model = model.lock().unwrap().clone();
            check(&*a, &model, &name);
            a.close().unwrap();
            drop(a);
            for leave_out in (0..shape.members).filter(|&i| i != 1) {
                check_without(&m, leave_out, &model, &name);
            }
            println!(
                "{name}: {} dirty bits of {} KiB, {} KiB written to the member, \
                 {racing_writes:?} racing writes",
                info.dirty,
                info.chunk_bytes >> 10,
                written >> 10
            );
        }
    }
}

/// A replacement whose writes fail part-way through the pipelined copy is dropped: the
/// copy ends with the error, the member it was to replace goes on serving its role, and
/// nothing is lost.
#[test]
fn a_replacement_failing_writes_is_dropped_and_the_member_serves() {
    let seed = test_seed("array_members replacement fails");
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    for shape in [
        Shape::new(Level::Raid5, None, 16, 4).rows(64),
        Shape::new(Level::Raid1, None, 64, 2).rows(64),
    ] {
        let name = shape.name();
        let (a, m) = create(&shape);
        let model = fill(&a, &mut rng);
        let off = data_offset_of(&*m[0]);
        let extent = shape.rows * shape.chunk_kib * 1024;
        let new = Arc::new(FaultyDisk::new(MemDisk::new(m[0].geometry().size)));
        let bad_at = off + extent / 2;
        new.handle()
            .fail_range(cairn_block::testkit::Op::Write, bad_at..bad_at + (64 << 10));
        a.replace(
            "disk0.img",
            Some((new.clone() as Arc<dyn BlockDevice>, "new.img".into())),
            false,
        )
        .unwrap();
        let e = a.run_pending().unwrap_err();
        println!("{name}: {e}");
        let st = a.background().unwrap();
        assert!(st.state.starts_with("failed"), "{name}: {st:?}");
        let r = a.report();
        assert!(
            !r.members
                .iter()
                .any(|x| x.state == MemberState::Replacement),
            "{name}: {r:?}"
        );
        assert!(!r.state.degraded, "{name}: {r:?}");
        assert_eq!(roles_of(&a)[0].as_deref(), Some("disk0.img"), "{name}");
        check(&a, &model, &name);
        a.close().unwrap();
        drop(a);
        for leave_out in 0..shape.members {
            check_without(&m, leave_out, &model, &name);
        }
    }
}
