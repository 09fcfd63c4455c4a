//! Assembly and creation rules, reports, and member faults at run time.

mod common;

use std::sync::Arc;

use cairn_block::testkit::{Fault, FaultyDisk, Ops};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_md::report::MemberState;
use cairn_md::{
    Array, AssembleOptions, CreateOptions, DevRole, FeaturePolicy, Level, Raid10Layout, Sectors,
    Superblock,
};
use common::{create, dyn_members, names, read_all, us, Shape, MIB};

fn assemble(members: &[Arc<MemDisk>], keep: &[usize], force: bool) -> cairn_block::Result<Array> {
    let devs = keep
        .iter()
        .map(|&i| members[i].clone() as Arc<dyn BlockDevice>)
        .collect();
    let nm = keep.iter().map(|&i| format!("disk{i}.img")).collect();
    Array::assemble(devs, nm, AssembleOptions { force })
}

fn filled(a: &Array, byte: u8) -> Vec<u8> {
    let size = a.geometry().size;
    let data: Vec<u8> = (0..size).map(|i| byte ^ (i % 251) as u8).collect();
    a.write_at(&data, 0, WriteFlags::NONE).unwrap();
    data
}

#[test]
fn members_in_any_order_and_the_report() {
    let (a, m) = create(&Shape::new(Level::Raid6, None, 64, 5));
    let data = filled(&a, 7);
    a.close().unwrap();
    drop(a);
    let a = assemble(&m, &[3, 1, 4, 0, 2], false).unwrap();
    assert!(read_all(&a) == data);
    let r = a.report();
    assert_eq!(r.level, Level::Raid6);
    assert_eq!(r.layout.as_deref(), Some("left-symmetric"));
    assert_eq!(r.chunk_kib, Some(64));
    assert_eq!(r.raid_devices, 5);
    assert_eq!(r.active_devices, 5);
    assert_eq!(r.state_text, "clean");
    assert_eq!(r.name, "test");
    for (i, mem) in r.members.iter().enumerate() {
        assert_eq!(mem.role, Some(u32::try_from(i).unwrap()));
        assert_eq!(mem.name.as_deref(), Some(format!("disk{i}.img").as_str()));
        assert_eq!(mem.state, MemberState::ActiveSync);
    }
    let text = r.to_string();
    for want in [
        "Raid Level : raid6",
        "Raid Devices : 5",
        "State : clean",
        "Layout : left-symmetric",
        "Chunk Size : 64K",
        "active sync",
        "disk4.img",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["level"], "raid6");
    assert_eq!(json["state"]["clean"], true);
    assert_eq!(json["members"][2]["state"], "active-sync");
    assert_eq!(json["uuid"].as_str().unwrap().len(), 35);
}

