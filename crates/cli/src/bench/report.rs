//! What a bench run hands back: results.json (the one document everything else is made
//! from), the terminal table, CSV, the recommendation and `--compare`.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::measure::CellResult;
use super::{short_size, Plan, Workload};

use crate::error::{CliError, Result};
use cairn_stack::node::{LuksDetails, MdDetails, Node, NodeGeometry, NodeKind};

/// The recommended cell for a workload, with the mkfs lines for its stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    pub workload: Workload,
    /// The winning cell's label (one of `cells[].cell`).
    pub cell: String,
    pub level: String,
    pub chunk: u64,
    pub stripe_cache: u32,
    /// LUKS sector size; 0 without LUKS.
    pub sector_size: u32,
    /// The score the cells were ranked by, and what it is.
    pub score: f64,
    pub score_is: String,
    pub mkfs_ext4: String,
    pub mkfs_xfs: String,
}

/// results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub tool: String,
    /// "in-process" or "nbd+fio".
    pub mode: String,
    pub runtime_s: f64,
    pub array_size: u64,
    /// Per member operation, when --member-latency was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_latency_us: Option<f64>,
    pub note: String,
    pub cells: Vec<CellResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendation: Option<Recommendation>,
}

impl Results {
    pub fn new(plan: &Plan, mode: &str, cells: Vec<CellResult>) -> Results {
        let mut r = Results {
            tool: "cairn bench".into(),
            mode: mode.into(),
            runtime_s: plan.runtime.as_secs_f64(),
            array_size: plan.size,
            member_latency_us: plan.member_latency.map(|d| d.as_secs_f64() * 1e6),
            note: "absolute figures depend on the machine and what else runs on it; compare \
                   cells of one run, or runs of one machine, side by side"
                .into(),
            cells,
            recommendation: None,
        };
        r.recommendation = recommend(&r.cells, plan.workload);
        r
    }
}

