//! Exposition parsing throughput: this crate's parser against the published Rust parsers
//! (`prometheus-parse`, `nom-openmetrics`, `prom_text_format_parser`), on the real
//! alltypes scrape and on a synthetic 1 MiB EPP-shaped exposition, in one run.
//!
//! After criterion has measured every pair, the bench prints MiB/s per parser and the
//! ratio of ours to each competitor, read back from criterion's own estimates. A
//! competitor that cannot parse an input is reported as such, not skipped silently.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{Criterion, Throughput};
use grid_signals::exposition::{MAX_EXPOSITION_BYTES, samples};
use grid_sim::epp_exposition::epp_exposition;

/// What a parser run hands back, to check it parsed the whole input: a sample count.
type ParseFn = fn(&str) -> Result<usize, String>;

/// Ours, strict mode: every sample validated (names, labels, escapes, value, timestamp).
fn ours(body: &str) -> Result<usize, String> {
    let mut count = 0;
    for sample in samples(body.as_bytes()) {
        let sample = sample.map_err(|e| e.to_string())?;
        black_box(&sample);
        count += 1;
    }
    Ok(count)
}

/// Ours, strict mode, and every label pair split out as well (what a caller that looks at
/// all labels pays).
fn ours_all_labels(body: &str) -> Result<usize, String> {
    let mut count = 0;
    for sample in samples(body.as_bytes()) {
        let sample = sample.map_err(|e| e.to_string())?;
        for pair in sample.labels {
            black_box(pair);
        }
        black_box(sample.value);
        count += 1;
    }
    Ok(count)
}

fn prometheus_parse(body: &str) -> Result<usize, String> {
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).map_err(|e| e.to_string())?;
    Ok(black_box(scrape).samples.len())
}

fn nom_openmetrics(body: &str) -> Result<usize, String> {
    // `prometheus` wants no `# EOF`; `openmetrics` requires it: use the one that fits.
    let parsed = if body.trim_end().ends_with("# EOF") {
        nom_openmetrics::parser::openmetrics(body)
    } else {
        nom_openmetrics::parser::prometheus(body)
    };
    let (rest, families) =
        parsed.map_err(|e| format!("{e:?}").chars().take(200).collect::<String>())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes left unparsed", rest.len()));
    }
    Ok(black_box(families).iter().map(|f| f.samples.len()).sum())
}

fn prom_text_format_parser(body: &str) -> Result<usize, String> {
    let scrape = prom_text_format_parser::Scrape::parse(body).map_err(|e| format!("{e:?}"))?;
    Ok(black_box(scrape).metrics.len())
}

const PARSERS: [(&str, ParseFn); 5] = [
    ("ours", ours),
    ("ours_all_labels", ours_all_labels),
    ("prometheus-parse", prometheus_parse),
    ("nom-openmetrics", nom_openmetrics),
    ("prom_text_format_parser", prom_text_format_parser),
];

fn inputs() -> Vec<(&'static str, String)> {
    let alltypes = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/prometheus/alltypes.237mfs.prom.txt");
    let alltypes = std::fs::read_to_string(&alltypes)
        .unwrap_or_else(|e| panic!("{}: {e}", alltypes.display()));
    vec![
        ("alltypes", alltypes),
        ("epp_1mib", epp_exposition(MAX_EXPOSITION_BYTES)),
    ]
}

fn output_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion-exposition")
}

/// Mean time per iteration, in nanoseconds, from criterion's saved estimates.
fn mean_ns(group: &str, parser: &str) -> Option<f64> {
    let path = output_dir()
        .join(group)
        .join(parser)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    // The file is criterion's JSON; `"mean":{"confidence_interval":{...},"point_estimate":X`.
    let mean = &text[text.find("\"mean\"")?..];
    let at = mean.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let end = mean[at..].find([',', '}'])?;
    mean[at..at + end].trim().parse().ok()
}

fn main() {
    // Only a full measuring run reports; `--test`/`--list` runs and old estimates from
    // an earlier run must not produce figures.
    let measuring = !std::env::args().any(|a| a == "--test" || a == "--list");
    if measuring {
        let _ = std::fs::remove_dir_all(output_dir());
    }
    let mut criterion = Criterion::default()
        .output_directory(&output_dir())
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();

    let inputs = inputs();
    let mut refused: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for (input, body) in &inputs {
        let mut group = criterion.benchmark_group(format!("exposition_{input}"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        for (name, parse) in PARSERS {
            match parse(body) {
                Ok(count) => println!("{input}: {name} parses {count} samples/metrics"),
                Err(e) => {
                    println!("{input}: {name} CANNOT PARSE this input: {e}");
                    refused.insert((*input, name), e);
                    continue;
                }
            }
            group.bench_function(name, |b| b.iter(|| parse(black_box(body))));
        }
        group.finish();
    }
    criterion.final_summary();
    if measuring {
        report(&inputs, &refused);
    }
}

fn report(inputs: &[(&str, String)], refused: &BTreeMap<(&str, &str), String>) {
    println!("\nexposition throughput (MiB/s, criterion mean) and ours / competitor:");
    for (input, body) in inputs {
        let group = format!("exposition_{input}");
        let mib = body.len() as f64 / f64::from(1u32 << 20);
        let speed = |parser: &str| mean_ns(&group, parser).map(|ns| mib / (ns * 1e-9));
        let Some(our_speed) = speed("ours") else {
            println!("{input}: not measured in this mode (run `cargo bench` for figures)");
            continue;
        };
        println!("{input} ({} bytes):", body.len());
        let mut fastest_competitor = 0.0f64;
        for (name, _) in PARSERS {
            if refused.contains_key(&(*input, name)) {
                println!("  {name:<26} cannot parse this input");
                continue;
            }
            let Some(s) = speed(name) else { continue };
            if name.starts_with("ours") {
                println!("  {name:<26} {s:>9.1} MiB/s");
            } else {
                fastest_competitor = fastest_competitor.max(s);
                println!(
                    "  {name:<26} {s:>9.1} MiB/s   ours/it = {:.1}x",
                    our_speed / s
                );
            }
        }
        if fastest_competitor > 0.0 {
            println!(
                "  ours vs fastest competitor: {:.1}x (target >= 5x)",
                our_speed / fastest_competitor
            );
        }
    }
}
