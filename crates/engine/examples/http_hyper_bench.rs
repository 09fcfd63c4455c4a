//! Measures the question issue 14 asks of the control API's HTTP server: would hyper 1
//! (on a one-thread tokio runtime, hyper-util's glue) serve it as well as the hand-written
//! server in `cairn_engine::http`? Both answer the same JSON on a Unix socket, driven by
//! the same client; round trips alternate between them so machine load falls on both.
//! Then each is run out of file descriptors (RLIMIT_NOFILE lowered, clients holding
//! connections open) and must answer again once the clients let go.
//!
//! `cargo run --release -p cairn-engine --example http_hyper_bench [ROUND_TRIPS]`

use std::convert::Infallible;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_engine::http::{self, Handler, Request, Response};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

fn answer() -> Vec<u8> {
    let r = Response::json(
        200,
        &serde_json::json!({ "path": "/v1/status", "ok": true }),
    );
    r.body
}

/// hyper on a current-thread runtime in a thread of its own; the accept loop is ours, as
/// hyper 1 has none: on an accept error it waits 100 ms and tries again.
fn spawn_hyper(path: &Path) {
    let std_l = std::os::unix::net::UnixListener::bind(path).unwrap();
    std_l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::UnixListener::from_std(std_l).unwrap();
            loop {
                let s = match l.accept().await {
                    Ok((s, _)) => s,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                tokio::task::spawn(async move {
                    let svc = service_fn(|_req| async {
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(answer())))
                                .unwrap(),
                        )
                    });
                    let _ = http1::Builder::new()
                        .max_buf_size(16 << 10)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    });
}

/// The `pct`-th percentile (0..=100) of `v`.
fn percentile(v: &mut [u128], pct: usize) -> u128 {
    v.sort_unstable();
    v[(v.len() - 1) * pct / 100]
}

fn trip(path: &Path) -> u128 {
    let t = Instant::now();
    let (st, body) = http::unix_request(path, "GET", "/v1/status", None).unwrap();
    assert_eq!(st, 200);
    assert!(!body.is_empty());
    t.elapsed().as_micros()
}

/// Holds connections until connect fails (descriptors gone), then checks the server
/// answers again once they are closed.
fn survives_emfile(name: &str, path: &Path) -> bool {
    let mut held = Vec::new();
    while held.len() < 10_000 {
        match UnixStream::connect(path) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    let n = held.len();
    std::thread::sleep(Duration::from_millis(300));
    drop(held);
    // The server may still be closing what it accepted: give it a few seconds.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        if http::unix_request(path, "GET", "/v1/status", None).is_ok_and(|(s, _)| s == 200) {
            println!(
                "{name}: held {n} connections until descriptors ran out; answers again after {:?}",
                t.elapsed()
            );
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{name}: held {n} connections; did NOT answer again within 15 s");
    false
}

/// Sends `raw` as-is and returns the answer's status line and body length.
fn raw_answer(path: &Path, raw: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(raw);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text.lines().next().unwrap_or("(nothing)").to_string();
    let body = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
    format!("{status:?}, body {body} bytes")
}

fn main() {
    let trips: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir: PathBuf =
        std::env::temp_dir().join(format!("cairn-hyper-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("ours.sock");
    let hyp = dir.join("hyper.sock");
    let handler: Handler = Arc::new(|_r: &Request| {
        Response::json(
            200,
            &serde_json::json!({ "path": "/v1/status", "ok": true }),
        )
    });
    http::spawn(http::bind_unix(&ours, 0o600).unwrap(), "ours", handler).unwrap();
    spawn_hyper(&hyp);
    for _ in 0..100 {
        trip(&ours);
        trip(&hyp);
    }
    let (mut a, mut b) = (Vec::with_capacity(trips), Vec::with_capacity(trips));
    for _ in 0..trips {
        a.push(trip(&ours));
        b.push(trip(&hyp));
    }
    let mean = |v: &[u128]| v.iter().sum::<u128>() / v.len() as u128;
    let (ma, mb) = (mean(&a), mean(&b));
    println!(
        "round trip over a Unix socket, {trips} each, alternating (connect, GET, answer, close):\n  \
         hand-written: mean {ma} us, p50 {} us, p99 {} us\n  hyper 1:      mean {mb} us, p50 {} us, p99 {} us\n  \
         hyper / hand-written (mean): {:.2}",
        percentile(&mut a, 50),
        percentile(&mut a, 99),
        percentile(&mut b, 50),
        percentile(&mut b, 99),
        mb as f64 / ma.max(1) as f64
    );
    // Refusals: the API promises a 4xx with a JSON {"error"} naming the problem for
    // every bad request, the malformed ones included.
    let big = format!(
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20 << 10)
    );
    for (what, raw) in [
        ("a malformed request line", b"GARBAGE\r\n\r\n".to_vec()),
        ("a 20 KiB header", big.into_bytes()),
        (
            "HTTP/2.0 on an HTTP/1 socket",
            b"GET / HTTP/2.0\r\n\r\n".to_vec(),
        ),
    ] {
        println!(
            "{what}: hand-written {}; hyper 1 {}",
            raw_answer(&ours, &raw),
            raw_answer(&hyp, &raw)
        );
    }
    // Out of descriptors: a low limit, then clients hold connections until connect fails.
    let lim = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: setrlimit with a valid pointer to an initialised rlimit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit");
    let ok_a = survives_emfile("hand-written", &ours);
    let ok_b = survives_emfile("hyper 1", &hyp);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok_a && ok_b);
}
