//! Graceful shutdown: `serve` returns, requests in flight are answered (or the connection
//! closes cleanly), nothing acknowledged is lost, and the device is flushed last.

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, MemDisk};
use cairn_nbd::client::Error;
use cairn_nbd::proto::*;
use cairn_nbd::{Listen, ServerConfig};
use common::*;

#[test]
fn in_flight_requests_finish_and_the_device_is_flushed() {
    let (mut rng, _) = rng_for("shutdown_in_flight");
    for transport in 0..2 {
        let disk = HookDisk::new(MemDisk::new(8 << 20));
        *disk.write_delay.lock().unwrap() = Duration::from_millis(200);
        let disk = Arc::new(disk);
        let mut cfg = ServerConfig::new(vec![export("d", disk.clone())]);
        cfg.threads_per_connection = 4;
        let mut srv = TestServer::start_with(cfg);
        let addr = srv.addrs()[transport].clone();
        let mut c = open(&addr, "d", transport == 1, false);
        let mut idle = open(&addr, "d", false, false);
        let mut sent = HashMap::new();
        for i in 0..4u64 {
            let data = random_vec(&mut rng, 64 << 10);
            let k = c.submit_write(i << 20, &data, 0).expect("submit");
            sent.insert(k, (i << 20, data));
        }
        wait_until("four writes inside the device", || {
            disk.writes_started.load(Ordering::SeqCst) == 4
        });
        let took = srv.shutdown();
        assert!(
            took < Duration::from_secs(3),
            "shutdown took {took:?} with 200 ms of work in flight"
        );
        // Everything the device was doing finished before serve() returned, and a flush
        // came after the last write.
        assert_eq!(disk.writes_done.load(Ordering::SeqCst), 4);
        assert!(
            disk.flushes.load(Ordering::SeqCst) >= 1,
            "no flush at shutdown"
        );
        assert_eq!(
            disk.writes_done_at_last_flush.load(Ordering::SeqCst),
            4,
            "the last flush ran before the last write finished"
        );
        // Each in-flight request got a reply (success or ESHUTDOWN), or the stream ended
        // cleanly; no acknowledged write is missing.
        let mut acked = 0;
        while c.in_flight() > 0 {
            match c.recv() {
                Ok(r) => {
                    let (off, data) = sent.get(&r.cookie).expect("known cookie");
                    match r.error {
                        0 => {
                            acked += 1;
                            let mut got = vec![0u8; data.len()];
                            disk.inner.read_at(&mut got, *off).unwrap();
                            assert!(
                                got == *data,
                                "acknowledged write at {off} is not on the device"
                            );
                        }
                        ESHUTDOWN => {}
                        e => panic!("in-flight write answered with error {e}"),
                    }
                }
                Err(Error::Closed) => break,
                Err(e) => panic!("in-flight replies: {e}"),
            }
        }
        eprintln!("transport {transport}: {acked} of 4 in-flight writes acknowledged");
        // Both connections are closed now.
        assert!(c.recv().is_err(), "the connection survived shutdown");
        let _ = idle.submit_read(0, 512, 0);
        assert!(idle.recv().is_err(), "an idle connection survived shutdown");
        // Nothing listens any more.
        match &addr {
            Listen::Unix(p) => assert!(!p.exists(), "socket file {} left behind", p.display()),
            Listen::Tcp(a) => {
                let still = std::net::TcpStream::connect(a).and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_secs(2)))?;
                    let mut b = [0u8; 1];
                    std::io::Read::read(&mut &s, &mut b)
                });
                assert!(
                    !matches!(still, Ok(n) if n > 0),
                    "a new TCP connection was greeted after shutdown"
                );
            }
        }
    }
}

#[test]
fn idle_and_handshaking_connections_do_not_delay_shutdown() {
    let mut srv = TestServer::start(vec![export("d", mem(1 << 20))]);
    let mut idle = open(&srv.unix, "d", true, false);
    idle.write(0, &[3u8; 4096], 0).expect("write");
    let mut hs = handshake(&srv.tcp);
    let took = srv.shutdown();
    assert!(
        took < Duration::from_secs(2),
        "shutdown with idle connections took {took:?}"
    );
    // A handshake in progress is refused or closed, never served.
    match hs.list() {
        Err(Error::Option { reply, .. }) => assert_eq!(reply, REP_ERR_SHUTDOWN),
        Err(Error::Closed) | Err(Error::Io(_)) | Err(Error::Protocol(_)) => {}
        Ok(l) => panic!("LIST answered after shutdown: {l:?}"),
        Err(e) => panic!("unexpected {e}"),
    }
    assert!(
        idle.read_vec(0, 4096, 0).is_err(),
        "transmission went on after shutdown"
    );
}