fn geo_mean(v: &[f64]) -> f64 {
    if v.iter().any(|x| *x <= 0.0) {
        return 0.0;
    }
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// The score a workload ranks cells by (higher is better), and its words.
pub fn score(c: &CellResult, w: Workload) -> (f64, &'static str) {
    match w {
        Workload::Seq => (
            geo_mean(&[c.seq_write_mbps, c.seq_read_mbps]),
            "geometric mean of sequential write and read MB/s",
        ),
        Workload::Random => (
            geo_mean(&[c.randread_qd32_iops, c.randwrite_qd32_iops]),
            "geometric mean of 4K random read and write IOPS at QD32",
        ),
        Workload::Db => (
            geo_mean(&[c.sync_write_iops, c.randread_qd32_iops, c.randwrite_qd32_iops]),
            "geometric mean of QD1 write+flush per second and 4K random read and write IOPS at QD32",
        ),
    }
}

/// The stack of a cell as `cairn advise` sees one: export -> LUKS2 -> md.
pub fn cell_node(c: &CellResult) -> Node {
    let geo = NodeGeometry {
        logical_block: c.spec.sector_size.max(512),
        physical_block: 4096,
        optimal_io: u32::try_from(c.full_stripe).unwrap_or(0),
    };
    let level = cairn_md::Level::parse(&c.spec.level).unwrap_or(cairn_md::Level::Raid0);
    let data = super::cell::data_members(level, c.spec.members);
    let mut md = Node::new(
        NodeKind::Md,
        "md:bench".into(),
        "bench".into(),
        cairn_stack::node::NodeState::Array(cairn_md::ArrayState {
            clean: true,
            degraded: false,
            resync_pending: false,
            forced: false,
            failed: false,
            recovering: false,
            fenced: false,
        }),
        0,
        geo,
    );
    md.md = Some(MdDetails {
        uuid: String::new(),
        level: c.spec.level.clone(),
        // advise reads RAID10's copies from mdadm's layout text ("near=2", "far=2").
        layout: if level == cairn_md::Level::Raid10 {
            let l = c
                .spec
                .layout
                .as_deref()
                .and_then(cairn_md::Raid10Layout::parse)
                .unwrap_or(cairn_md::Raid10Layout::DEFAULT);
            Some(l.mdadm_text())
        } else {
            c.spec.layout.clone()
        },
        chunk_bytes: c.spec.chunk,
        raid_devices: c.spec.members,
        data_disks: data,
        active_devices: c.spec.members,
        failed_devices: 0,
        events: 0,
        mismatch_sectors: None,
        job: None,
    });
    let below = if c.spec.cipher == "none" {
        md
    } else {
        let mut l = Node::new(
            NodeKind::Luks,
            "luks:bench".into(),
            "bench".into(),
            cairn_stack::node::NodeState::Active,
            0,
            geo,
        );
        l.data_offset = c.payload_offset;
        l.luks = Some(LuksDetails {
            version: 2,
            uuid: String::new(),
            description: format!("LUKS2 {} {}-bit", c.spec.cipher, c.spec.key_size),
            sector_size: c.spec.sector_size,
            payload_offset: c.payload_offset,
        });
        l.children.push(md);
        l
    };
    let mut e = Node::new(
        NodeKind::Export,
        "export:bench".into(),
        "bench".into(),
        cairn_stack::node::NodeState::Active,
        0,
        geo,
    );
    e.children.push(below);
    e
}

/// The best cell for `w`, and the mkfs lines for its stack (from `cairn advise`).
pub fn recommend(cells: &[CellResult], w: Workload) -> Option<Recommendation> {
    let (best, s) = cells
        .iter()
        .map(|c| (c, score(c, w).0))
        .filter(|(_, s)| s.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let advice = cairn_stack::advise::advise_on(&cell_node(best), "DEVICE");
    Some(Recommendation {
        workload: w,
        cell: best.cell.clone(),
        level: best.spec.level.clone(),
        chunk: best.spec.chunk,
        stripe_cache: best.spec.stripe_cache,
        sector_size: best.spec.sector_size,
        score: s,
        score_is: score(best, w).1.into(),
        mkfs_ext4: advice.mkfs_ext4,
        mkfs_xfs: advice.mkfs_xfs,
    })
}

pub fn recommendation_text(r: &Results) -> String {
    let Some(rec) = &r.recommendation else {
        return "no recommendation: no cell was measured\n".into();
    };
    let mut s = format!(
        "recommended for a {} workload: {}\n  ({}: {:.1})\n",
        rec.workload.name(),
        rec.cell,
        rec.score_is,
        rec.score
    );
    if rec.chunk > 0 {
        let _ = writeln!(s, "  chunk {}", short_size(rec.chunk));
    }
    if rec.stripe_cache > 0 {
        let _ = writeln!(
            s,
            "  stripe cache {} (cairn serve --stripe-cache-size {})",
            rec.stripe_cache, rec.stripe_cache
        );
    }
    if rec.sector_size > 0 {
        let _ = writeln!(
            s,
            "  LUKS sector size {} (cairn luks format --sector-size {})",
            rec.sector_size, rec.sector_size
        );
    }
    let _ = writeln!(s, "  {}\n  {}", rec.mkfs_ext4, rec.mkfs_xfs);
    s
}

/// The columns of the table and the CSV: (header, value).
fn columns(c: &CellResult) -> Vec<(&'static str, String)> {
    let l = &c.sync_write_lat_us;
    vec![
        ("cell", c.cell.clone()),
        ("seq_w_MB/s", format!("{:.1}", c.seq_write_mbps)),
        ("seq_r_MB/s", format!("{:.1}", c.seq_read_mbps)),
        ("rr_qd1", format!("{:.0}", c.randread_qd1_iops)),
        ("rw_qd1", format!("{:.0}", c.randwrite_qd1_iops)),
        ("rr_qd32", format!("{:.0}", c.randread_qd32_iops)),
        ("rw_qd32", format!("{:.0}", c.randwrite_qd32_iops)),
        ("sync/s", format!("{:.0}", c.sync_write_iops)),
        ("sync_p99_us", format!("{:.0}", l.p99)),
        ("cpu_s/GB_w", format!("{:.2}", c.cpu_s_per_gb_write)),
        ("cpu_s/GB_r", format!("{:.2}", c.cpu_s_per_gb_read)),
    ]
}

/// The results table, one row per cell, then each cell's sweep.
pub fn table(r: &Results) -> String {
    let rows: Vec<Vec<(&str, String)>> = r.cells.iter().map(columns).collect();
    let Some(first) = rows.first() else {
        return String::new();
    };
    let widths: Vec<usize> = (0..first.len())
        .map(|i| {
            rows.iter()
                .map(|row| row[i].1.len())
                .chain(std::iter::once(first[i].0.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = format!("cairn bench ({}), IOPS at 4K:\n", r.mode);
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let _ = writeln!(s, "{}", line(first.iter().map(|c| c.0).collect()));
    for row in &rows {
        let _ = writeln!(s, "{}", line(row.iter().map(|c| c.1.as_str()).collect()));
    }
    let _ = writeln!(
        s,
        "\nrequest-size sweep, sequential write MB/s [member operations per MiB] (* = full stripe):"
    );
    for c in &r.cells {
        let pts: Vec<String> = c
            .sweep
            .iter()
            .map(|p| {
                format!(
                    "{}{}={:.1}{}",
                    short_size(p.request),
                    if p.request == c.full_stripe { "*" } else { "" },
                    p.write_mbps,
                    p.member_ops_per_mib
                        .map(|o| format!("[{o:.0}]"))
                        .unwrap_or_default()
                )
            })
            .collect();
        let _ = writeln!(s, "  {}: {}", c.cell, pts.join(" "));
    }
    s
}

pub fn write_json(r: &Results, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(r)
        .map_err(|e| CliError::new(format!("cannot encode the results: {e}")))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| CliError::new(format!("cannot write {}: {e}", path.display())))
}

/// CSV, one row per cell: the spec, every figure, and the sweep as request:MBps pairs.
pub fn write_csv(r: &Results, path: &Path) -> Result<()> {
    let mut s = String::from(
        "cell,mode,level,members,layout,chunk,cipher,key_size,sector_size,stripe_cache,full_stripe,\
         seq_write_mbps,seq_read_mbps,randread_qd1_iops,randwrite_qd1_iops,randread_qd32_iops,\
         randwrite_qd32_iops,sync_write_iops,sync_lat_p50_us,sync_lat_p90_us,sync_lat_p99_us,\
         sync_lat_p999_us,sync_lat_max_us,cpu_s_per_gb_write,cpu_s_per_gb_read,sweep\n",
    );
    for c in &r.cells {
        let l = &c.sync_write_lat_us;
        let sweep: Vec<String> = c
            .sweep
            .iter()
            .map(|p| format!("{}:{:.3}", p.request, p.write_mbps))
            .collect();
        let _ = writeln!(
            s,
            "\"{}\",{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.4},{:.4},\"{}\"",
            c.cell, c.mode, c.spec.level, c.spec.members,
            c.spec.layout.as_deref().unwrap_or("default"), c.spec.chunk, c.spec.cipher,
            c.spec.key_size, c.spec.sector_size, c.spec.stripe_cache, c.full_stripe,
            c.seq_write_mbps, c.seq_read_mbps, c.randread_qd1_iops, c.randwrite_qd1_iops,
            c.randread_qd32_iops, c.randwrite_qd32_iops, c.sync_write_iops, l.p50, l.p90,
            l.p99, l.p999, l.max, c.cpu_s_per_gb_write, c.cpu_s_per_gb_read, sweep.join(" ")
        );
    }
    std::fs::write(path, s)
        .map_err(|e| CliError::new(format!("cannot write {}: {e}", path.display())))
}

fn load(path: &Path) -> Result<Results> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::new(format!(
            "{} is not a cairn bench results.json: {e}",
            path.display()
        ))
    })
}

/// The figures --compare sets side by side: (name, value, higher is better).
fn figures(c: &CellResult) -> Vec<(&'static str, f64, bool)> {
    vec![
        ("seq write MB/s", c.seq_write_mbps, true),
        ("seq read MB/s", c.seq_read_mbps, true),
        ("4K rand read QD1 IOPS", c.randread_qd1_iops, true),
        ("4K rand write QD1 IOPS", c.randwrite_qd1_iops, true),
        ("4K rand read QD32 IOPS", c.randread_qd32_iops, true),
        ("4K rand write QD32 IOPS", c.randwrite_qd32_iops, true),
        ("write+flush QD1 /s", c.sync_write_iops, true),
        ("write+flush p99 us", c.sync_write_lat_us.p99, false),
        ("CPU s/GB write", c.cpu_s_per_gb_write, false),
        ("CPU s/GB read", c.cpu_s_per_gb_read, false),
    ]
}

/// `--compare A.json B.json`: for each cell in both, every figure before and after and
/// the ratio B/A.
pub fn compare(a: &Path, b: &Path, json: bool) -> Result<()> {
    let (ra, rb) = (load(a)?, load(b)?);
    let mut rows = Vec::new();
    for ca in &ra.cells {
        let Some(cb) = rb.cells.iter().find(|c| c.cell == ca.cell) else {
            continue;
        };
        for ((name, va, up), (_, vb, _)) in figures(ca).into_iter().zip(figures(cb)) {
            let ratio = if va > 0.0 { vb / va } else { f64::NAN };
            rows.push((ca.cell.clone(), name, va, vb, ratio, up));
        }
    }
    if rows.is_empty() {
        return Err(CliError::new(format!(
            "{} and {} have no cell in common (cells are matched by their names)",
            a.display(),
            b.display()
        )));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(cell, name, va, vb, ratio, up)| {
                serde_json::json!({"cell": cell, "figure": name, "a": va, "b": vb,
                    "ratio": if ratio.is_finite() { Some(*ratio) } else { None },
                    "higher_is_better": up})
            })
            .collect();
        println!("{}", serde_json::json!({"a": a, "b": b, "rows": v}));
        return Ok(());
    }
    println!(
        "A = {} ({})\nB = {} ({})",
        a.display(),
        ra.mode,
        b.display(),
        rb.mode
    );
    let mut last = String::new();
    for (cell, name, va, vb, ratio, up) in rows {
        if cell != last {
            println!("\n{cell}");
            println!("  {:<26}{:>12}{:>12}{:>9}", "figure", "A", "B", "B/A");
            last = cell;
        }
        let verdict = if !ratio.is_finite() || (ratio - 1.0).abs() < 0.05 {
            ""
        } else if (ratio > 1.0) == up {
            "  better"
        } else {
            "  worse"
        };
        println!("  {name:<26}{va:>12.1}{vb:>12.1}{ratio:>8.2}x{verdict}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::{Latency, SweepPoint};
    use crate::bench::CellSpec;

    fn cell(chunk: u64, seq: f64, iops: f64) -> CellResult {
        let spec = CellSpec {
            level: "raid6".into(),
            members: 4,
            layout: None,
            chunk,
            cipher: "aes-xts-plain64".into(),
            key_size: 512,
            sector_size: 4096,
            stripe_cache: 256,
        };
        CellResult {
            cell: spec.label(),
            spec,
            mode: "in-process".into(),
            full_stripe: chunk * 2,
            payload_offset: 16 << 20,
            seq_write_mbps: seq,
            seq_read_mbps: seq,
            randread_qd1_iops: iops,
            randwrite_qd1_iops: iops,
            randread_qd32_iops: iops,
            randwrite_qd32_iops: iops,
            sync_write_iops: iops,
            sync_write_lat_us: Latency {
                p50: 1.0,
                p90: 2.0,
                p99: 3.0,
                p999: 4.0,
                max: 5.0,
            },
            cpu_s_per_gb_write: 1.0,
            cpu_s_per_gb_read: 1.0,
            sweep: vec![SweepPoint {
                request: 4096,
                write_mbps: 1.0,
                member_ops_per_mib: None,
            }],
        }
    }

    #[test]
    fn the_recommendation_follows_the_workload_and_advise() {
        let cells = vec![cell(64 << 10, 100.0, 10.0), cell(512 << 10, 50.0, 20.0)];
        let seq = recommend(&cells, Workload::Seq).expect("a cell");
        assert_eq!(seq.cell, cells[0].cell);
        assert_eq!(seq.chunk, 64 << 10);
        // cairn advise's maths: RAID6 4 x 64K -> stride 16, stripe width 32.
        assert_eq!(
            seq.mkfs_ext4,
            "mkfs.ext4 -E stride=16,stripe_width=32 DEVICE"
        );
        assert_eq!(seq.mkfs_xfs, "mkfs.xfs -d su=64k,sw=2 DEVICE");
        let rnd = recommend(&cells, Workload::Random).expect("a cell");
        assert_eq!(rnd.cell, cells[1].cell);
        assert_eq!(
            rnd.mkfs_ext4,
            "mkfs.ext4 -E stride=128,stripe_width=256 DEVICE"
        );
        assert!(recommend(&[], Workload::Db).is_none());
    }

    #[test]
    fn compare_reads_what_a_run_writes() {
        let dir = std::env::temp_dir().join(format!("cairn-bench-cmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mk = |seq| Results {
            tool: "cairn bench".into(),
            mode: "in-process".into(),
            runtime_s: 1.0,
            array_size: 1 << 30,
            member_latency_us: None,
            note: String::new(),
            cells: vec![cell(64 << 10, seq, 10.0)],
            recommendation: None,
        };
        let (a, b) = (dir.join("a.json"), dir.join("b.json"));
        write_json(&mk(100.0), &a).expect("a");
        write_json(&mk(200.0), &b).expect("b");
        compare(&a, &b, true).expect("compare");
        std::fs::write(&b, "{}").expect("b");
        assert!(compare(&a, &b, false).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
