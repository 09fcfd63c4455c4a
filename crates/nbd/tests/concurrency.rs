//! Pipelining, out-of-order replies and multiple connections.

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, MemDisk, WriteDone, WriteFlags};
use cairn_nbd::client::{Client, ClientOptions, Connection};
use cairn_nbd::proto::*;
use cairn_nbd::ServerConfig;
use common::*;
use rand::Rng;

const BLOCK: usize = 4096;

#[test]
fn a_slow_request_does_not_hold_back_later_replies() {
    let disk = HookDisk::new(MemDisk::new(4 << 20));
    *disk.read_delay.lock().unwrap() = Some((0..4096, Duration::from_millis(500)));
    let disk = Arc::new(disk);
    // Several workers per connection: the server runs requests of one connection
    // concurrently and replies in completion order.
    let mut cfg = ServerConfig::new(vec![export("d", disk)]);
    cfg.threads_per_connection = 4;
    let srv = TestServer::start_with(cfg);
    for addr in srv.addrs() {
        for structured in [false, true] {
            let mut c = open(&addr, "d", structured, false);
            let t0 = Instant::now();
            let slow = c.submit_read(0, 4096, 0).expect("slow read");
            let fast_w = c
                .submit_write(1 << 20, &[9u8; 4096], 0)
                .expect("fast write");
            let fast_r = c.submit_read(8192, 4096, 0).expect("fast read");
            let first = c.recv().expect("first reply");
            let second = c.recv().expect("second reply");
            let third = c.recv().expect("third reply");
            assert!(t0.elapsed() >= Duration::from_millis(500));
            assert_ne!(
                first.cookie, slow,
                "{addr}: the slow read's reply came first: replies are serialised"
            );
            assert_ne!(
                second.cookie, slow,
                "{addr}: the slow read overtook a fast request"
            );
            assert_eq!(third.cookie, slow);
            let got: HashSet<u64> = [first.cookie, second.cookie].into();
            assert_eq!(got, [fast_w, fast_r].into());
            for r in [first, second, third] {
                assert!(r.is_ok(), "{r:?}");
            }
        }
    }
}

/// A device the server has learned is fast has its requests run on the connection's
/// reader (no hand-off); when it turns slow, the server goes back to keeping requests in
/// flight after a sample or two, instead of answering one slow request at a time.
#[test]
fn a_fast_device_that_turns_slow_gets_its_requests_overlapped_again() {
    let disk = Arc::new(HookDisk::new(MemDisk::new(4 << 20)));
    let srv = TestServer::start_with(ServerConfig::new(vec![export("d", disk.clone())]));
    let addr = &srv.addrs()[0];
    let mut c = open(addr, "d", true, false);
    // Fast: hundreds of reads from memory.
    for i in 0..400u64 {
        c.read_vec((i % 64) * 4096, 4096, 0).expect("fast read");
    }
    const SLOW: Duration = Duration::from_millis(50);
    const N: u64 = 16;
    *disk.read_delay.lock().unwrap() = Some((0..4 << 20, SLOW));
    let t0 = Instant::now();
    let cookies: Vec<u64> = (0..N)
        .map(|i| c.submit_read(i * 4096, 4096, 0).expect("slow read"))
        .collect();
    let mut got = HashSet::new();
    for _ in 0..N {
        let r = c.recv().expect("reply");
        assert!(r.is_ok(), "{r:?}");
        got.insert(r.cookie);
    }
    let took = t0.elapsed();
    assert_eq!(got, cookies.into_iter().collect::<HashSet<_>>());
    // One at a time would take N x 50 ms = 800 ms; at most a few run on the reader
    // before the estimate crosses the line, then the rest overlap.
    assert!(
        took < SLOW * 8,
        "{N} slow reads took {took:?}: the server did not overlap them"
    );
}

