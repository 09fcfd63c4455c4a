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

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// One family written through prometheus-client's encoder: its HELP and TYPE lines, then
/// one series per `(labels, value)`.
fn family<'a, V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> fmt::Result
where
    V: Value,
{
    // The encoder adds `_total` to a counter's name itself.
    let base = match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    let mut m = enc.encode_descriptor(base, help, None, kind)?;
    for (labels, v) in series {
        v.encode(&mut m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A sample's value as a counter or a gauge.
trait Value {
    fn encode(&self, m: &mut MetricEncoder) -> fmt::Result;
}

struct Gauge<T>(T);
struct Counter<T>(T);

impl<T: EncodeGaugeValue> Value for Gauge<T> {
    fn encode(&self, m: &mut MetricEncoder) -> fmt::Result {
        m.encode_gauge(&self.0)
    }
}

impl<T: EncodeCounterValue> Value for Counter<T> {
    fn encode(&self, m: &mut MetricEncoder) -> fmt::Result {
        m.encode_counter::<NoLabelSet, _, u64>(&self.0, None)
    }
}

/// A scrape's sample, handed to prometheus-client's registry for one encoding.
#[derive(Debug)]
struct Scrape(Sample);

/// The text exposition of `s` (format 0.0.4, [`CONTENT_TYPE`]).
pub fn render(s: &Sample) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(s.clone())));
    let mut out = String::new();
    // Writing into a String fails only when a collector does, and ours does not.
    if let Err(e) = prometheus_text::encode(&mut out, &registry) {
        tracing::warn!("encoding the metrics: {e}");
    }
    out
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let enc = &mut enc;
        family(
            enc,
            "cairn_build_info",
            "cairn's version; always 1.",
            MetricType::Gauge,
            [(vec![("version", s.version.as_str())], Gauge(1u32))],
        )?;

        fn exp(e: &ExportSample) -> Labels<'_> {
            vec![("export", e.export.as_str())]
        }
        family(
            enc,
            "cairn_export_size_bytes",
            "Size of each export.",
            MetricType::Gauge,
            s.exports.iter().map(|e| (exp(e), Gauge(e.size_bytes))),
        )?;
        family(
            enc,
            "cairn_export_read_only",
            "1 when the export is read-only.",
            MetricType::Gauge,
            s.exports
                .iter()
                .map(|e| (exp(e), Gauge(u32::from(e.read_only)))),
        )?;
        family(
            enc,
            "cairn_export_connections",
            "NBD client connections open on each export.",
            MetricType::Gauge,
            s.exports.iter().map(|e| (exp(e), Gauge(e.connections))),
        )?;

        fn dev_labels(d: &DeviceSample, op: Option<Op>) -> Labels<'_> {
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
        type Count = (
            &'static str,
            &'static str,
            fn(&crate::stats::OpSnapshot) -> u64,
        );
        let counters: [Count; 3] = [
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
            family(
                enc,
                name,
                help,
                MetricType::Counter,
                s.devices.iter().flat_map(|d| {
                    Op::ALL
                        .into_iter()
                        .map(move |op| (dev_labels(d, Some(op)), Counter(get(d.stats.op(op)))))
                }),
            )?;
        }
        family(
            enc,
            "cairn_io_in_flight",
            "Requests running on each device now.",
            MetricType::Gauge,
            s.devices
                .iter()
                .map(|d| (dev_labels(d, None), Gauge(d.stats.in_flight))),
        )?;
        family(
            enc,
            "cairn_io_queue_seconds_total",
            "Summed time requests spent on each device; its rate is the average queue depth.",
            MetricType::Counter,
            s.devices.iter().map(|d| {
                (
                    dev_labels(d, None),
                    Counter(d.stats.queue_ns() as f64 / 1e9),
                )
            }),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "cairn_io_request_duration_seconds",
                "Request latency per device and operation.",
                None,
                MetricType::Histogram,
            )?;
            for d in &s.devices {
                for op in Op::ALL {
                    let snap = d.stats.op(op);
                    // Per-bucket counts; the encoder sums them and adds le="+Inf".
                    let buckets: Vec<(f64, u64)> = BUCKET_BOUNDS_NS
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (*b as f64 / 1e9, snap.buckets.get(i).copied().unwrap_or(0)))
                        .collect();
                    let labels = dev_labels(d, Some(op));
                    m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                        snap.latency_ns as f64 / 1e9,
                        snap.ops,
                        &buckets,
                        None,
                    )?;
                }
            }
        }

        fn arr(a: &ArraySample) -> Labels<'_> {
            vec![
                ("export", a.export.as_str()),
                ("device", a.device.as_str()),
                ("level", a.level.as_str()),
            ]
        }
        type ArrayGauge = (&'static str, &'static str, fn(&ArraySample) -> u32);
        let arrays: [ArrayGauge; 4] = [
            (
                "cairn_md_raid_devices",
                "Members an md array is made of.",
                |a| a.raid_devices,
            ),
            (
                "cairn_md_active_devices",
                "Members of an md array that are in sync.",
                |a| a.active_devices,
            ),
            (
                "cairn_md_failed_devices",
                "Members of an md array that are faulty or missing.",
                |a| a.failed_devices,
            ),
            (
                "cairn_md_degraded",
                "1 when an md array runs without full redundancy.",
                |a| u32::from(a.degraded),
            ),
        ];
        for (name, help, get) in arrays {
            family(
                enc,
                name,
                help,
                MetricType::Gauge,
                s.arrays.iter().map(|a| (arr(a), Gauge(get(a)))),
            )?;
        }
        family(
            enc,
            "cairn_md_state",
            "md's state words for each array, as a label; always 1.",
            MetricType::Gauge,
            s.arrays.iter().map(|a| {
                (
                    vec![
                        ("export", a.export.as_str()),
                        ("device", a.device.as_str()),
                        ("state", a.state.as_str()),
                    ],
                    Gauge(1u32),
                )
            }),
        )?;

        fn prog(p: &ProgressSample) -> Labels<'_> {
            vec![
                ("export", p.export.as_str()),
                ("device", p.device.as_str()),
                ("action", p.action.as_str()),
            ]
        }
        family(
            enc,
            "cairn_background_progress_ratio",
            "Share of background work (resync, recovery, check) done, 0 to 1.",
            MetricType::Gauge,
            s.progress.iter().map(|p| {
                let ratio = if p.total_bytes == 0 {
                    0.0
                } else {
                    p.done_bytes as f64 / p.total_bytes as f64
                };
                (prog(p), Gauge(ratio))
            }),
        )?;
        type ProgressGauge = (&'static str, &'static str, fn(&ProgressSample) -> u64);
        let progress: [ProgressGauge; 3] = [
            (
                "cairn_background_done_bytes",
                "Bytes of background work done.",
                |p| p.done_bytes,
            ),
            (
                "cairn_background_total_bytes",
                "Bytes of background work in all.",
                |p| p.total_bytes,
            ),
            (
                "cairn_background_speed_bytes_per_second",
                "Recent speed of background work.",
                |p| p.bytes_per_sec,
            ),
        ];
        for (name, help, get) in progress {
            family(
                enc,
                name,
                help,
                MetricType::Gauge,
                s.progress.iter().map(|p| (prog(p), Gauge(get(p)))),
            )?;
        }

        family(
            enc,
            "cairn_events_total",
            "State-change events since the daemon started, by event.",
            MetricType::Counter,
            s.events
                .iter()
                .map(|(kind, n)| (vec![("event", kind.as_str())], Counter(*n))),
        )
    }
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
            format!("cairn_io_request_duration_seconds_bucket{{{l},op=\"read\",le=\"5e-05\"}} 0"),
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
        let mut s = sample();
        s.arrays[0].state = "a\"b\\c\nd".into();
        let t = render(&s);
        assert!(t.contains(r#"state="a\"b\\c\nd""#), "{t}");
    }
}
