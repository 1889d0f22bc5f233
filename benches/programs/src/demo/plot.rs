//! The demo's closing picture: traffic share and rho per site over time, as an SVG
//! (plotters), with the scenario's steps marked.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use grid_kit::Error;

/// The highest rho drawn: a site at rho 40 would flatten every other line, so a rho above
/// it is drawn at the top of the axis with a marker, and the legend says how high it went.
pub const RHO_CEILING: f64 = 4.0;
/// The lowest top of the rho axis: rho 1 (full) stays visible with room above it.
pub const RHO_FLOOR_TOP: f64 = 1.2;

/// The SVG's size in pixels.
pub const WIDTH: u32 = 1200;
/// The SVG's size in pixels.
pub const HEIGHT: u32 = 880;
/// The column right of both panels that holds the legend, so it never covers a line.
pub const LEGEND_COLUMN: u32 = 210;
/// Rows of step labels above the top panel: steps a few seconds apart stack instead of
/// overwriting each other.
const LABEL_ROWS: usize = 3;
const LABEL_ROW_PX: i32 = 15;
const LABEL_FONT: u32 = 14;
/// A generous guess of one label character's width at [`LABEL_FONT`] (the SVG backend
/// measures no text).
const LABEL_CHAR_PX: i32 = 8;
const LEGEND_ROW_PX: i32 = 22;
/// Room for a panel's caption.
const CAPTION_PX: i32 = 30;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];
const STEP_GREY: RGBColor = RGBColor(120, 120, 120);

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
    /// The scenario's steps: when (seconds) and a short label
    /// ([`super::scenario::Action::label`]).
    pub events: Vec<(f64, String)>,
}

/// A rectangle of the SVG in pixels, edges inclusive-exclusive like plotters' ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    /// Left edge.
    pub left: i32,
    /// Top edge.
    pub top: i32,
    /// Right edge.
    pub right: i32,
    /// Bottom edge.
    pub bottom: i32,
}

impl Rect {
    /// Whether the two share any pixel.
    pub fn overlaps(&self, other: &Rect) -> bool {
        self.left < other.right
            && other.left < self.right
            && self.top < other.bottom
            && other.top < self.bottom
    }

    /// Whether `(x, y)` lies inside.
    pub fn contains(&self, (x, y): (i32, i32)) -> bool {
        (self.left..=self.right).contains(&x) && (self.top..=self.bottom).contains(&y)
    }
}

/// Where the drawing put its parts: what the tests check the picture against.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Each panel's plotting area (inside the axes), top panel first.
    pub panels: Vec<Rect>,
    /// The legend's box.
    pub legend: Rect,
}

/// The rho axis: how high it goes, and the highest rho it could not show.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RhoAxis {
    /// The axis' top.
    pub top: f64,
    /// The highest rho above `top`, when one was seen: such points are drawn at the top
    /// with a marker instead of being cut off silently.
    pub beyond: Option<f64>,
}

