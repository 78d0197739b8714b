//! PNG charts (plotters): stacked line-chart panels and grouped bars with error bars.
//!
//! Text is drawn with a font embedded in the binary (a DejaVu Sans subset, `assets/fonts/`),
//! so charts render the same on a fresh machine without fontconfig or system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::error::{Error, Result};

const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans-subset.ttf");
const WIDTH: u32 = 960;
const PANEL_HEIGHT: u32 = 400;

/// Colours that stay apart on white and for the common colour-vision deficiencies (Okabe–Ito).
const COLOURS: &[RGBColor] = &[
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

pub fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The font is part of the binary: failing to parse it is a build defect, not user error.
            if register_font("sans-serif", style, FONT).is_err() {
                panic!("the embedded chart font does not parse");
            }
        }
    });
}

fn draw_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("could not draw {}: {e}", path.display()))
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Draw a marker at each point (for sparse series such as periodic evaluations).
    pub markers: bool,
    pub colour: usize,
}

/// One chart of a stacked figure.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub series: Vec<Series>,
    /// Fixed y range; otherwise fitted to the data.
    pub y_range: Option<(f64, f64)>,
}

/// Smallest and largest finite value.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    lo.is_finite().then_some((lo, hi))
}

/// The extent with a margin, so lines do not run along the frame.
fn fitted(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    extent(values).map(|(lo, hi)| {
        let pad = ((hi - lo) * 0.08).max(1e-3);
        (lo - pad, hi + pad)
    })
}

/// Draws `panels` stacked vertically under `title` into the PNG `path`.
pub fn line_panels(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    register_fonts();
    let height = 60 + PANEL_HEIGHT * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let root = root.titled(title, ("sans-serif", 26)).map_err(|e| draw_err(path, e))?;
    for (area, panel) in root.split_evenly((panels.len().max(1), 1)).iter().zip(panels) {
        let (x0, x1) = match extent(panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0))) {
            Some((lo, hi)) => (lo, if hi > lo { hi } else { lo + 1.0 }),
            None => (0.0, 1.0),
        };
        let (y0, y1) = panel
            .y_range
            .or_else(|| fitted(panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1))))
            .unwrap_or((0.0, 1.0));
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw_err(path, e))?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { format!("{x:.1}") })
            .x_desc(&panel.x_desc)
            .y_desc(&panel.y_desc)
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw_err(path, e))?;
        for s in &panel.series {
            let c = colour(s.colour);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                .map_err(|e| draw_err(path, e))?
                .label(&s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(3)));
            if s.markers {
                chart
                    .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, c.filled())))
                    .map_err(|e| draw_err(path, e))?;
            }
        }
        if panel.series.iter().any(|s| !s.name.is_empty()) {
            chart
                .configure_series_labels()
                .label_font(("sans-serif", 14))
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(160, 160, 160))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| draw_err(path, e))?;
        }
    }
    root.present().map_err(|e| draw_err(path, e))?;
    Ok(())
}

/// Grouped bars: for each group (x axis), one bar per `bar_names` entry with mean ± std,
/// labelled with the mean to one decimal.
#[derive(Clone, Debug)]
pub struct BarGroup {
    pub label: String,
    /// (mean, std) per bar name; `None` where that bar has no value.
    pub bars: Vec<Option<(f64, f64)>>,
    /// A reference level drawn across the group (e.g. accuracy before training).
    pub reference: Option<f64>,
}

