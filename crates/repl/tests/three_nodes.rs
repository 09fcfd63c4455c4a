//! Three nodes in one process: a, b and c, each with the other two as peers, their
//! metadata on 16 MiB memory disks, served to each other on Unix sockets in a directory
//! of their own (the peer-facing NBD server with the replication handshake, as
//! `cairn repl up` serves it). Only the public API: the tests drive the nodes as the
//! control socket does (promote, demote, connect, verify, status).
//!
//! A crash of the primary is its disk's image taken while it was primary (its
//! superblock says primary, its activity log holds the extents it wrote), the node then
//! stopped; the node that comes back runs on that image.
//!
//! What they check (docs/replication.md, "A crash of the primary with two secondaries"):
//!
//! - a crashed primary resynced from the new primary keeps no out-of-sync bits towards
//!   the third node when the new primary knows that node holds its data (the verify
//!   after the failover compared every block); when it does not (the third node was
//!   away), the bits stay;
//! - a verify after a failover that stops early (the peer left) is owed again, and runs
//!   again once the peer is back in sync.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_nbd::client::ClientOptions;
use cairn_nbd::{Listen, Server, ServerConfig, ShutdownHandle};
use cairn_repl::node::{
    Exports, Node, NodeConfig, OnIoError, PeerConfig, Protocol, Repl, SplitBrainPolicy, Status,
    Volume,
};
use cairn_repl::rate::RateLimits;
use cairn_repl::store::{create, CreateParams, Store};
use cairn_repl::target::Target;

const DISK: u64 = 16 << 20;
/// The activity log's extent on these disks (create-md's default is 4 MiB).
const EXTENT: u64 = 1 << 20;

/// A directory for the sockets, removed at the end (also when a test fails).
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("cairn-three-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn sock(&self, node: &str) -> PathBuf {
        self.0.join(format!("{node}.sock"))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn disk() -> Arc<dyn BlockDevice> {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(DISK));
    let p = CreateParams {
        max_peers: 2,
        bm_block: 4096,
        al_extent: EXTENT,
        force: false,
        resource: None,
    };
    create(dev.as_ref(), &p).unwrap();
    dev
}

/// A copy of every byte of `dev`: what a power cut leaves of a memory disk.
fn image(dev: &Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
    let size = dev.geometry().size;
    let copy: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(size));
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = usize::try_from((size - at).min(1 << 20)).unwrap();
        dev.read_at(&mut buf[..n], at).unwrap();
        copy.write_at(&buf[..n], at, WriteFlags::NONE).unwrap();
        at += n as u64;
    }
    copy
}

/// One running node and its peer-facing server.
struct Up {
    node: Arc<Node>,
    disk: Arc<dyn BlockDevice>,
    stop: ShutdownHandle,
    sock: PathBuf,
}

impl Up {
    /// Node `me` on `disk`, the other two of a, b, c as its peers, served at its socket.
    fn new(dir: &Dir, me: &str, disk: &Arc<dyn BlockDevice>, resync: RateLimits) -> Up {
        let peers = ["a", "b", "c"]
            .iter()
            .filter(|n| **n != me)
            .map(|n| PeerConfig {
                name: (*n).into(),
                opts: ClientOptions::new(Listen::Unix(dir.sock(n)), "home"),
            })
            .collect();
        let cfg = NodeConfig {
            resource: "home".into(),
            node: me.into(),
            peers,
            protocol: Protocol::C,
            resync,
            al_extents: 4,
            split_brain: SplitBrainPolicy::Disconnect,
            peer_timeout: Duration::from_secs(10),
            quorum: None,
            on_io_error: OnIoError::Detach,
            on_no_data: cairn_repl::node::OnNoData::IoError,
        };
        let meta = Box::new(Store::open(disk.clone()).unwrap());
        let node = Node::open(cfg, disk.clone(), meta).unwrap();
        let target = Target::new(&node);
        let mut pcfg = ServerConfig::new(Vec::new());
        pcfg.allow_empty = true;
        pcfg.fence = Some(Arc::new(target.clone()));
        pcfg.extension = Some(Arc::new(target));
        let peers = Server::new(pcfg).unwrap();
        let mut ccfg = ServerConfig::new(Vec::new());
        ccfg.allow_empty = true;
        let clients = Server::new(ccfg).unwrap();
        let sock = dir.sock(me);
        let l = peers.bind(&[Listen::Unix(sock.clone())]).unwrap();
        node.attach(Exports {
            clients: clients.exports_handle(),
            peers: peers.exports_handle(),
        })
        .unwrap();
        let stop = peers.shutdown_handle();
        thread::spawn(move || peers.serve(l));
        Up {
            node,
            disk: disk.clone(),
            stop,
            sock,
        }
    }

