//! verification.md §5.3, "Requests cairn must answer with an error and then keep serving
//! the same connection": every row of the table is sent as a raw request, its reply
//! checked, and then a normal write + read-back on the SAME connection must succeed. A
//! second connection checks after every case that nothing leaked across.

// Test code: casts here are of test-chosen sizes and offsets (a few MiB at most), and a
// truncation would surface as a failed comparison, not as silent corruption.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::sync::Arc;

use cairn_block::testkit::{FaultyDisk, Ops};
use cairn_block::{BlockDevice, Capabilities, Geometry, MemDisk, Support, WriteFlags};
use cairn_nbd::client::{errno_name, Connection, Error, RawRequest};
use cairn_nbd::proto::*;
use cairn_nbd::Export;
use common::*;
use rand::Rng;

/// Size of the main export: sparse, so large requests cost nothing until written.
const SIZE: u64 = 128 << 20;
/// Where the "still usable" probe writes on the connection under test / the witness.
const PROBE: u64 = 1 << 20;
const WITNESS: u64 = 2 << 20;

#[derive(Debug, Clone, Copy)]
enum Want {
    /// Exactly this error.
    Err(u32),
    /// Success.
    Ok,
    /// Success or one of these errors.
    OkOr(&'static [u32]),
    /// One of these errors.
    OneOf(&'static [u32]),
}

impl Want {
    fn accepts(self, errno: u32) -> bool {
        match self {
            Want::Err(e) => errno == e,
            Want::Ok => errno == 0,
            Want::OkOr(es) => errno == 0 || es.contains(&errno),
            Want::OneOf(es) => es.contains(&errno),
        }
    }
}

struct Case {
    name: String,
    req: RawRequest,
    payload: Vec<u8>,
    want: Want,
}

fn case(
    name: impl Into<String>,
    kind: u16,
    flags: u16,
    offset: u64,
    length: u32,
    want: Want,
) -> Case {
    let payload = if kind == CMD_WRITE {
        vec![0xeeu8; length as usize]
    } else {
        Vec::new()
    };
    Case {
        name: name.into(),
        req: RawRequest::new(kind, flags, offset, length),
        payload,
        want,
    }
}

/// The table, for a connection with or without structured replies / base:allocation.
fn table(structured: bool, meta: bool) -> Vec<Case> {
    use Want::*;
    let s = SIZE;
    let top = u64::MAX - 255;
    let mut v = vec![
        // Past the end, straddling the end.
        case("read past end", CMD_READ, 0, s, 512, Err(EINVAL)),
        case(
            "read straddling end",
            CMD_READ,
            0,
            s - 512,
            1024,
            Err(EINVAL),
        ),
        case("write past end", CMD_WRITE, 0, s, 512, Err(ENOSPC)),
        case(
            "write straddling end",
            CMD_WRITE,
            0,
            s - 512,
            1024,
            Err(ENOSPC),
        ),
        case(
            "write far past end",
            CMD_WRITE,
            0,
            1 << 50,
            4096,
            Err(ENOSPC),
        ),
        case("trim past end", CMD_TRIM, 0, s, 512, Err(EINVAL)),
        case(
            "trim straddling end",
            CMD_TRIM,
            0,
            s - 512,
            1024,
            Err(EINVAL),
        ),
        case("zero past end", CMD_WRITE_ZEROES, 0, s, 512, Err(ENOSPC)),
        case(
            "zero straddling end",
            CMD_WRITE_ZEROES,
            0,
            s - 512,
            1024,
            Err(ENOSPC),
        ),
        case("cache past end", CMD_CACHE, 0, s, 512, Err(EINVAL)),
        // offset + length overflows 64 bits.
        case("read offset overflow", CMD_READ, 0, top, 512, Err(EINVAL)),
        case("write offset overflow", CMD_WRITE, 0, top, 512, Err(EINVAL)),
        case("trim offset overflow", CMD_TRIM, 0, top, 512, Err(EINVAL)),
        case(
            "zero offset overflow",
            CMD_WRITE_ZEROES,
            0,
            top,
            512,
            Err(EINVAL),
        ),
        case("read at u64::MAX", CMD_READ, 0, u64::MAX, 1, Err(EINVAL)),
        // Misaligned (minimum block 512).
        case("read misaligned offset", CMD_READ, 0, 100, 512, Err(EINVAL)),
        case("read misaligned length", CMD_READ, 0, 0, 100, Err(EINVAL)),
        case(
            "write misaligned offset",
            CMD_WRITE,
            0,
            4096 + 1,
            512,
            Err(EINVAL),
        ),
        case(
            "write misaligned length",
            CMD_WRITE,
            0,
            4096,
            700,
            Err(EINVAL),
        ),
        case("trim misaligned", CMD_TRIM, 0, 256, 512, Err(EINVAL)),
        case(
            "zero misaligned",
            CMD_WRITE_ZEROES,
            0,
            256,
            512,
            Err(EINVAL),
        ),
        // Unknown command types.
        case("unknown command 8", 8, 0, 0, 512, Err(EINVAL)),
        case("unknown command 9", 9, 0, 0, 0, Err(EINVAL)),
        case("unknown command 0x7fff", 0x7fff, 0, 0, 4096, Err(EINVAL)),
        case("unknown command 0xffff", 0xffff, 0, 0, 0, Err(EINVAL)),
        // Unknown flags, or flags not defined for the command.
        case("unknown flag on read", CMD_READ, 0x80, 0, 512, Err(EINVAL)),
        case("high flag on read", CMD_READ, 0x8000, 0, 512, Err(EINVAL)),
        case(
            "NO_HOLE on read",
            CMD_READ,
            CMD_FLAG_NO_HOLE,
            0,
            512,
            Err(EINVAL),
        ),
        case("DF on write", CMD_WRITE, CMD_FLAG_DF, 0, 512, Err(EINVAL)),
        case(
            "unknown flag on write",
            CMD_WRITE,
            0x40,
            0,
            4096,
            Err(EINVAL),
        ),
        case(
            "REQ_ONE on trim",
            CMD_TRIM,
            CMD_FLAG_REQ_ONE,
            0,
            512,
            Err(EINVAL),
        ),
        case(
            "NO_HOLE on flush",
            CMD_FLUSH,
            CMD_FLAG_NO_HOLE,
            0,
            0,
            Err(EINVAL),
        ),
        case(
            "FAST_ZERO on write",
            CMD_WRITE,
            CMD_FLAG_FAST_ZERO,
            0,
            512,
            Err(EINVAL),
        ),
        // FUA is advertised, so it is accepted on every command.
        case("FUA on read", CMD_READ, CMD_FLAG_FUA, 0, 4096, Ok),
        case("FUA on write", CMD_WRITE, CMD_FLAG_FUA, 8192, 4096, Ok),
        case("FUA on flush", CMD_FLUSH, CMD_FLAG_FUA, 0, 0, Ok),
        case("FUA on trim", CMD_TRIM, CMD_FLAG_FUA, 3 << 20, 4096, Ok),
        case(
            "FUA on zero",
            CMD_WRITE_ZEROES,
            CMD_FLAG_FUA,
            3 << 20,
            4096,
            Ok,
        ),
        case("FUA on cache", CMD_CACHE, CMD_FLAG_FUA, 0, 4096, Ok),
        case(
            "NO_HOLE on zero",
            CMD_WRITE_ZEROES,
            CMD_FLAG_NO_HOLE,
            3 << 20,
            4096,
            Ok,
        ),
        // FLUSH's offset and length are reserved.
        case("flush with offset", CMD_FLUSH, 0, 4096, 0, Err(EINVAL)),
        case("flush with length", CMD_FLUSH, 0, 0, 512, Err(EINVAL)),
        // Zero-length requests: unspecified, but never a disconnect.
        case("zero-length read", CMD_READ, 0, 0, 0, OkOr(&[EINVAL])),
        case("zero-length write", CMD_WRITE, 0, 0, 0, OkOr(&[EINVAL])),
        case("zero-length trim", CMD_TRIM, 0, 0, 0, OkOr(&[EINVAL])),
        case(
            "zero-length zero",
            CMD_WRITE_ZEROES,
            0,
            0,
            0,
            OkOr(&[EINVAL]),
        ),
        case("zero-length cache", CMD_CACHE, 0, 0, 0, OkOr(&[EINVAL])),
        case(
            "zero-length read at the end",
            CMD_READ,
            0,
            s,
            0,
            OkOr(&[EINVAL]),
        ),
        // TRIM/WRITE_ZEROES longer than the maximum payload: success or refusal.
        case(
            "trim above max payload",
            CMD_TRIM,
            0,
            0,
            64 << 20,
            OkOr(&[EOVERFLOW, EINVAL]),
        ),
        case(
            "zero above max payload",
            CMD_WRITE_ZEROES,
            0,
            64 << 20,
            64 << 20,
            OkOr(&[EOVERFLOW, EINVAL]),
        ),
        case(
            "cache above max payload",
            CMD_CACHE,
            0,
            0,
            64 << 20,
            OkOr(&[EOVERFLOW, EINVAL]),
        ),
        // A READ above the advertised maximum has no payload to consume: refuse it.
        case(
            "read above max",
            CMD_READ,
            0,
            0,
            (32 << 20) + 512,
            OneOf(&[EINVAL, EOVERFLOW]),
        ),
        // In range and aligned: the control group.
        case("plain read", CMD_READ, 0, s - 4096, 4096, Ok),
        case("plain write at the end", CMD_WRITE, 0, s - 4096, 4096, Ok),
    ];
    if structured {
        // DF is advertised with structured replies; an unfragmented 64 KiB read must work.
        v.push(case(
            "DF read of 64 KiB",
            CMD_READ,
            CMD_FLAG_DF,
            0,
            65536,
            Ok,
        ));
        v.push(case(
            "DF|FUA read",
            CMD_READ,
            CMD_FLAG_DF | CMD_FLAG_FUA,
            4096,
            4096,
            Ok,
        ));
    } else {
        v.push(case(
            "DF without structured replies",
            CMD_READ,
            CMD_FLAG_DF,
            0,
            512,
            Err(EINVAL),
        ));
    }
    if meta {
        v.push(case("block status", CMD_BLOCK_STATUS, 0, 0, 1 << 20, Ok));
        v.push(case(
            "block status REQ_ONE|FUA",
            CMD_BLOCK_STATUS,
            CMD_FLAG_REQ_ONE | CMD_FLAG_FUA,
            0,
            4096,
            Ok,
        ));
        v.push(case(
            "block status past end",
            CMD_BLOCK_STATUS,
            0,
            s,
            512,
            Err(EINVAL),
        ));
        v.push(case(
            "block status overflow",
            CMD_BLOCK_STATUS,
            0,
            top,
            512,
            Err(EINVAL),
        ));
        v.push(case(
            "block status NO_HOLE",
            CMD_BLOCK_STATUS,
            CMD_FLAG_NO_HOLE,
            0,
            512,
            Err(EINVAL),
        ));
        v.push(case(
            "zero-length block status",
            CMD_BLOCK_STATUS,
            0,
            0,
            0,
            OkOr(&[EINVAL]),
        ));
    } else {
        v.push(case(
            "block status without meta context",
            CMD_BLOCK_STATUS,
            0,
            0,
            4096,
            Err(EINVAL),
        ));
    }
    v
}

/// Sends one case, checks the reply, then checks the connection and the witness.
fn run_case(
    c: &mut Connection,
    witness: &mut Connection,
    cookie: u64,
    case: &Case,
    rng: &mut impl Rng,
    ctx: &str,
) {
    let mut req = case.req;
    req.cookie = cookie;
    c.send_raw(req, &case.payload)
        .unwrap_or_else(|e| panic!("{ctx}: {}: send: {e}", case.name));
    let r = c.wait(cookie).unwrap_or_else(|e| {
        panic!(
            "{ctx}: {}: no reply ({e}); the connection must survive",
            case.name
        )
    });
    assert!(
        case.want.accepts(r.error),
        "{ctx}: {}: got {}, want {:?}{}",
        case.name,
        errno_name(r.error),
        case.want,
        if r.message.is_empty() {
            String::new()
        } else {
            format!(" (message: {})", r.message)
        }
    );
    if r.error == 0 && case.req.kind == CMD_READ {
        assert_eq!(
            r.data.len(),
            case.req.length as usize,
            "{ctx}: {}: data length",
            case.name
        );
    }
    if c.structured() && case.req.kind == CMD_READ {
        // proto.md: with structured replies, a READ's reply is structured, errors included.
        assert!(
            r.structured,
            "{ctx}: {}: simple reply to a READ on a structured connection",
            case.name
        );
    }
    assert_usable(c, PROBE, rng, &format!("{ctx}: {}", case.name));
    assert_usable(
        witness,
        WITNESS,
        rng,
        &format!("{ctx}: witness after {}", case.name),
    );
}

#[test]
fn every_bad_request_gets_its_error_and_the_connection_goes_on() {
    let (mut rng, _) = rng_for("bad_requests");
    let srv = TestServer::start(vec![export("d", mem(SIZE))]);
    for addr in srv.addrs() {
        let mut witness = open(&addr, "d", false, false);
        for (structured, meta) in [(false, false), (true, false), (true, true)] {
            let ctx = format!("{addr} structured={structured} meta={meta}");
            let mut c = open(&addr, "d", structured, meta);
            for (i, case) in table(structured, meta).iter().enumerate() {
                run_case(&mut c, &mut witness, 1000 + i as u64, case, &mut rng, &ctx);
            }
            c.disconnect()
                .unwrap_or_else(|e| panic!("{ctx}: disconnect: {e}"));
        }
        witness.disconnect().expect("witness disconnect");
    }
}

#[test]
fn refused_writes_leave_the_data_alone() {
    // Every refused WRITE consumed its payload (the stream stayed in sync, checked by the
    // table); here: none of it landed anywhere.
    let disk = Arc::new(MemDisk::new(SIZE));
    let srv = TestServer::start(vec![export("d", disk.clone())]);
    let mut c = open(&srv.unix, "d", false, false);
    for (off, len) in [(SIZE - 512, 1024u32), (4096 + 1, 512), (4096, 700)] {
        let mut req = RawRequest::new(CMD_WRITE, 0, off, len);
        req.cookie = 7;
        c.send_raw(req, &vec![0xee; len as usize]).expect("send");
        assert_ne!(c.wait(7).expect("reply").error, 0);
    }
    let mut req = RawRequest::new(CMD_WRITE, CMD_FLAG_DF, 0, 4096);
    req.cookie = 8;
    c.send_raw(req, &[0xee; 4096]).expect("send");
    assert_eq!(c.wait(8).expect("reply").error, EINVAL);
    c.flush().expect("flush");
    let mut buf = vec![0u8; 8192];
    disk.read_at(&mut buf, 0).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "a refused write changed the start of the disk"
    );
    disk.read_at(&mut buf[..512], SIZE - 512).unwrap();
    assert!(
        buf[..512].iter().all(|&b| b == 0),
        "a refused straddling write changed the end"
    );
}

#[test]
fn misaligned_on_a_4k_export() {
    let g = Geometry {
        size: 16 << 20,
        logical_block_size: 4096,
        physical_block_size: 4096,
        optimal_io_size: 4096,
        max_io_size: 1 << 20,
    };
    let srv = TestServer::start(vec![export("4k", Arc::new(MemDisk::with_geometry(g)))]);
    let (mut rng, _) = rng_for("misaligned_4k");
    for addr in srv.addrs() {
        let mut c = open(&addr, "4k", false, false);
        let mut w = open(&addr, "4k", false, false);
        assert_eq!(c.info().min_block, 4096);
        for (i, case) in [
            case(
                "write 512 at 512",
                CMD_WRITE,
                0,
                512,
                512,
                Want::Err(EINVAL),
            ),
            case("write 512 at 0", CMD_WRITE, 0, 0, 512, Want::Err(EINVAL)),
            case(
                "read 4096 at 512",
                CMD_READ,
                0,
                512,
                4096,
                Want::Err(EINVAL),
            ),
            case("trim 512", CMD_TRIM, 0, 0, 512, Want::Err(EINVAL)),
            case(
                "zero 2048 at 2048",
                CMD_WRITE_ZEROES,
                0,
                2048,
                2048,
                Want::Err(EINVAL),
            ),
            case("write 4096 at 4096", CMD_WRITE, 0, 4096, 4096, Want::Ok),
            // Above the advertised 1 MiB maximum, below 32 MiB: refuse (or accept), never close.
            case(
                "write 2 MiB above a 1 MiB max",
                CMD_WRITE,
                0,
                0,
                2 << 20,
                Want::OkOr(&[EINVAL]),
            ),
            case(
                "read 2 MiB above a 1 MiB max",
                CMD_READ,
                0,
                0,
                2 << 20,
                Want::OneOf(&[EINVAL, EOVERFLOW]),
            ),
        ]
        .iter()
        .enumerate()
        {
            run_case(
                &mut c,
                &mut w,
                i as u64 + 1,
                case,
                &mut rng,
                &format!("{addr} 4k"),
            );
        }
    }
}

#[test]
fn write_payload_of_32_mib_is_never_a_disconnect() {
    let (mut rng, _) = rng_for("write_32m");
    let small_max = Geometry {
        size: 64 << 20,
        logical_block_size: 512,
        physical_block_size: 4096,
        optimal_io_size: 4096,
        max_io_size: 1 << 20,
    };
    let srv = TestServer::start(vec![
        export("d", mem(64 << 20)),
        export("small", Arc::new(MemDisk::with_geometry(small_max))),
    ]);
    for addr in srv.addrs() {
        let big = random_vec(&mut rng, 32 << 20);
        // At the advertised maximum (32 MiB): accepted, and the data is all there.
        let mut c = open(&addr, "d", true, false);
        assert_eq!(c.info().max_block, 32 << 20);
        c.write(0, &big, 0)
            .expect("32 MiB write at the advertised maximum");
        for off in [0usize, 12345 * 512, (32 << 20) - 4096] {
            let got = c.read_vec(off as u64, 4096, 0).expect("read back");
            assert!(
                got[..] == big[off..off + 4096],
                "32 MiB write: data at {off} differs"
            );
        }
        // Above a 1 MiB maximum but <= 32 MiB: EINVAL (or accepted), payload consumed.
        let mut s = open(&addr, "small", false, false);
        let mut w = open(&addr, "small", false, false);
        assert_eq!(s.info().max_block, 1 << 20);
        let mut req = RawRequest::new(CMD_WRITE, 0, 0, 32 << 20);
        req.cookie = 42;
        s.send_raw(req, &big).expect("send 32 MiB");
        let r = s
            .wait(42)
            .expect("a 32 MiB payload must not kill the connection");
        assert!(
            r.error == 0 || r.error == EINVAL,
            "got {}",
            errno_name(r.error)
        );
        assert_usable(&mut s, PROBE, &mut rng, "32 MiB write above the maximum");
        assert_usable(&mut w, WITNESS, &mut rng, "witness");
        // Above both 32 MiB and the maximum: the server may hang up, but only on that
        // connection.
        let huge = vec![0u8; (32 << 20) + 4096];
        let mut req = RawRequest::new(CMD_WRITE, 0, 0, (32 << 20) + 4096);
        req.cookie = 43;
        match s.send_raw(req, &huge) {
            Err(_) => {} // the server closed while we were still sending
            Ok(()) => match s.wait(43) {
                Ok(r) => {
                    assert_eq!(r.error, EINVAL, "33 MiB write");
                    assert_usable(&mut s, PROBE, &mut rng, "33 MiB write");
                }
                Err(Error::Closed) | Err(Error::Io(_)) => {}
                Err(e) => panic!("33 MiB write: {e}"),
            },
        }
        assert_usable(
            &mut w,
            WITNESS,
            &mut rng,
            "witness after a 33 MiB write elsewhere",
        );
    }
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let disk = MemDisk::new(4 << 20);
    disk.write_at(&[0x11; 4096], 0, WriteFlags::NONE).unwrap();
    let srv = TestServer::start(vec![Export {
        read_only: true,
        ..export("ro", Arc::new(disk))
    }]);
    for addr in srv.addrs() {
        for structured in [false, true] {
            let mut c = open(&addr, "ro", structured, false);
            assert!(c.info().has(FLAG_READ_ONLY));
            let cases = [
                case("write", CMD_WRITE, 0, 0, 4096, Want::Err(EPERM)),
                case(
                    "write FUA",
                    CMD_WRITE,
                    CMD_FLAG_FUA,
                    0,
                    512,
                    Want::Err(EPERM),
                ),
                case("trim", CMD_TRIM, 0, 0, 4096, Want::Err(EPERM)),
                case("zero", CMD_WRITE_ZEROES, 0, 0, 4096, Want::Err(EPERM)),
                // A write past the end of a read-only export: either refusal is right.
                case(
                    "write past end",
                    CMD_WRITE,
                    0,
                    4 << 20,
                    512,
                    Want::OneOf(&[EPERM, ENOSPC]),
                ),
                case("flush", CMD_FLUSH, 0, 0, 0, Want::Ok),
                case("read", CMD_READ, 0, 0, 4096, Want::Ok),
            ];
            for (i, cs) in cases.iter().enumerate() {
                let mut req = cs.req;
                req.cookie = i as u64 + 1;
                c.send_raw(req, &cs.payload).expect("send");
                let r = c
                    .wait(req.cookie)
                    .unwrap_or_else(|e| panic!("{}: {e}", cs.name));
                assert!(
                    cs.want.accepts(r.error),
                    "{addr} read-only {}: got {}",
                    cs.name,
                    errno_name(r.error)
                );
                // The payload was consumed: the next read parses and shows the old data.
                let got = c
                    .read_vec(0, 4096, 0)
                    .unwrap_or_else(|e| panic!("after {}: {e}", cs.name));
                assert_eq!(got, vec![0x11; 4096], "after {}", cs.name);
            }
        }
    }
}

#[test]
fn fast_zero_that_cannot_be_fast_is_enotsup() {
    // A device that claims native zeroing but refuses FAST_ZERO at run time (a filesystem
    // that turned fallocate down): FAST_ZERO is advertised, and must fail with ENOTSUP,
    // leaving the data alone.
    let mut refusing = HookDisk::new(MemDisk::new(4 << 20));
    refusing.refuse_fast_zero = true;
    // A device whose zeroing is emulated.
    let mut emulated = HookDisk::new(MemDisk::new(4 << 20));
    emulated.emulate_zeroes = true;
    emulated.caps = Capabilities {
        write_zeroes: Support::Emulate,
        ..emulated.caps
    };
    let srv = TestServer::start(vec![
        export("refusing", Arc::new(refusing)),
        export("emulated", Arc::new(emulated)),
    ]);
    let (mut rng, _) = rng_for("fast_zero");
    for addr in srv.addrs() {
        for name in ["refusing", "emulated"] {
            for structured in [false, true] {
                let mut c = open(&addr, name, structured, false);
                let data = random_vec(&mut rng, 8192);
                c.write(0, &data, 0).expect("write");
                let advertised = c.info().has(FLAG_SEND_FAST_ZERO);
                let cookie = c
                    .submit(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 8192, &[])
                    .expect("send");
                let r = c.wait(cookie).expect("reply to FAST_ZERO");
                if advertised {
                    assert_eq!(
                        r.error, ENOTSUP,
                        "{addr} {name}: FAST_ZERO that cannot be fast"
                    );
                } else {
                    // Not advertised: the flag is one the client must not send.
                    assert_eq!(
                        r.error, EINVAL,
                        "{addr} {name}: FAST_ZERO when not advertised"
                    );
                }
                if name == "refusing" {
                    assert!(advertised, "native zeroing should advertise FAST_ZERO");
                }
                assert_eq!(
                    c.read_vec(0, 8192, 0).expect("read"),
                    data,
                    "{name}: a failed fast zero changed data"
                );
                // Without FAST_ZERO the same request zeroes.
                c.write_zeroes(0, 8192, 0).expect("slow zero");
                assert_eq!(c.read_vec(0, 8192, 0).expect("read"), vec![0; 8192]);
                assert_usable(&mut c, PROBE, &mut rng, "FAST_ZERO");
            }
        }
    }
}

/// FAST_ZERO on an emulated-zero device is answered with ENOTSUP (as nbdkit does), which
/// needs `NBD_FLAG_SEND_FAST_ZERO` advertised for it: failing fast is always possible, and
/// it lets `qemu-img convert` skip a pre-zeroing pass it would otherwise do slowly.
#[test]
fn fast_zero_is_advertised_for_emulated_zeroing() {
    let mut emulated = HookDisk::new(MemDisk::new(4 << 20));
    emulated.emulate_zeroes = true;
    emulated.caps = Capabilities {
        write_zeroes: Support::Emulate,
        ..emulated.caps
    };
    let srv = TestServer::start(vec![export("emulated", Arc::new(emulated))]);
    let mut c = open(&srv.unix, "emulated", false, false);
    assert!(
        c.info().has(FLAG_SEND_FAST_ZERO),
        "flags {:#x}",
        c.info().flags
    );
    let cookie = c
        .submit(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096, &[])
        .expect("send");
    assert_eq!(c.wait(cookie).expect("reply").error, ENOTSUP);
}

#[test]
fn bad_magic_closes_that_connection_only() {
    let (mut rng, _) = rng_for("bad_magic");
    let srv = TestServer::start(vec![export("d", mem(SIZE))]);
    for addr in srv.addrs() {
        let mut witness = open(&addr, "d", true, false);
        for magic in [0u32, REQUEST_MAGIC ^ 1, SIMPLE_REPLY_MAGIC, u32::MAX] {
            let mut c = open(&addr, "d", false, false);
            assert_usable(&mut c, PROBE, &mut rng, "fresh connection");
            let mut req = RawRequest::new(CMD_READ, 0, 0, 512);
            req.magic = magic;
            req.cookie = 5;
            c.send_raw(req, &[]).expect("send");
            c.expect_closed()
                .unwrap_or_else(|e| panic!("{addr}: magic {magic:#x}: expected a close, got {e}"));
            assert_usable(&mut witness, WITNESS, &mut rng, "witness after a bad magic");
        }
        // New connections are still accepted.
        let mut fresh = open(&addr, "d", false, false);
        assert_usable(
            &mut fresh,
            PROBE,
            &mut rng,
            "a new connection after bad magics",
        );
    }
}

#[test]
fn backend_failure_is_eio_and_the_connection_goes_on() {
    let (mut rng, _) = rng_for("backend_failure");
    let faulty = Arc::new(FaultyDisk::new(MemDisk::new(8 << 20)));
    let h = faulty.handle();
    let srv = TestServer::start(vec![export("f", faulty.clone() as Arc<dyn BlockDevice>)]);
    let bad = 4u64 << 20..(4 << 20) + 65536;
    for addr in srv.addrs() {
        for structured in [false, true] {
            let ctx = format!("{addr} structured={structured}");
            let mut c = open(&addr, "f", structured, false);
            let mut w = open(&addr, "f", structured, false);
            let old = random_vec(&mut rng, 65536);
            c.write(bad.start, &old, 0).expect("write before the fault");
            h.fail_range(
                Ops::WRITE | Ops::READ | Ops::WRITE_ZEROES | Ops::DISCARD,
                bad.clone(),
            );
            let e = c
                .write(bad.start, &random_vec(&mut rng, 4096), 0)
                .expect_err("write into a failing range");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: write: {e}");
            let e = c
                .write(bad.start + 4096, &random_vec(&mut rng, 4096), CMD_FLAG_FUA)
                .expect_err("FUA write");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: FUA write: {e}");
            let e = c
                .read_vec(bad.start, 4096, 0)
                .expect_err("read from a failing range");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: read: {e}");
            let e = c
                .write_zeroes(bad.start, 4096, 0)
                .expect_err("zero a failing range");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: zero: {e}");
            let e = c
                .trim(bad.start, 4096, 0)
                .expect_err("trim a failing range");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: trim: {e}");
            // Outside the range, and on the other connection, everything works.
            assert_usable(&mut c, PROBE, &mut rng, &format!("{ctx}: failed I/O"));
            assert_usable(&mut w, WITNESS, &mut rng, &format!("{ctx}: witness"));
            // A failing flush.
            h.heal();
            h.inject(cairn_block::testkit::Fault::new(Ops::FLUSH));
            let e = c.flush().expect_err("failing flush");
            assert_eq!(e.errno(), Some(EIO), "{ctx}: flush: {e}");
            h.heal();
            c.flush().expect("flush after healing");
            // The failed writes never reported success, and never landed.
            let got = c.read_vec(bad.start, 65536, 0).expect("read after healing");
            assert!(got == old, "{ctx}: data under failed writes changed");
            assert_usable(&mut c, PROBE, &mut rng, &format!("{ctx}: failed flush"));
        }
    }
}

#[test]
fn pipelined_errors_and_successes_are_matched_to_their_cookies() {
    // Bad and good requests in flight together: each reply carries its own verdict.
    let (mut rng, _) = rng_for("pipelined_errors");
    let srv = TestServer::start(vec![export("d", mem(SIZE))]);
    for addr in srv.addrs() {
        let mut c = open(&addr, "d", true, false);
        let cases = table(true, false);
        let mut sent = Vec::new();
        for (i, cs) in cases.iter().enumerate() {
            let mut req = cs.req;
            req.cookie = 10_000 + i as u64;
            c.send_raw(req, &cs.payload).expect("send");
            sent.push((req.cookie, cs));
        }
        for _ in 0..sent.len() {
            let r = c.recv().expect("reply");
            let (_, cs) = sent
                .iter()
                .find(|(k, _)| *k == r.cookie)
                .expect("known cookie");
            assert!(
                cs.want.accepts(r.error),
                "{addr}: pipelined {}: got {}",
                cs.name,
                errno_name(r.error)
            );
        }
        assert_eq!(c.in_flight(), 0);
        assert_usable(&mut c, PROBE, &mut rng, "pipelined bad requests");
    }
}
