//! Prometheus text exposition (format 0.0.4) of the daemon's state.
//!
//! ```text
//!   Sample { devices (stats per stack node), arrays (md state), progress, exports }
//!      └─ render ─> "# HELP cairn_io_requests_total ...\n# TYPE ... counter\n..."
//! ```
//!
//! Names follow Prometheus' conventions: a `cairn_` prefix, base units (bytes, seconds),
//! `_total` on counters, `_seconds` histograms with cumulative `_bucket{le=...}`, `_sum`
//! and `_count`. Device series carry `export` (the export the node serves), `device` (the
//! node's name: export name, file or member path), `kind` (the stack node kind: export,
//! file, member) and `op` (read, write, flush, discard, write_zeroes).

use std::fmt::Write as _;

use crate::stats::{Op, Snapshot, BUCKET_BOUNDS_NS};

/// One counted device: a stack node with a [`crate::stats::StatsDisk`].
#[derive(Debug, Clone)]
pub struct DeviceSample {
    pub export: String,
    pub device: String,
    /// The stack node kind: "export", "file", "member".
    pub kind: String,
    pub stats: Snapshot,
}

/// One md array's health.
#[derive(Debug, Clone)]
pub struct ArraySample {
    pub export: String,
    /// The array's name.
    pub device: String,
    pub level: String,
    /// md's state words, e.g. "clean, degraded".
    pub state: String,
    pub raid_devices: u32,
    pub active_devices: u32,
    pub failed_devices: u32,
    pub degraded: bool,
}

/// Background work on a node (resync, recovery, check).
#[derive(Debug, Clone)]
pub struct ProgressSample {
    pub export: String,
    pub device: String,
    pub action: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub bytes_per_sec: u64,
}

/// One export.
#[derive(Debug, Clone)]
pub struct ExportSample {
    pub export: String,
    pub size_bytes: u64,
    pub read_only: bool,
    pub connections: u64,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub version: String,
    pub exports: Vec<ExportSample>,
    pub devices: Vec<DeviceSample>,
    pub arrays: Vec<ArraySample>,
    pub progress: Vec<ProgressSample>,
    /// Events seen since start, by kind.
    pub events: Vec<(String, u64)>,
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str(r"\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str(r"\n"),
            c => s.push(c),
        }
    }
    s
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A float the way Prometheus reads it (`+Inf`, no exponent surprises for integers).
fn num(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }
    fn line(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.0, "{name}{labels} {value}");
    }
}