/// Sends `ops` with at most `window` in flight, returns replies by cookie, and checks that
/// every cookie got exactly one reply.
fn pipeline(
    c: &mut Connection,
    ops: &[Op],
    window: usize,
) -> HashMap<u64, cairn_nbd::client::Reply> {
    let mut cookies = Vec::with_capacity(ops.len());
    let mut replies = HashMap::new();
    let take = |c: &mut Connection, replies: &mut HashMap<u64, cairn_nbd::client::Reply>| {
        let r = c.recv().expect("reply");
        assert!(
            replies.insert(r.cookie, r).is_none(),
            "two replies for one cookie"
        );
    };
    for op in ops {
        if c.in_flight() >= window {
            take(c, &mut replies);
        }
        let cookie = match op {
            Op::Write(off, data, fua) => {
                c.submit_write(*off, data, if *fua { CMD_FLAG_FUA } else { 0 })
            }
            Op::Read(off) => c.submit_read(*off, BLOCK as u32, 0),
            Op::Flush => c.submit_flush(),
        }
        .expect("submit");
        cookies.push(cookie);
    }
    while c.in_flight() > 0 {
        take(c, &mut replies);
    }
    assert_eq!(replies.len(), ops.len(), "every request gets one reply");
    for k in &cookies {
        assert!(replies.contains_key(k), "no reply for cookie {k}");
    }
    // Keep the order of `ops` for the caller.
    cookies
        .into_iter()
        .zip(ops)
        .map(|(k, _)| (k, replies.remove(&k).expect("present")))
        .collect()
}

#[derive(Debug)]
enum Op {
    Write(u64, Vec<u8>, bool),
    Read(u64),
    Flush,
}

#[test]
fn pipelined_reads_and_writes_all_complete_with_the_right_data() {
    let (mut rng, _) = rng_for("pipelined");
    const BLOCKS: usize = 256;
    for threads in [1, 4] {
        let mut cfg = ServerConfig::new(vec![export("d", mem((BLOCKS * BLOCK) as u64))]);
        cfg.threads_per_connection = threads;
        let srv = TestServer::start_with(cfg);
        for addr in srv.addrs() {
            for structured in [false, true] {
                let ctx = format!("{addr} threads={threads} structured={structured}");
                let mut c = open(&addr, "d", structured, false);
                // Fill every block, pipelined.
                let mut model: Vec<Vec<u8>> =
                    (0..BLOCKS).map(|_| random_vec(&mut rng, BLOCK)).collect();
                let fill: Vec<Op> = model
                    .iter()
                    .enumerate()
                    .map(|(i, d)| Op::Write((i * BLOCK) as u64, d.clone(), i % 7 == 0))
                    .collect();
                for (_, r) in pipeline(&mut c, &fill, 16) {
                    assert!(r.is_ok(), "{ctx}: fill: {r:?}");
                }
                // Rewrite even blocks while reading odd ones (never both on one block
                // while in flight), with a few flushes mixed in.
                let mut ops = Vec::new();
                let mut expect: HashMap<usize, usize> = HashMap::new(); // op index -> block
                for (i, slot) in model.iter_mut().enumerate() {
                    if i % 2 == 0 {
                        let d = random_vec(&mut rng, BLOCK);
                        *slot = d.clone();
                        ops.push(Op::Write((i * BLOCK) as u64, d, rng.gen_bool(0.2)));
                    } else {
                        expect.insert(ops.len(), i);
                        ops.push(Op::Read((i * BLOCK) as u64));
                    }
                    if rng.gen_bool(0.05) {
                        ops.push(Op::Flush);
                    }
                }
                let replies: Vec<_> = {
                    let m = pipeline(&mut c, &ops, 24);
                    let mut v: Vec<_> = m.into_iter().collect();
                    v.sort_by_key(|(k, _)| *k);
                    v
                };
                for (idx, (_, r)) in replies.iter().enumerate() {
                    assert!(r.is_ok(), "{ctx}: op {idx}: {r:?}");
                    if let Some(&b) = expect.get(&idx) {
                        assert!(
                            r.data == model[b],
                            "{ctx}: pipelined read of block {b} returned wrong data"
                        );
                    }
                }
                // Read everything back, pipelined and in random order.
                let mut order: Vec<usize> = (0..BLOCKS).collect();
                rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
                let reads: Vec<Op> = order
                    .iter()
                    .map(|&b| Op::Read((b * BLOCK) as u64))
                    .collect();
                let mut v: Vec<_> = pipeline(&mut c, &reads, 32).into_iter().collect();
                v.sort_by_key(|(k, _)| *k);
                for ((_, r), &b) in v.iter().zip(&order) {
                    assert!(r.data == model[b], "{ctx}: final read of block {b} differs");
                }
                c.disconnect().expect("disconnect");
            }
        }
    }
}

