//! Shared by the NBD integration tests: a server on a Unix socket in a temp dir and on
//! TCP 127.0.0.1:0, connection helpers, and small test devices (slow, counting, with a
//! chosen capability set).
//!
//! ```text
//!   test ── client::{Handshake, Connection, Client} ──unix/tcp──> TestServer (thread)
//!                                                                   └─ exports: MemDisk, HookDisk(...), ...
//! ```

#![allow(dead_code)] // each test binary uses a different part of this module

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cairn_block::{
    write_zeroes_by_writing, BlockDevice, Capabilities, Error, ErrorKind, Extent, Geometry,
    MemDisk, Result, WriteFlags,
};
use cairn_nbd::client::{Connection, Handshake};
use cairn_nbd::proto::*;
use cairn_nbd::{Export, Listen, Server, ServerConfig, ShutdownHandle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How long a test waits for anything before it calls the server hung.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A unique directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "cairn-nbd-{what}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server, listening on a Unix socket and on TCP. Shut down on drop.
#[derive(Debug)]
pub struct TestServer {
    pub unix: Listen,
    pub tcp: Listen,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
    dir: TempDir,
}

impl TestServer {
    pub fn start(exports: Vec<Export>) -> TestServer {
        TestServer::start_with(ServerConfig::new(exports))
    }

    pub fn start_with(mut config: ServerConfig) -> TestServer {
        config.shutdown_grace = Duration::from_secs(5);
        let dir = TempDir::new("srv");
        let server = Server::new(config).expect("server config");
        let listeners = server
            .bind(&[
                Listen::Unix(dir.path().join("nbd.sock")),
                Listen::Tcp("127.0.0.1:0".parse().expect("addr")),
            ])
            .expect("bind");
        let addrs = listeners.addresses();
        assert_eq!(addrs.len(), 2);
        let Listen::Tcp(a) = &addrs[1] else {
            panic!("second listener is not TCP")
        };
        assert_ne!(a.port(), 0, "addresses() must report the real port");
        let handle = server.shutdown_handle();
        let thread = thread::Builder::new()
            .name("test-nbd-server".into())
            .spawn(move || server.serve(listeners))
            .expect("spawn server");
        TestServer {
            unix: addrs[0].clone(),
            tcp: addrs[1].clone(),
            handle,
            thread: Some(thread),
            dir,
        }
    }

    /// Both addresses: every transport-level test runs over each.
    pub fn addrs(&self) -> [Listen; 2] {
        [self.unix.clone(), self.tcp.clone()]
    }

    pub fn handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Asks the server to stop and waits for `serve` to return; returns how long it took.
    /// Panics if it takes longer than [`TIMEOUT`] or `serve` failed.
    pub fn shutdown(&mut self) -> Duration {
        let t0 = Instant::now();
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            while !t.is_finished() {
                assert!(
                    t0.elapsed() < TIMEOUT,
                    "serve() did not return {TIMEOUT:?} after shutdown()"
                );
                thread::sleep(Duration::from_millis(5));
            }
            t.join()
                .expect("server thread panicked")
                .expect("serve() failed");
        }
        t0.elapsed()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if thread::panicking() {
            self.handle.shutdown();
            return;
        }
        self.shutdown();
    }
}

pub fn export(name: &str, device: Arc<dyn BlockDevice>) -> Export {
    Export {
        name: name.into(),
        description: format!("test export {name}"),
        device,
        read_only: false,
    }
}

pub fn mem(size: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemDisk::new(size))
}

/// A started handshake (greeting read, flags sent).
pub fn handshake(addr: &Listen) -> Handshake {
    Handshake::connect(addr, Some(TIMEOUT)).expect("connect and read the greeting")
}