/// The text exposition of `s`.
pub fn render(s: &Sample) -> String {
    let mut o = Out(String::new());
    o.family("cairn_build_info", "gauge", "cairn's version; always 1.");
    o.line("cairn_build_info", &labels(&[("version", &s.version)]), 1);

    o.family("cairn_export_size_bytes", "gauge", "Size of each export.");
    for e in &s.exports {
        o.line(
            "cairn_export_size_bytes",
            &labels(&[("export", &e.export)]),
            e.size_bytes,
        );
    }
    o.family(
        "cairn_export_read_only",
        "gauge",
        "1 when the export is read-only.",
    );
    for e in &s.exports {
        o.line(
            "cairn_export_read_only",
            &labels(&[("export", &e.export)]),
            u8::from(e.read_only),
        );
    }
    o.family(
        "cairn_export_connections",
        "gauge",
        "NBD client connections open on each export.",
    );
    for e in &s.exports {
        o.line(
            "cairn_export_connections",
            &labels(&[("export", &e.export)]),
            e.connections,
        );
    }

    fn dev_labels(d: &DeviceSample, op: Option<Op>) -> Vec<(&'static str, &str)> {
        let mut p = vec![
            ("export", d.export.as_str()),
            ("device", d.device.as_str()),
            ("kind", d.kind.as_str()),
        ];
        if let Some(op) = op {
            p.push(("op", op.name()));
        }
        p
    }
    type Counter = (
        &'static str,
        &'static str,
        fn(&crate::stats::OpSnapshot) -> u64,
    );
    let counters: [Counter; 3] = [
        (
            "cairn_io_requests_total",
            "Completed requests per device and operation (failed ones included).",
            |o| o.ops,
        ),
        (
            "cairn_io_bytes_total",
            "Bytes moved by successful requests per device and operation.",
            |o| o.bytes,
        ),
        (
            "cairn_io_errors_total",
            "Failed requests per device and operation.",
            |o| o.errors,
        ),
    ];
    for (name, help, get) in counters {
        o.family(name, "counter", help);
        for d in &s.devices {
            for op in Op::ALL {
                o.line(name, &labels(&dev_labels(d, Some(op))), get(d.stats.op(op)));
            }
        }
    }
    o.family(
        "cairn_io_in_flight",
        "gauge",
        "Requests running on each device now.",
    );
    for d in &s.devices {
        o.line(
            "cairn_io_in_flight",
            &labels(&dev_labels(d, None)),
            d.stats.in_flight,
        );
    }
    o.family(
        "cairn_io_queue_seconds_total",
        "counter",
        "Summed time requests spent on each device; its rate is the average queue depth.",
    );
    for d in &s.devices {
        o.line(
            "cairn_io_queue_seconds_total",
            &labels(&dev_labels(d, None)),
            num(d.stats.queue_ns() as f64 / 1e9),
        );
    }
    let h = "cairn_io_request_duration_seconds";
    o.family(h, "histogram", "Request latency per device and operation.");
    for d in &s.devices {
        for op in Op::ALL {
            let snap = d.stats.op(op);
            let base = dev_labels(d, Some(op));
            let mut cumulative = 0u64;
            for (i, bound) in BUCKET_BOUNDS_NS.iter().enumerate() {
                cumulative += snap.buckets.get(i).copied().unwrap_or(0);
                let le = num(*bound as f64 / 1e9);
                let mut p = base.clone();
                p.push(("le", &le));
                o.line(&format!("{h}_bucket"), &labels(&p), cumulative);
            }
            let mut p = base.clone();
            p.push(("le", "+Inf"));
            o.line(&format!("{h}_bucket"), &labels(&p), snap.ops);
            o.line(
                &format!("{h}_sum"),
                &labels(&base),
                num(snap.latency_ns as f64 / 1e9),
            );
            o.line(&format!("{h}_count"), &labels(&base), snap.ops);
        }
    }

    let arr = |a: &ArraySample| {
        labels(&[
            ("export", &a.export),
            ("device", &a.device),
            ("level", &a.level),
        ])
    };
    o.family(
        "cairn_md_raid_devices",
        "gauge",
        "Members an md array is made of.",
    );
    for a in &s.arrays {
        o.line("cairn_md_raid_devices", &arr(a), a.raid_devices);
    }
    o.family(
        "cairn_md_active_devices",
        "gauge",
        "Members of an md array that are in sync.",
    );
    for a in &s.arrays {
        o.line("cairn_md_active_devices", &arr(a), a.active_devices);
    }
    o.family(
        "cairn_md_failed_devices",
        "gauge",
        "Members of an md array that are faulty or missing.",
    );
    for a in &s.arrays {
        o.line("cairn_md_failed_devices", &arr(a), a.failed_devices);
    }
    o.family(
        "cairn_md_degraded",
        "gauge",
        "1 when an md array runs without full redundancy.",
    );
    for a in &s.arrays {
        o.line("cairn_md_degraded", &arr(a), u8::from(a.degraded));
    }
    o.family(
        "cairn_md_state",
        "gauge",
        "md's state words for each array, as a label; always 1.",
    );
    for a in &s.arrays {
        let l = labels(&[
            ("export", &a.export),
            ("device", &a.device),
            ("state", &a.state),
        ]);
        o.line("cairn_md_state", &l, 1);
    }

    let prog = |p: &ProgressSample| {
        labels(&[
            ("export", &p.export),
            ("device", &p.device),
            ("action", &p.action),
        ])
    };
    o.family(
        "cairn_background_progress_ratio",
        "gauge",
        "Share of background work (resync, recovery, check) done, 0 to 1.",
    );
    for p in &s.progress {
        let ratio = if p.total_bytes == 0 {
            0.0
        } else {
            p.done_bytes as f64 / p.total_bytes as f64
        };
        o.line("cairn_background_progress_ratio", &prog(p), num(ratio));
    }
    o.family(
        "cairn_background_done_bytes",
        "gauge",
        "Bytes of background work done.",
    );
    for p in &s.progress {
        o.line("cairn_background_done_bytes", &prog(p), p.done_bytes);
    }
    o.family(
        "cairn_background_total_bytes",
        "gauge",
        "Bytes of background work in all.",
    );
    for p in &s.progress {
        o.line("cairn_background_total_bytes", &prog(p), p.total_bytes);
    }
    o.family(
        "cairn_background_speed_bytes_per_second",
        "gauge",
        "Recent speed of background work.",
    );
    for p in &s.progress {
        o.line(
            "cairn_background_speed_bytes_per_second",
            &prog(p),
            p.bytes_per_sec,
        );
    }

    o.family(
        "cairn_events_total",
        "counter",
        "State-change events since the daemon started, by event.",
    );
    for (kind, n) in &s.events {
        o.line("cairn_events_total", &labels(&[("event", kind)]), n);
    }
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{IoStats, BUCKETS};

    fn sample() -> Sample {
        let st = IoStats::new();
        st.record(Op::Read, 4096, 80_000, true); // bucket le=0.0001
        st.record(Op::Read, 4096, 80_000, true);
        st.record(Op::Write, 512, 3_000_000, false);
        Sample {
            version: "0.1.0".into(),
            exports: vec![ExportSample {
                export: "home".into(),
                size_bytes: 1 << 30,
                read_only: false,
                connections: 2,
            }],
            devices: vec![DeviceSample {
                export: "home".into(),
                device: "d\"0\\.img".into(),
                kind: "member".into(),
                stats: st.snapshot(),
            }],
            arrays: vec![ArraySample {
                export: "home".into(),
                device: "demo".into(),
                level: "raid6".into(),
                state: "clean, degraded".into(),
                raid_devices: 4,
                active_devices: 3,
                failed_devices: 1,
                degraded: true,
            }],
            progress: vec![ProgressSample {
                export: "home".into(),
                device: "demo".into(),
                action: "resync".into(),
                done_bytes: 1,
                total_bytes: 4,
                bytes_per_sec: 100,
            }],
            events: vec![("DegradedArray".into(), 1)],
        }
    }

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let t = render(&sample());
        let l = r#"export="home",device="d\"0\\.img",kind="member""#;
        for want in [
            "# TYPE cairn_io_requests_total counter".to_string(),
            format!("cairn_io_requests_total{{{l},op=\"read\"}} 2"),
            format!("cairn_io_bytes_total{{{l},op=\"read\"}} 8192"),
            format!("cairn_io_bytes_total{{{l},op=\"write\"}} 0"),
            format!("cairn_io_errors_total{{{l},op=\"write\"}} 1"),
            "# TYPE cairn_io_request_duration_seconds histogram".to_string(),
            format!("cairn_io_request_duration_seconds_bucket{{{l},op=\"read\",le=\"0.00005\"}} 0"),
            format!("cairn_io_request_duration_seconds_bucket{{{l},op=\"read\",le=\"0.0001\"}} 2"),
            format!("cairn_io_request_duration_seconds_bucket{{{l},op=\"read\",le=\"10\"}} 2"),
            format!("cairn_io_request_duration_seconds_bucket{{{l},op=\"read\",le=\"+Inf\"}} 2"),
            format!("cairn_io_request_duration_seconds_sum{{{l},op=\"read\"}} 0.00016"),
            format!("cairn_io_request_duration_seconds_count{{{l},op=\"write\"}} 1"),
            format!("cairn_io_in_flight{{{l}}} 0"),
            "cairn_md_degraded{export=\"home\",device=\"demo\",level=\"raid6\"} 1".to_string(),
            "cairn_md_failed_devices{export=\"home\",device=\"demo\",level=\"raid6\"} 1"
                .to_string(),
            "cairn_background_progress_ratio{export=\"home\",device=\"demo\",action=\"resync\"} 0.25"
                .to_string(),
            "cairn_export_connections{export=\"home\"} 2".to_string(),
            "cairn_events_total{event=\"DegradedArray\"} 1".to_string(),
        ] {
            assert!(t.contains(&want), "missing {want:?} in:\n{t}");
        }
    }

    /// Every line is a comment or `name{labels} value`, every family has HELP and TYPE
    /// once, and histogram buckets never decrease.
    #[test]
    fn exposition_is_well_formed() {
        let t = render(&sample());
        let mut typed = std::collections::HashSet::new();
        let mut last_bucket: Option<(String, u64)> = None;
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(typed.insert(name.to_string()), "TYPE twice: {name}");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect(line);
            assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{line}");
            let name = series.split('{').next().unwrap();
            assert!(name.starts_with("cairn_"), "{line}");
            let family = name
                .strip_suffix("_bucket")
                .or_else(|| name.strip_suffix("_sum"))
                .or_else(|| name.strip_suffix("_count"))
                .filter(|f| typed.contains(*f))
                .unwrap_or(name);
            assert!(typed.contains(family), "no TYPE before {line}");
            if name.ends_with("_bucket") {
                let key = series.split(",le=").next().unwrap().to_string();
                let v: u64 = value.parse().unwrap();
                if let Some((k, prev)) = &last_bucket {
                    if *k == key {
                        assert!(v >= *prev, "bucket decreased: {line}");
                    }
                }
                last_bucket = Some((key, v));
            }
        }
        assert_eq!(BUCKETS, BUCKET_BOUNDS_NS.len() + 1);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
        assert_eq!(num(f64::INFINITY), "+Inf");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(0.00005), "0.00005");
    }
}