#[test]
fn write_on_one_connection_flush_on_another_read_on_a_third() {
    let disk = Arc::new(HookDisk::new(MemDisk::new(8 << 20)));
    let srv = TestServer::start(vec![export("d", disk.clone())]);
    let (mut rng, _) = rng_for("multi_conn");
    for addr in srv.addrs() {
        let mut a = open(&addr, "d", false, false);
        let mut b = open(&addr, "d", true, false);
        let mut c = open(&addr, "d", true, true);
        for conn in [&a, &b, &c] {
            assert!(
                conn.info().has(FLAG_CAN_MULTI_CONN),
                "multi-conn must be advertised"
            );
        }
        let data = random_vec(&mut rng, 64 << 10);
        a.write(1 << 20, &data, 0).expect("write on A");
        let writes_before = disk.writes_done.load(Ordering::SeqCst);
        let flushes_before = disk.flushes.load(Ordering::SeqCst);
        b.flush().expect("flush on B");
        assert!(
            disk.flushes.load(Ordering::SeqCst) > flushes_before,
            "FLUSH on B did not reach the device"
        );
        assert!(
            disk.writes_done_at_last_flush.load(Ordering::SeqCst) >= writes_before,
            "the device flush ran before A's completed write"
        );
        assert_eq!(c.read_vec(1 << 20, 64 << 10, 0).expect("read on C"), data);
        // And the other way round, with FUA instead of a flush.
        let d2 = random_vec(&mut rng, 4096);
        c.write(2 << 20, &d2, CMD_FLAG_FUA).expect("FUA write on C");
        assert_eq!(a.read_vec(2 << 20, 4096, 0).expect("read on A"), d2);
        for conn in [a, b, c] {
            conn.disconnect().expect("disconnect");
        }
    }
}

#[test]
fn many_connections_at_once_each_see_their_own_data() {
    const CONNS: usize = 6;
    const REGION: u64 = 1 << 20;
    let srv = TestServer::start(vec![export("d", mem(CONNS as u64 * REGION))]);
    let (_, seed) = rng_for("many_connections");
    let addrs = srv.addrs();
    std::thread::scope(|s| {
        for i in 0..CONNS {
            let addr = addrs[i % 2].clone();
            s.spawn(move || {
                use rand::SeedableRng;
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ i as u64);
                let mut c = open(&addr, "d", i % 3 != 0, false);
                let base = i as u64 * REGION;
                let mut model = vec![0u8; REGION as usize];
                for _ in 0..150 {
                    let blocks = rng.gen_range(1..=16usize);
                    let at = rng.gen_range(0..(REGION as usize / 512 - blocks)) * 512;
                    let len = blocks * 512;
                    if rng.gen_bool(0.5) {
                        let d = random_vec(&mut rng, len);
                        model[at..at + len].copy_from_slice(&d);
                        c.write(base + at as u64, &d, 0).expect("write");
                    } else {
                        let got = c.read_vec(base + at as u64, len as u32, 0).expect("read");
                        assert!(
                            got[..] == model[at..at + len],
                            "connection {i}: read at {at} differs"
                        );
                    }
                }
                c.flush().expect("flush");
                let all = c.read_vec(base, REGION as u32, 0).expect("read region");
                assert!(all == model, "connection {i}: region differs at the end");
                c.disconnect().expect("disconnect");
            });
        }
    });
}

