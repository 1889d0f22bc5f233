//! `docs/metrics.md` names every EPP spelling grid reads (router-subsystem spellings are
//! abbreviated there), every series published, every Ready reason and every refusal label
//! (refused samples and refused exposition lines).

use grid_signals::epp::{Generation, NAME_TABLE, PROVIDER_SERIES};
use grid_signals::epp::{ReadyReason, SampleRejection, ScrapeFailure};
use grid_signals::exposition::SyntaxError;

fn doc() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_metrics_doc_names_everything_the_code_reads_and_publishes() {
    let doc = doc();
    let mut missing = Vec::new();
    let mut expect = |word: &str| {
        if !doc.contains(&format!("`{word}`")) && !doc.contains(&format!("`{word},")) {
            missing.push(word.to_owned());
        }
    };
    for (name, metric, generation) in NAME_TABLE {
        if *generation != Generation::Router {
            expect(name);
        }
        expect(metric.current_name());
    }
    for series in PROVIDER_SERIES {
        expect(series);
    }
    for reason in ReadyReason::all() {
        expect(reason.as_str());
    }
    for failure in ScrapeFailure::ALL {
        expect(failure.as_str());
    }
    for rejection in SampleRejection::ALL {
        expect(rejection.as_str());
    }
    for reason in SyntaxError::ALL {
        expect(reason.as_str());
    }
    expect("grid_operator_scrape_lines_refused_total{provider,reason}");
    assert!(
        missing.is_empty(),
        "docs/metrics.md does not mention: {missing:?}"
    );
}
