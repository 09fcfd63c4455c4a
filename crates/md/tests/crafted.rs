//! Crafted md metadata with valid checksums: what md and mdadm refuse is refused here
//! too, and a partial-parity log that cannot be used is said so and does not count as
//! protection.
//!
//! * a chunk past md's largest (1 GiB) or larger than the component size: refused at
//!   the superblock, never a 0-byte array;
//! * a log header whose ring runs into the data, or whose checksum fails: a warning
//!   naming the member, and a dirty degraded start needs force exactly as without a log.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_md::ondisk::checksum;
use cairn_md::{Array, AssembleOptions, FeaturePolicy, Level, Superblock};
use common::{create, dyn_members, names, us, Shape};

const SB_AT: u64 = 4096;

/// Rewrites the superblock of `disk` with `edit` applied to its raw bytes, checksum
/// recomputed (`max_dev` at byte 220, `sb_csum` at 216).
fn patch_sb(disk: &MemDisk, edit: impl Fn(&mut [u8])) {
    let mut b = vec![0u8; 4096];
    disk.read_at(&mut b, SB_AT).unwrap();
    edit(&mut b);
    let max_dev = u32::from_le_bytes(b[220..224].try_into().unwrap());
    let c = checksum(&b, max_dev);
    b[216..220].copy_from_slice(&c.to_le_bytes());
    disk.write_at(&b, SB_AT, WriteFlags::FUA).unwrap();
}

/// Marks every member's superblock not cleanly shut down (`resync_offset` 0).
fn make_dirty(members: &[Arc<MemDisk>]) {
    for m in members {
        patch_sb(m, |b| b[208..216].copy_from_slice(&0u64.to_le_bytes()));
    }
}

fn assemble(members: &[Arc<MemDisk>], keep: &[usize], force: bool) -> cairn_block::Result<Array> {
    let all = dyn_members(members);
    let nm = names(members.len());
    let (devs, nm): (Vec<_>, Vec<_>) = keep
        .iter()
        .map(|&i| (all[i].clone(), nm[i].clone()))
        .unzip();
    Array::assemble(devs, nm, AssembleOptions { force })
}

/// Runs `f` with the log lines it emits captured (warnings and above).
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(buf.clone());
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || sink.clone())
        .finish();
    let out = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
    (out, text)
}

#[test]
fn chunks_md_cannot_run_are_refused() {
    for (level, chunk, want) in [
        (
            Level::Raid5,
            1u32 << 31,
            "past md's largest chunk of 2097152 sectors",
        ),
        (
            Level::Raid0,
            1 << 31,
            "past md's largest chunk of 2097152 sectors",
        ),
        (
            Level::Raid6,
            1 << 22,
            "past md's largest chunk of 2097152 sectors",
        ),
        // Within md's range, but larger than what each member holds: 0 bytes of array.
        (Level::Raid5, 1 << 20, "larger than the component size"),
    ] {
        let members = if level == Level::Raid6 { 4 } else { 3 };
        let (a, m) = create(&Shape::new(level, None, 64, members));
        drop(a);
        for d in &m {
            patch_sb(d, |b| b[88..92].copy_from_slice(&chunk.to_le_bytes()));
        }
        let what = format!("{level} chunk {chunk}");
        let e = assemble(&m, &[0, 1, 2], false).expect_err(&what);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("chunksize") && msg.contains(want),
            "{what}: {msg}"
        );
        // The superblock parser says the same to `md examine`.
        let sb = Superblock::read_from(&*m[0], "disk0.img", FeaturePolicy::Supported);
        assert!(sb.unwrap_err().to_string().contains(want), "{what}");
    }
}

/// Byte offset of the log header on a member: the 4 KiB block carrying its magic.
fn log_header_at(disk: &MemDisk) -> u64 {
    let sb = Superblock::read_from(disk, "m", FeaturePolicy::Supported).unwrap();
    let img = disk.to_vec();
    let end = us(sb.data_offset.0 * 512);
    (0..end)
        .step_by(4096)
        .find(|&o| &img[o..o + 8] == b"cairnPLR")
        .map(|o| o as u64)
        .expect("a partial-parity log header")
}

