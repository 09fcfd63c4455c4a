//! Safety rules around assembly (issue 12): read-only assemblies never write; stale
//! members are refused precisely; `force` assembles from the freshest members after a
//! shared failure; resync follows the bitmap and goes on past a member failure.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_block::{BlockDevice, Capabilities, Error, ErrorKind, Geometry, MemDisk, WriteFlags};
use cairn_md::{Array, AssembleOptions, Level};
use common::{dyn_members, names, read_all, Shape};

/// A member opened read-only: reads pass through, every write attempt is counted and
/// refused, as a file opened O_RDONLY refuses it.
#[derive(Debug)]
struct ReadOnly {
    inner: Arc<MemDisk>,
    writes: AtomicU64,
}

impl BlockDevice for ReadOnly {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: true,
            ..self.inner.capabilities()
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_block::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, _: &[u8], _: u64, _: WriteFlags) -> cairn_block::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        Err(Error::new(ErrorKind::ReadOnly, "opened read-only"))
    }
}

fn copies(m: &[Arc<MemDisk>]) -> Vec<Arc<MemDisk>> {
    m.iter()
        .map(|d| Arc::new(MemDisk::from_bytes(&d.to_vec())))
        .collect()
}

/// A RAID5 (with and without its partial-parity log) and a RAID1, caught while open
/// and written (dirty, bits set): assembled from read-only members, looked at, dropped.
#[test]
fn a_read_only_assembly_never_writes() {
    for (level, journal) in [
        (Level::Raid5, true),
        (Level::Raid5, false),
        (Level::Raid1, true),
    ] {
        let shape = Shape::new(level, None, 64, if level == Level::Raid1 { 2 } else { 4 });
        let m = common::mem_members(&shape);
        let mut o = shape.create_options();
        o.write_journal = journal;
        let a = Array::create(dyn_members(&m), names(m.len()), &o).unwrap();
        let data: Vec<u8> = (0..a.geometry().size).map(|i| (i % 253) as u8).collect();
        a.write_at(&data, 0, WriteFlags::NONE).unwrap();
        a.flush().unwrap();
        // The array is being served: its members as they are now.
        let served = copies(&m);
        let before: Vec<Vec<u8>> = served.iter().map(|d| d.to_vec()).collect();
        let ro: Vec<Arc<ReadOnly>> = served
            .iter()
            .map(|d| {
                Arc::new(ReadOnly {
                    inner: d.clone(),
                    writes: AtomicU64::new(0),
                })
            })
            .collect();
        let devs: Vec<Arc<dyn BlockDevice>> = ro
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let b = Array::assemble(devs, names(ro.len()), AssembleOptions::default()).unwrap();
        let r = b.report();
        assert!(!r.state.clean, "{level}: the served array is active");
        assert!(
            r.members
                .iter()
                .all(|x| x.state == cairn_md::report::MemberState::ActiveSync),
            "{level}: {r:?}"
        );
        assert!(read_all(&b) == data, "{level}");
        b.close().unwrap();
        drop(b);
        for (i, d) in ro.iter().enumerate() {
            assert_eq!(
                d.writes.load(Ordering::Relaxed),
                0,
                "{level}: member {i} written"
            );
            assert!(
                served[i].to_vec() == before[i],
                "{level}: member {i} changed"
            );
        }
        drop(a);
    }
}

