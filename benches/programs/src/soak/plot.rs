//! The soak's pictures: one figure per process over the run (resident memory, open
//! descriptors), one line per process, with the warm-up and the two compared windows
//! shaded. SVG, by plotters.

use std::path::Path;

use plotters::prelude::*;

use grid_kit::Error;

use super::procs::ProcReading;
use super::verdict::{Track, Windows};

/// The SVG's size in pixels.
pub const WIDTH: u32 = 1100;
/// The SVG's size in pixels.
pub const HEIGHT: u32 = 560;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const WARMUP_GREY: RGBColor = RGBColor(235, 235, 235);
const WINDOW_BLUE: RGBColor = RGBColor(222, 235, 247);

/// One figure: its caption, its y axis and what it reads of each sample.
pub struct Figure<'a> {
    /// Above the plot.
    pub caption: &'a str,
    /// The y axis's description.
    pub y_desc: &'a str,
    /// The value drawn; a sample without it (a page not read) is skipped.
    pub value: fn(&ProcReading) -> Option<f64>,
}

/// Resident memory in MiB.
pub const MEMORY: Figure<'static> = Figure {
    caption: "Resident memory (VmRSS) per process; grey: warm-up, blue: the compared windows",
    y_desc: "MiB",
    value: |r| Some(r.rss_kib as f64 / 1024.0),
};

/// Open descriptors.
pub const DESCRIPTORS: Figure<'static> = Figure {
    caption: "Open file descriptors per process; grey: warm-up, blue: the compared windows",
    y_desc: "descriptors",
    value: |r| Some(r.fds as f64),
};

/// Series on each daemon's `/metrics`.
pub const SERIES: Figure<'static> = Figure {
    caption: "Series on /metrics per process; grey: warm-up, blue: the compared windows",
    y_desc: "series",
    value: |r| r.series.map(|n| n as f64),
};

/// Threads.
pub const THREADS: Figure<'static> = Figure {
    caption: "Threads per process; grey: warm-up, blue: the compared windows",
    y_desc: "threads",
    value: |r| Some(r.threads as f64),
};

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

/// Draws `figure` over `tracks` as SVG text, minutes on the x axis.
///
/// # Errors
///
/// When plotters fails to draw.
pub fn render(figure: &Figure<'_>, tracks: &[Track], windows: Windows) -> Result<String, Error> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x_max = tracks
            .iter()
            .flat_map(|t| t.samples.iter().map(|(s, _)| *s / 60.0))
            .fold(windows.late.1 / 60.0, f64::max);
        let y_max = tracks
            .iter()
            .flat_map(|t| t.samples.iter().filter_map(|(_, r)| (figure.value)(r)))
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .caption(figure.caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(plot_err)?;
        let shade = |(from, to): (f64, f64), color: RGBColor| {
            Rectangle::new([(from / 60.0, 0.0), (to / 60.0, y_max)], color.filled())
        };
        chart
            .draw_series([
                shade((0.0, windows.warmup_end_s), WARMUP_GREY),
                shade(windows.baseline, WINDOW_BLUE),
                shade(windows.late, WINDOW_BLUE),
            ])
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("minutes since the load started")
            .y_desc(figure.y_desc)
            .draw()
            .map_err(plot_err)?;
        for (i, track) in tracks.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points = track
                .samples
                .iter()
                .filter_map(|(s, r)| Some((*s / 60.0, (figure.value)(r)?)));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(plot_err)?
                .label(track.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Draws `figure` and writes it to `path`.
///
/// # Errors
///
/// When it cannot be drawn or written.
pub fn write(
    path: &Path,
    figure: &Figure<'_>,
    tracks: &[Track],
    windows: Windows,
) -> Result<(), Error> {
    let svg = render(figure, tracks, windows)?;
    std::fs::write(path, svg).map_err(|e| Error::Plot(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_figure_names_every_process_and_its_axis() {
        let tracks: Vec<Track> = ["gateway", "operator a"]
            .into_iter()
            .map(|name| Track {
                name: name.into(),
                samples: (0..=60)
                    .map(|i| {
                        let r = ProcReading {
                            rss_kib: 20_000 + i,
                            fds: 30,
                            ..ProcReading::default()
                        };
                        (i as f64 * 2.0, r)
                    })
                    .collect(),
                ..Track::default()
            })
            .collect();
        let svg = render(&MEMORY, &tracks, Windows::of(120.0, 30.0, 0.0).unwrap()).unwrap();
        for text in ["gateway", "operator a", "MiB", "Resident memory"] {
            assert!(svg.contains(text), "{text}");
        }
    }
}
