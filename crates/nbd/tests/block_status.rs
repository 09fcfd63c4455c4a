//! `NBD_CMD_BLOCK_STATUS` with `base:allocation` over sparse devices: holes and data are
//! reported where they are, zero-flagged ranges read as zeroes, REQ_ONE gives one
//! descriptor, and the answers keep the protocol's shape.

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, FileDisk, MemDisk, OpenOptions};
use cairn_nbd::client::Connection;
use cairn_nbd::proto::*;
use common::*;
use rand::Rng;

/// MemDisk allocates in 64 KiB pages; a page never written (or wholly trimmed or zeroed)
/// is a hole.
const PAGE: u64 = 64 << 10;
const SIZE: u64 = 2 << 20;

/// Queries `[off, off + len)` the way a client must: the server may stop short, so ask
/// again from where it stopped. Checks the shape of each answer; returns (offset, length,
/// flags) runs covering the range.
fn walk(c: &mut Connection, off: u64, len: u64, ctx: &str) -> Vec<(u64, u64, u32)> {
    let min = u64::from(c.info().min_block);
    let mut out = Vec::new();
    let mut pos = off;
    while pos < off + len {
        let ask = u32::try_from((off + len - pos).min(1 << 30)).unwrap();
        let d = c
            .block_status(pos, ask, 0)
            .unwrap_or_else(|e| panic!("{ctx}: block status at {pos}: {e}"));
        assert!(!d.is_empty(), "{ctx}: no descriptors");
        let sum: u64 = d.iter().map(|&(l, _)| u64::from(l)).sum();
        assert!(
            sum <= u64::from(ask),
            "{ctx}: descriptors cover {sum} bytes of a {ask}-byte request"
        );
        for &(l, f) in &d {
            assert!(l > 0, "{ctx}: zero-length descriptor");
            assert_eq!(
                u64::from(l) % min,
                0,
                "{ctx}: descriptor length {l} not a multiple of {min}"
            );
            assert_eq!(
                f & !(STATE_HOLE | STATE_ZERO),
                0,
                "{ctx}: unknown state bits {f:#x}"
            );
            out.push((pos, u64::from(l), f));
            pos += u64::from(l);
        }
    }
    out
}

/// Every run agrees with the page model, and zero-flagged runs read as zeroes.
fn check_against_model(
    c: &mut Connection,
    runs: &[(u64, u64, u32)],
    allocated: &[bool],
    model: &[u8],
    ctx: &str,
) {
    for &(off, len, flags) in runs {
        let hole = flags & STATE_HOLE != 0;
        let zero = flags & STATE_ZERO != 0;
        assert!(!hole || zero, "{ctx}: a hole at {off} not flagged zero");
        let first = off / PAGE;
        let last = (off + len - 1) / PAGE;
        for p in first..=last {
            assert_eq!(
                hole,
                !allocated[p as usize],
                "{ctx}: run {off}+{len} flags {flags:#x}, but page {p} is {}",
                if allocated[p as usize] {
                    "allocated"
                } else {
                    "a hole"
                }
            );
        }
        if zero {
            let got = c.read_vec(off, len as u32, 0).expect("read a zero run");
            assert!(
                got.iter().all(|&b| b == 0),
                "{ctx}: run {off}+{len} flagged zero holds data"
            );
        }
        let expect_zero = model[off as usize..(off + len) as usize]
            .iter()
            .all(|&b| b == 0);
        if !expect_zero {
            assert!(
                !zero,
                "{ctx}: run {off}+{len} flagged zero, but data was written there"
            );
        }
    }
}

#[test]
fn memdisk_holes_and_data_are_reported_where_they_are() {
    let (mut rng, _) = rng_for("block_status_memdisk");
    let disk = Arc::new(MemDisk::new(SIZE));
    let srv = TestServer::start(vec![export("d", disk.clone())]);
    let pages = (SIZE / PAGE) as usize;
    let mut allocated = vec![false; pages];
    let mut model = vec![0u8; SIZE as usize];
    for addr in srv.addrs() {
        let mut c = open(&addr, "d", true, true);
        assert!(c.meta_base_allocation().is_some());
        // An empty disk is one hole.
        if !allocated.iter().any(|&a| a) {
            let runs = walk(&mut c, 0, SIZE, "empty disk");
            assert!(
                runs.iter().all(|r| r.2 == STATE_HOLE | STATE_ZERO),
                "empty disk: {runs:?}"
            );
        }
        for round in 0..30 {
            // Change something: write (allocates), trim or zero whole pages (holes again),
            // or zero part of a page (stays allocated, reads zero).
            let p = rng.gen_range(0..pages as u64);
            let n = rng.gen_range(1..=3u64).min(pages as u64 - p);
            let (off, len) = (p * PAGE, n * PAGE);
            match rng.gen_range(0..4) {
                0 | 1 => {
                    // A small write somewhere inside the pages.
                    let at = off + rng.gen_range(0..len / 512) * 512;
                    let l = (rng.gen_range(1..=16u64) * 512).min(off + len - at);
                    let d = random_vec(&mut rng, l as usize);
                    c.write(at, &d, 0).expect("write");
                    model[at as usize..(at + l) as usize].copy_from_slice(&d);
                    for q in at / PAGE..=(at + l - 1) / PAGE {
                        allocated[q as usize] = true;
                    }
                }
                2 => {
                    c.trim(off, len as u32, 0).expect("trim");
                    model[off as usize..(off + len) as usize].fill(0);
                    allocated[p as usize..(p + n) as usize].fill(false);
                }
                _ => {
                    c.write_zeroes(off + 512, 1024, 0).expect("partial zero");
                    model[(off + 512) as usize..(off + 1536) as usize].fill(0);
                }
            }
            let ctx = format!("{addr} round {round}");
            let runs = walk(&mut c, 0, SIZE, &ctx);
            check_against_model(&mut c, &runs, &allocated, &model, &ctx);
            // A random unaligned-to-page window.
            let a = rng.gen_range(0..SIZE / 512) * 512;
            let b = rng.gen_range(a / 512 + 1..=SIZE / 512) * 512;
            let runs = walk(&mut c, a, b - a, &format!("{ctx} window {a}..{b}"));
            assert_eq!(runs.first().map(|r| r.0), Some(a));
            check_against_model(&mut c, &runs, &allocated, &model, &ctx);
        }
        // The device itself agrees with what was sent.
        let direct = disk.extents(0, SIZE).expect("extents");
        for e in &direct {
            for q in e.offset / PAGE..(e.offset + e.length).div_ceil(PAGE) {
                assert_eq!(
                    e.hole, !allocated[q as usize],
                    "model drifted from MemDisk at page {q}"
                );
            }
        }
    }
}

