//! SVG charts (plotters) for the HTML reports: line charts of named series with optional
//! horizontal lines (SLOs) and marked points (saturation knees), CDFs, and down-sampled
//! time series. Every chart is a self-contained `<svg>` string.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::full_palette;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, series, reference lines and marked points.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Horizontal reference lines `(label, y)` (e.g. an SLO bound).
    pub hlines: Vec<(String, f64)>,
    /// Marked points `(label, x, y)` (e.g. a saturation knee).
    pub marks: Vec<(String, f64, f64)>,
    /// A logarithmic x axis (for positive x, e.g. request rates doubling).
    pub log_x: bool,
}

const PALETTE: [RGBColor; 8] = [
    full_palette::BLUE_700,
    full_palette::RED_700,
    full_palette::GREEN_700,
    full_palette::ORANGE_700,
    full_palette::PURPLE_700,
    full_palette::BROWN_700,
    full_palette::CYAN_700,
    full_palette::PINK_700,
];

/// The color of series `i`.
fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Renders `chart` as an SVG of `w x h` pixels. A chart without any finite point still
/// renders (an empty frame and its title).
pub fn svg(chart: &Chart, (w, h): (u32, u32)) -> String {
    let finite = |v: f64| v.is_finite();
    let xs = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(chart.marks.iter().map(|m| m.1))
        .filter(|&v| finite(v));
    let ys = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(chart.hlines.iter().map(|l| l.1))
        .chain(chart.marks.iter().map(|m| m.2))
        .filter(|&v| finite(v));
    let (mut x0, mut x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    let (mut y0, mut y1) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !(x0.is_finite() && x1.is_finite()) {
        (x0, x1) = (0.0, 1.0);
    }
    if !(y0.is_finite() && y1.is_finite()) {
        (y0, y1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Values start from 0 (latencies, counts, fractions), with a little headroom.
    y0 = y0.min(0.0);
    y1 = if y1 <= y0 {
        y0 + 1.0
    } else {
        y1 + 0.05 * (y1 - y0)
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (w, h)).into_drawing_area();
        // Drawing into a String cannot fail for I/O reasons; a failed element only
        // leaves it out, so the errors are not propagated.
        let _ = root.fill(&WHITE);
        if chart.log_x && x0 > 0.0 {
            draw(&root, chart, (x0..x1).log_scale(), (x0, x1), y0..y1, true);
        } else {
            draw(&root, chart, x0..x1, (x0, x1), y0..y1, false);
        }
        let _ = root.present();
    }
    out
}

/// Draws `chart` on `root` with the x coordinate `x` (linear or logarithmic) spanning
/// `xr` and `y` on the y axis.
fn draw<X>(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    chart: &Chart,
    x: X,
    (x0, x1): (f64, f64),
    y: std::ops::Range<f64>,
    log_x: bool,
) where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let finite = |v: f64| v.is_finite();
    let Ok(mut c) = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x, y)
    else {
        return;
    };
    let _ = c
        .configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .light_line_style(full_palette::GREY_100)
        .draw();
    for (i, s) in chart.series.iter().enumerate() {
        let col = color(i);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| finite(p.0) && finite(p.1) && (!log_x || p.0 > 0.0))
            .collect();
        if let Ok(a) = c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2))) {
            a.label(s.name.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2))
            });
        }
        if pts.len() <= 12 {
            let _ = c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, col.filled())));
        }
    }
    for (label, y) in &chart.hlines {
        let style = full_palette::GREY_700.stroke_width(1);
        let _ = c.draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 6, 4, style));
        let _ = c.draw_series(std::iter::once(Text::new(
            label.clone(),
            (x0, *y),
            ("sans-serif", 11)
                .into_font()
                .color(&full_palette::GREY_700),
        )));
    }
    for (label, x, y) in &chart.marks {
        let _ = c.draw_series(std::iter::once(TriangleMarker::new(
            (*x, *y),
            7,
            full_palette::BLACK.filled(),
        )));
        if !label.is_empty() {
            let _ = c.draw_series(std::iter::once(Text::new(
                label.clone(),
                (*x, *y),
                ("sans-serif", 11).into_font().color(&full_palette::BLACK),
            )));
        }
    }
    if !chart.series.is_empty() {
        let _ = c
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(full_palette::GREY_400)
            .position(SeriesLabelPosition::UpperLeft)
            .draw();
    }
}

/// The empirical CDF of `values` (finite ones), down-sampled to at most `max_points`
/// points: `(value, fraction of values <= it)`.
pub fn cdf(values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points.max(2)).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (v[i], (i + 1) as f64 / n as f64))
        .collect();
    if out.last().is_some_and(|p| p.1 < 1.0) {
        out.push((v[n - 1], 1.0));
    }
    out
}

/// A time series down-sampled to at most `max_points` buckets (the mean of each).
pub fn downsample(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let n = points.len();
    if n <= max_points {
        return points.to_vec();
    }
    let per = n.div_ceil(max_points.max(1));
    points
        .chunks(per)
        .map(|c| {
            let k = c.len() as f64;
            (
                c.iter().map(|p| p.0).sum::<f64>() / k,
                c.iter().map(|p| p.1).sum::<f64>() / k,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_render_as_svg_with_their_labels() {
        let chart = Chart {
            title: "TTFT CDF".into(),
            x_label: "ms".into(),
            y_label: "fraction".into(),
            series: vec![Series {
                name: "chunked".into(),
                points: cdf(&[5.0, 1.0, 3.0, f64::NAN], 100),
            }],
            hlines: vec![("SLO".into(), 0.5)],
            marks: vec![("knee".into(), 3.0, 0.66)],
            log_x: false,
        };
        let s = svg(&chart, (480, 320));
        // A log axis too.
        let log = svg(
            &Chart {
                log_x: true,
                ..chart.clone()
            },
            (480, 320),
        );
        assert!(log.contains("chunked"));
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>"),
            "{s}"
        );
        for label in ["TTFT CDF", "chunked", "SLO", "knee", "fraction"] {
            assert!(s.contains(label), "{label} missing");
        }
        // Empty charts still render.
        assert!(svg(&Chart::default(), (200, 100)).starts_with("<svg"));
        assert_eq!(cdf(&[2.0, 1.0], 10), vec![(1.0, 0.5), (2.0, 1.0)]);
        let d = downsample(&(0..100).map(|i| (i as f64, 1.0)).collect::<Vec<_>>(), 10);
        assert_eq!(d.len(), 10);
        assert_eq!(d[0], (4.5, 1.0));
    }
}