#[test]
fn a_shared_client_serialises_callers() {
    // One connection shared by threads: each gets its own replies.
    let srv = TestServer::start(vec![export("d", mem(4 << 20))]);
    let client =
        Arc::new(Client::connect(&ClientOptions::new(srv.tcp.clone(), "d")).expect("connect"));
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let client = client.clone();
            s.spawn(move || {
                let base = u64::from(t) << 20;
                for i in 0..50u64 {
                    let data = vec![t ^ (i as u8); 8192];
                    client
                        .write_at(&data, base + i * 8192, cairn_block::WriteFlags::NONE)
                        .expect("write");
                    let mut got = vec![0u8; 8192];
                    client.read_at(&mut got, base + i * 8192).expect("read");
                    assert_eq!(got, data);
                }
            });
        }
    });
    Arc::try_unwrap(client)
        .expect("sole owner")
        .disconnect()
        .expect("disconnect");
}

#[test]
fn a_shared_client_keeps_many_requests_in_flight_on_one_connection() {
    // Every read waits 100 ms in the device: 32 callers on one connection finish in a few
    // device latencies only if the client pipelines them and the server runs them at once.
    let disk = HookDisk::new(MemDisk::new(4 << 20));
    *disk.read_delay.lock().unwrap() = Some((0..4 << 20, Duration::from_millis(100)));
    let srv = TestServer::start(vec![export("d", Arc::new(disk))]);
    let mut opts = ClientOptions::new(srv.unix.clone(), "d");
    opts.connections = 1;
    let client = Arc::new(Client::connect(&opts).expect("connect"));
    assert_eq!(client.connections(), 1);
    for i in 0..32u64 {
        let data = vec![i as u8 + 1; BLOCK];
        client
            .write_at(&data, i * BLOCK as u64, cairn_block::WriteFlags::NONE)
            .expect("write");
    }
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for i in 0..32u64 {
            let client = client.clone();
            s.spawn(move || {
                let mut got = vec![0u8; BLOCK];
                client.read_at(&mut got, i * BLOCK as u64).expect("read");
                assert!(
                    got.iter().all(|&b| b == i as u8 + 1),
                    "read {i} got another's data"
                );
            });
        }
    });
    let took = t0.elapsed();
    // One after another: 3.2 s.
    assert!(took < Duration::from_millis(1600), "32 reads took {took:?}");
    Arc::try_unwrap(client)
        .expect("sole owner")
        .disconnect()
        .expect("disconnect");
}

#[test]
fn a_shared_client_matches_out_of_order_replies_to_their_callers() {
    // The first 4 KiB read slowly: the replies to the later reads overtake it, and each
    // caller still gets its own data.
    let disk = HookDisk::new(MemDisk::new(4 << 20));
    *disk.read_delay.lock().unwrap() = Some((0..4096, Duration::from_millis(400)));
    let srv = TestServer::start(vec![export("d", Arc::new(disk))]);
    let mut opts = ClientOptions::new(srv.tcp.clone(), "d");
    opts.connections = 1;
    let client = Arc::new(Client::connect(&opts).expect("connect"));
    client
        .write_at(&[7u8; BLOCK], 0, cairn_block::WriteFlags::NONE)
        .expect("write");
    client
        .write_at(&[8u8; BLOCK], BLOCK as u64, cairn_block::WriteFlags::NONE)
        .expect("write");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let c = client.clone();
        let tx1 = tx.clone();
        s.spawn(move || {
            let mut got = vec![0u8; BLOCK];
            c.read_at(&mut got, 0).expect("slow read");
            assert!(got.iter().all(|&b| b == 7));
            tx1.send("slow").unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..8 {
            let c = client.clone();
            let tx = tx.clone();
            s.spawn(move || {
                let mut got = vec![0u8; BLOCK];
                c.read_at(&mut got, BLOCK as u64).expect("fast read");
                assert!(got.iter().all(|&b| b == 8));
                tx.send("fast").unwrap();
            });
        }
    });
    drop(tx);
    let order: Vec<&str> = rx.iter().collect();
    assert_eq!(order.len(), 9);
    assert_eq!(
        order.last(),
        Some(&"slow"),
        "the slow read held back others: {order:?}"
    );
}