#[test]
fn req_one_gives_exactly_one_descriptor() {
    let disk = Arc::new(MemDisk::new(SIZE));
    // hole | data | hole | data ...
    for p in (1..SIZE / PAGE).step_by(2) {
        disk.write_at(&[1u8; 512], p * PAGE, cairn_block::WriteFlags::NONE)
            .unwrap();
    }
    let srv = TestServer::start(vec![export("d", disk)]);
    for addr in srv.addrs() {
        let mut c = open(&addr, "d", true, true);
        let all = c.block_status(0, SIZE as u32, 0).expect("block status");
        assert!(
            all.len() > 1,
            "alternating pages give several descriptors: {all:?}"
        );
        for (off, len) in [
            (0, SIZE),
            (PAGE, SIZE - PAGE),
            (PAGE / 2, 3 * PAGE),
            (SIZE - 512, 512),
        ] {
            let d = c
                .block_status(off, len as u32, CMD_FLAG_REQ_ONE)
                .expect("REQ_ONE");
            assert_eq!(d.len(), 1, "{addr}: REQ_ONE at {off}+{len} gave {d:?}");
            let (l, f) = d[0];
            assert!(
                l > 0 && u64::from(l) <= len,
                "{addr}: REQ_ONE length {l} for a {len}-byte query"
            );
            let page_is_hole = (off / PAGE).is_multiple_of(2);
            assert_eq!(
                f & STATE_HOLE != 0,
                page_is_hole,
                "{addr}: REQ_ONE at {off}: flags {f:#x}"
            );
            // One descriptor never runs past the page's state.
            assert!(
                off + u64::from(l) <= (off / PAGE + 1) * PAGE,
                "{addr}: REQ_ONE descriptor crosses a state change"
            );
        }
    }
}

#[test]
fn file_disk_sparse_file_reports_consistent_extents() {
    let dir = TempDir::new("bs-file");
    let path = dir.path().join("sparse.img");
    let disk = FileDisk::open(
        &path,
        &OpenOptions {
            create_size: Some(SIZE),
            ..OpenOptions::default()
        },
    )
    .expect("create sparse file");
    let seek_data = disk.capabilities().extents;
    let disk = Arc::new(disk);
    let srv = TestServer::start(vec![export("f", disk)]);
    let (mut rng, _) = rng_for("block_status_file");
    let data = random_vec(&mut rng, 256 << 10);
    let mut c = open(&srv.unix, "f", true, true);
    c.write(1 << 20, &data, 0).expect("write");
    c.flush().expect("flush");
    let runs = walk(&mut c, 0, SIZE, "file");
    for &(off, len, flags) in &runs {
        let overlaps_data = off < (1 << 20) + data.len() as u64 && (1 << 20) < off + len;
        if overlaps_data {
            assert_eq!(
                flags & (STATE_HOLE | STATE_ZERO),
                0,
                "written data reported as hole/zero at {off}+{len}"
            );
        }
        if flags & STATE_ZERO != 0 {
            let got = c.read_vec(off, len as u32, 0).expect("read");
            assert!(
                got.iter().all(|&b| b == 0),
                "zero run {off}+{len} holds data"
            );
        }
    }
    if seek_data {
        assert!(
            runs.first().is_some_and(|r| r.2 & STATE_HOLE != 0),
            "SEEK_DATA works here, so the unwritten start of a sparse file is a hole: {runs:?}"
        );
        assert!(
            runs.last().is_some_and(|r| r.2 & STATE_HOLE != 0),
            "unwritten end is a hole: {runs:?}"
        );
    } else {
        eprintln!("SKIP hole checks: this filesystem does not support SEEK_DATA");
    }
    // Trimmed range becomes a hole (or at least reads as zeroes if the filesystem punches).
    c.trim(1 << 20, 128 << 10, 0).expect("trim");
    let runs = walk(&mut c, 1 << 20, 128 << 10, "file after trim");
    for &(off, len, flags) in &runs {
        if flags & STATE_ZERO != 0 {
            assert!(c
                .read_vec(off, len as u32, 0)
                .unwrap()
                .iter()
                .all(|&b| b == 0));
        }
    }
}
