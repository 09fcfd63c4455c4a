//! The control API's costs: parsing a typical request, whole round trips over a Unix
//! socket (connect, request, handler, answer, close), and rendering a metrics scrape of a
//! RAID6 export on 8 members (10 counted devices, 5 ops each, 18-bucket histograms).
//!
//! `cargo run --release -p cairn-engine --example http_bench [ROUND_TRIPS]`

use std::io::{BufReader, Cursor};
use std::sync::Arc;
use std::time::Instant;

use cairn_engine::http::{self, Handler, Request, Response};
use cairn_engine::metrics::{self, ArraySample, DeviceSample, ExportSample, Sample};
use cairn_engine::stats::{IoStats, Op};

fn main() {
    let trips: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);

    let raw = b"POST /v1/arrays/r5 HTTP/1.1\r\nHost: cairn\r\nUser-Agent: curl/8.5.0\r\n\
Accept: */*\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n\
{\"action\":\"md-add\",\"device\":\"/dev/sdb1\"}";
    let parses = 200_000u32;
    let t = Instant::now();
    for _ in 0..parses {
        let r = http::read_request(&mut BufReader::new(Cursor::new(&raw[..]))).unwrap();
        std::hint::black_box(r);
    }
    let per_parse = t.elapsed().as_nanos() / u128::from(parses);

    let dir = std::env::temp_dir().join(format!("cairn-http-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.sock");
    let l = http::bind_unix(&path, 0o600).unwrap();
    let handler: Handler =
        Arc::new(|r: &Request| Response::json(200, &serde_json::json!({ "path": r.path })));
    http::spawn(l, "bench", handler).unwrap();
    for _ in 0..50 {
        http::unix_request(&path, "GET", "/v1/status", None).unwrap();
    }
    let t = Instant::now();
    for _ in 0..trips {
        let (st, _) = http::unix_request(&path, "GET", "/v1/status", None).unwrap();
        assert_eq!(st, 200);
    }
    let per_trip = t.elapsed().as_micros() / u128::from(trips);
    let _ = std::fs::remove_dir_all(&dir);

    let st = IoStats::new();
    for i in 0..1000u64 {
        st.record(Op::Read, 4096, 50_000 + i * 1000, true);
        st.record(Op::Write, 4096, 200_000 + i * 5000, i % 100 != 0);
    }
    let snap = st.snapshot();
    let mut devices = vec![
        DeviceSample {
            export: "r6".into(),
            device: "r6".into(),
            kind: "export".into(),
            stats: snap.clone(),
        },
        DeviceSample {
            export: "r6".into(),
            device: "r6".into(),
            kind: "md".into(),
            stats: snap.clone(),
        },
    ];
    for m in 0..8 {
        devices.push(DeviceSample {
            export: "r6".into(),
            device: format!("/srv/disks/d{m}.img"),
            kind: "member".into(),
            stats: snap.clone(),
        });
    }
    let sample = Sample {
        version: "0.1.0".into(),
        exports: vec![ExportSample {
            export: "r6".into(),
            size_bytes: 6 << 40,
            read_only: false,
            connections: 4,
        }],
        devices,
        arrays: vec![ArraySample {
            export: "r6".into(),
            device: "r6".into(),
            level: "raid6".into(),
            state: "clean".into(),
            raid_devices: 8,
            active_devices: 8,
            failed_devices: 0,
            degraded: false,
        }],
        progress: vec![],
        events: vec![("ExportAdded".into(), 1)],
    };
    let renders = 2000u32;
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..renders {
        bytes = std::hint::black_box(metrics::render(&sample)).len();
    }
    let per_render = t.elapsed().as_micros() / u128::from(renders);
    println!(
        "parse {per_parse} ns/request, round trip {per_trip} us/request ({trips} trips), \
         metrics render {per_render} us/scrape ({bytes} bytes)"
    );
}