#[test]
fn a_client_opens_several_connections_when_the_server_offers_multi_conn() {
    let srv = TestServer::start(vec![export("d", mem(4 << 20))]);
    let client = Client::connect(&ClientOptions::new(srv.unix.clone(), "d")).expect("connect");
    assert!(client.flags() & FLAG_CAN_MULTI_CONN != 0);
    assert_eq!(client.connections(), 4);
    // Writes spread over the connections; a FLUSH on one covers them all; reads see them.
    for i in 0..16u64 {
        client
            .write_at(
                &[i as u8; BLOCK],
                i * BLOCK as u64,
                cairn_block::WriteFlags::NONE,
            )
            .expect("write");
    }
    client.flush().expect("flush");
    for i in 0..16u64 {
        let mut got = vec![0u8; BLOCK];
        client.read_at(&mut got, i * BLOCK as u64).expect("read");
        assert!(got.iter().all(|&b| b == i as u8));
    }
    client.disconnect().expect("disconnect");
}

#[test]
fn a_shared_client_against_nbdkit() {
    // nbdkit's parallel thread model answers out of order too; its delay filter makes
    // every read take 50 ms.
    if std::process::Command::new("nbdkit")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP: nbdkit is not installed");
        return;
    }
    let dir = TempDir::new("nbdkit-pipeline");
    let sock = dir.path().join("nbdkit.sock");
    let mut child = std::process::Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(["--filter=delay", "memory", "8M", "rdelay=50ms"])
        .spawn()
        .expect("start nbdkit");
    // The socket file appears before nbdkit listens on it: wait until it accepts.
    wait_until("nbdkit listens", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let client = Arc::new(
        Client::connect(&ClientOptions::new(
            cairn_nbd::Listen::Unix(sock.clone()),
            "",
        ))
        .expect("connect to nbdkit"),
    );
    for i in 0..16u64 {
        client
            .write_at(
                &[i as u8 ^ 0x5a; BLOCK],
                i * 65536,
                cairn_block::WriteFlags::NONE,
            )
            .expect("write");
    }
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let client = client.clone();
            s.spawn(move || {
                let mut got = vec![0u8; BLOCK];
                client.read_at(&mut got, i * 65536).expect("read");
                assert!(got.iter().all(|&b| b == i as u8 ^ 0x5a));
            });
        }
    });
    // One after another: 0.8 s.
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    Arc::try_unwrap(client)
        .expect("sole owner")
        .disconnect()
        .expect("disconnect");
    let _ = child.kill();
    let _ = child.wait();
}

/// The server answers every write after 200 ms; the client's timeout is 500 ms.
fn slow_writes_server() -> (TestServer, Arc<HookDisk>) {
    let disk = HookDisk::new(MemDisk::new(4 << 20));
    *disk.write_delay.lock().unwrap() = Duration::from_millis(200);
    let disk = Arc::new(disk);
    let srv = TestServer::start(vec![export("d", disk.clone())]);
    (srv, disk)
}

fn client_with_timeout(srv: &TestServer, timeout: Duration) -> Client {
    let mut opts = ClientOptions::new(srv.tcp.clone(), "d");
    opts.connections = 1;
    opts.timeout = Some(timeout);
    Client::connect(&opts).expect("connect")
}

