//! The demo's closing picture: traffic share and rho per site over time, as an SVG
//! (plotters), with the scenario's steps marked.

use std::path::Path;

use plotters::prelude::*;

use crate::Error;

/// The highest rho drawn; above it the line is clipped (a site at rho 40 would flatten
/// every other line).
pub const RHO_CEILING: f64 = 4.0;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// One sampled second.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotPoint {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Per site, its share of the gateway's routing decisions (`None`: nothing routed).
    pub share: Vec<Option<f64>>,
    /// Per site, its rho at the gateway (`None`: excluded or unmeasured).
    pub rho: Vec<Option<f64>>,
}

/// Everything the plot draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlotData {
    /// Site names, in the order of each point's vectors.
    pub sites: Vec<String>,
    /// The samples, in time order.
    pub points: Vec<PlotPoint>,
    /// The scenario's steps: when (seconds) and what.
    pub events: Vec<(f64, String)>,
}

/// Runs of consecutive points where `value` is known: a line is not drawn across a gap.
fn segments(
    points: &[PlotPoint],
    value: impl Fn(&PlotPoint) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current = Vec::new();
    for p in points {
        if let Some(v) = value(p) {
            current.push((p.t_s, v));
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    data: &PlotData,
    caption: &str,
    y_max: f64,
    value: impl Fn(&PlotPoint, usize) -> Option<f64>,
) -> Result<(), Error> {
    let x_max = data.points.last().map_or(1.0, |p| p.t_s.max(1.0));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .draw()
        .map_err(plot_err)?;
    for (t, _) in &data.events {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(*t, 0.0), (*t, y_max)],
                6,
                4,
                RGBColor(120, 120, 120).stroke_width(2),
            ))
            .map_err(plot_err)?;
    }
    for (i, site) in data.sites.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let runs = segments(&data.points, |p| value(p, i).map(|v| v.min(y_max)));
        for (k, run) in runs.into_iter().enumerate() {
            let series = chart
                .draw_series(LineSeries::new(run, color.stroke_width(2)))
                .map_err(plot_err)?;
            if k == 0 {
                series.label(site.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// Draws the two panels into an SVG at `path`.
pub fn write_svg(path: &Path, data: &PlotData) -> Result<(), Error> {
    let root = SVGBackend::new(path, (1100, 820)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (top, bottom) = root.split_vertically(410);
    panel(
        &top,
        data,
        "Share of the gateway's routing decisions per site, last 3 s (dashed lines: scenario steps)",
        1.0,
        |p, i| p.share.get(i).copied().flatten(),
    )?;
    let rho_max = data
        .points
        .iter()
        .flat_map(|p| p.rho.iter().flatten().copied())
        .fold(1.2_f64, f64::max)
        .min(RHO_CEILING);
    panel(
        &bottom,
        data,
        "rho per site at the gateway (gaps: excluded or unmeasured)",
        rho_max,
        |p, i| p.rho.get(i).copied().flatten(),
    )?;
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, a: Option<f64>) -> PlotPoint {
        PlotPoint {
            t_s: t,
            share: vec![a, Some(1.0 - a.unwrap_or(0.0))],
            rho: vec![a.map(|v| v * 8.0), Some(0.5)],
        }
    }

    #[test]
    fn a_gap_splits_a_line_into_segments() {
        let points = [
            point(0.0, Some(0.5)),
            point(1.0, None),
            point(2.0, Some(0.2)),
            point(3.0, Some(0.3)),
        ];
        let runs = segments(&points, |p| p.share[0]);
        assert_eq!(runs, vec![vec![(0.0, 0.5)], vec![(2.0, 0.2), (3.0, 0.3)]]);
    }

    #[test]
    fn the_svg_names_both_panels_and_every_site() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.svg");
        let data = PlotData {
            sites: vec!["a".into(), "b".into()],
            points: (0..10)
                .map(|t| point(f64::from(t), (t != 4).then_some(0.4)))
                .collect(),
            events: vec![(4.0, "a loses all its endpoints".into())],
        };
        write_svg(&path, &data).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("routing decisions per site"));
        assert!(svg.contains("rho per site"));
        // plotters writes each text on its own line between the tags.
        let texts: Vec<&str> = svg.lines().map(str::trim).collect();
        assert!(texts.contains(&"a") && texts.contains(&"b"), "{svg}");
    }
}
