//! FaultyDisk's failure modes: after N ops of a kind or in total, on ranges, always,
//! transient, torn writes, healing, counters, and control from another thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cairn_block::testkit::{Fault, FaultyDisk, LogOp, LogWritesDisk, Op, Ops, Torn};
use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};

const SIZE: u64 = 1 << 20;

fn disk() -> FaultyDisk<MemDisk> {
    FaultyDisk::new(MemDisk::new(SIZE))
}

fn read(d: &dyn BlockDevice, off: u64, len: usize) -> cairn_block::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    d.read_at(&mut buf, off).map(|()| buf)
}

fn assert_injected(r: cairn_block::Result<impl std::fmt::Debug>, op: &str, offset: u64) {
    let e = r.expect_err("expected an injected failure");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("injected fault"), "{msg}");
    assert!(msg.contains(op), "{msg} should name {op}");
    if op != "flush" {
        assert!(
            msg.contains(&format!("at {offset}")),
            "{msg} should name offset {offset}"
        );
    }
}

#[test]
fn fails_writes_after_n_writes_and_heals() {
    let d = disk();
    let h = d.handle();
    h.fail_after(Op::Write, 3);
    for i in 0..3u64 {
        d.write_at(&[1u8; 512], i * 512, WriteFlags::NONE)
            .expect("first three writes pass");
        // Other kinds do not count towards a write rule and keep working.
        read(&d, 0, 512).expect("reads pass");
        d.flush().expect("flushes pass");
    }
    assert_injected(
        d.write_at(&[2u8; 512], 4096, WriteFlags::NONE),
        "write",
        4096,
    );
    assert_injected(
        d.write_at(&[2u8; 512], 8192, WriteFlags::FUA),
        "write",
        8192,
    );
    // The failed writes did not reach the inner device.
    assert_eq!(read(d.inner(), 4096, 512).unwrap(), vec![0u8; 512]);
    assert_eq!(read(d.inner(), 8192, 512).unwrap(), vec![0u8; 512]);
    h.heal();
    assert!(!h.is_faulty());
    d.write_at(&[3u8; 512], 4096, WriteFlags::NONE)
        .expect("healed");
    assert_eq!(read(&d, 4096, 512).unwrap(), vec![3u8; 512]);
}

#[test]
fn each_op_kind_can_fail_after_n() {
    let cases: [(Op, &str); 5] = [
        (Op::Read, "read"),
        (Op::Write, "write"),
        (Op::Flush, "flush"),
        (Op::Discard, "discard"),
        (Op::WriteZeroes, "write_zeroes"),
    ];
    for (op, name) in cases {
        let d = disk();
        d.handle().fail_after(op, 2);
        let run = |off: u64| -> cairn_block::Result<()> {
            match op {
                Op::Read => read(&d, off, 512).map(|_| ()),
                Op::Write => d.write_at(&[9u8; 512], off, WriteFlags::NONE),
                Op::Flush => d.flush(),
                Op::Discard => d.discard(off, 512),
                Op::WriteZeroes => d.write_zeroes(off, 512, WriteFlags::NONE),
                Op::Extents => d.extents(off, 512).map(|_| ()),
            }
        };
        run(0).unwrap_or_else(|e| panic!("{name} #1: {e}"));
        run(512).unwrap_or_else(|e| panic!("{name} #2: {e}"));
        assert_injected(run(1024), name, 1024);
        assert_injected(run(1536), name, 1536);
        assert_eq!(d.handle().stats().count(op), 4);
        assert_eq!(d.handle().stats().failed, 2);
    }
}

#[test]
fn fails_after_n_ops_total() {
    let d = disk();
    let h = d.handle();
    h.fail_after_total(Op::Flush, 4);
    d.flush().expect("op 1");
    read(&d, 0, 512).expect("op 2");
    d.write_at(&[1u8; 512], 0, WriteFlags::NONE).expect("op 3");
    d.flush().expect("op 4");
    assert_injected(d.flush(), "flush", 0);
    // Only flushes fail.
    read(&d, 0, 512).expect("reads still pass");
    d.write_at(&[1u8; 512], 0, WriteFlags::NONE)
        .expect("writes still pass");
    assert_injected(d.flush(), "flush", 0);
}