/// A crash with 1 of 64 bitmap bits dirty: the resync at 1 MiB/s (md's minimum is
/// about that) covers the dirty stripe only, and its progress, time and pacing follow
/// that stripe, not the 12 MiB array (12 s at that speed).
#[test]
fn a_bitmap_resync_is_as_long_as_its_dirty_bits() {
    let shape = Shape::new(Level::Raid5, None, 64, 4).rows(64);
    let m = common::mem_members(&shape);
    let mut o = shape.create_options();
    o.bitmap = cairn_md::BitmapChoice::Internal {
        chunk_bytes: Some(64 * common::KIB),
    };
    let a = Array::create(dyn_members(&m), names(m.len()), &o).unwrap();
    let size = a.geometry().size;
    a.write_at(&[7u8; 4096], size / 2, WriteFlags::NONE)
        .unwrap();
    a.flush().unwrap();
    let crashed = copies(&m);
    drop(a);
    let a = Arc::new(
        Array::assemble(dyn_members(&crashed), names(4), AssembleOptions::default()).unwrap(),
    );
    let info = a.bitmap_info().unwrap();
    assert_eq!((info.dirty, info.chunks), (1, 64), "{info:?}");
    let stripe = 3 * 64 * common::KIB;
    let mib = cairn_md::SpeedLimits {
        min: 1 << 20,
        max: 1 << 20,
    };
    let start = std::time::Instant::now();
    assert!(a.start_resync(mib).unwrap());
    let st = a.background().unwrap();
    assert_eq!(
        st.total_bytes, stripe,
        "progress counts the dirty stripe: {st:?}"
    );
    let st = loop {
        let st = a.background().unwrap();
        if st.state != "running" {
            break st;
        }
        assert!(
            start.elapsed().as_secs() < 20,
            "resync never finished: {st:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = start.elapsed();
    assert_eq!(st.state, "finished", "{st:?}");
    assert_eq!((st.done_bytes, st.worked_bytes), (stripe, stripe), "{st:?}");
    assert!(
        took < std::time::Duration::from_secs(2),
        "a resync of one dirty 192 KiB stripe at 1 MiB/s took {took:?}"
    );
    assert!(!a.report().state.resync_pending);
    let mut back = [0u8; 4096];
    a.read_at(&mut back, size / 2).unwrap();
    assert_eq!(back, [7u8; 4096]);
}

/// After `replace`, the original member list: the old member is stale (its role now
/// belongs to the new device, which is not given). Starting degraded because of it needs
/// force, and the refusal counts one missing role and says why once.
#[test]
fn a_replaced_member_is_stale_and_a_degraded_start_needs_force() {
    let (a, m) = common::create(&Shape::new(Level::Raid5, None, 64, 4));
    let data: Vec<u8> = (0..a.geometry().size).map(|i| (i % 249) as u8).collect();
    a.write_at(&data, 0, WriteFlags::NONE).unwrap();
    let new = Arc::new(MemDisk::new(m[0].geometry().size));
    a.replace(
        "disk1.img",
        Some((new.clone() as Arc<dyn BlockDevice>, "new.img".into())),
        false,
    )
    .unwrap();
    a.run_pending().unwrap();
    a.remove("disk1.img").unwrap();
    a.close().unwrap();
    drop(a);
    let e = Array::assemble(dyn_members(&m), names(4), AssembleOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Degraded, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("1 of 4 members missing"), "{msg}");
    assert!(msg.contains("disk1.img") && msg.contains("stale"), "{msg}");
    assert_eq!(msg.matches("disk1.img").count(), 1, "said once: {msg}");
    assert!(msg.contains("force"), "{msg}");
    // With force it starts degraded, without the stale member, and the data is there.
    let a = Array::assemble(dyn_members(&m), names(4), AssembleOptions { force: true }).unwrap();
    let r = a.report();
    assert!(r.state.degraded, "{}", r.state_text);
    assert!(read_all(&a) == data);
    drop(a);
    // The current members start as they are.
    let mut cur = m.clone();
    cur[1] = new;
    let a = Array::assemble(dyn_members(&cur), names(4), AssembleOptions::default()).unwrap();
    assert!(!a.report().state.degraded);
    assert!(read_all(&a) == data);
}

/// RAID6 x4 whose members fail one after another by write errors on their data areas
/// (a shared full filesystem: superblocks, already allocated, still take updates), until
/// a write is refused. Each superblock records the others' failures as it saw them.
/// Without force the restart is refused; with force the freshest members by event count
/// are taken (mdadm --assemble --force) and every acknowledged write reads back.
#[test]
fn force_assembles_from_the_freshest_after_a_shared_failure() {
    use cairn_block::testkit::{FaultyDisk, Ops};
    let shape = Shape::new(Level::Raid6, None, 64, 4).rows(16);
    let (a, m) = common::create(&shape);
    a.close().unwrap();
    drop(a);
    let f: Vec<Arc<FaultyDisk<Arc<MemDisk>>>> = m
        .iter()
        .map(|d| Arc::new(FaultyDisk::new(d.clone())))
        .collect();
    let devs: Vec<Arc<dyn BlockDevice>> = f
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = Array::assemble(devs, names(4), AssembleOptions::default()).unwrap();
    let base = common::bases(&m)[0];
    let end = m[0].geometry().size;
    let stripe = 2 * 64 * common::KIB;
    let region = |i: u64| {
        let byte = u8::try_from(0x10 + i).unwrap();
        (vec![byte; common::us(stripe)], i * 2 * stripe)
    };
    let mut acked = Vec::new();
    // Region 0 with all four; then one member after another loses its data area.
    for (i, fail) in [None, Some(0usize), Some(1)].into_iter().enumerate() {
        if let Some(d) = fail {
            f[d].handle()
                .fail_range(Ops::from(cairn_block::testkit::Op::Write), base..end);
        }
        let (data, off) = region(i as u64);
        a.write_at(&data, off, WriteFlags::NONE).unwrap();
        a.flush().unwrap();
        acked.push((data, off));
    }
    assert!(a.report().state.degraded);
    for d in [2, 3] {
        f[d].handle()
            .fail_range(Ops::from(cairn_block::testkit::Op::Write), base..end);
    }
    let (data, off) = region(3);
    assert!(
        a.write_at(&data, off, WriteFlags::NONE).is_err(),
        "no member left to write"
    );
    drop(a);
    // The space is back: the member images as the failures left them.
    let imgs = copies(&m);
    let events: Vec<u64> = imgs
        .iter()
        .map(|d| {
            cairn_md::Superblock::read_from(&**d, "d", cairn_md::FeaturePolicy::Supported)
                .unwrap()
                .events
        })
        .collect();
    println!("events {events:?}");
    let e = Array::assemble(dyn_members(&imgs), names(4), AssembleOptions::default()).unwrap_err();
    println!("without force: {e}");
    assert_eq!(e.kind(), ErrorKind::Degraded, "{e}");
    assert!(e.to_string().contains("with force the freshest"), "{e}");
    let a = Array::assemble(
        dyn_members(&imgs),
        names(4),
        AssembleOptions { force: true },
    )
    .unwrap_or_else(|e| panic!("force: {e}"));
    let r = a.report();
    println!("{}", r.state_text);
    assert!(r.state.forced, "{}", r.state_text);
    for (data, off) in &acked {
        let mut back = vec![0u8; data.len()];
        a.read_at(&mut back, *off).unwrap();
        assert!(back == *data, "acknowledged data at {off} lost");
    }
    // Writable, and the members taken are brought to the same events.
    a.write_at(&data, off, WriteFlags::NONE).unwrap();
    a.close().unwrap();
    drop(a);
    let a = Array::assemble(dyn_members(&imgs), names(4), AssembleOptions::default())
        .unwrap_or_else(|e| panic!("after a forced start, a plain one: {e}"));
    let mut back = vec![0u8; data.len()];
    a.read_at(&mut back, off).unwrap();
    assert!(back == data);
}

/// A resync goes on past a member failure while redundancy remains, as md's does: a
/// RAID6 (and a 3-way RAID1) created over old data loses a member part-way through its
/// resync; the resync finishes over the others and leaves them consistent, degraded.
#[test]
fn a_resync_goes_on_past_a_member_failure() {
    use cairn_block::testkit::{Fault, FaultyDisk, Op};
    for (shape, after) in [
        (Shape::new(Level::Raid6, None, 16, 5).rows(32), 4),
        (Shape::new(Level::Raid1, None, 64, 3).rows(64), 1),
    ] {
        let name = shape.name();
        // Members full of old data: the array starts with a full resync pending.
        let m: Vec<Arc<MemDisk>> = shape
            .member_bytes()
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                Arc::new(MemDisk::from_bytes(
                    &(0..b)
                        .map(|x| (x % 251) as u8 ^ u8::try_from(i).unwrap())
                        .collect::<Vec<_>>(),
                ))
            })
            .collect();
        let mut o = shape.create_options();
        o.members_zeroed = false;
        o.force = true;
        drop(Array::create(dyn_members(&m), names(m.len()), &o).unwrap());
        let f: Vec<Arc<FaultyDisk<Arc<MemDisk>>>> = m
            .iter()
            .map(|d| Arc::new(FaultyDisk::new(d.clone())))
            .collect();
        let devs: Vec<Arc<dyn BlockDevice>> = f
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let a = Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap();
        assert!(a.report().state.resync_pending, "{name}");
        let base = common::bases(&m)[1];
        // Member 1 takes a few resync writes, then fails every write to its data area.
        f[1].handle().inject(
            Fault::new(Op::Write)
                .in_range(base..m[1].geometry().size)
                .after(after),
        );
        a.resync()
            .unwrap_or_else(|e| panic!("{name}: the resync stopped: {e}"));
        let r = a.report();
        assert!(r.state.degraded, "{name}: {}", r.state_text);
        assert!(!r.state.resync_pending, "{name}: {}", r.state_text);
        let data = read_all(&a);
        let layout = a.layout().clone();
        a.close().unwrap();
        drop(a);
        let images: Vec<Option<Vec<u8>>> = m
            .iter()
            .enumerate()
            .map(|(i, d)| (i != 1).then(|| d.to_vec()))
            .collect();
        common::check_members(&layout, &images, &common::bases(&m), &data)
            .unwrap_or_else(|e| panic!("{name}: after the resync: {e}"));
    }
}

