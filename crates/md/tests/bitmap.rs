//! The write-intent bitmap through the array (bitmap.rs), over a table of levels:
//! * every data write reaches a member only after a FUA write of the bitmap block with
//!   its bit set (checked in each member's `LogWritesDisk` log);
//! * the bits set are exactly the chunks written (computed here from the layout maths,
//!   not from the array), and they clear only after a flush and the idle time;
//! * a clean close leaves no dirty bit and bitmap events equal to the superblock's;
//! * after a crash (member images taken with the array still open) the resync covers
//!   only the dirty chunks, and an out-of-date bitmap falls back to a full resync;
//! * a degraded array keeps its bits.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::testkit::{LogOp, LogWritesDisk};
use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::bitmap::{BitmapSuper, HEADER_SIZE};
use cairn_md::{Array, AssembleOptions, BitmapChoice, Level, Superblock};
use common::*;

const BM_CHUNK: u64 = 64 * KIB;

struct Case {
    shape: Shape,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            shape: Shape::new(Level::Raid1, None, 64, 2).rows(48),
        },
        Case {
            shape: Shape::new(Level::Raid5, None, 64, 3).rows(48),
        },
        Case {
            shape: Shape::new(Level::Raid6, None, 64, 4).rows(48),
        },
        Case {
            shape: Shape::new(Level::Raid10, Some(0x102), 64, 4).rows(48),
        },
    ]
}

fn opts(shape: &Shape) -> cairn_md::CreateOptions {
    let mut o = shape.create_options();
    o.bitmap = BitmapChoice::Internal {
        chunk_bytes: Some(BM_CHUNK),
    };
    o
}

/// Writes spread over the array: (offset, length), block aligned.
fn workload(size: u64) -> Vec<(u64, u64)> {
    vec![
        (0, 4096),
        (3 * BM_CHUNK + 512 * 8, 8192),
        (size / 2, 100 * KIB),
        (size - 8192, 8192),
    ]
}

/// The bits the writes dirty, from the layout maths: member bytes per stripe row for
/// parity levels (the whole row is rewritten), array bytes for RAID1 and RAID10.
fn expected_bits(shape: &Shape, array: &Array, writes: &[(u64, u64)]) -> BTreeSet<u64> {
    let mut bits = BTreeSet::new();
    for &(off, len) in writes {
        let (start, end) = match shape.level {
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                let c = shape.chunk_kib * KIB;
                let data = match array.layout() {
                    cairn_md::layout::ArrayLayout::Parity(pl) => pl.data_disks() as u64,
                    _ => unreachable!(),
                };
                let row = c * data;
                (off / row * c, (off + len - 1) / row * c + c)
            }
            _ => (off, off + len),
        };
        bits.extend(start / BM_CHUNK..=(end - 1) / BM_CHUNK);
    }
    bits
}

fn pattern(len: u64, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7)).to_le_bytes()[0] | 1)
        .collect()
}

/// The bitmap as it is on `dev`: header and the set bits below `chunks`.
fn on_disk(dev: &dyn BlockDevice) -> (BitmapSuper, BTreeSet<u64>) {
    let mut head = vec![0u8; 4096];
    dev.read_at(&mut head, 8192).unwrap();
    let sb = BitmapSuper::parse(&head, "m").unwrap();
    let mut area = vec![0u8; us(sb.area_bytes().unwrap())];
    dev.read_at(&mut area, 8192).unwrap();
    let bits = (0..sb.chunks().unwrap())
        .filter(|&c| area[HEADER_SIZE + us(c / 8)] & (1 << (c % 8)) != 0)
        .collect();
    (sb, bits)
}

fn image(d: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; us(d.geometry().size)];
    d.read_at(&mut v, 0).unwrap();
    v
}