#[test]
fn a_request_sent_on_an_idle_pipeline_gets_the_whole_timeout() {
    // The reader's wait for a reply starts when the connection goes idle, not when a
    // request is sent: a write sent 0.9 s into an idle period meets a read timeout
    // (0.5 s, started after the previous reply) 0.1 s later. It must not fail: the
    // server answers 0.2 s after it was sent, well within the timeout.
    let (srv, _disk) = slow_writes_server();
    let client = client_with_timeout(&srv, Duration::from_millis(500));
    for i in 0..3u8 {
        std::thread::sleep(Duration::from_millis(900));
        let t = Instant::now();
        client
            .write_at(&[i; BLOCK], 0, cairn_block::WriteFlags::NONE)
            .unwrap_or_else(|e| {
                panic!(
                    "write {i}, answered in 200 ms, failed after {:?}: {e}",
                    t.elapsed()
                )
            });
    }
}

#[test]
fn a_request_the_server_does_not_answer_fails_after_the_timeout_from_its_sending() {
    let (srv, disk) = slow_writes_server();
    let client = client_with_timeout(&srv, Duration::from_millis(500));
    client
        .write_at(&[1; BLOCK], 0, cairn_block::WriteFlags::NONE)
        .expect("a write answered in time");
    *disk.write_delay.lock().unwrap() = Duration::from_millis(1500);
    std::thread::sleep(Duration::from_millis(900));
    let t = Instant::now();
    let r = client.write_at(&[2; BLOCK], 0, cairn_block::WriteFlags::NONE);
    let took = t.elapsed();
    assert!(
        r.is_err(),
        "a write answered after 1.5 s succeeded with a 500 ms timeout"
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(900),
        "the write failed after {took:?}, not after the 500 ms timeout"
    );
}

/// A device whose writes complete later, on a thread of their own (as a replicated
/// volume's complete when the replica answers): the first `slow_first` writes wait
/// until the test sends on `release` (5 s at most: a server that held the others back
/// behind them then shows as a wrong order, not a hang), the others are done at once; a
/// write at offset `PANIC_AT` panics.
#[derive(Debug)]
struct LaterDisk {
    inner: Arc<MemDisk>,
    slow_first: std::sync::atomic::AtomicUsize,
    release: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
}

const PANIC_AT: u64 = 3 << 20;

impl BlockDevice for LaterDisk {
    fn geometry(&self) -> cairn_block::Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_block::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        self.inner.write_at(buf, offset, flags)
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        assert_ne!(offset, PANIC_AT, "a device bug");
        let slow = self
            .slow_first
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        let (inner, data, release) = (self.inner.clone(), buf.to_vec(), self.release.clone());
        std::thread::spawn(move || {
            if slow {
                let rx = release.lock().unwrap_or_else(|p| p.into_inner());
                let _ = rx.recv_timeout(Duration::from_secs(5));
            }
            done(inner.write_at(&data, offset, flags));
        });
    }
}