#[test]
fn fails_only_on_ranges() {
    let d = disk();
    let h = d.handle();
    h.fail_range(Ops::ALL, 8192..12288);
    read(&d, 0, 8192).expect("just before the range");
    read(&d, 12288, 512).expect("just after the range");
    assert_injected(read(&d, 8192, 512), "read", 8192);
    assert_injected(read(&d, 11776, 512), "read", 11776);
    // Any overlap counts: a request that starts before and ends inside.
    assert_injected(read(&d, 4096, 8192), "read", 4096);
    assert_injected(
        d.write_at(&[1u8; 1024], 7680, WriteFlags::NONE),
        "write",
        7680,
    );
    assert_injected(d.discard(12288 - 512, 1024), "discard", 11776);
    assert_injected(d.write_zeroes(0, SIZE, WriteFlags::NONE), "write_zeroes", 0);
    assert_injected(d.extents(8192, 512), "extents", 8192);
    d.flush()
        .expect("flush has no range: never matches a ranged rule");
    d.write_at(&[1u8; 512], 12288, WriteFlags::NONE)
        .expect("outside");
    // A read-only range rule leaves writes alone.
    h.heal();
    h.fail_range(Ops::READ, 0..512);
    d.write_at(&[5u8; 512], 0, WriteFlags::NONE)
        .expect("writes pass");
    assert_injected(read(&d, 0, 512), "read", 0);
}

#[test]
fn fail_always_is_a_dead_disk() {
    let d = disk();
    let h = d.handle();
    d.write_at(&[7u8; 512], 0, WriteFlags::NONE).unwrap();
    h.fail_always();
    assert_injected(read(&d, 0, 512), "read", 0);
    assert_injected(d.write_at(&[1u8; 512], 0, WriteFlags::NONE), "write", 0);
    assert_injected(d.flush(), "flush", 0);
    assert_injected(d.discard(0, 512), "discard", 0);
    assert_injected(d.write_zeroes(0, 512, WriteFlags::NONE), "write_zeroes", 0);
    assert_injected(d.extents(0, 512), "extents", 0);
    d.cache(0, 512).expect("cache is a hint and never fails");
    h.heal();
    assert_eq!(
        read(&d, 0, 512).unwrap(),
        vec![7u8; 512],
        "data survived the outage"
    );
}

#[test]
fn transient_faults_expire() {
    let d = disk();
    d.handle().inject(Fault::new(Ops::MODIFY).after(1).times(2));
    d.write_at(&[1u8; 512], 0, WriteFlags::NONE)
        .expect("first passes");
    assert_injected(d.write_at(&[1u8; 512], 0, WriteFlags::NONE), "write", 0);
    assert_injected(d.discard(0, 512), "discard", 0);
    d.write_at(&[1u8; 512], 0, WriteFlags::NONE)
        .expect("rule expired");
    assert!(!d.handle().is_faulty());
    // times(0) never fires.
    d.handle().inject(Fault::new(Ops::ALL).times(0));
    d.flush().expect("times(0) is no fault");
}

#[test]
fn rules_apply_in_order_and_count_independently() {
    let d = disk();
    let h = d.handle();
    h.fail_after(Op::Read, 2);
    h.inject(Fault::new(Op::Read).in_range(0..512).times(1));
    // Read 1 at 0: the first rule is not due, the second fires (and expires).
    assert_injected(read(&d, 0, 512), "read", 0);
    // Read 2: counted by the first rule as its second; passes.
    read(&d, 0, 512).expect("second read passes");
    // Read 3: the first rule is due.
    assert_injected(read(&d, 4096, 512), "read", 4096);
}

#[test]
fn torn_write_lands_a_prefix() {
    let d = disk();
    d.handle()
        .inject(Fault::new(Op::Write).torn(Torn::Blocks(3)).times(1));
    let data: Vec<u8> = (0..8 * 512)
        .map(|i| u8::try_from(i / 512 + 1).expect("8 blocks"))
        .collect();
    let e = d
        .write_at(&data, 4096, WriteFlags::FUA)
        .expect_err("torn write fails");
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("torn"), "{e}");
    let got = read(&d, 4096, 8 * 512).unwrap();
    assert_eq!(&got[..3 * 512], &data[..3 * 512], "prefix landed");
    assert_eq!(&got[3 * 512..], &vec![0u8; 5 * 512][..], "the rest did not");
    assert_eq!(d.handle().stats().torn, 1);

    // A prefix longer than the write lands all of it, and still fails.
    d.handle()
        .inject(Fault::new(Op::Write).torn(Torn::Blocks(100)).times(1));
    assert!(d.write_at(&[0xee; 1024], 0, WriteFlags::NONE).is_err());
    assert_eq!(read(&d, 0, 1024).unwrap(), vec![0xee; 1024]);
}