#[test]
fn bitmap_block_is_durable_before_each_data_write() {
    for case in cases() {
        let s = &case.shape;
        if s.level == Level::Raid10 {
            // Bits count array bytes there; the member-offset check below needs member
            // coverage. RAID10's bits are checked by the other tests.
            continue;
        }
        let logs: Vec<Arc<LogWritesDisk<MemDisk>>> = s
            .member_bytes()
            .into_iter()
            .map(|b| Arc::new(LogWritesDisk::new(MemDisk::new(b)).unwrap()))
            .collect();
        let devs: Vec<Arc<dyn BlockDevice>> = logs
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let a = Array::create(devs, names(logs.len()), &opts(s)).unwrap();
        let base = bases_of(&logs);
        let size = a.geometry().size;
        for (i, &(off, len)) in workload(size).iter().enumerate() {
            a.write_at(&pattern(len, i as u64), off, WriteFlags::NONE)
                .unwrap();
        }
        for (m, log) in logs.iter().enumerate() {
            let entries = log.log();
            let mut last_any: Option<Vec<u8>> = None;
            let mut last_fua: Option<Vec<u8>> = None;
            let mut data_writes = 0;
            for e in entries.entries() {
                let LogOp::Write { offset, data, fua } = &e.op else {
                    continue;
                };
                if *offset == 8192 {
                    last_any = Some(data.to_vec());
                    if *fua {
                        last_fua = Some(data.to_vec());
                    }
                    continue;
                }
                if *offset < base[m] {
                    continue;
                }
                data_writes += 1;
                let first = (offset - base[m]) / BM_CHUNK;
                let last = (offset - base[m] + data.len() as u64 - 1) / BM_CHUNK;
                for c in first..=last {
                    for (what, img) in [("last", &last_any), ("last FUA", &last_fua)] {
                        let img = img.as_ref().unwrap_or_else(|| {
                            panic!("{}: member {m}: data write with no bitmap write", s.name())
                        });
                        assert!(
                            img[HEADER_SIZE + us(c / 8)] & (1 << (c % 8)) != 0,
                            "{}: member {m}: data write at {offset} (chunk {c}) before the \
                             {what} bitmap write set its bit",
                            s.name()
                        );
                    }
                }
            }
            assert!(data_writes > 0, "{}: member {m} got no data", s.name());
        }
        a.close().unwrap();
    }
}

fn bases_of(logs: &[Arc<LogWritesDisk<MemDisk>>]) -> Vec<u64> {
    logs.iter()
        .map(|m| {
            Superblock::read_from(&**m, "m", cairn_md::FeaturePolicy::Supported)
                .unwrap()
                .data_offset
                .0
                * 512
        })
        .collect()
}

#[test]
fn bits_are_the_chunks_written_and_clear_after_flush_and_idle() {
    for case in cases() {
        let s = &case.shape;
        let m = mem_members(s);
        let a = Array::create(dyn_members(&m), names(m.len()), &opts(s)).unwrap();
        let info = a.bitmap_info().expect("a bitmap");
        assert_eq!(
            (info.dirty, info.chunk_bytes),
            (0, BM_CHUNK),
            "{}",
            s.name()
        );
        a.set_bitmap_daemon_sleep(Duration::from_secs(3600));
        let writes = workload(a.geometry().size);
        for (i, &(off, len)) in writes.iter().enumerate() {
            a.write_at(&pattern(len, i as u64), off, WriteFlags::NONE)
                .unwrap();
        }
        let want = expected_bits(s, &a, &writes);
        assert_eq!(
            a.bitmap_info().unwrap().dirty,
            want.len() as u64,
            "{}",
            s.name()
        );
        // On every member, durably, before anything else happens.
        for d in &m {
            assert_eq!(on_disk(&**d).1, want, "{}", s.name());
        }
        // Flushed but not idle long enough: kept.
        a.flush().unwrap();
        assert_eq!(a.bitmap_info().unwrap().dirty, want.len() as u64);
        // Idle: the next pass clears them, on disk too.
        a.set_bitmap_daemon_sleep(Duration::ZERO);
        assert_eq!(a.bitmap_daemon_work().unwrap(), want.len() as u64);
        assert_eq!(a.bitmap_info().unwrap().dirty, 0);
        for d in &m {
            let (sb, bits) = on_disk(&**d);
            assert!(bits.is_empty(), "{}", s.name());
            assert_eq!(sb.events_cleared, sb.events, "{}", s.name());
        }
        a.close().unwrap();
    }
}

#[test]
fn clean_close_leaves_no_dirty_bits_and_events_in_step() {
    for case in cases() {
        let s = &case.shape;
        let m = mem_members(s);
        let a = Array::create(dyn_members(&m), names(m.len()), &opts(s)).unwrap();
        for (i, &(off, len)) in workload(a.geometry().size).iter().enumerate() {
            a.write_at(&pattern(len, i as u64), off, WriteFlags::FUA)
                .unwrap();
        }
        a.close().unwrap();
        drop(a);
        for d in &m {
            let (bsb, bits) = on_disk(&**d);
            let sb = Superblock::read_from(&**d, "m", cairn_md::FeaturePolicy::Supported).unwrap();
            assert!(bits.is_empty(), "{}: {bits:?}", s.name());
            assert_eq!(bsb.events, sb.events, "{}", s.name());
            assert!(sb.is_clean());
        }
        // And it assembles clean with nothing to resync.
        let a =
            Array::assemble(dyn_members(&m), names(m.len()), AssembleOptions::default()).unwrap();
        assert_eq!(a.bitmap_info().unwrap().dirty, 0);
        a.resync().unwrap();
        a.close().unwrap();
    }
}