#[test]
fn mixed_arrays_are_refused_naming_both() {
    let (a, m1) = create(&Shape::new(Level::Raid1, None, 64, 2));
    let (b, m2) = create(&Shape::new(Level::Raid1, None, 64, 2));
    let (ua, ub) = (a.uuid(), b.uuid());
    drop((a, b));
    let devs = vec![
        m1[0].clone() as Arc<dyn BlockDevice>,
        m2[1].clone() as Arc<dyn BlockDevice>,
    ];
    let e = Array::assemble(
        devs,
        vec!["a0".into(), "b1".into()],
        AssembleOptions::default(),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    for want in [
        "a0",
        "b1",
        &ua.to_string(),
        &ub.to_string(),
        "different arrays",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
}

#[test]
fn not_a_member_names_the_device() {
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    drop(a);
    let blank = Arc::new(MemDisk::new(8 * MIB)) as Arc<dyn BlockDevice>;
    let e = Array::assemble(
        vec![m[0].clone(), blank],
        vec!["good".into(), "blank.img".into()],
        AssembleOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("blank.img") && e.to_string().contains("magic"),
        "{e}"
    );
}

#[test]
fn too_many_missing_is_refused_with_the_reason() {
    let (a, m) = create(&Shape::new(Level::Raid5, None, 64, 4));
    drop(a);
    let e = assemble(&m, &[0, 3], false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Degraded);
    let msg = e.to_string();
    for want in [
        "cannot start",
        "2 of 4 members missing",
        "role 1",
        "role 2",
        "raid5 tolerates 1",
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    let (a, m) = create(&Shape::new(Level::Raid6, None, 64, 5));
    drop(a);
    assert!(assemble(&m, &[0, 1, 2], false).is_ok());
    let msg = assemble(&m, &[0, 1], false).unwrap_err().to_string();
    assert!(msg.contains("raid6 tolerates 2"), "{msg}");
    let (a, m) = create(&Shape::new(Level::Raid0, None, 64, 3));
    drop(a);
    let msg = assemble(&m, &[0, 2], false).unwrap_err().to_string();
    assert!(
        msg.contains("no redundancy") && msg.contains("role 1"),
        "{msg}"
    );
    // RAID10 n2 on 4: members 0 and 1 hold the same chunks; 0 and 2 do not.
    let (a, m) = create(&Shape::new(
        Level::Raid10,
        Some(Raid10Layout::DEFAULT.to_raw()),
        64,
        4,
    ));
    let data = filled(&a, 3);
    a.close().unwrap();
    drop(a);
    let msg = assemble(&m, &[2, 3], false).unwrap_err().to_string();
    assert!(msg.contains("needs one of each"), "{msg}");
    let a = assemble(&m, &[1, 3], false).unwrap();
    assert!(read_all(&a) == data);
    // RAID1 survives on any one member.
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 3));
    drop(a);
    assert!(assemble(&m, &[1], false).is_ok());
}

#[test]
fn stale_and_faulty_members_are_left_out() {
    let (a, m) = create(&Shape::new(Level::Raid5, None, 64, 4));
    let old = filled(&a, 1);
    a.close().unwrap();
    drop(a);
    // Degraded without disk3, written: disk3 misses the writes.
    let a = assemble(&m, &[0, 1, 2], false).unwrap();
    let new = filled(&a, 2);
    assert_ne!(old, new);
    a.close().unwrap();
    drop(a);
    let sb3 = Superblock::read_from(&*m[3], "disk3", FeaturePolicy::Supported).unwrap();
    let sb0 = Superblock::read_from(&*m[0], "disk0", FeaturePolicy::Supported).unwrap();
    assert!(
        sb3.events + 1 < sb0.events,
        "{} vs {}",
        sb3.events,
        sb0.events
    );
    assert_eq!(
        sb0.dev_roles[3],
        DevRole::FAULTY,
        "the others record the missing member as faulty"
    );
    let a = assemble(&m, &[0, 1, 2, 3], false).unwrap();
    let r = a.report();
    assert!(r.state.degraded);
    let left = r
        .members
        .iter()
        .find(|x| x.state == MemberState::LeftOut)
        .unwrap();
    assert_eq!(left.name.as_deref(), Some("disk3.img"));
    assert!(
        left.reason.as_deref().unwrap().contains("stale"),
        "{left:?}"
    );
    assert!(read_all(&a) == new);
    drop(a);

    // One event behind but marked faulty by the freshest superblock: also out.
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    drop(a);
    let mut sb = Superblock::read_from(&*m[0], "disk0", FeaturePolicy::Supported).unwrap();
    sb.events += 1;
    sb.dev_roles[1] = DevRole::FAULTY;
    sb.write_to(&*m[0], "disk0").unwrap();
    let a = assemble(&m, &[0, 1], false).unwrap();
    let r = a.report();
    let left = r
        .members
        .iter()
        .find(|x| x.state == MemberState::LeftOut)
        .unwrap();
    assert!(
        left.reason.as_deref().unwrap().contains("faulty"),
        "{left:?}"
    );
    assert_eq!(r.members[1].state, MemberState::Missing);
}

#[test]
fn dirty_degraded_parity_needs_force() {
    // Without the partial-parity log, as mdadm makes it (with the log a dirty degraded
    // start is safe: tests/write_hole.rs).
    let shape = Shape::new(Level::Raid5, None, 64, 3);
    let m = common::mem_members(&shape);
    let mut o = shape.create_options();
    o.write_journal = false;
    let a = Array::create(dyn_members(&m), names(m.len()), &o).unwrap();
    let data = filled(&a, 9);
    // A crash: the members as they are while the array is open (dirty).
    let crashed: Vec<Arc<MemDisk>> = m
        .iter()
        .map(|d| Arc::new(MemDisk::from_bytes(&d.to_vec())))
        .collect();
    drop(a);
    let sb = Superblock::read_from(&*crashed[0], "c0", FeaturePolicy::Supported).unwrap();
    assert!(!sb.is_clean());
    // Whole, it starts, with a resync pending.
    let a = assemble(&crashed, &[0, 1, 2], false).unwrap();
    let r = a.report();
    assert!(r.state.resync_pending && !r.state.clean, "{}", r.state_text);
    assert!(read_all(&a) == data);
    a.close().unwrap();
    assert!(
        a.report().state.resync_pending,
        "close must not hide a pending resync"
    );
    drop(a);
    // Degraded, it needs force.
    let e = assemble(&crashed, &[0, 2], false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Degraded);
    assert!(
        e.to_string().contains("not shut down cleanly") && e.to_string().contains("force"),
        "{e}"
    );
    let a = assemble(&crashed, &[0, 2], true).unwrap();
    let r = a.report();
    assert!(r.state.forced && r.state.degraded, "{}", r.state_text);
    assert!(
        read_all(&a) == data,
        "no write was interrupted, so the rebuilt data is right"
    );
    drop(a);
    // RAID1 has no parity to be wrong: dirty and degraded starts.
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    filled(&a, 1);
    let crashed: Vec<Arc<MemDisk>> = m
        .iter()
        .map(|d| Arc::new(MemDisk::from_bytes(&d.to_vec())))
        .collect();
    drop(a);
    assert!(assemble(&crashed, &[1], false).is_ok());
}

fn with_signature(size: u64, off: u64, magic: &[u8]) -> Arc<MemDisk> {
    let d = MemDisk::new(size);
    let mut block = vec![0u8; 4096];
    let at = us(off % 4096);
    block[at..at + magic.len()].copy_from_slice(magic);
    d.write_at(&block, off - off % 4096, WriteFlags::NONE)
        .unwrap();
    Arc::new(d)
}

#[test]
fn create_refuses_signatures_without_force() {
    let size = 8 * MIB;
    let opts = || {
        let mut o = CreateOptions::new(Level::Raid1, "r1");
        o.members_zeroed = true;
        o
    };
    let cases: Vec<(Arc<MemDisk>, &str)> = vec![
        (with_signature(size, 1080, &[0x53, 0xef]), "ext2 filesystem"),
        (with_signature(size, 0, b"XFSB"), "XFS"),
        (with_signature(size, 0, b"LUKS\xba\xbe\x00\x02"), "LUKS"),
        (with_signature(size, 512, b"LABELONE"), "LVM2"),
        (with_signature(size, 65_536 + 64, b"_BHRfS_M"), "btrfs"),
        (
            with_signature(size, 0, &[0xfc, 0x4e, 0x2b, 0xa9, 1, 0, 0, 0]),
            "md superblock 1.1",
        ),
    ];
    for (disk, kind) in cases {
        let blank = Arc::new(MemDisk::new(size)) as Arc<dyn BlockDevice>;
        let e = Array::create(
            vec![blank.clone(), disk.clone()],
            vec!["blank".into(), "used.img".into()],
            &opts(),
        )
        .err()
        .unwrap_or_else(|| panic!("{kind}: created over a signature"));
        let msg = e.to_string();
        assert!(
            msg.contains("used.img") && msg.contains(kind) && msg.contains("force"),
            "{kind}: {msg}"
        );
        let mut o = opts();
        o.force = true;
        let blank = Arc::new(MemDisk::new(size)) as Arc<dyn BlockDevice>;
        Array::create(
            vec![blank, disk],
            vec!["blank".into(), "used.img".into()],
            &o,
        )
        .unwrap();
    }
    // md 0.90 sits in the last 64 KiB-aligned 64 KiB of the device.
    let off = ((size / 512) & !127) * 512 - 65_536;
    let d = with_signature(size, off, &0xa92b_4efcu32.to_le_bytes());
    assert!(cairn_md::probe_signatures(&*d)
        .unwrap()
        .iter()
        .any(|s| s.kind.contains("0.90")));
    // An existing member, with its array named.
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    drop(a);
    let e = Array::create(dyn_members(&m), names(2), &opts()).unwrap_err();
    assert!(
        e.to_string().contains("md superblock 1.2") && e.to_string().contains("member of array"),
        "{e}"
    );
}

#[test]
fn create_marks_resync_unless_members_read_as_zeroes() {
    let size = 8 * MIB;
    let opts = CreateOptions::new(Level::Raid5, "r5");
    // Sparse members: clean without being told.
    let m: Vec<Arc<MemDisk>> = (0..3).map(|_| Arc::new(MemDisk::new(size))).collect();
    let a = Array::create(dyn_members(&m), names(3), &opts).unwrap();
    assert!(a.report().state.clean);
    drop(a);
    // Allocated but zero: still clean (the data is read).
    let m: Vec<Arc<MemDisk>> = (0..3)
        .map(|_| Arc::new(MemDisk::from_bytes(&vec![0u8; us(size)])))
        .collect();
    let a = Array::create(dyn_members(&m), names(3), &opts).unwrap();
    assert!(a.report().state.clean);
    drop(a);
    // Old data in the data area: resync pending, and the superblocks say so.
    let m: Vec<Arc<MemDisk>> = (0..3).map(|_| Arc::new(MemDisk::new(size))).collect();
    m[1].write_at(&[1u8; 512], 5 * MIB, WriteFlags::NONE)
        .unwrap();
    let a = Array::create(dyn_members(&m), names(3), &opts).unwrap();
    let r = a.report();
    assert!(r.state.resync_pending && !r.state.clean, "{}", r.state_text);
    let sb = Superblock::read_from(&*m[0], "m0", FeaturePolicy::Supported).unwrap();
    assert_eq!(sb.resync_offset, Sectors::ZERO);
    drop(a);
    // ... unless the caller vouches for the members.
    let m: Vec<Arc<MemDisk>> = (0..3).map(|_| Arc::new(MemDisk::new(size))).collect();
    m[1].write_at(&[1u8; 512], 5 * MIB, WriteFlags::NONE)
        .unwrap();
    let mut o = opts.clone();
    o.assume_clean = true;
    assert!(
        Array::create(dyn_members(&m), names(3), &o)
            .unwrap()
            .report()
            .state
            .clean
    );
    // RAID0 never needs a resync.
    let m: Vec<Arc<MemDisk>> = (0..2)
        .map(|_| Arc::new(MemDisk::from_bytes(&vec![1u8; us(size)])))
        .collect();
    let mut o = CreateOptions::new(Level::Raid0, "r0");
    o.force = true;
    assert!(
        Array::create(dyn_members(&m), names(2), &o)
            .unwrap()
            .report()
            .state
            .clean
    );
}

#[test]
fn dirty_on_write_clean_on_close() {
    let (a, m) = create(&Shape::new(Level::Raid6, None, 64, 4));
    let sb = |i: usize| Superblock::read_from(&*m[i], "m", FeaturePolicy::Supported).unwrap();
    let e0 = sb(0).events;
    assert!(sb(0).is_clean());
    a.write_at(&[5u8; 4096], 0, WriteFlags::NONE).unwrap();
    assert!(
        !sb(0).is_clean() && !sb(3).is_clean(),
        "dirty before the first write lands"
    );
    assert_eq!(sb(2).events, e0 + 1);
    a.write_at(&[6u8; 4096], 8192, WriteFlags::NONE).unwrap();
    assert_eq!(
        sb(2).events,
        e0 + 1,
        "one update per clean->dirty transition"
    );
    a.close().unwrap();
    assert!(sb(1).is_clean());
    assert_eq!(sb(1).events, e0 + 2);
    let r = a.report();
    assert!(r.state.clean);
    assert_eq!(r.events, e0 + 2);
}

fn faulty_members(shape: &Shape) -> (Vec<Arc<FaultyDisk<Arc<MemDisk>>>>, Array) {
    let (a, m) = create(shape);
    a.close().unwrap();
    drop(a);
    let f: Vec<Arc<FaultyDisk<Arc<MemDisk>>>> = m
        .iter()
        .map(|d| Arc::new(FaultyDisk::new(d.clone())))
        .collect();
    let devs = f
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = Array::assemble(devs, names(m.len()), AssembleOptions::default()).unwrap();
    (f, a)
}

#[test]
fn read_errors_are_served_from_redundancy_and_repaired() {
    let r10 = Raid10Layout::parse("f2").unwrap().to_raw();
    for shape in [
        Shape::new(Level::Raid1, None, 64, 2).rows(4),
        Shape::new(Level::Raid5, None, 16, 4).rows(8),
        Shape::new(Level::Raid6, None, 16, 5).rows(8),
        Shape::new(Level::Raid10, Some(r10), 16, 3).rows(8),
    ] {
        let name = shape.name();
        let (f, a) = faulty_members(&shape);
        let data = filled(&a, 4);
        // Member 1 cannot read its whole data area, once per block.
        f[1].handle()
            .inject(Fault::new(Ops::READ).in_range(0..u64::MAX).times(100_000));
        assert!(
            read_all(&a) == data,
            "{name}: reads around a member read error"
        );
        // Partial writes while member 1 cannot read: whatever it holds must still end up
        // consistent (its new bytes computed, not read).
        let mut data = data;
        for (i, off) in [0u64, 4096, 20 << 10, 60 << 10, 100 << 10]
            .into_iter()
            .enumerate()
        {
            let len = [512usize, 8192, 3072, 40 << 10, 4096][i];
            let bytes = vec![0x40 + u8::try_from(i).unwrap(); len];
            a.write_at(&bytes, off, WriteFlags::NONE).unwrap();
            data[us(off)..us(off) + len].copy_from_slice(&bytes);
        }
        // Small writes across chunk boundaries: read-modify-write is the cheaper plan
        // there, and member 1 is the parity of some of these stripes.
        for c in 1..24u64 {
            let off = c * (16 << 10) - 1024;
            if off + 2048 > a.geometry().size {
                break;
            }
            let bytes = vec![u8::try_from(c).unwrap(); 2048];
            a.write_at(&bytes, off, WriteFlags::NONE).unwrap();
            data[us(off)..us(off) + 2048].copy_from_slice(&bytes);
        }
        f[1].handle().heal();
        assert!(
            read_all(&a) == data,
            "{name}: after writes around a read error"
        );
        let images: Vec<Option<Vec<u8>>> = f.iter().map(|d| Some(d.inner().to_vec())).collect();
        let b: Vec<u64> = f
            .iter()
            .map(|d| {
                Superblock::read_from(&**d.inner(), "m", FeaturePolicy::Supported)
                    .unwrap()
                    .data_offset
                    .0
                    * 512
            })
            .collect();
        common::check_members(a.layout(), &images, &b, &data)
            .unwrap_or_else(|e| panic!("{name}: members after writes around a read error: {e}"));
        // The errors were repaired in place and the member is still in the array.
        assert_eq!(
            a.report().active_devices,
            u32::try_from(shape.members).unwrap(),
            "{name}"
        );
        // RAID6: two members failing reads at once.
        if shape.level == Level::Raid6 {
            f[0].handle().inject(Fault::new(Ops::READ));
            f[3].handle().inject(Fault::new(Ops::READ));
            assert!(read_all(&a) == data, "{name}: two members failing reads");
            f[0].handle().heal();
            f[3].handle().heal();
        }
    }
    // No redundancy: the error names the member and the offset.
    let (f, a) = faulty_members(&Shape::new(Level::Raid0, None, 64, 2));
    f[1].handle().inject(Fault::new(Ops::READ));
    let mut buf = vec![0u8; 256 << 10];
    let e = a.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(
        e.to_string().contains("disk1.img") && e.to_string().contains("member offset"),
        "{e}"
    );
}

#[test]
fn write_errors_fail_the_member_and_keep_the_data() {
    for shape in [
        Shape::new(Level::Raid1, None, 64, 2).rows(8),
        Shape::new(Level::Raid5, None, 16, 4).rows(16),
        Shape::new(Level::Raid6, None, 16, 5).rows(16),
        Shape::new(Level::Raid10, None, 16, 4).rows(16),
    ] {
        let name = shape.name();
        let (f, a) = faulty_members(&shape);
        let mut data = filled(&a, 5);
        let victim = shape.members - 1;
        f[victim].handle().inject(Fault::new(Ops::WRITE));
        let new = vec![0xabu8; 200 << 10];
        a.write_at(&new, 4096, WriteFlags::FUA)
            .unwrap_or_else(|e| panic!("{name}: write with one failing member: {e}"));
        data[4096..4096 + new.len()].copy_from_slice(&new);
        let r = a.report();
        assert_eq!(r.members[victim].state, MemberState::Faulty, "{name}:\n{r}");
        assert!(r.state.degraded, "{name}");
        assert!(read_all(&a) == data, "{name}: data after a member failed");
        // The failure is on disk: the others record the member as faulty.
        let sb =
            Superblock::read_from(&*f[0].inner().clone(), "m0", FeaturePolicy::Supported).unwrap();
        let sb2 =
            Superblock::read_from(&*f[victim].inner().clone(), "m2", FeaturePolicy::Supported)
                .unwrap();
        assert_eq!(
            sb.dev_roles[usize::try_from(sb2.dev_number).unwrap()],
            DevRole::FAULTY,
            "{name}"
        );
    }
    // Past redundancy a write fails loudly.
    let (f, a) = faulty_members(&Shape::new(Level::Raid5, None, 16, 3));
    f[0].handle().inject(Fault::new(Ops::WRITE));
    f[1].handle().inject(Fault::new(Ops::WRITE));
    let e = a
        .write_at(&vec![1u8; 64 << 10], 0, WriteFlags::NONE)
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Io | ErrorKind::Degraded),
        "{e}"
    );
}

