//! PNG line charts for `tether campaign`: execution time relative to the
//! fault-free run against fault rate, one line per fault kind, in the style
//! of Figs. 3 and 4 of Li et al. [CI]. Pure Rust (plotters + ab_glyph) with a
//! bundled font, so a chart looks the same on every machine and needs no
//! system fonts. Beside the charts, the CSV of what they were drawn from
//! ([`write_csv`]).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, ensure, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// DejaVu Sans (licence in assets/DejaVuSans-LICENSE.txt). ab_glyph has no
/// font of its own and panics on the first text drawn unless one is registered.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Tableau 10: distinct on screen and on paper; cycles past ten series.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Write `records` as `dir/name` (a CSV row each, with a header), making
/// `dir` if need be; the path written.
pub fn write_csv<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    records: impl IntoIterator<Item = T>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let mut w = csv::Writer::from_path(&path)?;
    for r in records {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(path)
}

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What to draw: titles, the x scale, and the lines.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Logarithmic x axis (fault rates span decades, 1e-4..1e-1).
    pub log_x: bool,
    pub series: &'a [Series],
}

/// Draw `chart` as a PNG of `width` x `height` pixels at `path`.
pub fn line_png(path: &Path, chart: &Chart, width: u32, height: u32) -> Result<()> {
    let is_png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
    ensure!(is_png, "{}: chart file name must end in .png", path.display());
    // Validate before the backend exists: dropping it writes the file anyway.
    let data = validate(chart, width, height)?;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    draw(&root, chart, &data)?;
    root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

/// The points that can be drawn, per series: non-finite values (a failed run)
/// and, on a log axis, x <= 0 (the fault-free baseline) are skipped.
fn validate(chart: &Chart, width: u32, height: u32) -> Result<Vec<Vec<(f64, f64)>>> {
    // Below this the fixed label areas leave no room for the plot itself.
    ensure!(width >= 200 && height >= 150, "chart size {width}x{height} is too small (min 200x150)");
    ensure!(!chart.series.is_empty(), "chart {:?} has no series", chart.title);
    let keep = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite() && (!chart.log_x || x > 0.0);
    let data: Vec<Vec<_>> =
        chart.series.iter().map(|s| s.points.iter().filter(keep).copied().collect()).collect();
    ensure!(data.iter().any(|d| !d.is_empty()), "chart {:?} has no plottable points", chart.title);
    Ok(data)
}

fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    ensure!(ok, "bundled chart font failed to load");
    Ok(())
}

/// Lay out the axes from the data and hand over to `draw_in` with the right
/// x coordinate type (log and linear are different types in plotters).
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
    data: &[Vec<(f64, f64)>],
) -> Result<()> {
    ensure_font()?;
    let all = || data.iter().flatten();
    let (x_lo, x_hi) = min_max(all().map(|p| p.0));
    let (y_lo, y_hi) = min_max(all().map(|p| p.1));
    // Relative times are read against 0 (as in the paper); go below only for negatives.
    let base = y_lo.min(0.0);
    let pad = if y_hi > base { (y_hi - base) * 0.05 } else { 1.0 };
    let y = if y_lo < 0.0 { y_lo - pad } else { 0.0 }..y_hi + pad;
    // Text and strokes grow with the image: sized for 500 px, the short side.
    let (width, height) = root.dim_in_pixel();
    let scale = f64::from(width.min(height)) / 500.0;
    if chart.log_x {
        // Pad in decades so the end points do not sit on the frame.
        let (a, b) = (x_lo.log10(), x_hi.log10());
        let pad = if b > a { (b - a) * 0.05 } else { 0.5 };
        let x = (10f64.powf(a - pad)..10f64.powf(b + pad)).log_scale();
        draw_in(root, chart, data, x, y, scale, Some(&sci))
    } else {
        let pad = if x_hi > x_lo { (x_hi - x_lo) * 0.05 } else { x_lo.abs().max(1.0) * 0.1 };
        // plotters' own labels suit a linear axis: they round to the tick step.
        draw_in(root, chart, data, x_lo - pad..x_hi + pad, y, scale, None)
    }
}