/// A write that completes after the device call returned is answered from the thread
/// that completes it, in completion order; the data is there when the reply is; a
/// device that panics in `write_then` gets the request an EIO, and the connection goes
/// on.
#[test]
fn writes_completed_later_are_answered_when_they_complete() {
    let (release, rx) = std::sync::mpsc::channel();
    let disk = Arc::new(LaterDisk {
        inner: Arc::new(MemDisk::new(4 << 20)),
        slow_first: std::sync::atomic::AtomicUsize::new(1),
        release: Arc::new(Mutex::new(rx)),
    });
    let srv = TestServer::start_with(ServerConfig::new(vec![export("d", disk.clone())]));
    let addr = &srv.addrs()[0];
    let mut c = open(addr, "d", true, false);
    let slow = c.submit_write(0, &[1u8; 4096], 0).expect("slow write");
    let fast = c.submit_write(8192, &[2u8; 4096], 0).expect("fast write");
    let first = c.recv().expect("first reply");
    assert_eq!(first.cookie, fast, "the slow write held back the fast one");
    assert!(first.is_ok(), "{first:?}");
    release.send(()).unwrap();
    let second = c.recv().expect("second reply");
    assert_eq!(second.cookie, slow);
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(c.read_vec(0, 4096, 0).unwrap(), vec![1u8; 4096]);
    assert_eq!(c.read_vec(8192, 4096, 0).unwrap(), vec![2u8; 4096]);
    // Many at once, each read back.
    for round in 0..3u8 {
        let cookies: Vec<u64> = (0..32u64)
            .map(|i| {
                c.submit_write(i * 4096, &[round ^ i as u8; 4096], 0)
                    .unwrap()
            })
            .collect();
        let mut got = HashSet::new();
        for _ in 0..32 {
            let r = c.recv().unwrap();
            assert!(r.is_ok(), "{r:?}");
            got.insert(r.cookie);
        }
        assert_eq!(got, cookies.into_iter().collect::<HashSet<_>>());
        for i in 0..32u64 {
            assert_eq!(
                c.read_vec(i * 4096, 4096, 0).unwrap(),
                vec![round ^ i as u8; 4096]
            );
        }
    }
    let err = c
        .write(PANIC_AT, &[3u8; 4096], 0)
        .expect_err("the device panicked");
    assert_eq!(err.errno(), Some(EIO), "{err}");
    assert_eq!(c.read_vec(4096 * 5, 4096, 0).unwrap(), vec![5u8 ^ 2; 4096]);
}

/// `Client::write_then` over a real server: a write of several pieces (larger than the
/// server's maximum request) is called back once, after every piece is answered, with
/// the data in place; a write to a server that went away is called back with an error,
/// once.
#[test]
fn a_client_write_then_is_called_back_once_when_every_piece_is_in() {
    let disk = Arc::new(MemDisk::new(64 << 20));
    let srv = TestServer::start_with(ServerConfig::new(vec![export("d", disk.clone())]));
    let addr = srv.addrs()[0].clone();
    let client = Client::connect(&ClientOptions::new(addr, "d")).expect("connect");
    let big: Vec<u8> = (0..(40 << 20)).map(|i: usize| (i / 4096) as u8).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = calls.clone();
    client.write_then(
        &big,
        4096,
        WriteFlags::FUA,
        Box::new(move |r| {
            n.fetch_add(1, Ordering::SeqCst);
            tx.send(r).unwrap();
        }),
    );
    rx.recv_timeout(Duration::from_secs(30))
        .expect("called back")
        .expect("written");
    let mut back = vec![0u8; big.len()];
    disk.read_at(&mut back, 4096).unwrap();
    assert!(back == big, "the data is not what was written");
    drop(srv);
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    let n = calls.clone();
    client.write_then(
        &[7u8; 8192],
        0,
        WriteFlags::NONE,
        Box::new(move |r| {
            n.fetch_add(1, Ordering::SeqCst);
            tx.send(r).unwrap();
        }),
    );
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("called back");
    assert!(r.is_err(), "a write to a stopped server succeeded");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "a callback ran twice");
}