/// The rho axis for `data`: up to the highest rho seen, between [`RHO_FLOOR_TOP`] and
/// [`RHO_CEILING`].
pub fn rho_axis(data: &PlotData) -> RhoAxis {
    let highest = data
        .points
        .iter()
        .flat_map(|p| p.rho.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let top = highest.clamp(RHO_FLOOR_TOP, RHO_CEILING);
    RhoAxis {
        top,
        beyond: (highest > top).then_some(highest),
    }
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

/// For labels spanning `spans` (left, right pixels, in time order), the row each goes in:
/// the nearest row where it clears the label before it, else the row that frees first.
fn label_rows(spans: &[(i32, i32)], rows: usize) -> Vec<usize> {
    const GAP: i32 = 6;
    let mut ends = vec![i32::MIN / 2; rows.max(1)];
    spans
        .iter()
        .map(|&(left, right)| {
            let row = (0..ends.len())
                .find(|&k| ends[k] + GAP <= left)
                .unwrap_or_else(|| (0..ends.len()).min_by_key(|&k| ends[k]).unwrap_or_default());
            ends[row] = right;
            row
        })
        .collect()
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// What drawing one panel placed.
struct Drawn {
    plot: Rect,
    /// Each step marker's x, in pixels.
    steps_x: Vec<i32>,
}

struct Panel<'a> {
    caption: &'a str,
    y_max: f64,
    /// Empty room above the plotting area, for the step labels.
    top_band: u32,
}

fn panel(
    area: &Area<'_>,
    data: &PlotData,
    spec: &Panel<'_>,
    value: impl Fn(&PlotPoint, usize) -> Option<f64>,
) -> Result<Drawn, Error> {
    let y_max = spec.y_max;
    let x_max = data
        .points
        .iter()
        .map(|p| p.t_s)
        .chain(data.events.iter().map(|(t, _)| *t))
        .fold(1.0_f64, f64::max);
    // The caption is drawn by hand so the band for step labels lies between it and the
    // plot (a top label area would also get a second, cluttering time axis).
    let (width, _) = area.dim_in_pixel();
    area.draw(&Text::new(
        spec.caption,
        (width as i32 / 2, CAPTION_PX / 2 + 6),
        ("sans-serif", 20)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(plot_err)?;
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .margin_top(CAPTION_PX as u32 + spec.top_band)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .draw()
        .map_err(plot_err)?;
    let mut steps_x = Vec::with_capacity(data.events.len());
    for (t, _) in &data.events {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(*t, 0.0), (*t, y_max)],
                6,
                4,
                STEP_GREY.stroke_width(2),
            ))
            .map_err(plot_err)?;
        steps_x.push(chart.backend_coord(&(*t, y_max)).0);
    }
    for i in 0..data.sites.len() {
        let color = COLORS[i % COLORS.len()];
        for run in segments(&data.points, |p| value(p, i).map(|v| v.min(y_max))) {
            chart
                .draw_series(LineSeries::new(run, color.stroke_width(2)))
                .map_err(plot_err)?;
        }
        // Beyond the axis: at the top, marked, never silently cut.
        let beyond = data
            .points
            .iter()
            .filter(|p| value(p, i).is_some_and(|v| v > y_max))
            .map(|p| TriangleMarker::new((p.t_s, y_max), 6, color.filled()));
        chart.draw_series(beyond).map_err(plot_err)?;
    }
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    Ok(Drawn {
        plot: Rect {
            left: xs.start,
            top: ys.start,
            right: xs.end,
            bottom: ys.end,
        },
        steps_x,
    })
}

/// Writes each step's label above the top panel, at its marker.
fn step_labels(root: &Area<'_>, data: &PlotData, top: &Drawn) -> Result<(), Error> {
    let widths: Vec<i32> = data
        .events
        .iter()
        .map(|(_, label)| label.chars().count() as i32 * LABEL_CHAR_PX)
        .collect();
    // Left of its marker when it would run past the panel's right edge.
    let spans: Vec<(i32, i32)> = top
        .steps_x
        .iter()
        .zip(&widths)
        .map(|(&x, &w)| {
            if x + 3 + w <= top.plot.right {
                (x + 3, x + 3 + w)
            } else {
                (x - 3 - w, x - 3)
            }
        })
        .collect();
    let rows = label_rows(&spans, LABEL_ROWS);
    for (((_, label), (left, _)), row) in data.events.iter().zip(&spans).zip(rows) {
        let y = top.plot.top - 9 - row as i32 * LABEL_ROW_PX;
        let style = ("sans-serif", LABEL_FONT)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(label.as_str(), (*left, y), style))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Draws the legend in the column right of the panels, starting level with the top
/// panel's plotting area; returns its box.
fn legend(root: &Area<'_>, data: &PlotData, rho: RhoAxis, top: &Drawn) -> Result<Rect, Error> {
    let left = (WIDTH - LEGEND_COLUMN) as i32 + 10;
    let right = WIDTH as i32 - 10;
    let rows = data.sites.len() as i32 + 1 + if rho.beyond.is_some() { 2 } else { 0 };
    let rect = Rect {
        left,
        top: top.plot.top,
        right,
        bottom: top.plot.top + 10 + rows * LEGEND_ROW_PX,
    };
    root.draw(&Rectangle::new(
        [(rect.left, rect.top), (rect.right, rect.bottom)],
        WHITE.filled(),
    ))
    .map_err(plot_err)?;
    root.draw(&Rectangle::new(
        [(rect.left, rect.top), (rect.right, rect.bottom)],
        BLACK,
    ))
    .map_err(plot_err)?;
    let text = |s: String, y: i32| {
        Text::new(
            s,
            (left + 40, y),
            ("sans-serif", 15)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center)),
        )
    };
    let mut y = rect.top + 5 + LEGEND_ROW_PX / 2;
    for (i, site) in data.sites.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        root.draw(&PathElement::new(
            vec![(left + 8, y), (left + 32, y)],
            color.stroke_width(2),
        ))
        .map_err(plot_err)?;
        root.draw(&text(site.clone(), y)).map_err(plot_err)?;
        y += LEGEND_ROW_PX;
    }
    for (from, to) in [(8, 15), (19, 26), (30, 32)] {
        root.draw(&PathElement::new(
            vec![(left + from, y), (left + to, y)],
            STEP_GREY.stroke_width(2),
        ))
        .map_err(plot_err)?;
    }
    root.draw(&text("scenario step".into(), y))
        .map_err(plot_err)?;
    if let Some(highest) = rho.beyond {
        y += LEGEND_ROW_PX;
        root.draw(&TriangleMarker::new((left + 20, y), 6, BLACK.filled()))
            .map_err(plot_err)?;
        root.draw(&text(format!("rho > {:.1} (max {highest:.1})", rho.top), y))
            .map_err(plot_err)?;
        y += LEGEND_ROW_PX;
        root.draw(&text("drawn at the top".into(), y))
            .map_err(plot_err)?;
    }
    Ok(rect)
}

