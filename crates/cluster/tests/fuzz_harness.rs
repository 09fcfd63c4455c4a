//! The etcd answer fuzz harness of `fuzz/` (`fuzz/etcd_harness.rs`) on stable Rust:
//! seeded mutations of answers shaped as etcd 3.4's JSON gateway gives them (a lease
//! grant, a keepalive stream in chunks, a transaction that created the key and one that
//! found it held, a range, a 503 without a leader, an error in a 200) with bit flips,
//! byte edits, hostile numbers and lengths, truncation and splices, plus plain random
//! bytes. None may panic.
//!
//! `CAIRN_SEED=N` replays a run. With `CAIRN_FUZZ_SEEDS_DIR=DIR`, the unmutated seeds are
//! written to `DIR/etcd_answer/` as a corpus for cargo-fuzz.

#[path = "../../../fuzz/etcd_harness.rs"]
mod harness;

use cairn_block::testkit;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn plain(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn chunked(status: &str, parts: &[&str]) -> Vec<u8> {
    let mut s = format!("HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n");
    for p in parts {
        s.push_str(&format!("{:x}\r\n{p}\r\n", p.len()));
    }
    s.push_str("0\r\n\r\n");
    s.into_bytes()
}

fn seeds() -> Vec<Vec<u8>> {
    let header = r#""header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"42","raft_term":"3"}"#;
    let kv = r#"{"key":"Y2Fpcm4vb3duZXIvaG9tZQ==","create_revision":"40","mod_revision":"41","version":"2","value":"bm9kZS1h","lease":"7587869851376418311"}"#;
    vec![
        plain(
            "200 OK",
            &format!(r#"{{{header},"ID":"7587869851376418311","TTL":"10"}}"#),
        ),
        chunked(
            "200 OK",
            &[&format!(
                r#"{{"result":{{{header},"ID":"7587869851376418311","TTL":"10"}}}}"#
            )],
        ),
        plain(
            "200 OK",
            &format!(
                r#"{{{header},"succeeded":true,"responses":[{{"response_put":{{{header}}}}}]}}"#
            ),
        ),
        plain(
            "200 OK",
            &format!(
                r#"{{{header},"responses":[{{"response_range":{{{header},"kvs":[{kv}],"count":"1"}}}}]}}"#
            ),
        ),
        plain(
            "200 OK",
            &format!(r#"{{{header},"kvs":[{kv}],"count":"1"}}"#),
        ),
        plain("200 OK", &format!(r#"{{{header}}}"#)),
        plain(
            "503 Service Unavailable",
            r#"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#,
        ),
        plain(
            "200 OK",
            r#"{"error":"etcdserver: requested lease not found","code":5}"#,
        ),
        plain(
            "401 Unauthorized",
            r#"{"error":"etcdserver: invalid auth token","code":16}"#,
        ),
        plain(
            "400 Bad Request",
            "Client sent an HTTP request to an HTTPS server.\n",
        ),
    ]
}

/// Values that break numbers, lengths and base64 when spliced in.
const HOSTILE: &[&str] = &[
    "\"-1\"",
    "\"18446744073709551616\"",
    "\"9223372036854775807\"",
    "null",
    "[]",
    "{}",
    "\"====\"",
    "\"\\u0000\"",
    "ffffffffffffffff",
    "\r\n\r\n",
    "1e999",
    "true",
];

fn mutate(rng: &mut SmallRng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.gen_range(1..6) {
        if b.is_empty() {
            break;
        }
        let at = rng.gen_range(0..b.len());
        match rng.gen_range(0..7) {
            6 => {
                // A JSON value (what follows a ':' up to the next ',', '}' or ']')
                // replaced by a hostile one: numbers out of range, wrong types.
                let colons: Vec<usize> = (0..b.len()).filter(|&i| b[i] == b':').collect();
                if let Some(&c) = colons.get(rng.gen_range(0..colons.len().max(1))) {
                    let end = (c + 1..b.len())
                        .find(|&i| matches!(b[i], b',' | b'}' | b']'))
                        .unwrap_or(b.len());
                    let h = HOSTILE[rng.gen_range(0..HOSTILE.len())].as_bytes();
                    b.splice(c + 1..end, h.iter().copied());
                }
            }
            0 => b[at] ^= 1 << rng.gen_range(0..8),
            1 => b[at] = rng.gen(),
            2 => b.truncate(at),
            3 => {
                let h = HOSTILE[rng.gen_range(0..HOSTILE.len())].as_bytes();
                let end = (at + rng.gen_range(0..12)).min(b.len());
                b.splice(at..end, h.iter().copied());
            }
            4 => {
                // A token of one place copied over another (a number into a length, a
                // quote into a value).
                let from = rng.gen_range(0..b.len());
                let n = rng.gen_range(1..16).min(b.len() - from);
                let piece = b[from..from + n].to_vec();
                b.splice(at..at, piece);
            }
            _ => {
                const BYTES: &[u8] = b"{[\"\\:,0x\r\n";
                b.insert(at, BYTES[rng.gen_range(0..BYTES.len())]);
            }
        }
    }
    b
}

#[test]
fn etcd_answers_mutated_and_random_never_panic() {
    let seed = testkit::test_seed("etcd answer fuzz");
    let mut rng = SmallRng::seed_from_u64(seed);
    let seeds = seeds();
    if let Some(dir) = std::env::var_os("CAIRN_FUZZ_SEEDS_DIR") {
        let dir = std::path::Path::new(&dir).join("etcd_answer");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
    for s in &seeds {
        harness::etcd_answer(s);
    }
    for _ in 0..20_000 {
        let s = &seeds[rng.gen_range(0..seeds.len())];
        harness::etcd_answer(&mutate(&mut rng, s));
    }
    for _ in 0..2_000 {
        let n = rng.gen_range(0..512);
        let b: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        harness::etcd_answer(&b);
    }
}

#[test]
fn the_seeds_decode_as_etcd_means_them() {
    // The harness only proves "no panic"; this proves the seeds reach the decoders
    // (a seed the parser refused at the status line would fuzz nothing past it).
    let etcd = |b: &[u8]| cairn_cluster::etcd::decode_for_test(b);
    let s = seeds();
    assert!(etcd(&s[0]).is_ok(), "grant");
    assert!(etcd(&s[1]).is_ok(), "chunked keepalive");
    assert!(etcd(&s[3]).is_ok(), "txn found the key held");
    let e = etcd(&s[6]).unwrap_err();
    assert!(
        matches!(e, cairn_cluster::etcd::EtcdError::Unavailable(_)),
        "{e}"
    );
    assert!(etcd(&s[7]).is_err(), "an error in a 200");
}
