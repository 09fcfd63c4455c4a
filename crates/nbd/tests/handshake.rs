//! The option phase (verification.md §5.3, "During the handshake"): LIST, INFO with block
//! sizes, unknown and default exports, option errors, oversized option data, ABORT.

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, Geometry, MemDisk};
use cairn_nbd::client::Client;
use cairn_nbd::proto::*;
use cairn_nbd::{Listen, ServerConfig};
use common::*;

fn geometry(size: u64, lbs: u32, pbs: u32, opt: u32, max: u32) -> Arc<dyn BlockDevice> {
    Arc::new(MemDisk::with_geometry(Geometry {
        size,
        logical_block_size: lbs,
        physical_block_size: pbs,
        optimal_io_size: opt,
        max_io_size: max,
    }))
}

fn two_exports() -> TestServer {
    TestServer::start(vec![
        export("alpha", mem(1 << 20)),
        export("beta", geometry(4 << 20, 4096, 4096, 64 << 10, 1 << 20)),
    ])
}

#[test]
fn list_names_every_export_with_its_description() {
    let srv = two_exports();
    for addr in srv.addrs() {
        let list = Client::list_exports(&addr).expect("LIST");
        assert_eq!(
            list,
            vec![
                ("alpha".to_string(), "test export alpha".to_string()),
                ("beta".to_string(), "test export beta".to_string())
            ],
            "over {addr}"
        );
        // LIST with data is malformed: ERR_INVALID, and the connection goes on.
        let mut hs = handshake(&addr);
        let r = hs.option(OPT_LIST, b"junk").expect("LIST with data");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].reply, REP_ERR_INVALID);
        assert_eq!(hs.list().expect("LIST after the error").len(), 2);
    }
}

#[test]
fn info_reports_size_flags_and_block_sizes() {
    // (lbs, pbs, optimal, max) -> expected (min, preferred, max)
    type Case = ((u32, u32, u32, u32), (u32, u32, u32));
    let cases: &[Case] = &[
        // A plain 512-byte-sector disk: preferred is the optimal I/O size.
        ((512, 4096, 4096, 32 << 20), (512, 4096, 32 << 20)),
        // 4K sectors, a 64 KiB stripe, 1 MiB max.
        ((4096, 4096, 64 << 10, 1 << 20), (4096, 64 << 10, 1 << 20)),
        // A full stripe of three 64 KiB chunks is not a power of two: preferred must
        // still be one (proto.md), and must not be the stripe.
        (
            (512, 64 << 10, 3 * (64 << 10), 8 << 20),
            (512, 64 << 10, 8 << 20),
        ),
        // A max above 32 MiB is capped to what the server accepts as payload.
        ((512, 4096, 4096, u32::MAX), (512, 4096, 32 << 20)),
    ];
    for &((lbs, pbs, opt, max), want) in cases {
        let size = 8 << 20;
        let srv = TestServer::start(vec![export("d", geometry(size, lbs, pbs, opt, max))]);
        for addr in srv.addrs() {
            let info = Client::query_info(&addr, "d").expect("INFO");
            assert!(info.block_size_sent, "INFO_BLOCK_SIZE must be sent");
            assert_eq!(
                (info.min_block, info.preferred_block, info.max_block),
                want,
                "geometry lbs={lbs} pbs={pbs} opt={opt} max={max}"
            );
            assert!(info.preferred_block.is_power_of_two());
            assert_eq!(info.size, size);
            assert_eq!(info.reported_name.as_deref(), Some("d"));
            assert_eq!(info.description.as_deref(), Some("test export d"));
            for f in [
                FLAG_HAS_FLAGS,
                FLAG_SEND_FLUSH,
                FLAG_SEND_FUA,
                FLAG_SEND_WRITE_ZEROES,
            ] {
                assert!(info.has(f), "flag {f:#x} missing from {:#x}", info.flags);
            }
            assert!(!info.has(FLAG_READ_ONLY));
            // DF only once structured replies are negotiated.
            assert!(!info.has(FLAG_SEND_DF));
            // GO gives the same answer and then transmission works.
            let c = Client::connect(&cairn_nbd::client::ClientOptions::new(addr.clone(), "d"))
                .expect("connect");
            assert_eq!(c.block_sizes(), want);
            assert_eq!(c.size(), size);
            assert!(
                c.info().has(FLAG_SEND_DF),
                "structured connection should get DF"
            );
            let mut buf = vec![0u8; usize::try_from(lbs).unwrap()];
            c.read_at(&mut buf, size - u64::from(lbs))
                .expect("read the last block");
            c.disconnect().expect("disconnect");
        }
    }
}