/// Draws the two panels, the step labels and the legend as SVG text.
pub fn render_svg(data: &PlotData) -> Result<(String, Layout), Error> {
    let mut svg = String::new();
    let layout = {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (charts, _) = root.split_horizontally(WIDTH - LEGEND_COLUMN);
        let (upper, lower) = charts.split_vertically(HEIGHT / 2 + 20);
        let top = panel(
            &upper,
            data,
            &Panel {
                caption: "Share of the gateway's routing decisions per site, last 3 s",
                y_max: 1.0,
                top_band: LABEL_ROWS as u32 * LABEL_ROW_PX as u32 + 10,
            },
            |p, i| p.share.get(i).copied().flatten(),
        )?;
        step_labels(&root, data, &top)?;
        let rho = rho_axis(data);
        let rho_caption = match rho.beyond {
            None => "rho per site at the gateway (gaps: excluded or unmeasured)".to_owned(),
            Some(_) => format!(
                "rho per site at the gateway (gaps: excluded or unmeasured; \u{25b2}: rho > {:.1})",
                rho.top
            ),
        };
        let bottom = panel(
            &lower,
            data,
            &Panel {
                caption: &rho_caption,
                y_max: rho.top,
                top_band: 0,
            },
            |p, i| p.rho.get(i).copied().flatten(),
        )?;
        let legend = legend(&root, data, rho, &top)?;
        root.present().map_err(plot_err)?;
        Layout {
            panels: vec![top.plot, bottom.plot],
            legend,
        }
    };
    Ok((svg, layout))
}