/// An array created over members full of old data (a pattern mod `modulus`), so with a
/// resync pending.
fn create_over_old_data(shape: &Shape, modulus: u8) -> (Array, Vec<Arc<MemDisk>>) {
    let m: Vec<Arc<MemDisk>> = shape
        .member_bytes()
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            Arc::new(MemDisk::from_bytes(
                &(0..b)
                    .map(|x| {
                        u8::try_from(x % u64::from(modulus)).unwrap() ^ u8::try_from(i).unwrap()
                    })
                    .collect::<Vec<_>>(),
            ))
        })
        .collect();
    let mut o = shape.create_options();
    o.members_zeroed = false;
    o.force = true;
    let a = Array::create(dyn_members(&m), names(m.len()), &o).unwrap();
    (a, m)
}

#[test]
fn resync_makes_parity_and_mirrors_agree() {
    let f2 = Raid10Layout::parse("f2").unwrap().to_raw();
    for shape in [
        Shape::new(Level::Raid1, None, 64, 3).rows(4),
        Shape::new(Level::Raid5, None, 16, 4).rows(8),
        Shape::new(
            Level::Raid6,
            Some(cairn_md::ParityAlgorithm::LeftAsymmetric.to_raw()),
            16,
            5,
        )
        .rows(8),
        Shape::new(Level::Raid10, Some(f2), 16, 3).rows(8),
    ] {
        let name = shape.name();
        // Members full of old data: created with a resync pending.
        let (a, m) = create_over_old_data(&shape, 253);
        assert!(a.report().state.resync_pending, "{name}");
        a.write_at(&vec![7u8; 8192], 4096, WriteFlags::NONE)
            .unwrap();
        a.resync().unwrap();
        let data = read_all(&a);
        a.close().unwrap();
        let r = a.report();
        assert!(
            r.state.clean && !r.state.resync_pending,
            "{name}: {}",
            r.state_text
        );
        let layout = a.layout().clone();
        drop(a);
        let images: Vec<Option<Vec<u8>>> = m.iter().map(|d| Some(d.to_vec())).collect();
        common::check_members(&layout, &images, &common::bases(&m), &data)
            .unwrap_or_else(|e| panic!("{name}: after resync: {e}"));
        // Clean now, so it starts degraded without force and reads the same.
        let a = assemble(&m, &(1..shape.members).collect::<Vec<_>>(), false).unwrap();
        assert!(read_all(&a) == data, "{name}");
    }
    // A degraded array cannot be resynced.
    let (a, m) = create(&Shape::new(Level::Raid5, None, 16, 3));
    drop(a);
    let a = assemble(&m, &[0, 1], false).unwrap();
    assert_eq!(a.resync().unwrap_err().kind(), ErrorKind::Degraded);
}