#[test]
fn torn_random_lands_some_prefix() {
    let d = disk();
    d.handle()
        .inject(Fault::new(Op::Write | Op::WriteZeroes).torn(Torn::Random(42)));
    let mut lens = std::collections::BTreeSet::new();
    for round in 0..40u8 {
        let off = u64::from(round) * 8192;
        d.inner()
            .write_at(&[0xffu8; 8192], off, WriteFlags::NONE)
            .unwrap();
        let data = vec![round; 8192];
        let use_zeroes = round % 2 == 1;
        let r = if use_zeroes {
            d.write_zeroes(off, 8192, WriteFlags::NONE)
        } else {
            d.write_at(&data, off, WriteFlags::NONE)
        };
        assert!(r.is_err());
        let got = read(&d, off, 8192).unwrap();
        let new = if use_zeroes { 0 } else { round };
        // Some prefix of whole blocks is new, the rest old.
        let landed = got.iter().take_while(|&&b| b == new).count() / 512 * 512;
        assert!(
            got[landed..].iter().all(|&b| b == 0xff),
            "round {round}: not a prefix"
        );
        lens.insert(landed);
    }
    assert!(lens.len() > 3, "random prefixes should vary: {lens:?}");
}

#[test]
fn torn_write_is_logged_as_the_prefix_that_landed() {
    let d = FaultyDisk::new(LogWritesDisk::new(MemDisk::new(SIZE)).unwrap());
    d.handle()
        .inject(Fault::new(Op::Write).after(1).torn(Torn::Blocks(2)));
    d.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    assert!(d.write_at(&[2u8; 4096], 8192, WriteFlags::FUA).is_err());
    assert!(d.write_at(&[3u8; 4096], 16384, WriteFlags::NONE).is_err());
    let log = d.inner().log();
    let writes: Vec<(u64, usize)> = log
        .entries()
        .iter()
        .map(|e| match &e.op {
            LogOp::Write { offset, data, .. } => (*offset, data.len()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(writes, vec![(0, 4096), (8192, 1024), (16384, 1024)]);
    assert_eq!(log.image_after(log.len()), d.inner().inner().to_vec());
}

#[test]
fn counters_count_every_op() {
    let d = disk();
    let h = d.handle();
    read(&d, 0, 512).unwrap();
    read(&d, 0, 512).unwrap();
    d.write_at(&[0u8; 512], 0, WriteFlags::NONE).unwrap();
    d.flush().unwrap();
    d.discard(0, 512).unwrap();
    d.write_zeroes(0, 512, WriteFlags::NONE).unwrap();
    d.extents(0, 512).unwrap();
    h.fail_always();
    let _ = d.flush();
    let s = h.stats();
    assert_eq!(
        (
            s.reads,
            s.writes,
            s.flushes,
            s.discards,
            s.write_zeroes,
            s.extents,
            s.failed
        ),
        (2, 1, 2, 1, 1, 1, 1)
    );
    assert_eq!(s.total(), 8);
    h.reset_stats();
    assert_eq!(h.stats().total(), 0);
}

#[test]
fn handle_controls_the_disk_from_another_thread() {
    let d = disk();
    let h = d.handle();
    let stop = AtomicBool::new(false);
    let ok = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (d, stop, ok, failed) = (&d, &stop, &ok, &failed);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let off = (t * 64 + i % 64) * 512;
                    match d.write_at(
                        &[u8::try_from(t).expect("4 threads"); 512],
                        off,
                        WriteFlags::NONE,
                    ) {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::Io);
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    i += 1;
                }
            });
        }
        while h.stats().writes < 200 {
            std::thread::yield_now();
        }
        h.fail_always();
        let at_failure = h.stats().writes;
        while h.stats().writes < at_failure + 200 {
            std::thread::yield_now();
        }
        h.heal();
        let at_heal = h.stats().writes;
        while h.stats().writes < at_heal + 200 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let s = h.stats();
    assert_eq!(
        s.writes,
        ok.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed)
    );
    assert_eq!(s.failed, failed.load(Ordering::Relaxed));
    assert!(s.failed >= 200 - 4, "writes while dead must fail: {s:?}");
}