/// Draws the plot and writes it to `path`.
pub fn write_svg(path: &Path, data: &PlotData) -> Result<Layout, Error> {
    let (svg, layout) = render_svg(data)?;
    std::fs::write(path, svg)
        .map_err(|e| Error::Plot(format!("writing {}: {e}", path.display())))?;
    Ok(layout)
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

    /// A 90 s run of the full scenario's steps, with rho staying within the axis.
    fn full_run() -> PlotData {
        let steps = crate::demo::scenario::steps(crate::demo::scenario::Scenario::Full, 90_000);
        PlotData {
            sites: vec!["a".into(), "b".into()],
            points: (0..90)
                .map(|t| point(f64::from(t), (t % 20 != 4).then_some(0.4)))
                .collect(),
            events: steps
                .iter()
                .map(|s| (s.at_ms as f64 / 1e3, s.action.label()))
                .collect(),
        }
    }

    /// Every `<text>` of an SVG: where it is anchored and what it says (plotters writes
    /// the content on its own line, escaped).
    fn texts(svg: &str) -> Vec<((i32, i32), String)> {
        svg.split("<text ")
            .skip(1)
            .map(|element| {
                let element = element.split("</text>").next().unwrap();
                let attr = |name: &str| {
                    let value = element
                        .split(&format!("{name}=\""))
                        .nth(1)
                        .and_then(|v| v.split('"').next())
                        .unwrap();
                    value.parse::<f64>().unwrap() as i32
                };
                let content = element.split_once('>').unwrap().1.trim().to_owned();
                ((attr("x"), attr("y")), content)
            })
            .collect()
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
        write_svg(&path, &full_run()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("routing decisions per site"));
        assert!(svg.contains("rho per site"));
        let texts: Vec<String> = texts(&svg).into_iter().map(|(_, t)| t).collect();
        assert!(
            texts.contains(&"a".into()) && texts.contains(&"b".into()),
            "{svg}"
        );
    }

    #[test]
    fn a_plot_that_cannot_be_written_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("plot.svg");
        let e = write_svg(&path, &full_run()).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn the_svg_labels_every_scenario_step_above_the_plot_at_its_marker() {
        let data = full_run();
        let (svg, layout) = render_svg(&data).unwrap();
        let top = layout.panels[0];
        let texts = texts(&svg);
        let mut placed = Vec::new();
        for (_, label) in &data.events {
            let found: Vec<&((i32, i32), String)> =
                texts.iter().filter(|(_, t)| t == label).collect();
            assert_eq!(found.len(), 1, "{label}: {found:?}");
            let ((x, y), _) = *found[0];
            // Above the data, not on it, and over the panel's time axis.
            assert!(y < top.top, "{label} at y {y}, plot from {}", top.top);
            assert!((top.left..top.right).contains(&x), "{label} at x {x}");
            placed.push((x, y, label.chars().count() as i32 * LABEL_CHAR_PX));
        }
        // No two labels on one row overlap.
        for (i, a) in placed.iter().enumerate() {
            for b in &placed[i + 1..] {
                if a.1 == b.1 {
                    assert!(a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0, "{a:?} {b:?}");
                }
            }
        }
    }

    #[test]
    fn the_legend_lies_outside_both_plotting_areas() {
        let data = full_run();
        let (svg, layout) = render_svg(&data).unwrap();
        for panel in &layout.panels {
            assert!(!layout.legend.overlaps(panel), "{layout:?}");
        }
        let texts = texts(&svg);
        for entry in data
            .sites
            .iter()
            .map(String::as_str)
            .chain(["scenario step"])
        {
            let (at, _) = texts.iter().find(|(_, t)| t == entry).unwrap();
            assert!(layout.legend.contains(*at), "{entry} at {at:?}: {layout:?}");
        }
    }

    #[test]
    fn a_rho_beyond_the_axis_is_drawn_at_the_top_with_a_marker_and_a_note() {
        let mut data = full_run();
        let over = [30, 31, 32];
        for t in over {
            data.points[t].rho[0] = Some(38.0);
        }
        let axis = rho_axis(&data);
        assert!((axis.top - RHO_CEILING).abs() < 1e-12, "{axis:?}");
        assert_eq!(axis.beyond, Some(38.0));
        let (svg, layout) = render_svg(&data).unwrap();
        // One marker per point beyond the axis, at the rho panel's top, plus the legend's.
        let markers: Vec<&str> = svg.split("<polygon").skip(1).collect();
        assert_eq!(markers.len(), over.len() + 1, "{svg}");
        let rho_top = layout.panels[1].top;
        let at_top = markers
            .iter()
            .filter(|m| {
                let points = m
                    .split("points=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                let ys: Vec<i32> = points
                    .split_whitespace()
                    .map(|xy| xy.split(',').nth(1).unwrap().parse().unwrap())
                    .collect();
                ys.iter().min().unwrap() < &rho_top && ys.iter().max().unwrap() > &rho_top
            })
            .count();
        assert_eq!(at_top, over.len());
        let texts = texts(&svg);
        let (at, _) = texts
            .iter()
            .find(|(_, t)| t == "rho &gt; 4.0 (max 38.0)")
            .unwrap_or_else(|| panic!("{texts:?}"));
        assert!(layout.legend.contains(*at));
        assert!(
            svg.contains("\u{25b2}: rho &gt; 4.0"),
            "the caption says so"
        );
    }

    #[test]
    fn a_rho_within_the_axis_draws_no_marker_and_no_note() {
        let data = full_run();
        assert_eq!(rho_axis(&data).beyond, None);
        let (svg, _) = render_svg(&data).unwrap();
        assert!(
            !svg.contains("<polygon") && !svg.contains("rho &gt;"),
            "{svg}"
        );
    }

    #[test]
    fn labels_too_close_for_one_row_stack_into_the_next_and_reuse_freed_rows() {
        let rows = label_rows(&[(0, 100), (50, 150), (90, 200), (300, 400)], 3);
        assert_eq!(rows, vec![0, 1, 2, 0]);
        // With every row taken, the one that frees first is reused.
        assert_eq!(
            label_rows(&[(0, 100), (10, 50), (20, 60)], 2),
            vec![0, 1, 1]
        );
    }
}
