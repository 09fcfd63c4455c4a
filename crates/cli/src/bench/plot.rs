//! The plots of a run, each as PNG and SVG next to results.json, drawn with plotters:
//!
//! ```text
//!   throughput.{png,svg}  sequential write/read MB/s per cell (horizontal bars)
//!   iops.{png,svg}        4K random read/write IOPS at QD1 and QD32 per cell
//!   knee.{png,svg}        request-size sweep: write MB/s over request size (log), one line
//!                         per cell, the full stripe marked: the knee
//!   latency.{png,svg}     QD1 write+flush latency percentiles per cell (log us)
//! ```
//!
//! Text is drawn with DejaVu Sans compiled in (plotters' ab_glyph backend), so no
//! fontconfig or system font is needed.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::Results;
use super::short_size;
use crate::error::{CliError, Result};

type Drawn = std::result::Result<(), String>;

fn font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_err()
        {
            tracing::warn!("bench plots: the built-in font did not load; text may be missing");
        }
    });
}

/// A tick value as an integer (ticks are small: log2 of sizes, counts).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn to_u64(x: f64) -> u64 {
    x.round().max(0.0) as u64
}

fn to_usize(x: f64) -> usize {
    usize::try_from(to_u64(x)).unwrap_or(64).min(64)
}

fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

/// Horizontal grouped bars: one group per label, one bar per series.
fn hbars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    unit: &str,
    labels: &[String],
    series: &[(&str, Vec<f64>)],
) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    let n = labels.len().max(1);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(0f64..max, 0f64..n as f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(unit)
        .x_label_formatter(&|x| {
            if max > 20.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            }
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let k = series.len().max(1) as f64;
    let h = 0.8 / k;
    for (si, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(si).to_rgba();
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let y0 = (n - 1 - i) as f64 + 0.1 + (k - 1.0 - si as f64) * h;
                Rectangle::new([(0.0, y0), (*v, y0 + h)], color.filled())
            }))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    // The cell names beside their bars, in pixels left of the plot.
    let style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, label) in labels.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, (n - 1 - i) as f64 + 0.5));
        root.draw(&Text::new(label.clone(), (px - 8, py), style.clone()))
            .map_err(e)?;
    }
    root.present().map_err(e)
}

/// The request-size sweep, one line per cell; a circle on each cell's full stripe.
fn knee<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &Results) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    // x is log2 of the request size, so each tick is a power of two: 4K, 8K, ... 1M.
    let pts = r.cells.iter().flat_map(|c| c.sweep.iter());
    let (lo, hi, ymax) = pts.fold((f64::MAX, 0f64, 0f64), |(lo, hi, y), p| {
        let x = (p.request as f64).log2();
        (lo.min(x), hi.max(x), y.max(p.write_mbps))
    });
    let (lo, hi) = if lo > hi {
        (12.0, 13.0)
    } else {
        (lo.floor(), hi.ceil().max(lo + 1.0))
    };
    let mut chart = ChartBuilder::on(root)
        .caption(
            "request-size sweep: sequential write (o = full stripe)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(lo..hi + 0.25, 0f64..ymax.max(1e-9) * 1.1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("request size")
        .y_desc("MB/s")
        .x_labels(to_usize(hi - lo) + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                short_size(1u64 << to_u64(*x).min(62))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for (i, c) in r.cells.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                c.sweep
                    .iter()
                    .map(|p| ((p.request as f64).log2(), p.write_mbps)),
                color.stroke_width(2),
            ))
            .map_err(e)?
            .label(c.cell.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                c.sweep
                    .iter()
                    .filter(|p| p.request == c.full_stripe)
                    .map(|p| {
                        Circle::new(
                            ((p.request as f64).log2(), p.write_mbps),
                            6,
                            color.stroke_width(2),
                        )
                    }),
            )
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// QD1 write+flush latency percentiles, one line per cell, log scale.
fn latency<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &Results) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e)?;
    let names = ["p50", "p90", "p99", "p99.9", "max"];
    let (lo, hi) = r
        .cells
        .iter()
        .flat_map(|c| c.sync_write_lat_us.pairs().map(|(_, v)| v))
        .fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (1.0, 10.0)
    } else {
        (lo.max(0.1) / 1.5, hi.max(lo * 2.0) * 1.5)
    };
    let mut chart = ChartBuilder::on(root)
        .caption("QD1 4K write + flush latency", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0usize..4usize).into_segmented(), (lo..hi).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .y_desc("microseconds")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                names.get(*i).map_or(String::new(), |s| (*s).to_string())
            }
            SegmentValue::Last => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for (i, c) in r.cells.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<_> = c
            .sync_write_lat_us
            .pairs()
            .iter()
            .enumerate()
            .map(|(k, (_, v))| (SegmentValue::CenterOf(k), v.max(lo)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(c.cell.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draws one figure both ways: `name`.png and `name`.svg in `dir`, the same code for
/// each backend.
macro_rules! figure {
    ($dir:expr, $name:expr, $size:expr, $out:expr, |$root:ident| $body:expr) => {{
        let png = $dir.join(format!("{}.png", $name));
        let svg = $dir.join(format!("{}.svg", $name));
        let drawn: Drawn = (|| {
            {
                let $root = BitMapBackend::new(&png, $size).into_drawing_area();
                $body?;
            }
            {
                let $root = SVGBackend::new(&svg, $size).into_drawing_area();
                $body?;
            }
            Ok(())
        })();
        drawn.map_err(|err| CliError::new(format!("cannot draw {}: {err}", png.display())))?;
        $out.push(png);
        $out.push(svg);
    }};
}

/// Draws every plot into `dir`; returns the files written.
pub fn all(r: &Results, dir: &Path) -> Result<Vec<PathBuf>> {
    font();
    let mut out = Vec::new();
    let labels: Vec<String> = r.cells.iter().map(|c| c.cell.clone()).collect();
    let n = u32::try_from(labels.len()).unwrap_or(256);
    let bars_size = (1100, 140 + 46 * n);
    let tp = [
        (
            "seq write",
            r.cells.iter().map(|c| c.seq_write_mbps).collect(),
        ),
        (
            "seq read",
            r.cells.iter().map(|c| c.seq_read_mbps).collect(),
        ),
    ];
    let mode = &r.mode;
    figure!(dir, "throughput", bars_size, out, |root| hbars(
        &root,
        &format!("sequential throughput ({mode})"),
        "MB/s",
        &labels,
        &tp
    ));
    let iops = [
        (
            "rand read QD1",
            r.cells.iter().map(|c| c.randread_qd1_iops).collect(),
        ),
        (
            "rand write QD1",
            r.cells.iter().map(|c| c.randwrite_qd1_iops).collect(),
        ),
        (
            "rand read QD32",
            r.cells.iter().map(|c| c.randread_qd32_iops).collect(),
        ),
        (
            "rand write QD32",
            r.cells.iter().map(|c| c.randwrite_qd32_iops).collect(),
        ),
    ];
    let iops_size = (1100, 140 + 80 * n);
    figure!(dir, "iops", iops_size, out, |root| hbars(
        &root,
        &format!("4K random IOPS ({mode})"),
        "IOPS",
        &labels,
        &iops
    ));
    figure!(dir, "knee", (1000, 600), out, |root| knee(&root, r));
    figure!(dir, "latency", (1000, 600), out, |root| latency(&root, r));
    Ok(out)
}
