//! FLUSH and FUA over the real server, checked against the device's write log.
//!
//! ```text
//!   conn A (unix) ─┐                        LogWritesDisk ── MemDisk
//!   conn B (tcp)  ─┴─ server (4 workers) ──>   log: W W W(fua) FLUSH W ...  + clock ticks
//! ```
//!
//! Each connection owns half of the disk and runs epochs: a batch of pipelined writes to
//! distinct places (some FUA, some WRITE_ZEROES), all replies collected, then a FLUSH.
//! Reading the shared [`LogClock`] just before sending the FLUSH and just after its reply
//! brackets the device flush(es) it caused. Checks:
//! - some device flush ran inside that bracket, and the image the log says was durable at
//!   it holds exactly what the connection had acknowledged in its half;
//! - a crash right after the FLUSH reply keeps all of it;
//! - a crash right after a FUA reply keeps that write (the other writes of the batch touch
//!   other places and cannot cover it).
//!
//! The seed is printed (`durability seed: N`); `CAIRN_SEED=N` replays the workload (the
//! interleaving of the two connections is up to the scheduler).

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use cairn_block::testkit::{test_seed, CrashPoint, LogClock, LogWritesDisk, WriteLog};
use cairn_block::{BlockDevice, MemDisk};
use cairn_nbd::client::Connection;
use cairn_nbd::proto::*;
use cairn_nbd::{Listen, ServerConfig};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SIZE: u64 = 1 << 20;
const HALF: u64 = SIZE / 2;
/// Writes of one batch go to distinct slots of this size, so none overlaps another.
const SLOT: u64 = 8 << 10;
const EPOCHS: usize = 25;

/// What a connection saw: its flushes and FUA acknowledgements, with clock readings.
#[derive(Debug, Default)]
struct History {
    base: u64,
    /// (clock before sending FLUSH, clock after its reply, acknowledged contents of the half)
    flushes: Vec<(u64, u64, Vec<u8>)>,
    /// (clock after the reply, offset, data) of FUA writes and FUA zeroes.
    fua: Vec<(u64, u64, Vec<u8>)>,
    model: Vec<u8>,
}

fn workload(c: &mut Connection, clock: &LogClock, base: u64, rng: &mut SmallRng) -> History {
    let mut h = History {
        base,
        model: vec![0u8; HALF as usize],
        ..History::default()
    };
    let slots = HALF / SLOT;
    for _ in 0..EPOCHS {
        let n = rng.gen_range(1..=12usize);
        let mut chosen: Vec<u64> = rand::seq::index::sample(rng, slots as usize, n)
            .into_iter()
            .map(|s| s as u64)
            .collect();
        chosen.sort_unstable();
        // (cookie, offset in the half, data, fua)
        let mut sent = Vec::new();
        for s in chosen {
            let blocks = rng.gen_range(1..=(SLOT / 512));
            let start = s * SLOT + rng.gen_range(0..=(SLOT / 512 - blocks)) * 512;
            let len = (blocks * 512) as usize;
            let fua = rng.gen_bool(0.3);
            let flags = if fua { CMD_FLAG_FUA } else { 0 };
            let (cookie, data) = if rng.gen_bool(0.15) {
                let k = c
                    .submit(CMD_WRITE_ZEROES, flags, base + start, len as u32, &[])
                    .expect("submit zero");
                (k, vec![0u8; len])
            } else {
                let d = random_vec(rng, len);
                (
                    c.submit_write(base + start, &d, flags)
                        .expect("submit write"),
                    d,
                )
            };
            sent.push((cookie, start, data, fua));
        }
        for _ in 0..sent.len() {
            let r = c.recv().expect("reply");
            let now = clock.now();
            assert!(r.is_ok(), "write failed: {r:?}");
            let (_, start, data, fua) =
                sent.iter().find(|s| s.0 == r.cookie).expect("known cookie");
            h.model[*start as usize..*start as usize + data.len()].copy_from_slice(data);
            if *fua {
                h.fua.push((now, base + start, data.clone()));
            }
        }
        let t0 = clock.now();
        c.flush().expect("flush");
        let t1 = clock.now();
        h.flushes.push((t0, t1, h.model.clone()));
    }
    h
}

