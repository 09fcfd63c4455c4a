//! `cairn top`: live I/O per export and per member, like `iostat -x`.
//!
//! ```text
//!   every -d SECS: GET /v1/status (the trees) + GET /v1/stats (counters, monotonic ns)
//!      rates = (this sample - the previous one) / elapsed      (first: since daemon start)
//!      a member whose IOPS is >= 1.5 x the median of its array's members gets a "!"
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use cairn_engine::stats::{Rates, Snapshot};
use serde::Serialize;

use crate::control;
use crate::control::ControlArgs;
use crate::error::{CliError, Result};
use crate::global::Global;
use cairn_stack::node::{Node, NodeKind};
use clap::Args;

/// A member this many times busier than its array's median is flagged.
const UNBALANCED: f64 = 1.5;

/// One device in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: String,
    pub export: String,
    pub kind: NodeKind,
    pub name: String,
    /// For members: the md array's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// Tree depth below the export, for indenting.
    #[serde(skip)]
    pub depth: usize,
    pub rates: Rates,
    pub totals: Totals,
    /// A member much busier than its array's median.
    pub unbalanced: bool,
}

/// Counters since the daemon started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub errors: u64,
}

/// One sample: what `--json` prints per line.
#[derive(Debug, Serialize)]
pub struct Sample {
    pub time: String,
    pub interval_seconds: f64,
    pub devices: Vec<Row>,
}

pub fn run(args: TopArgs, global: &Global) -> Result<()> {
    let path = control::resolve(args.control.control.as_deref())?;
    let mut prev: BTreeMap<String, Snapshot> = BTreeMap::new();
    let mut prev_ns = 0u64;
    let mut n = 0u64;
    loop {
        let status = control::get_ok(&path, "/v1/status")?;
        let stats = control::get_ok(&path, "/v1/stats")?;
        let trees: Vec<Node> = serde_json::from_value(status["exports"].clone())
            .map_err(|e| CliError::new(format!("the daemon's status is not understood: {e}")))?;
        let now_ns = stats["monotonic_ns"].as_u64().unwrap_or(0);
        let mut snaps: BTreeMap<String, Snapshot> = BTreeMap::new();
        if let Some(nodes) = stats["nodes"].as_object() {
            for (id, v) in nodes {
                if let Ok(s) = serde_json::from_value::<Snapshot>(v["stats"].clone()) {
                    snaps.insert(id.clone(), s);
                }
            }
        }
        let secs = now_ns.saturating_sub(prev_ns) as f64 / 1e9;
        let sample = Sample {
            time: cairn_engine::events::rfc3339_now(),
            interval_seconds: secs,
            devices: rows(&trees, &snaps, &prev, secs),
        };
        let mut out = std::io::stdout().lock();
        let _ = if global.json {
            serde_json::to_writer(&mut out, &sample)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
        } else {
            write!(out, "{}", render(&sample))
        };
        let _ = out.flush();
        drop(out);
        n += 1;
        if args.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        prev = snaps;
        prev_ns = now_ns;
        std::thread::sleep(Duration::from_secs_f64(args.delay.max(0.1)));
    }
}

/// The rows of one sample, in tree order, with unbalanced members marked.
pub fn rows(
    trees: &[Node],
    now: &BTreeMap<String, Snapshot>,
    prev: &BTreeMap<String, Snapshot>,
    secs: f64,
) -> Vec<Row> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    fn visit(
        n: &Node,
        export: &str,
        array: Option<&str>,
        depth: usize,
        ctx: (
            &BTreeMap<String, Snapshot>,
            &BTreeMap<String, Snapshot>,
            f64,
        ),
        seen: &mut std::collections::HashSet<String>,
        out: &mut Vec<Row>,
    ) {
        let (now, prev, secs) = ctx;
        if let Some(s) = now.get(&n.id) {
            if seen.insert(n.id.clone()) {
                let zero = Snapshot::default();
                let before = prev.get(&n.id).unwrap_or(&zero);
                out.push(Row {
                    id: n.id.clone(),
                    export: export.to_string(),
                    kind: n.kind,
                    name: n.name.clone(),
                    array: array.map(str::to_string),
                    depth,
                    rates: s.rates_since(before, secs),
                    totals: Totals {
                        reads: s.read.ops,
                        writes: s.write.ops,
                        read_bytes: s.read.bytes,
                        write_bytes: s.write.bytes,
                        flushes: s.flush.ops,
                        errors: s.read.errors
                            + s.write.errors
                            + s.flush.errors
                            + s.discard.errors
                            + s.write_zeroes.errors,
                    },
                    unbalanced: false,
                });
            }
        } else if n.kind == NodeKind::Md {
            // The array itself is not counted (its members are): a heading row.
            out.push(Row {
                id: n.id.clone(),
                export: export.to_string(),
                kind: n.kind,
                name: format!(
                    "{} {}",
                    n.name,
                    n.md.as_ref().map(|m| m.level.as_str()).unwrap_or("")
                ),
                array: None,
                depth,
                rates: Rates::default(),
                totals: Totals::default(),
                unbalanced: false,
            });
        }
        let array = if n.kind == NodeKind::Md {
            Some(n.name.as_str())
        } else {
            array
        };
        for c in &n.children {
            visit(c, export, array, depth + 1, ctx, seen, out);
        }
    }
    for t in trees {
        visit(t, &t.name, None, 0, (now, prev, secs), &mut seen, &mut out);
    }
    mark_unbalanced(&mut out);
    out
}