#[test]
fn a_member_that_cannot_take_its_superblock_fails() {
    let (f, a) = faulty_members(&Shape::new(Level::Raid5, None, 16, 4).rows(8));
    // The first write marks the array dirty in every superblock; member 1 cannot.
    f[1].handle()
        .inject(Fault::new(Ops::WRITE).in_range(4096..8192));
    a.write_at(&[3u8; 4096], 0, WriteFlags::NONE).unwrap();
    let r = a.report();
    assert_eq!(r.members[1].state, MemberState::Faulty, "{r}");
    let mut buf = vec![0u8; 4096];
    a.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![3u8; 4096]);
    a.close().unwrap();
}

#[test]
fn background_resync_runs_under_io_stops_at_a_checkpoint_and_resumes() {
    let shape = Shape::new(Level::Raid6, None, 16, 5).rows(64);
    let (a, m) = create_over_old_data(&shape, 241);
    let a = Arc::new(a);
    let total = a.geometry().size;
    // Slow enough to be stopped part-way: a few stripes per 100 ms.
    let slow = cairn_md::SpeedLimits {
        min: total / 20,
        max: total / 20,
    };
    assert!(a.start_resync(slow).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Client writes go on meanwhile.
    a.write_at(&vec![9u8; 8192], 8192, WriteFlags::NONE)
        .unwrap();
    let st = a.background().unwrap();
    assert_eq!((st.action, st.state.as_str()), ("resync", "running"));
    assert!(st.done_bytes > 0 && st.done_bytes < total, "{st:?}");
    // A clean stop records where it got to.
    a.close().unwrap();
    let st = a.background().unwrap();
    assert_eq!(st.state, "stopped", "{st:?}");
    drop(a);
    let sb = Superblock::read_from(&*m[0], "disk0", FeaturePolicy::Supported).unwrap();
    assert!(
        sb.resync_offset > Sectors::ZERO && sb.resync_offset < Sectors::MAX,
        "checkpoint {:?}",
        sb.resync_offset
    );
    // Reassembled: still pending, and it resumes from the checkpoint to the end.
    let a = Arc::new(assemble(&m, &[0, 1, 2, 3, 4], false).unwrap());
    assert!(a.report().state.resync_pending);
    assert!(a.start_resync(cairn_md::SpeedLimits::default()).unwrap());
    let start = std::time::Instant::now();
    loop {
        let st = a.background().unwrap();
        if st.state != "running" {
            assert_eq!(st.state, "finished", "{st:?}");
            assert_eq!(st.done_bytes, total);
            break;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "resync never finished: {st:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = a.report();
    assert!(!r.state.resync_pending, "{}", r.state_text);
    let data = read_all(&a);
    a.close().unwrap();
    let layout = a.layout().clone();
    drop(a);
    let sb = Superblock::read_from(&*m[0], "disk0", FeaturePolicy::Supported).unwrap();
    assert_eq!(sb.resync_offset, Sectors::MAX);
    let images: Vec<Option<Vec<u8>>> = m.iter().map(|d| Some(d.to_vec())).collect();
    common::check_members(&layout, &images, &common::bases(&m), &data)
        .unwrap_or_else(|e| panic!("after a resumed resync: {e}"));
}

/// A superblock update cut short leaves some members one event behind. Assembly takes
/// them (md's rule) and brings every member level, so that a second update cut short
/// cannot leave them two behind and stale.
#[test]
fn members_one_event_behind_are_brought_level() {
    let (a, m) = create(&Shape::new(Level::Raid5, None, 64, 4));
    let data = filled(&a, 3);
    a.close().unwrap();
    drop(a);
    let events = |i: usize| {
        Superblock::read_from(&*m[i], "d", FeaturePolicy::Supported)
            .unwrap()
            .events
    };
    // Members 2 and 3 missed the last update.
    for i in [2, 3] {
        let mut sb = Superblock::read_from(&*m[i], "d", FeaturePolicy::Supported).unwrap();
        sb.events -= 1;
        sb.write_to(&*m[i], "d").unwrap();
    }
    let top = events(0);
    assert_eq!(events(2) + 1, top);
    let a = assemble(&m, &[0, 1, 2, 3], false).unwrap();
    assert!(!a.report().state.degraded, "one event behind is current");
    for i in 0..4 {
        assert_eq!(events(i), top, "member {i} not brought level");
    }
    // The next update (a write marks the array dirty) is cut short on members 0 and 1
    // only: members 2 and 3 are one behind again, not two, and still assemble.
    drop(a);
    for i in [0, 1] {
        let mut sb = Superblock::read_from(&*m[i], "d", FeaturePolicy::Supported).unwrap();
        sb.events += 1;
        sb.write_to(&*m[i], "d").unwrap();
    }
    let b = assemble(&m, &[0, 1, 2, 3], false).unwrap();
    assert!(!b.report().state.degraded, "{:?}", b.report());
    assert!(read_all(&b) == data);
}