/// Creates, writes the workload, and returns member images taken while the array is
/// still open (what a crash leaves: the writes all returned, nothing closed), with the
/// bits the writes dirtied.
fn crashed(s: &Shape) -> (Vec<Vec<u8>>, BTreeSet<u64>, u64) {
    let m = mem_members(s);
    let a = Array::create(dyn_members(&m), names(m.len()), &opts(s)).unwrap();
    let writes = workload(a.geometry().size);
    for (i, &(off, len)) in writes.iter().enumerate() {
        a.write_at(&pattern(len, i as u64), off, WriteFlags::NONE)
            .unwrap();
    }
    a.flush().unwrap();
    let images = m.iter().map(|d| image(&**d)).collect();
    let want = expected_bits(s, &a, &writes);
    let chunks = a.bitmap_info().unwrap().chunks;
    (images, want, chunks)
}

fn reopen(images: &[Vec<u8>]) -> (Array, Vec<Arc<MemDisk>>) {
    let m: Vec<Arc<MemDisk>> = images
        .iter()
        .map(|i| Arc::new(MemDisk::from_bytes(i)))
        .collect();
    let a = Array::assemble(dyn_members(&m), names(m.len()), AssembleOptions::default()).unwrap();
    (a, m)
}

#[test]
fn crash_resyncs_only_the_dirty_chunks() {
    for case in cases() {
        let s = &case.shape;
        let (images, want, _) = crashed(s);
        let (a, m) = reopen(&images);
        assert_eq!(
            a.bitmap_info().unwrap().dirty,
            want.len() as u64,
            "{}",
            s.name()
        );
        a.resync().unwrap();
        let done = a.resynced_bytes();
        let bound = want.len() as u64 * BM_CHUNK + BM_CHUNK;
        assert!(
            done > 0 && done <= bound,
            "{}: resynced {done} bytes for {} dirty chunks",
            s.name(),
            want.len()
        );
        // Data intact, and a clean stop clears the bits.
        for (i, &(off, len)) in workload(a.geometry().size).iter().enumerate() {
            let mut back = vec![0u8; us(len)];
            a.read_at(&mut back, off).unwrap();
            assert_eq!(back, pattern(len, i as u64), "{}", s.name());
        }
        a.close().unwrap();
        for d in &m {
            assert!(on_disk(&**d).1.is_empty(), "{}", s.name());
        }
    }
}

#[test]
fn an_out_of_date_bitmap_means_a_full_resync() {
    for case in cases() {
        let s = &case.shape;
        let (mut images, _, chunks) = crashed(s);
        // The bitmap header says events 0: older than the superblocks.
        for img in &mut images {
            img[8192 + 24..8192 + 32].copy_from_slice(&0u64.to_le_bytes());
        }
        let (a, _m) = reopen(&images);
        assert_eq!(a.bitmap_info().unwrap().dirty, chunks, "{}", s.name());
        a.resync().unwrap();
        let full = match s.level {
            Level::Raid10 => a.geometry().size,
            _ => {
                let sb = Superblock::read_from(
                    &*a.member(0).unwrap(),
                    "m",
                    cairn_md::FeaturePolicy::Supported,
                )
                .unwrap();
                sb.size.0 * 512
            }
        };
        assert!(a.resynced_bytes() >= full - BM_CHUNK, "{}", s.name());
        a.close().unwrap();
    }
}

#[test]
fn a_degraded_array_keeps_its_bits() {
    for case in cases() {
        let s = &case.shape;
        let m = mem_members(s);
        let a = Array::create(dyn_members(&m), names(m.len()), &opts(s)).unwrap();
        a.close().unwrap();
        drop(a);
        // Member 1 missing.
        let present: Vec<Arc<MemDisk>> = m
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != 1)
            .map(|(_, d)| d.clone())
            .collect();
        let a = Array::assemble(
            dyn_members(&present),
            names(present.len()),
            AssembleOptions::default(),
        )
        .unwrap();
        a.set_bitmap_daemon_sleep(Duration::ZERO);
        let writes = workload(a.geometry().size);
        for (i, &(off, len)) in writes.iter().enumerate() {
            a.write_at(&pattern(len, i as u64), off, WriteFlags::NONE)
                .unwrap();
        }
        let want = expected_bits(s, &a, &writes);
        assert_eq!(a.bitmap_daemon_work().unwrap(), 0, "{}", s.name());
        a.close().unwrap();
        drop(a);
        for d in &present {
            let (bsb, bits) = on_disk(&**d);
            assert_eq!(bits, want, "{}", s.name());
            // The absent member's events are below events_cleared only if bits were
            // cleared after it left, which never happens while degraded.
            let gone =
                Superblock::read_from(&*m[1], "m", cairn_md::FeaturePolicy::Supported).unwrap();
            assert!(gone.events >= bsb.events_cleared, "{}", s.name());
        }
    }
}