/// The re-add counterpart of the bitmap resync: a member that comes back after one
/// write is rebuilt at the speed limit over what it missed, not over its whole size, so
/// it is in sync again in the time that write's stripe takes (issue 13: a re-add said
/// "only the bytes the bitmap marks" and then paced a walk over the whole member).
#[test]
fn a_bitmap_guided_re_add_is_as_long_as_what_it_missed() {
    let shape = Shape::new(Level::Raid5, None, 64, 4).rows(256);
    let m = common::mem_members(&shape);
    let mut o = shape.create_options();
    o.bitmap = cairn_md::BitmapChoice::Internal {
        chunk_bytes: Some(64 * common::KIB),
    };
    let a = Arc::new(Array::create(dyn_members(&m), names(m.len()), &o).unwrap());
    a.fail("disk1.img").unwrap();
    a.remove("disk1.img").unwrap();
    let size = a.geometry().size;
    a.write_at(&[9u8; 4096], size / 2, WriteFlags::NONE)
        .unwrap();
    a.flush().unwrap();
    let mib = cairn_md::SpeedLimits {
        min: 1 << 20,
        max: 1 << 20,
    };
    a.manage(mib);
    let start = std::time::Instant::now();
    let msg = a
        .add(
            m[1].clone() as Arc<dyn BlockDevice>,
            "disk1.img".into(),
            false,
        )
        .unwrap();
    assert!(msg.message.contains("only the"), "not bitmap-guided: {msg}");
    let st = loop {
        if let Some(st) = a.background() {
            if st.action == "recovery" && st.state != "running" {
                break st;
            }
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "re-add never finished: {:?}",
            a.background()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = start.elapsed();
    assert_eq!(st.state, "finished", "{st:?}");
    // One 64 KiB chunk of the member per dirty stripe; the member is 16 MiB, which at
    // 1 MiB/s took 16 s before.
    assert_eq!(st.total_bytes, 64 * common::KIB, "{st:?}");
    assert_eq!(st.done_bytes, st.total_bytes, "{st:?}");
    assert!(
        took < std::time::Duration::from_secs(3),
        "a re-add that missed one stripe took {took:?} at 1 MiB/s ({st:?})"
    );
    assert!(!a.report().state.degraded);
    let mut back = [0u8; 4096];
    a.read_at(&mut back, size / 2).unwrap();
    assert_eq!(back, [9u8; 4096]);
    a.close().unwrap();
}