/// CRC-32C, bit by bit (the log's checksum), independent of the crate's.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Rewrites the log header of `disk` with `edit` applied; the checksum is recomputed
/// when `fix_crc`.
fn patch_log_header(disk: &MemDisk, fix_crc: bool, edit: impl Fn(&mut [u8], u64)) {
    let at = log_header_at(disk);
    let data_offset = Superblock::read_from(disk, "m", FeaturePolicy::Supported)
        .unwrap()
        .data_offset
        .0
        * 512;
    let mut b = vec![0u8; 4096];
    disk.read_at(&mut b, at).unwrap();
    edit(&mut b, data_offset);
    if fix_crc {
        let c = crc32c(&b[..64]);
        b[64..68].copy_from_slice(&c.to_le_bytes());
    }
    disk.write_at(&b, at, WriteFlags::FUA).unwrap();
}

fn raid5() -> Vec<Arc<MemDisk>> {
    let (a, m) = create(&Shape::new(Level::Raid5, None, 64, 3));
    let mut buf = vec![0x5au8; 4096];
    a.write_at(&buf, 8192, WriteFlags::FUA).unwrap();
    a.read_at(&mut buf, 0).unwrap();
    drop(a);
    m
}

#[test]
fn a_log_ring_running_into_the_data_is_not_protection() {
    let m = raid5();
    // Valid checksum, ring stretched one block past data_offset, on every member.
    for d in &m {
        patch_log_header(d, true, |b, data_offset| {
            let ring_off = u64::from_le_bytes(b[16..24].try_into().unwrap());
            let len = data_offset + 4096 - ring_off;
            b[24..32].copy_from_slice(&len.to_le_bytes());
        });
    }
    make_dirty(&m);
    let (r, log) = logged(|| assemble(&m, &[0, 1], false));
    let e = r.expect_err("a dirty degraded start without a usable log needs force");
    assert_eq!(e.kind(), ErrorKind::Degraded, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("start it with force"), "{msg}");
    assert!(
        msg.contains("Its partial-parity log does not protect this start")
            && msg.contains("disk0.img: the partial-parity log cannot be used: the ring [")
            && msg.contains("is not inside the log area"),
        "{msg}"
    );
    assert!(
        log.contains("disk1.img: the partial-parity log cannot be used")
            && log.contains("not protected by that log against the write hole"),
        "{log}"
    );
    // With force it starts, as an array without a log would.
    assemble(&m, &[0, 1], true).unwrap();
}

#[test]
fn a_log_header_failing_its_checksum_is_warned_about_and_not_protection() {
    let m = raid5();
    // Member 1's header: the floor changed, the checksum left as it was.
    patch_log_header(&m[1], false, |b, _| b[32] ^= 0x10);
    // Clean: starts, with a warning naming the member.
    let (r, log) = logged(|| assemble(&m, &[0, 1, 2], false));
    r.unwrap();
    assert!(
        log.contains(
            "disk1.img: the partial-parity log cannot be used: the header fails its checksum"
        ),
        "{log}"
    );
    // That clean start rewrote member 1's header from the others: the log is whole again.
    let (r, log) = logged(|| assemble(&m, &[0, 1, 2], false));
    r.unwrap();
    assert!(!log.contains("cannot be used"), "{log}");

    // Dirty and degraded, with member 1's copy of the log unusable: refused.
    patch_log_header(&m[1], false, |b, _| b[32] ^= 0x10);
    make_dirty(&m);
    let (r, _) = logged(|| assemble(&m, &[0, 1], false));
    let e = r.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Degraded, "{e}");
    assert!(
        e.to_string().contains("the header fails its checksum"),
        "{e}"
    );
    // The same start with member 1's header intact is safe, and allowed.
    patch_log_header(&m[1], false, |b, _| b[32] ^= 0x10);
    assemble(&m, &[0, 1], false).unwrap();
}