/// Draws grouped bars into the PNG `path`.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    bar_names: &[String],
    groups: &[BarGroup],
    reference_name: &str,
) -> Result<()> {
    register_fonts();
    let root = BitMapBackend::new(path, (WIDTH, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let values = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten().map(|(m, s)| m + s).chain(g.reference).collect::<Vec<_>>().into_iter());
    let top = values.fold(0.0f64, f64::max).max(1e-3) * 1.25;
    let n = groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..top)
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    let k = bar_names.len().max(1) as f64;
    let width = 0.8 / k;
    for (b, name) in bar_names.iter().enumerate() {
        let c = colour(b);
        let bars: Vec<(f64, f64, f64)> = groups
            .iter()
            .enumerate()
            .filter_map(|(g, grp)| grp.bars.get(b).copied().flatten().map(|(m, s)| (g as f64, m, s)))
            .collect();
        let left = |g: f64| g - 0.4 + width * b as f64;
        chart
            .draw_series(bars.iter().map(|&(g, m, _)| {
                Rectangle::new([(left(g) + width * 0.06, 0.0), (left(g) + width * 0.94, m)], c.filled())
            }))
            .map_err(|e| draw_err(path, e))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
        chart
            .draw_series(bars.iter().filter(|b| b.2 > 0.0).map(|&(g, m, s)| {
                ErrorBar::new_vertical(left(g) + width / 2.0, (m - s).max(0.0), m, m + s, BLACK.stroke_width(2), 8)
            }))
            .map_err(|e| draw_err(path, e))?;
        chart
            .draw_series(bars.iter().map(|&(g, m, s)| {
                Text::new(
                    format!("{m:.1}"),
                    (left(g) + width * 0.18, m + s + top * 0.015),
                    ("sans-serif", 13).into_font(),
                )
            }))
            .map_err(|e| draw_err(path, e))?;
    }
    let refs: Vec<(f64, f64)> =
        groups.iter().enumerate().filter_map(|(g, grp)| grp.reference.map(|r| (g as f64, r))).collect();
    if !refs.is_empty() {
        let style = BLACK.stroke_width(2);
        chart
            .draw_series(refs.iter().map(|&(g, r)| PathElement::new(vec![(g - 0.45, r), (g + 0.45, r)], style)))
            .map_err(|e| draw_err(path, e))?
            .label(reference_name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| draw_err(path, e))?;
    // Group names under the axis, centred on their bars.
    for (g, grp) in groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(g as f64, 0.0));
        let style = ("sans-serif", 16).into_font().into_text_style(&root).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Top,
        ));
        root.draw_text(&grp.label, &style, (px, py + 10)).map_err(|e| draw_err(path, e))?;
    }
    root.present().map_err(|e| draw_err(path, e))?;
    Ok(())
}

/// Trailing moving average over `window` points (shorter at the start).
pub fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let w = window.max(1);
    (0..points.len())
        .map(|i| {
            let lo = (i + 1).saturating_sub(w);
            let slice = &points[lo..=i];
            (points[i].0, slice.iter().map(|p| p.1).sum::<f64>() / slice.len() as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_is_trailing() {
        let p = [(1.0, 0.0), (2.0, 1.0), (3.0, 2.0), (4.0, 3.0)];
        assert_eq!(moving_average(&p, 2), vec![(1.0, 0.0), (2.0, 0.5), (3.0, 1.5), (4.0, 2.5)]);
        assert_eq!(moving_average(&p, 1), p.to_vec());
    }

    #[test]
    fn charts_are_png_files_with_drawn_pixels() {
        let dir = tempfile::tempdir().unwrap();
        let lines = dir.path().join("lines.png");
        let series = |name: &str, c: usize, k: f64| Series {
            name: name.into(),
            points: (0..20).map(|i| (i as f64, k * i as f64)).collect(),
            markers: c == 1,
            colour: c,
        };
        let panel = |t: &str| Panel {
            title: t.into(),
            x_desc: "step".into(),
            y_desc: "reward".into(),
            series: vec![series("a", 0, 0.01), series("b", 1, 0.02)],
            y_range: None,
        };
        line_panels(&lines, "Two panels", &[panel("first"), panel("second")]).unwrap();
        let bars = dir.path().join("bars.png");
        let groups = vec![
            BarGroup {
                label: "agent0".into(),
                bars: vec![Some((30.0, 2.0)), Some((25.0, 0.0))],
                reference: Some(20.0),
            },
            BarGroup { label: "agent1".into(), bars: vec![Some((20.0, 5.0)), None], reference: None },
        ];
        grouped_bars(&bars, "Accuracy", "held-out accuracy", &["x".into(), "y".into()], &groups, "before").unwrap();
        for (p, h) in [(&lines, 60 + 2 * PANEL_HEIGHT), (&bars, 560)] {
            let img = image::open(p).unwrap().to_rgb8();
            assert_eq!(img.dimensions(), (WIDTH, h));
            // Not blank: the first series' colour and dark text pixels are both there.
            let blue = img.pixels().filter(|px| px.0 == [0, 114, 178]).count();
            let dark = img.pixels().filter(|px| px.0.iter().all(|&v| v < 60)).count();
            assert!(blue > 100 && dark > 100, "{}: blue {blue}, dark {dark}", p.display());
        }
    }
}