#[test]
fn read_only_export_is_flagged() {
    let mut e = export("ro", mem(1 << 20));
    e.read_only = true;
    let srv = TestServer::start(vec![e]);
    for addr in srv.addrs() {
        let info = Client::query_info(&addr, "ro").expect("INFO");
        assert!(info.has(FLAG_READ_ONLY));
        assert!(!info.has(FLAG_SEND_TRIM) && !info.has(FLAG_SEND_WRITE_ZEROES));
    }
}

#[test]
fn unknown_export_is_err_unknown_for_info_and_go() {
    let srv = two_exports();
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        let e = hs.info("gamma").expect_err("INFO on an unknown export");
        assert_eq!(e.option_reply(), Some(REP_ERR_UNKNOWN), "{e}");
        // Still in the option phase: a valid GO works afterwards.
        let hs2 = handshake(&addr);
        let e = hs2.go("gamma").expect_err("GO on an unknown export");
        assert_eq!(e.option_reply(), Some(REP_ERR_UNKNOWN), "{e}");
        let mut c = hs.go("alpha").expect("GO after a refused INFO");
        c.read_vec(0, 512, 0).expect("read");
    }
}

#[test]
fn empty_name_is_the_only_export_or_unknown_with_several() {
    let one = TestServer::start(vec![export("only", mem(1 << 20))]);
    for addr in one.addrs() {
        let info = Client::query_info(&addr, "").expect("INFO on the default export");
        assert_eq!(info.size, 1 << 20);
        let mut c = handshake(&addr).go("").expect("GO on the default export");
        c.write(0, &[7u8; 512], 0).expect("write");
        assert_eq!(c.read_vec(0, 512, 0).expect("read"), vec![7u8; 512]);
        // The same device under its own name.
        let mut c2 = handshake(&addr).go("only").expect("GO by name");
        assert_eq!(c2.read_vec(0, 512, 0).expect("read"), vec![7u8; 512]);
    }
    let two = two_exports();
    for addr in two.addrs() {
        let e = handshake(&addr).go("").expect_err("no default among two");
        assert_eq!(e.option_reply(), Some(REP_ERR_UNKNOWN), "{e}");
    }
    // An explicit default export among several.
    let mut cfg = ServerConfig::new(vec![export("a", mem(1 << 20)), export("b", mem(2 << 20))]);
    cfg.default_export = Some("b".into());
    let srv = TestServer::start_with(cfg);
    let info = Client::query_info(&srv.unix, "").expect("INFO on the configured default");
    assert_eq!(info.size, 2 << 20);
}