/// IOPS of a row: what "load" means for balance.
fn load(r: &Row) -> f64 {
    r.rates.reads_per_sec + r.rates.writes_per_sec
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn mark_unbalanced(rows: &mut [Row]) {
    let mut by_array: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kind == NodeKind::Member) {
        if let Some(a) = &r.array {
            by_array
                .entry((r.export.clone(), a.clone()))
                .or_default()
                .push(load(r));
        }
    }
    for r in rows.iter_mut().filter(|r| r.kind == NodeKind::Member) {
        let Some(a) = &r.array else { continue };
        let loads = &by_array[&(r.export.clone(), a.clone())];
        let med = median(loads.clone());
        let l = load(r);
        r.unbalanced = loads.len() > 1 && l >= 1.0 && l >= UNBALANCED * med;
    }
}

/// The text table of one sample, as iostat -x lays it out.
pub fn render(s: &Sample) -> String {
    let label = |r: &Row| {
        let indent = "  ".repeat(r.depth);
        match r.kind {
            NodeKind::Export => format!("export {}", r.name),
            NodeKind::Md => format!("{indent}md {}", r.name),
            NodeKind::File => format!("{indent}file {}", r.name),
            _ => format!("{indent}{}", r.name),
        }
    };
    let width = s
        .devices
        .iter()
        .map(|r| label(r).chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut out = format!(
        "{}  interval {:.1} s\n{:<width$}  ",
        s.time, s.interval_seconds, "Device"
    );
    for h in [
        "r/s", "w/s", "rMB/s", "wMB/s", "r_await", "w_await", "p99ms", "aqu-sz", "%rd",
    ] {
        out.push_str(&format!("{h:>8}"));
    }
    out.push('\n');
    for r in &s.devices {
        let name = label(r);
        if r.kind == NodeKind::Md {
            out.push_str(&format!("{name}\n"));
            continue;
        }
        let flag = if r.unbalanced { " !" } else { "  " };
        let x = &r.rates;
        out.push_str(&format!(
            "{name:<width$}{flag}{:>8.1}{:>8.1}{:>8.2}{:>8.2}{:>8.2}{:>8.2}{:>8.2}{:>8.2}{:>8.1}\n",
            x.reads_per_sec,
            x.writes_per_sec,
            x.read_mb_per_sec,
            x.write_mb_per_sec,
            x.read_await_ms,
            x.write_await_ms,
            x.p99_ms,
            x.queue_depth,
            x.read_percent,
        ));
    }
    if s.devices.iter().any(|r| r.unbalanced) {
        out.push_str(&format!(
            "! = a member doing at least {UNBALANCED}x the median I/O of its array\n"
        ));
    }
    out.push('\n');
    out
}

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const TOP_LONG: &str = "\
Live I/O of every export and of each device below it (md members, files), sampled from \
the running `cairn serve` every SECS seconds, as `iostat -x` shows disks: reads and \
writes per second, MB/s, average latency (r_await, w_await) and its 99th percentile, \
average queue depth (aqu-sz) and the share of reads. The first sample averages since the \
server started. A member doing at least 1.5x the median I/O of its array is marked `!`.

--json prints one JSON object per sample, with totals since the server started.";

pub(crate) const TOP_EXAMPLES: &str = "\
Examples:
  cairn top
  cairn top -d 5 -n 3
  cairn top --json -n 1 | jq '.devices[] | {id, reads: .totals.reads}'";

/// `cairn top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Seconds between samples
    #[arg(short, long, value_name = "SECS", default_value_t = 1.0)]
    pub delay: f64,

    /// Stop after COUNT samples
    #[arg(short = 'n', long = "iterations", value_name = "COUNT")]
    pub count: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_engine::stats::{IoStats, Op};

    fn node(kind: &str, name: &str, children: Vec<Node>) -> Node {
        serde_json::from_value(serde_json::json!({
            "id": format!("{kind}:{name}"), "kind": kind, "name": name, "state": "active",
            "size": 1, "geometry": {"logical_block": 512, "physical_block": 512, "optimal_io": 512},
            "data_offset": 0, "children": children,
        }))
        .unwrap()
    }

    fn snap(reads: u64) -> Snapshot {
        let s = IoStats::new();
        for _ in 0..reads {
            s.record(Op::Read, 4096, 100_000, true);
        }
        s.snapshot()
    }

    #[test]
    fn a_busy_member_is_flagged() {
        let md = node(
            "md",
            "demo",
            vec![
                node("member", "a", vec![]),
                node("member", "b", vec![]),
                node("member", "c", vec![]),
                node("member", "d", vec![]),
            ],
        );
        let tree = node("export", "home", vec![md]);
        let mut now = BTreeMap::new();
        now.insert("export:home".to_string(), snap(400));
        for (m, n) in [("a", 100), ("b", 100), ("c", 110), ("d", 300)] {
            now.insert(format!("member:{m}"), snap(n));
        }
        let rows = rows(&[tree], &now, &BTreeMap::new(), 2.0);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["home", "demo ", "a", "b", "c", "d"]);
        let flagged: Vec<&str> = rows
            .iter()
            .filter(|r| r.unbalanced)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(flagged, ["d"]);
        assert_eq!(rows[0].rates.reads_per_sec, 200.0);
        assert_eq!(rows[0].totals.reads, 400);
        let text = render(&Sample {
            time: "t".into(),
            interval_seconds: 2.0,
            devices: rows,
        });
        // Name column 11 wide ("export home"), a 2-wide flag, 8-wide numbers.
        assert!(text.contains("\n    d       !   150.0     0.0"), "{text}");
        assert!(text.contains("\n    c            55.0"), "{text}");
        assert!(
            text.contains("\nexport home     200.0     0.0    0.82"),
            "{text}"
        );
        assert!(text.contains("! = a member"), "{text}");
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
