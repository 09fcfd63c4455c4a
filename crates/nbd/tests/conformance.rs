//! The block-layer conformance suite through the NBD client: a served MemDisk, reached
//! as a remote member (`Client` as a `BlockDevice`), must keep the whole contract.
//!
//! ```text
//!   conformance::run_with ── Client (BlockDevice) ──unix/tcp──> server ── MemDisk
//! ```

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use cairn_block::testkit::conformance::{self, Options};
use cairn_block::{BlockDevice, Capabilities, Extent, Geometry, MemDisk, Result, WriteFlags};
use cairn_nbd::client::{Client, ClientOptions};
use cairn_nbd::Export;
use common::*;

/// A client that owns the server it talks to, so each `make()` is a fresh device.
#[derive(Debug)]
struct Served {
    client: Client, // dropped first: the server then sees a plain disconnect
    _server: TestServer,
}

impl BlockDevice for Served {
    fn geometry(&self) -> Geometry {
        self.client.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.client.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.client.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.client.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.client.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.client.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.client.write_zeroes(offset, len, flags)
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.client.extents(offset, len)
    }
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.client.cache(offset, len)
    }
}

fn served(e: Export, tcp: bool, structured: bool) -> Box<dyn BlockDevice> {
    let name = e.name.clone();
    let server = TestServer::start(vec![e]);
    let addr = if tcp {
        server.tcp.clone()
    } else {
        server.unix.clone()
    };
    let mut opts = ClientOptions::new(addr, name);
    opts.structured = structured;
    opts.meta_base_allocation = structured;
    opts.timeout = Some(TIMEOUT);
    let client = Client::connect(&opts).expect("connect");
    Box::new(Served {
        client,
        _server: server,
    })
}

fn opts() -> Options {
    // The random sequence is one round trip per op; 1500 keep the suite quick in debug.
    Options {
        random_ops: 1500,
        ..Options::default()
    }
}

#[test]
fn memdisk_over_unix_with_block_status() {
    conformance::run_with(&|| served(export("m", mem(8 << 20)), false, true), &opts());
}

#[test]
fn memdisk_4k_over_tcp_small_max_io() {
    // A 256 KiB maximum makes the client split large requests.
    let g = Geometry {
        size: 8 << 20,
        logical_block_size: 4096,
        physical_block_size: 4096,
        optimal_io_size: 64 << 10,
        max_io_size: 256 << 10,
    };
    conformance::run_with(
        &|| {
            served(
                export("m4k", Arc::new(MemDisk::with_geometry(g))),
                true,
                true,
            )
        },
        &opts(),
    );
}

#[test]
fn memdisk_without_structured_replies() {
    conformance::run_with(
        &|| served(export("plain", mem(4 << 20)), true, false),
        &opts(),
    );
}

#[test]
fn read_only_export() {
    conformance::run_with(
        &|| {
            let disk = MemDisk::new(4 << 20);
            let pattern: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
            disk.write_at(&pattern, 0, WriteFlags::NONE).unwrap();
            served(
                Export {
                    read_only: true,
                    ..export("ro", Arc::new(disk))
                },
                false,
                true,
            )
        },
        &opts(),
    );
}