#[test]
fn option_errors_leave_the_handshake_usable() {
    let srv = two_exports();
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        // Unknown option.
        let r = hs.option(0x7777, b"whatever").expect("unknown option");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].reply, REP_ERR_UNSUP, "unknown option");
        // Meta context before structured replies.
        let data = encode_meta_context_request("alpha", &[BASE_ALLOCATION]);
        for opt in [OPT_SET_META_CONTEXT, OPT_LIST_META_CONTEXT] {
            let r = hs.option(opt, &data).expect("meta context");
            assert_eq!(
                r.last().unwrap().reply,
                REP_ERR_INVALID,
                "option {opt} before structured"
            );
            assert_eq!(r.len(), 1, "no context reply before the error");
        }
        // STRUCTURED_REPLY with data.
        let r = hs
            .option(OPT_STRUCTURED_REPLY, &[0])
            .expect("structured with data");
        assert_eq!(r.last().unwrap().reply, REP_ERR_INVALID);
        assert!(!hs.structured());
        // Malformed INFO / GO payloads.
        for bad in [&b""[..], &[0, 0, 0, 9, b'a'][..], &[0, 0, 0, 0, 0][..]] {
            let r = hs.option(OPT_INFO, bad).expect("malformed INFO");
            assert_eq!(r.last().unwrap().reply, REP_ERR_INVALID, "INFO {bad:?}");
        }
        let mut bad_go = encode_info_request("alpha", &[]);
        bad_go.push(0);
        let r = hs.option(OPT_GO, &bad_go).expect("GO with trailing bytes");
        assert_eq!(r.last().unwrap().reply, REP_ERR_INVALID);
        // STARTTLS is not offered.
        let r = hs.option(OPT_STARTTLS, &[]).expect("STARTTLS");
        assert!(r.last().unwrap().is_error());
        // Now do it right: structured, meta context, GO, and a block status.
        hs.structured_replies().expect("structured");
        let again = hs
            .option(OPT_STRUCTURED_REPLY, &[])
            .expect("structured twice");
        assert_eq!(
            again.last().unwrap().reply,
            REP_ERR_INVALID,
            "second STRUCTURED_REPLY"
        );
        let ctx = hs
            .meta_context(false, "alpha", &[])
            .expect("LIST_META_CONTEXT");
        assert!(ctx.iter().any(|(_, n)| n == BASE_ALLOCATION), "{ctx:?}");
        let none = hs
            .meta_context(true, "alpha", &["qemu:dirty-bitmap:x"])
            .expect("SET unknown ns");
        assert!(
            none.is_empty(),
            "an unknown namespace selects nothing: {none:?}"
        );
        let e = hs
            .meta_context(true, "alpha", &["nonamespace"])
            .expect_err("query without namespace");
        assert_eq!(e.option_reply(), Some(REP_ERR_INVALID));
        let e = hs
            .meta_context(true, "gamma", &[BASE_ALLOCATION])
            .expect_err("unknown export");
        assert_eq!(e.option_reply(), Some(REP_ERR_UNKNOWN));
        let ctx = hs
            .meta_context(true, "alpha", &[BASE_ALLOCATION])
            .expect("SET_META_CONTEXT");
        assert_eq!(ctx.len(), 1);
        let mut c = hs.go("alpha").expect("GO");
        assert!(c.structured());
        let bs = c.block_status(0, 1 << 20, 0).expect("block status");
        assert!(!bs.is_empty());
    }
}

#[test]
fn meta_context_for_another_export_is_not_active_after_go() {
    let srv = two_exports();
    let mut hs = handshake(&srv.unix);
    hs.structured_replies().expect("structured");
    hs.meta_context(true, "beta", &[BASE_ALLOCATION])
        .expect("SET for beta");
    let mut c = hs.go("alpha").expect("GO alpha");
    let cookie = c.submit(CMD_BLOCK_STATUS, 0, 0, 4096, &[]).expect("send");
    let r = c.wait(cookie).expect("reply");
    assert_eq!(
        r.error, EINVAL,
        "BLOCK_STATUS with a context set for another export"
    );
    assert_usable(
        &mut c,
        0,
        &mut rand::thread_rng(),
        "BLOCK_STATUS without context",
    );
}

#[test]
fn oversized_option_data_is_drained_and_refused() {
    let srv = two_exports();
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        // More than the server reads into memory (64 KiB), but a size it can drain.
        let big = vec![0xabu8; (MAX_OPTION_DATA as usize) + 12345];
        for opt in [OPT_INFO, OPT_LIST, 0x4242] {
            let r = hs.option(opt, &big).expect("oversized option");
            assert_eq!(r.len(), 1);
            assert!(
                r[0].is_error(),
                "oversized option {opt} got reply {:#x}",
                r[0].reply
            );
        }
        // The stream is still in sync.
        assert_eq!(hs.list().expect("LIST after oversized options").len(), 2);
        let mut c = hs.go("alpha").expect("GO");
        c.read_vec(0, 4096, 0).expect("read");
    }
}