#[test]
fn shutdown_with_no_connections_is_quick_and_idempotent() {
    let mut srv = TestServer::start(vec![export("d", mem(1 << 20))]);
    let h = srv.handle();
    let took = srv.shutdown();
    assert!(took < Duration::from_secs(2), "idle shutdown took {took:?}");
    assert!(h.is_shutdown());
    h.shutdown(); // a second call is harmless
}

#[test]
fn requests_queued_behind_busy_workers_at_shutdown_are_answered_or_dropped_cleanly() {
    // Twice as many writes as workers: half are inside the device when shutdown starts,
    // the rest are still waiting to be read. Each may be answered (success or ESHUTDOWN)
    // or left unanswered by a clean close, but an acknowledged write must be on the
    // device, and the final flush must come after every write the device saw.
    let (mut rng, _) = rng_for("shutdown_queued");
    let disk = HookDisk::new(MemDisk::new(16 << 20));
    *disk.write_delay.lock().unwrap() = Duration::from_millis(150);
    let disk = Arc::new(disk);
    let mut cfg = ServerConfig::new(vec![export("d", disk.clone())]);
    cfg.threads_per_connection = 4;
    let mut srv = TestServer::start_with(cfg);
    let mut c = open(&srv.unix, "d", false, false);
    let mut sent = HashMap::new();
    for i in 0..8u64 {
        let data = random_vec(&mut rng, 16 << 10);
        let k = c.submit_write(i << 20, &data, 0).expect("submit");
        sent.insert(k, (i << 20, data));
    }
    wait_until("four writes inside the device", || {
        disk.writes_started.load(Ordering::SeqCst) >= 4
    });
    srv.shutdown();
    let done = disk.writes_done.load(Ordering::SeqCst);
    assert_eq!(
        done,
        disk.writes_started.load(Ordering::SeqCst),
        "a write was still running after serve() returned"
    );
    assert_eq!(
        disk.writes_done_at_last_flush.load(Ordering::SeqCst),
        done,
        "no flush after the last write"
    );
    let (mut ok, mut shut, mut unanswered) = (0, 0, 0);
    loop {
        match c.recv() {
            Ok(r) => {
                let (off, data) = sent.remove(&r.cookie).expect("one reply per cookie");
                match r.error {
                    0 => {
                        ok += 1;
                        let mut got = vec![0u8; data.len()];
                        disk.inner.read_at(&mut got, off).unwrap();
                        assert!(
                            got == data,
                            "acknowledged write at {off} is not on the device"
                        );
                    }
                    ESHUTDOWN => shut += 1,
                    e => panic!("write answered with error {e} during shutdown"),
                }
            }
            Err(Error::Closed) => {
                unanswered = sent.len();
                break;
            }
            Err(e) => panic!("replies during shutdown: {e}"),
        }
        if sent.is_empty() {
            break;
        }
    }
    eprintln!("8 writes at shutdown: {ok} acknowledged, {shut} ESHUTDOWN, {unanswered} unanswered; the device ran {done}");
    assert!(
        ok >= 4,
        "the four writes inside the device must be answered"
    );
}

#[test]
fn disc_answers_requests_in_flight_then_closes() {
    let disk = HookDisk::new(MemDisk::new(4 << 20));
    disk.inner
        .write_at(&[7u8; 8192], 0, cairn_block::WriteFlags::NONE)
        .unwrap();
    *disk.read_delay.lock().unwrap() = Some((0..8192, Duration::from_millis(150)));
    let srv = TestServer::start(vec![export("d", Arc::new(disk))]);
    for addr in srv.addrs() {
        let mut c = open(&addr, "d", true, false);
        let a = c.submit_read(0, 4096, 0).expect("read");
        let b = c.submit_read(4096, 4096, 0).expect("read");
        let w = c.submit_write(1 << 20, &[1u8; 4096], 0).expect("write");
        let mut disc = cairn_nbd::client::RawRequest::new(CMD_DISC, 0, 0, 0);
        disc.cookie = 99;
        c.send_raw(disc, &[]).expect("DISC");
        let mut got = Vec::new();
        for _ in 0..3 {
            let r = c.recv().unwrap_or_else(|e| {
                panic!("{addr}: a request sent before DISC was not answered: {e}")
            });
            assert!(r.is_ok(), "{r:?}");
            if r.cookie != w {
                assert_eq!(r.data, vec![7u8; 4096]);
            }
            got.push(r.cookie);
        }
        got.sort_unstable();
        let mut want = vec![a, b, w];
        want.sort_unstable();
        assert_eq!(got, want);
        c.expect_closed()
            .unwrap_or_else(|e| panic!("{addr}: no close after DISC (or a reply to it): {e}"));
    }
}
