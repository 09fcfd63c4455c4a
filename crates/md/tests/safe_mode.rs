//! md's safe mode and the re-add rule it feeds (issue 30, item 2), through the public
//! API only (`manage`, writes, `fail`/`remove`/`add`), on memory members:
//! * an array that goes unwritten for the safe-mode delay is marked clean on its members
//!   (`resync_offset` MAX) while it runs, one event later; the next write marks it dirty
//!   again, one more event;
//! * a member whose copy was taken before a round of writes that has since gone idle
//!   (and had its bits cleared) is stale by md's rule (events below the bitmap's
//!   `events_cleared`): added back, it is rebuilt in full, and every read of the data
//!   written after the copy returns that data, from either mirror;
//! * a member that left after the last clearing is still brought back by the bitmap.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::{Array, BitmapChoice, FeaturePolicy, Level, SpeedLimits, Superblock};
use common::{dyn_members, names, us, Shape, MIB};

fn sb(d: &MemDisk) -> Superblock {
    Superblock::read_from(d, "m", FeaturePolicy::Supported).unwrap()
}

fn disk_from(bytes: &[u8]) -> Arc<MemDisk> {
    let d = Arc::new(MemDisk::new(bytes.len() as u64));
    d.write_at(bytes, 0, WriteFlags::NONE).unwrap();
    d
}

fn clean_on_disk(d: &MemDisk) -> bool {
    sb(d).resync_offset.0 == u64::MAX
}

/// Waits until `f` holds (safe mode runs on its own thread); fails after 10 s.
fn wait(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A served RAID1 of two 16 MiB memory members with a 1 MiB-chunk bitmap, managed (its
/// background work and safe mode running), bits cleared as soon as they are idle.
fn raid1() -> (Arc<Array>, Vec<Arc<MemDisk>>) {
    let shape = Shape::new(Level::Raid1, None, 64, 2).rows(256);
    let mut o = shape.create_options();
    o.bitmap = BitmapChoice::Internal {
        chunk_bytes: Some(MIB),
    };
    let m = common::mem_members(&shape);
    let a = Arc::new(Array::create(dyn_members(&m), names(2), &o).unwrap());
    a.set_bitmap_daemon_sleep(Duration::ZERO);
    a.manage(SpeedLimits {
        min: 1 << 30,
        max: 1 << 30,
    });
    (a, m)
}

/// Bits cleared by the bitmap daemon (`bitmap_daemon_work`, as its thread would) and the
/// array marked clean by safe mode: the state a few idle seconds leave.
fn go_idle(a: &Array, m: &[Arc<MemDisk>]) {
    wait("bits cleared", || {
        a.bitmap_daemon_work().unwrap();
        a.bitmap_info().unwrap().dirty == 0
    });
    wait("marked clean while running", || clean_on_disk(&m[0]));
}

#[test]
fn an_idle_array_is_marked_clean_and_dirty_again_on_the_next_write() {
    let (a, m) = raid1();
    let e0 = sb(&m[0]).events;
    a.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    let dirty = sb(&m[0]);
    assert_eq!(dirty.resync_offset.0, 0, "dirty before the write");
    assert_eq!(dirty.events, e0 + 1);
    wait("marked clean while running", || clean_on_disk(&m[0]));
    assert_eq!(sb(&m[0]).events, e0 + 2, "one event to go clean");
    assert_eq!(sb(&m[1]).events, e0 + 2);
    assert!(!a.report().state.resync_pending);
    a.write_at(&[2u8; 4096], 4096, WriteFlags::NONE).unwrap();
    assert_eq!(sb(&m[0]).resync_offset.0, 0, "dirty again");
    assert_eq!(sb(&m[0]).events, e0 + 3);
    a.close().unwrap();
    assert!(clean_on_disk(&m[0]) && clean_on_disk(&m[1]));
}

#[test]
fn an_old_copy_of_a_member_is_rebuilt_in_full() {
    let (a, m) = raid1();
    let x_at = 4 * MIB;
    a.write_at(&vec![0x11u8; 8 << 20], x_at, WriteFlags::NONE)
        .unwrap();
    go_idle(&a, &m);
    let copy = m[1].to_vec();
    let x: Vec<u8> = (0..8u32 << 20)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    a.write_at(&x, x_at, WriteFlags::NONE).unwrap();
    go_idle(&a, &m);
    let cleared = a.bitmap_info().unwrap().events_cleared;
    assert!(
        sb(&disk_from(&copy)).events < cleared,
        "the copy's events are below events_cleared {cleared}"
    );
    a.fail("disk1.img").unwrap();
    a.remove("disk1.img").unwrap();
    let old = disk_from(&copy);
    let msg = a
        .add(
            old.clone() as Arc<dyn BlockDevice>,
            "disk1.img".into(),
            false,
        )
        .unwrap()
        .message;
    assert!(msg.contains("full recovery"), "{msg}");
    wait("rebuilt", || {
        a.background().is_some_and(|s| s.state == "finished") && !a.report().state.degraded
    });
    // Reads alternate between the mirrors: every one must return X.
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..64u64 {
        a.read_at(&mut buf, x_at + i * (128 << 10)).unwrap();
        let want = &x[us(i * (128 << 10))..us((i + 1) * (128 << 10))];
        assert!(buf == want, "read {i} of X returned old data");
    }
    a.close().unwrap();
}

#[test]
fn a_member_that_left_after_the_last_clearing_uses_the_bitmap() {
    let (a, m) = raid1();
    a.write_at(&[3u8; 4096], 0, WriteFlags::NONE).unwrap();
    go_idle(&a, &m);
    a.fail("disk1.img").unwrap();
    a.remove("disk1.img").unwrap();
    a.write_at(&[4u8; 4096], 8 * MIB, WriteFlags::NONE).unwrap();
    let msg = a
        .add(
            m[1].clone() as Arc<dyn BlockDevice>,
            "disk1.img".into(),
            false,
        )
        .unwrap()
        .message;
    assert!(
        msg.contains("only the 1048576 bytes the bitmap marks"),
        "{msg}"
    );
    a.close().unwrap();
}