/// Found by the md_ppl fuzz harness: a log entry (valid CRCs) whose sequence number is
/// the largest u64 made the replay's "next sequence number" overflow (a panic in debug
/// builds, a wrapped sequence in release). Such entries are not valid.
#[test]
fn a_log_entry_with_the_last_sequence_number_is_ignored() {
    let m = raid5();
    let mut patched = 0;
    for d in &m {
        let at = us(log_header_at(d));
        let img = d.to_vec();
        let end = us(Superblock::read_from(&**d, "m", FeaturePolicy::Supported)
            .unwrap()
            .data_offset
            .0
            * 512);
        for o in (at + 4096..end).step_by(4096) {
            if &img[o..o + 8] == b"cairnPLE" {
                let mut b = img[o..o + 4096].to_vec();
                b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
                let c = crc32c(&b[..76]);
                b[76..80].copy_from_slice(&c.to_le_bytes());
                d.write_at(&b, o as u64, WriteFlags::FUA).unwrap();
                patched += 1;
            }
        }
    }
    assert!(patched > 0, "the template has log entries");
    make_dirty(&m);
    let a = assemble(&m, &[0, 1, 2], false).unwrap();
    let mut buf = vec![0u8; 4096];
    a.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, vec![0x5a; 4096]);
}

/// Sets `events` (byte 200) on every member.
fn set_events(members: &[Arc<MemDisk>], events: u64) {
    for m in members {
        patch_sb(m, |b| b[200..208].copy_from_slice(&events.to_le_bytes()));
    }
}

fn events_on(disk: &MemDisk) -> u64 {
    Superblock::read_from(disk, "m", FeaturePolicy::Supported)
        .unwrap()
        .events
}

/// md's event counter at its maximum: the superblock still parses (`md examine` shows
/// it), but an array that would have to count one more change is refused with a
/// sentence, and nothing wraps to 0 (which would make the freshest member look stale).
#[test]
fn an_event_counter_at_its_maximum_is_refused_not_wrapped() {
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    drop(a);
    for at_max in [u64::MAX, u64::MAX - 1] {
        set_events(&m, at_max);
        assert_eq!(events_on(&m[0]), at_max);
        let e = assemble(&m, &[0, 1], false).expect_err("no room for one more event");
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(
            e.to_string().contains(&format!(
                "the superblocks' event counter is at its maximum ({at_max})"
            )),
            "{e}"
        );
    }
    // Room for one: the first write takes the last event; the next change (marking it
    // clean) is refused rather than wrapped, and says why.
    set_events(&m, u64::MAX - 2);
    let a = assemble(&m, &[0, 1], false).unwrap();
    a.write_at(&[7u8; 4096], 0, WriteFlags::NONE).unwrap();
    assert_eq!(events_on(&m[0]), u64::MAX - 1, "dirty: the last event");
    // Still writable while dirty: no event needed.
    a.write_at(&[8u8; 4096], 4096, WriteFlags::NONE).unwrap();
    let e = a.close().expect_err("a close needs one more event");
    assert!(e.to_string().contains("at its maximum"), "{e}");
    for d in &m {
        assert_eq!(events_on(d), u64::MAX - 1, "not wrapped");
    }
}

/// A bad-block log that overlaps the data area (data_offset moved onto the log, valid
/// checksum) is refused at assembly and by the superblock parser `md examine` uses.
#[test]
fn a_bad_block_log_over_the_data_is_refused() {
    let (a, m) = create(&Shape::new(Level::Raid1, None, 64, 2));
    drop(a);
    let sb = Superblock::read_from(&*m[0], "m", FeaturePolicy::Supported).unwrap();
    assert!(
        sb.bblog_size > 0 && sb.bblog_offset > 0,
        "cairn writes a log"
    );
    let log_at = sb.super_offset.0 as i64 + i64::from(sb.bblog_offset);
    for d in &m {
        patch_sb(d, |b| {
            b[128..136].copy_from_slice(&(log_at as u64).to_le_bytes())
        });
    }
    let e = assemble(&m, &[0, 1], false).expect_err("log over data");
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    let want = format!(
        "bblog_offset: the bad-block log ({} sectors at sector {log_at}) overlaps the data area",
        sb.bblog_size
    );
    assert!(e.to_string().contains(&want), "{e}");
    let e = Superblock::read_from(&*m[1], "disk1.img", FeaturePolicy::Supported).unwrap_err();
    assert!(e.to_string().contains(&want), "{e}");
}
