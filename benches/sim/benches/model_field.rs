//! The request path's `model` scan (`grid_score::model_field::find_model`) against the
//! published peer that would do the same job: `serde_json` deserializing the body into a
//! struct that keeps only a borrowed `model` (every other field skipped as
//! `IgnoredAny`), on three bodies: the comparison harness's short chat request (97
//! bytes), a 16 KiB prompt, and a 256 KiB chat history of 64 turns. Each row's ratio is
//! taken in the same run.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use grid_score::model_field::find_model;

/// What `serde_json` is asked for: the model, borrowed when it has no escapes.
#[derive(serde::Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

/// `n` bytes of plain prose (letters, spaces, punctuation; no escapes).
fn prose(n: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "grid", "routes", "each", "request", "to", "a", "site,", "quickly.",
    ];
    let mut out = String::with_capacity(n + 16);
    let mut i = 0;
    while out.len() < n {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i += 1;
    }
    out.truncate(n);
    out
}

fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let short = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "How loaded is the grid?"}],
        "stream": false,
    });
    let prompt = serde_json::json!({
        "messages": [{"role": "user", "content": prose(16 * 1024)}],
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "max_tokens": 256,
    });
    let turns: Vec<_> = (0..64)
        .map(|i| {
            serde_json::json!({
                "role": if i % 2 == 0 { "user" } else { "assistant" },
                "content": format!("{}\n\n\"quoted\" line {i}", prose(4 * 1024 - 32)),
            })
        })
        .collect();
    let history = serde_json::json!({
        "messages": turns,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "stream": true,
    });
    [
        ("short_chat", short),
        ("prompt_16k", prompt),
        ("history_256k", history),
    ]
    .into_iter()
    .map(|(name, v)| (name, serde_json::to_vec(&v).expect("json")))
    .collect()
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    for (name, body) in bodies() {
        // Both must find the same model, or the comparison is not of the same job.
        let ours = find_model(&body).expect("ours reads it");
        let theirs: ModelOnly<'_> = serde_json::from_slice(&body).expect("serde reads it");
        assert_eq!(ours, theirs.model);
        let mut g = c.benchmark_group(format!("model_field/{name}"));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function("ours", |b| b.iter(|| find_model(black_box(&body)).is_ok()));
        g.bench_function("serde_json", |b| {
            b.iter(|| serde_json::from_slice::<ModelOnly<'_>>(black_box(&body)).is_ok());
        });
        g.finish();
    }
    c.final_summary();
}