fn draw_in<DB: DrawingBackend, X>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
    data: &[Vec<(f64, f64)>],
    x: X,
    y: Range<f64>,
    scale: f64,
    x_fmt: Option<&dyn Fn(&f64) -> String>,
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing chart: {e}");
    let px = |n: f64| (n * scale).round().max(1.0) as u32;
    root.fill(&WHITE).map_err(err)?;
    let mut ctx = ChartBuilder::on(root)
        .caption(chart.title, ("sans-serif", px(22.0)))
        .margin(px(12.0))
        .x_label_area_size(px(45.0))
        .y_label_area_size(px(60.0))
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let mut mesh = ctx.configure_mesh();
    mesh.x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .label_style(("sans-serif", px(13.0)))
        .axis_desc_style(("sans-serif", px(15.0)))
        .light_line_style(WHITE); // major grid only: the lines stay readable
    if let Some(f) = x_fmt {
        mesh.x_label_formatter(f);
    }
    mesh.draw().map_err(err)?;
    let r = px(4.0);
    for (i, (s, pts)) in chart.series.iter().zip(data).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line = colour.stroke_width(px(2.0));
        ctx.draw_series(LineSeries::new(pts.iter().copied(), line))
            .map_err(err)?
            .label(s.label.as_str())
            .legend(move |(lx, ly)| {
                EmptyElement::at((lx, ly))
                    + PathElement::new([(0, 0), (20, 0)], line)
                    + Circle::new((10, 0), r, colour.filled())
            });
        ctx.draw_series(pts.iter().map(|&p| Circle::new(p, r, colour.filled()))).map_err(err)?;
    }
    // Times grow with the fault rate, so the upper left is usually empty.
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", px(13.0)))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// "1e-4" rather than "0.00010000000000000002": log ticks come from powf.
fn sci(v: &f64) -> String {
    let s = format!("{v:.2e}");
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.')),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u32 = 640;
    const H: u32 = 400;

    fn three_kinds() -> Vec<Series> {
        let rates = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1];
        let line = |label: &str, k: f64| Series {
            label: label.into(),
            points: rates.iter().map(|&r| (r, 1.0 + k * r * 10.0)).collect(),
        };
        vec![line("drop", 8.0), line("corrupt", 4.0), line("duplicate", 0.5)]
    }

    fn chart<'a>(series: &'a [Series], log_x: bool) -> Chart<'a> {
        Chart {
            title: "Effect of faults on execution time",
            x_label: "fault rate",
            y_label: "time / fault-free time",
            log_x,
            series,
        }
    }

    /// The same drawing as `line_png`, into an RGB buffer we can inspect.
    fn render_rgb(chart: &Chart) -> Result<Vec<u8>> {
        let data = validate(chart, W, H)?;
        let mut buf = vec![0u8; (W * H * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
            draw(&root, chart, &data)?;
            root.present().map_err(|e| anyhow!("{e}"))?;
        }
        Ok(buf)
    }

    fn temp_png(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("tether-plot-{}-{name}.png", std::process::id()))
    }

    #[test]
    fn plot_writes_a_png_with_three_coloured_lines() {
        let series = three_kinds();
        let path = temp_png("three");
        let written = line_png(&path, &chart(&series, true), W, H);
        let bytes = std::fs::read(&path);
        let _ = std::fs::remove_file(&path);
        written.unwrap();
        assert!(bytes.unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));

        let rgb = render_rgb(&chart(&series, true)).unwrap();
        let pixels: Vec<[u8; 3]> = rgb.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
        let inked = pixels.iter().filter(|p| **p != [255, 255, 255]).count();
        assert!(inked > pixels.len() / 50, "only {inked} non-white pixels");
        let distinct: std::collections::BTreeSet<_> =
            pixels.iter().filter(|p| **p != [255, 255, 255]).collect();
        assert!(distinct.len() >= 2);
        // Each series' colour appears (markers are filled in the exact colour).
        for c in &COLOURS[..3] {
            assert!(pixels.contains(&[c.0, c.1, c.2]), "colour {c:?} missing");
        }
    }

    #[test]
    fn plot_linear_axis_renders() {
        let series = three_kinds();
        let rgb = render_rgb(&chart(&series, false)).unwrap();
        assert!(rgb.chunks_exact(3).any(|p| p != [255, 255, 255]));
    }

    #[test]
    fn plot_rejects_empty_and_unplottable_charts() {
        let path = temp_png("empty");
        assert!(line_png(&path, &chart(&[], true), W, H).is_err());
        let bad = [Series { label: "nan".into(), points: vec![(0.0, 1.0), (1e-3, f64::NAN)] }];
        assert!(line_png(&path, &chart(&bad, true), W, H).is_err());
        assert!(!path.exists(), "a failed chart must not leave a file behind");
    }

    #[test]
    fn plot_reports_bad_paths_and_sizes() {
        let series = three_kinds();
        let c = chart(&series, true);
        let missing_dir = temp_png("no-such-dir").join("chart.png");
        assert!(line_png(&missing_dir, &c, W, H).is_err());
        let txt = temp_png("x").with_extension("txt");
        assert!(line_png(&txt, &c, W, H).is_err());
        let tiny = temp_png("tiny");
        assert!(line_png(&tiny, &c, 10, 10).is_err());
        assert!(!txt.exists() && !tiny.exists(), "a failed chart must not leave a file behind");
    }

    #[test]
    fn plot_degenerate_data_does_not_panic() {
        let one = |x: f64, y: f64| vec![Series { label: "one".into(), points: vec![(x, y)] }];
        for (s, log_x) in
            [(one(1e-3, 1.0), true), (one(0.0, 0.0), false), (one(-2.0, -3.0), false), (one(5.0, 1e9), false)]
        {
            render_rgb(&chart(&s, log_x)).unwrap();
        }
        let flat = [Series { label: "flat".into(), points: vec![(1e-4, 2.0), (1e-1, 2.0)] }];
        render_rgb(&chart(&flat, true)).unwrap();
        // A series with nothing to draw still gets a legend entry beside the others.
        let mut mixed = three_kinds();
        mixed.push(Series { label: "empty".into(), points: vec![] });
        render_rgb(&chart(&mixed, true)).unwrap();
    }

    #[test]
    fn plot_log_ticks_are_short() {
        assert_eq!(sci(&0.00010000000000000002), "1e-4");
        assert_eq!(sci(&0.025), "2.5e-2");
        assert_eq!(sci(&1.0), "1e0");
    }
}