#[test]
fn abort_gets_an_ack_and_a_close() {
    let srv = two_exports();
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        hs.list().expect("LIST");
        let r = hs.abort().expect("ABORT");
        if let Some(r) = r {
            assert_eq!(
                r.reply, REP_ACK,
                "ABORT is answered with ACK (or a bare close)"
            );
        }
        hs.expect_closed().expect("the server closes after ABORT");
    }
}

#[test]
fn garbage_before_options_closes_only_that_connection() {
    let srv = two_exports();
    let mut other = open(&srv.unix, "alpha", false, false);
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        // A wrong option magic: the stream is out of sync, and the server may only close.
        let mut bad = [0u8; 16];
        bad[0..8].copy_from_slice(b"IHAVEOPX");
        bad[8..12].copy_from_slice(&OPT_LIST.to_be_bytes());
        hs.send_raw(&bad).expect("send");
        hs.expect_closed()
            .expect("the server closes on a bad option magic");
        other
            .read_vec(0, 512, 0)
            .expect("another connection is unaffected");
    }
}

#[test]
fn over_tcp_and_unix_alike() {
    // The same export reached both ways sees the same data.
    let srv = TestServer::start(vec![export("x", mem(1 << 20))]);
    let mut u = open(&srv.unix, "x", true, false);
    let mut t = open(&srv.tcp, "x", false, false);
    u.write(4096, &[0x5a; 4096], CMD_FLAG_FUA)
        .expect("write over unix");
    assert_eq!(
        t.read_vec(4096, 4096, 0).expect("read over tcp"),
        vec![0x5a; 4096]
    );
    assert!(matches!(srv.unix, Listen::Unix(_)) && matches!(srv.tcp, Listen::Tcp(_)));
    t.disconnect().expect("disconnect tcp");
    u.disconnect().expect("disconnect unix");
}

#[test]
fn export_name_serves_a_known_export_and_closes_on_an_unknown_one() {
    let srv = two_exports();
    for addr in srv.addrs() {
        // Unknown: no error reply exists for EXPORT_NAME; the server must just close.
        let mut hs = handshake(&addr);
        hs.send_option(OPT_EXPORT_NAME, b"gamma").expect("send");
        hs.expect_closed()
            .expect("EXPORT_NAME of an unknown export closes the connection");
        // Known: size and transmission flags, no zero padding (we asked for NO_ZEROES).
        let mut hs = handshake(&addr);
        hs.send_option(OPT_EXPORT_NAME, b"alpha").expect("send");
        let mut r = [0u8; 10];
        hs.read_raw(&mut r).expect("export size and flags");
        assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), 1 << 20);
        let flags = u16::from_be_bytes([r[8], r[9]]);
        assert!(
            flags & FLAG_HAS_FLAGS != 0 && flags & FLAG_SEND_FLUSH != 0,
            "flags {flags:#x}"
        );
        // Transmission follows directly: a raw FLUSH gets a simple reply.
        let mut req = cairn_nbd::client::RawRequest::new(CMD_FLUSH, 0, 0, 0);
        req.cookie = 0x1234;
        hs.send_raw(&req.encode()).expect("send FLUSH");
        let mut reply = [0u8; SIMPLE_REPLY_LEN];
        hs.read_raw(&mut reply).expect("FLUSH reply");
        assert_eq!(reply, encode_simple_reply(0, 0x1234));
    }
}

#[test]
fn base_namespace_query_selects_base_allocation() {
    let srv = two_exports();
    let mut hs = handshake(&srv.unix);
    hs.structured_replies().expect("structured");
    let ctx = hs
        .meta_context(true, "alpha", &["base:"])
        .expect("SET base:");
    assert_eq!(ctx.len(), 1, "{ctx:?}");
    assert_eq!(ctx[0].1, BASE_ALLOCATION);
    let mut c = hs.go("alpha").expect("GO");
    assert!(!c.block_status(0, 4096, 0).expect("block status").is_empty());
}
