//! The fuzz harnesses, shared by the cargo-fuzz targets (`fuzz_targets/*.rs`) and by the
//! deterministic run in `crates/nbd/tests/fuzz_harness.rs`, which feeds them seeded
//! random and mutated inputs on stable Rust so that CI exercises them too.
//!
//! ```text
//!   nbd_options: bytes ──as the client──> Server::serve_stream ──> sink
//!   nbd_proto:   bytes ──> Request::parse / parse_info_request / parse_meta_context_request
//!   nbd_client:  bytes ──as the server──> client::Handshake / Connection ──> sink
//! ```
//!
//! Each must never panic, hang or allocate more than the protocol's bounds allow (the
//! fuzzers run with a malloc limit; the deterministic test counts allocations).

#![allow(dead_code)] // each target uses one function

use std::io::{self, Cursor};
use std::sync::Arc;

use cairn_block::{BlockDevice, MemDisk};
use cairn_nbd::client::Handshake;
use cairn_nbd::proto::*;
use cairn_nbd::{Export, Server, ServerConfig};

/// Size of the fuzzed exports: small, so that requests often land inside.
pub const EXPORT_SIZE: u64 = 1 << 20;

/// The names the fuzzed server knows; seeds use them so that GO succeeds.
pub const EXPORT_NAMES: [&str; 2] = ["a", "ro"];

/// A whole connection, client side: the bytes are what a client sends (flags, options,
/// then requests with payloads); the server's answers are thrown away.
pub fn nbd_options(data: &[u8]) {
    options_server().serve_stream(
        Box::new(Cursor::new(data.to_vec())),
        Box::new(io::sink()),
        "fuzz",
    );
}

/// The server `nbd_options` talks to: a writable export "a" (also the default) and a
/// read-only view "ro" of the same small disk, one worker per connection.
pub fn options_server() -> Server {
    let disk: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(EXPORT_SIZE));
    let mut cfg = ServerConfig::new(vec![
        Export {
            name: "a".into(),
            description: "fuzz".into(),
            device: disk.clone(),
            read_only: false,
        },
        Export {
            name: "ro".into(),
            description: String::new(),
            device: disk,
            read_only: true,
        },
    ]);
    cfg.default_export = Some("a".into());
    cfg.threads_per_connection = 1;
    Server::new(cfg).expect("valid config")
}

/// The pure parsers: never panic, and whatever parses re-encodes to the same bytes.
pub fn nbd_proto(data: &[u8]) {
    if let Some(h) = data.get(..REQUEST_HEADER_LEN) {
        let h: [u8; REQUEST_HEADER_LEN] = h.try_into().expect("28 bytes");
        if let Ok(r) = Request::parse(&h) {
            assert_eq!(r.encode(), h, "request header round trip");
            let _ = command_name(r.kind);
            let _ = r.has_payload();
        }
    }
    if let Ok(r) = parse_info_request(data) {
        assert!(r.name.len() <= MAX_STRING);
        assert_eq!(
            encode_info_request(&r.name, &r.requests),
            data,
            "info request round trip"
        );
    }
    if let Ok(r) = parse_meta_context_request(data) {
        assert!(r.name.len() <= MAX_STRING);
        let q: Vec<&str> = r.queries.iter().map(String::as_str).collect();
        assert_eq!(
            encode_meta_context_request(&r.name, &q),
            data,
            "meta context round trip"
        );
        for q in &r.queries {
            let _ = query_selects_base_allocation(q);
        }
    }
}

/// A whole connection, server side: the bytes are what a (hostile) server sends. The
/// first byte picks what the client asks for. The client must fail cleanly, never trust
/// a length it did not ask for, and never panic.
pub fn nbd_client(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(mut hs) = Handshake::over(Box::new(Cursor::new(rest.to_vec())), Box::new(io::sink()))
    else {
        return;
    };
    if mode & 1 != 0 && hs.list().is_err() {
        return;
    }
    if mode & 2 != 0 {
        if hs.structured_replies().is_err() {
            return;
        }
        if mode & 4 != 0 && hs.meta_context(true, "a", &[BASE_ALLOCATION]).is_err() {
            return;
        }
    }
    if mode & 8 != 0 && hs.info("a").is_err() {
        return;
    }
    let Ok(mut c) = hs.go("a") else { return };
    // Pipelined requests, then replies in whatever order the bytes say.
    let sends = [
        c.submit_read(0, 4096, 0),
        c.submit_write(4096, &[0u8; 512], 0),
        c.submit(CMD_BLOCK_STATUS, 0, 0, 65536, &[]),
        c.submit_read(8192, 65536, CMD_FLAG_DF),
        c.submit_flush(),
    ];
    if sends.iter().any(Result::is_err) {
        return;
    }
    while c.in_flight() > 0 {
        match c.recv() {
            Ok(r) => {
                if r.error == 0 && r.command == CMD_READ {
                    assert!(r.data.len() <= 65536, "read reply larger than asked");
                }
            }
            Err(_) => return,
        }
    }
    let _ = c.read_vec(0, 512, 0);
    let _ = c.block_status(0, 4096, CMD_FLAG_REQ_ONE);
}