    /// The node's peer-facing server stops and its socket goes: its peers no longer
    /// reach it.
    fn unplug(&self) {
        self.stop.shutdown();
        let until = Instant::now() + Duration::from_secs(10);
        while self.sock.exists() {
            assert!(
                Instant::now() < until,
                "the socket of a stopped server stays"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn status(&self) -> Status {
        self.node.status()
    }

    fn peer(&self, name: &str) -> cairn_repl::node::PeerStatus {
        self.status()
            .peers
            .into_iter()
            .find(|p| p.name == name)
            .unwrap()
    }

    fn events(&self, kind: &str, peer: &str) -> Vec<String> {
        self.status()
            .events
            .into_iter()
            .filter(|e| e.kind == kind && e.peer.as_deref() == Some(peer))
            .map(|e| e.message)
            .collect()
    }

    /// Waits (at most 60 s) until `what` holds.
    fn wait(&self, why: &str, what: impl Fn(&Up) -> bool) {
        let until = Instant::now() + Duration::from_secs(60);
        while !what(self) {
            assert!(Instant::now() < until, "{why}: {:#?}", self.status());
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_established(&self, peer: &str) {
        self.wait(&format!("{peer} in sync"), |u| {
            u.peer(peer).replication == Repl::Established && u.peer(peer).resync.is_none()
        });
    }

    /// The data area, read from the disk.
    fn data(&self) -> Vec<u8> {
        let mut v = vec![0u8; usize::try_from(self.node.data_size()).unwrap()];
        self.disk.read_at(&mut v, 0).unwrap();
        v
    }
}

fn unlimited() -> RateLimits {
    RateLimits {
        min_bytes_per_sec: 32 << 20,
        max_bytes_per_sec: 0,
    }
}

/// The 4 KiB blocks where two data areas differ (the first few).
fn differ(x: &[u8], y: &[u8]) -> Vec<usize> {
    (0..x.len() / 4096)
        .filter(|&i| x[i * 4096..(i + 1) * 4096] != y[i * 4096..(i + 1) * 4096])
        .take(20)
        .collect()
}

/// a primary of b and c writes into three extents and crashes; b takes over. The
/// shapes: c stays (b verifies it after the failover), or c is away (b cannot know what
/// it holds). a comes back as a crashed primary, its activity log's three extents out
/// of sync towards b and c, and b resyncs it. Towards b the bits go as always. Towards
/// c they go only if b told a that c holds b's data: then a and c, meeting with a
/// primary, copy nothing; else they stay.
#[test]
fn a_crashed_primary_keeps_bits_towards_the_third_node_only_while_it_is_not_known_in_sync() {
    for c_stays in [true, false] {
        let dir = Dir::new(if c_stays { "stays" } else { "away" });
        let (da, db, dc) = (disk(), disk(), disk());
        let a = Up::new(&dir, "a", &da, unlimited());
        let b = Up::new(&dir, "b", &db, unlimited());
        let c = Up::new(&dir, "c", &dc, unlimited());
        a.node.promote(true).unwrap();
        a.wait_established("b");
        a.wait_established("c");
        let vol = Volume(a.node.clone());
        for (i, at) in [0u64, 2 << 20, 5 << 20].iter().enumerate() {
            let fill = u8::try_from(i + 1).unwrap();
            vol.write_at(&[fill; 65536], *at, WriteFlags::FUA).unwrap();
        }
        // The power cut: a's disk as it is now, primary, three extents in its log.
        let crashed = image(&da);
        a.unplug();
        a.node.demote().unwrap();
        drop(vol);
        if !c_stays {
            c.unplug();
        }
        b.node.promote(false).unwrap();
        if c_stays {
            b.wait_established("c");
            b.wait("the verify of c after the failover", |u| {
                !u.events("verify-done", "c").is_empty() && !u.peer("c").verify.unwrap().running
            });
            assert_eq!(b.peer("c").verify.unwrap().out_of_sync_blocks, 0);
        }
        Volume(b.node.clone())
            .write_at(&[0xbb; 1 << 20], 8 << 20, WriteFlags::FUA)
            .unwrap();

        let a2 = Up::new(&dir, "a", &crashed, unlimited());
        assert!(a2.status().crashed_primary);
        assert_eq!(
            a2.peer("c").out_of_sync_bytes,
            3 * EXTENT,
            "the log's extents"
        );
        b.wait_established("a");
        a2.wait("a's resync from b", |u| {
            !u.events("resync-done", "b").is_empty()
        });
        let left = a2.peer("c").out_of_sync_bytes;
        let msg = a2.events("resync-done", "b").join("; ");
        assert_eq!(a2.peer("b").out_of_sync_bytes, 0, "{msg}");
        let (ad, bd) = (a2.data(), b.data());
        assert!(ad == bd, "a differs from b: {:?}", differ(&ad, &bd));
        if !c_stays {
            // b does not know what c holds: a's bits towards c stay.
            assert_eq!(left, 3 * EXTENT, "bits towards an unverified c: {msg}");
            a2.unplug();
            b.node.demote().unwrap();
            b.unplug();
            continue;
        }
        assert_eq!(left, 0, "a's bits towards c after its resync from b: {msg}");
        assert!(msg.contains("towards c"), "{msg}");
        let cd = c.data();
        assert!(cd == bd, "c differs from b: {:?}", differ(&cd, &bd));

        // a primary again (b stops cleanly): c is in sync with it, nothing is copied.
        b.node.demote().unwrap();
        a2.node.promote(false).unwrap();
        a2.wait_established("c");
        a2.wait_established("b");
        let resyncs = a2.events("resync-started", "c");
        assert!(
            resyncs.is_empty(),
            "a resynced c, which held its data: {resyncs:?}"
        );
        assert!(!a2.events("connected", "c").is_empty());
        a2.node.demote().unwrap();
        for u in [&a2, &b, &c] {
            u.unplug();
        }
    }
}

/// b promoted after its primary a vanished owes c a verify. The verify stops half-way
/// (c is disconnected): when c is back in sync, the verify runs again, to the end.
/// (It used to be marked done when it started: a verify cut short compared only part of
/// the data, and the old primary's last writes could stay different in the rest.)
#[test]
fn a_verify_after_failover_that_stops_early_runs_again() {
    let dir = Dir::new("verify");
    let (da, db, dc) = (disk(), disk(), disk());
    let a = Up::new(&dir, "a", &da, unlimited());
    // About 4 s for the whole data area: long enough to be cut short.
    let slow = RateLimits {
        min_bytes_per_sec: 1 << 20,
        max_bytes_per_sec: 4 << 20,
    };
    let b = Up::new(&dir, "b", &db, slow);
    let c = Up::new(&dir, "c", &dc, unlimited());
    a.node.promote(true).unwrap();
    a.wait_established("b");
    a.wait_established("c");
    a.unplug();
    a.node.demote().unwrap();
    b.node.promote(false).unwrap();
    b.wait("the verify of c after the failover to begin", |u| {
        u.peer("c")
            .verify
            .is_some_and(|v| v.running && v.done_bytes > 0)
    });
    b.node.set_connect(Some("c"), false, false).unwrap();
    b.wait("the verify to stop", |u| {
        !u.events("verify-failed", "c").is_empty()
    });
    b.node.set_connect(Some("c"), true, false).unwrap();
    b.wait_established("c");
    b.wait("a verify of c to the end", |u| {
        !u.events("verify-done", "c").is_empty()
    });
    let v = b.peer("c").verify.unwrap();
    assert!(v.error.is_none() && v.done_bytes == v.total_bytes, "{v:?}");
    assert_eq!(b.events("verify-after-failover", "c").len(), 2);
    b.node.demote().unwrap();
    for u in [&a, &b, &c] {
        u.unplug();
    }
}