#[test]
fn a_client_read_then_and_flush_then_are_called_back_once() {
    let disk = Arc::new(MemDisk::new(64 << 20));
    let big: Vec<u8> = (0..(40 << 20)).map(|i: usize| (i / 4096) as u8).collect();
    disk.write_at(&big, 8192, WriteFlags::NONE).unwrap();
    let srv = TestServer::start_with(ServerConfig::new(vec![export("d", disk.clone())]));
    let addr = srv.addrs()[0].clone();
    let client = Client::connect(&ClientOptions::new(addr, "d")).expect("connect");
    assert!(BlockDevice::completes_later(&client));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // A read larger than one request (pieces put together in order), and a small one.
    for (len, at) in [(big.len(), 8192u64), (4096, 8192 + 4096 * 7)] {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = calls.clone();
        client.read_then(
            len,
            at,
            Box::new(move |r| {
                n.fetch_add(1, Ordering::SeqCst);
                tx.send(r).unwrap();
            }),
        );
        let got = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("called back")
            .expect("read");
        let from = usize::try_from(at - 8192).unwrap();
        assert!(
            got == big[from..from + len],
            "read_then of {len} at {at}: wrong bytes"
        );
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let n = calls.clone();
    client.flush_then(Box::new(move |r| {
        n.fetch_add(1, Ordering::SeqCst);
        tx.send(r).unwrap();
    }));
    rx.recv_timeout(Duration::from_secs(30))
        .expect("called back")
        .expect("flushed");
    drop(srv);
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    let n = calls.clone();
    client.read_then(
        8192,
        0,
        Box::new(move |r| {
            n.fetch_add(1, Ordering::SeqCst);
            tx.send(r).unwrap();
        }),
    );
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("called back");
    assert!(r.is_err(), "a read from a stopped server succeeded");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::SeqCst), 4, "a callback ran twice");
}

/// `Client::discard_then` over a real server: a discard longer than one TRIM request
/// (1 GiB, on a sparse 3 GiB export) is called back once, after every piece, the
/// trimmed bytes reading back as zeroes (the server's memory disk zeroes them) and the
/// bytes around them kept; an export without TRIM is refused with `Unsupported`, and a
/// discard to a server that went away is called back with its error.
#[test]
fn a_client_discard_then_is_called_back_once_when_every_piece_is_in() {
    let disk = Arc::new(MemDisk::new(3 << 30));
    let mut no_trim = HookDisk::new(MemDisk::new(1 << 20));
    no_trim.caps.discard = cairn_block::Support::None;
    let srv = TestServer::start_with(ServerConfig::new(vec![
        export("d", disk.clone()),
        export("notrim", Arc::new(no_trim)),
    ]));
    let addr = srv.addrs()[0].clone();
    let client = Client::connect(&ClientOptions::new(addr.clone(), "d")).expect("connect");
    let end = 3u64 << 30;
    let marks = [
        0,
        4096,
        1 << 30,
        3 << 29,
        end - 3 * 4096,
        end - 8192,
        end - 4096,
    ];
    for (i, &at) in marks.iter().enumerate() {
        disk.write_at(&[i as u8 + 1; BLOCK], at, WriteFlags::NONE)
            .unwrap();
    }
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let discard = |client: &Client, offset: u64, len: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        let n = calls.clone();
        client.discard_then(
            offset,
            len,
            Box::new(move |r| {
                n.fetch_add(1, Ordering::SeqCst);
                tx.send((r, std::thread::current().id())).unwrap();
            }),
        );
        rx.recv_timeout(Duration::from_secs(30))
            .expect("called back")
    };
    // Three TRIM requests: [4096, 3 GiB - 8192), answered on the reader thread (not
    // discarded here, synchronously, as the trait's default does).
    let (r, on) = discard(&client, 4096, end - 3 * 4096);
    r.expect("discarded");
    assert_ne!(on, std::thread::current().id(), "called back on the caller");
    for (i, &at) in marks.iter().enumerate() {
        let mut back = [0u8; BLOCK];
        disk.read_at(&mut back, at).unwrap();
        let kept = at == 0 || at >= end - 8192;
        let expect = if kept { i as u8 + 1 } else { 0 };
        assert!(
            back.iter().all(|&b| b == expect),
            "block at {at}: {} where {expect} was expected",
            back[0]
        );
    }
    let other = Client::connect(&ClientOptions::new(addr, "notrim")).expect("connect");
    let e = discard(&other, 0, 4096).0.unwrap_err();
    assert_eq!(e.kind(), cairn_block::ErrorKind::Unsupported, "{e}");
    drop(srv);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        discard(&client, 0, 4096).0.is_err(),
        "a discard on a stopped server succeeded"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::SeqCst), 3, "a callback ran twice");
}