fn check(log: &WriteLog, h: &History, who: &str, rng: &mut SmallRng) {
    let half = h.base as usize..(h.base + HALF) as usize;
    for (i, (t0, t1, want)) in h.flushes.iter().enumerate() {
        let idx = log
            .entries()
            .iter()
            .position(|e| e.op.is_flush() && e.started >= *t0 && e.completed < *t1)
            .unwrap_or_else(|| panic!("{who}: FLUSH #{i} was acknowledged but no device flush ran while it was in flight"));
        let img = log.image_after(idx);
        if let Some(d) = cairn_block::testkit::first_difference(&img[half.clone()], want, h.base) {
            panic!("{who}: at FLUSH #{i} (log entry {idx}) the durable image lacks acknowledged writes: {d}");
        }
        let crash = log.crash_image(rng, CrashPoint::AtTime(*t1));
        if let Some(d) = cairn_block::testkit::first_difference(&crash[half.clone()], want, h.base)
        {
            panic!("{who}: a crash right after FLUSH #{i} lost acknowledged data: {d}");
        }
    }
    for (t, off, data) in &h.fua {
        for _ in 0..2 {
            let crash = log.crash_image(rng, CrashPoint::AtTime(*t));
            let at = *off as usize;
            if let Some(d) =
                cairn_block::testkit::first_difference(&crash[at..at + data.len()], data, *off)
            {
                panic!(
                    "{who}: a crash right after a FUA reply lost the write at {off}+{}: {d}",
                    data.len()
                );
            }
        }
    }
}

#[test]
fn flushed_and_fua_writes_are_durable_at_the_device() {
    let seed = test_seed("durability");
    let disk = Arc::new(LogWritesDisk::new(MemDisk::new(SIZE)).expect("log disk"));
    let clock = disk.clock().clone();
    let mut cfg = ServerConfig::new(vec![export("d", disk.clone() as Arc<dyn BlockDevice>)]);
    cfg.threads_per_connection = 4;
    let srv = TestServer::start_with(cfg);
    let addrs: [Listen; 2] = srv.addrs();
    let histories: Vec<History> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|i| {
                let addr = addrs[i as usize].clone();
                let clock = clock.clone();
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed ^ (i + 1));
                    let mut c = open(&addr, "d", i == 1, false);
                    let h = workload(&mut c, &clock, i * HALF, &mut rng);
                    c.disconnect().expect("disconnect");
                    h
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("workload thread"))
            .collect()
    });
    let log = disk.log();
    eprintln!(
        "durability: {} log entries, {} device flushes, {} FUA acknowledgements",
        log.len(),
        log.flush_count(),
        histories.iter().map(|h| h.fua.len()).sum::<usize>()
    );
    assert!(
        log.entries().iter().any(|e| e.op.fua()),
        "no FUA reached the device as FUA"
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    for (i, h) in histories.iter().enumerate() {
        check(&log, h, &format!("connection {i}"), &mut rng);
    }
    // The device holds the last acknowledged contents, read back through the server.
    let mut c = open(&srv.unix, "d", false, false);
    for h in &histories {
        let got = c.read_vec(h.base, HALF as u32, 0).expect("read back");
        assert!(
            got == h.model,
            "final contents of half at {} differ",
            h.base
        );
    }
}

#[test]
fn fua_is_passed_down_not_dropped() {
    // A narrower, deterministic check: one FUA write on an idle server is logged as a
    // FUA write, and a crash right after its reply keeps it while a plain write may be
    // lost (the crash model drops unflushed plain writes in some draws).
    let disk = Arc::new(LogWritesDisk::new(MemDisk::new(SIZE)).expect("log disk"));
    let srv = TestServer::start(vec![export("d", disk.clone() as Arc<dyn BlockDevice>)]);
    let mut c = open(&srv.tcp, "d", false, false);
    c.write(0, &[1u8; 4096], 0).expect("plain write");
    c.write(8192, &[2u8; 4096], CMD_FLAG_FUA)
        .expect("FUA write");
    let t = disk.clock().now();
    let log = disk.log();
    let fua: Vec<_> = log.entries().iter().filter(|e| e.op.fua()).collect();
    assert_eq!(
        fua.len(),
        1,
        "exactly the FUA write is logged as FUA: {:?}",
        log.entries()
    );
    let mut rng = SmallRng::seed_from_u64(1);
    let mut plain_lost = false;
    for _ in 0..64 {
        let img = log.crash_image(&mut rng, CrashPoint::AtTime(t));
        assert!(
            img[8192..12288].iter().all(|&b| b == 2),
            "a crash after the FUA reply lost it"
        );
        plain_lost |= img[..4096].iter().any(|&b| b != 1);
    }
    assert!(
        plain_lost,
        "the crash model never lost an unflushed plain write: the check above proves nothing"
    );
    assert_eq!(log.flush_count(), 0, "no flush was asked for");
    c.flush().expect("flush");
    assert_eq!(disk.flush_count(), 1, "one FLUSH, one device flush");
}