/// A connection in transmission on `export`.
pub fn open(addr: &Listen, export: &str, structured: bool, meta: bool) -> Connection {
    let mut hs = handshake(addr);
    if structured {
        hs.structured_replies().expect("STRUCTURED_REPLY");
    }
    if meta {
        let ctx = hs
            .meta_context(true, export, &[BASE_ALLOCATION])
            .expect("SET_META_CONTEXT");
        assert_eq!(ctx.len(), 1, "one context for base:allocation: {ctx:?}");
        assert_eq!(ctx[0].1, BASE_ALLOCATION);
    }
    hs.go(export).expect("GO")
}

pub fn rng_for(what: &str) -> (SmallRng, u64) {
    let seed = cairn_block::testkit::test_seed(what);
    (SmallRng::seed_from_u64(seed), seed)
}

pub fn random_vec(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// The connection still works: a write and a read-back of fresh data at `at` succeed.
pub fn assert_usable(c: &mut Connection, at: u64, rng: &mut impl Rng, why: &str) {
    let data = random_vec(rng, 4096);
    c.write(at, &data, 0)
        .unwrap_or_else(|e| panic!("after {why}: write failed: {e}"));
    let got = c
        .read_vec(at, 4096, 0)
        .unwrap_or_else(|e| panic!("after {why}: read failed: {e}"));
    assert!(got == data, "after {why}: read back different data");
}

/// Polls `cond` until it holds or [`TIMEOUT`] passes.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < TIMEOUT, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// A MemDisk with knobs: capabilities to claim, delays on chosen ranges, and counters.
#[derive(Debug)]
pub struct HookDisk {
    pub inner: MemDisk,
    pub caps: Capabilities,
    /// When set, `write_zeroes` is the trait's emulation (refuses FAST_ZERO).
    pub emulate_zeroes: bool,
    /// When set, `write_zeroes` with FAST_ZERO fails with `Unsupported` even though the
    /// capabilities may claim native zeroing (a filesystem that refuses fallocate).
    pub refuse_fast_zero: bool,
    pub read_delay: Mutex<Option<(Range<u64>, Duration)>>,
    pub write_delay: Mutex<Duration>,
    pub writes_started: AtomicU64,
    pub writes_done: AtomicU64,
    pub flushes: AtomicU64,
    /// `writes_done` when the last flush started.
    pub writes_done_at_last_flush: AtomicU64,
}

impl HookDisk {
    pub fn new(inner: MemDisk) -> HookDisk {
        let caps = inner.capabilities();
        HookDisk {
            inner,
            caps,
            emulate_zeroes: false,
            refuse_fast_zero: false,
            read_delay: Mutex::new(None),
            write_delay: Mutex::new(Duration::ZERO),
            writes_started: AtomicU64::new(0),
            writes_done: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            writes_done_at_last_flush: AtomicU64::new(0),
        }
    }
}

impl BlockDevice for HookDisk {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.caps
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let delay = self.read_delay.lock().expect("lock").clone();
        if let Some((r, d)) = delay {
            if offset < r.end && r.start < offset + buf.len() as u64 {
                thread::sleep(d);
            }
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.writes_started.fetch_add(1, Ordering::SeqCst);
        let d = *self.write_delay.lock().expect("lock");
        if !d.is_zero() {
            thread::sleep(d);
        }
        let r = self.inner.write_at(buf, offset, flags);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> Result<()> {
        self.writes_done_at_last_flush
            .store(self.writes_done.load(Ordering::SeqCst), Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let fast = flags.contains(WriteFlags::FAST_ZERO);
        if fast && (self.emulate_zeroes || self.refuse_fast_zero) {
            return Err(Error::new(ErrorKind::Unsupported, "fast write_zeroes"));
        }
        if self.emulate_zeroes {
            return write_zeroes_by_writing(self, offset, len, flags);
        }
        self.inner.write_zeroes(offset, len, flags)
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        if self.caps.extents {
            self.inner.extents(offset, len)
        } else {
            Ok(vec![Extent {
                offset,
                length: len,
                hole: false,
                zero: false,
            }])
        }
    }
}
