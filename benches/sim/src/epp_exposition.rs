//! A deterministic, EPP-shaped exposition of about a given size, for the exposition bench
//! and anything else that wants a realistic large scrape without a live EPP.
//!
//! Shape, after llm-d's endpoint picker: per-endpoint gauges for hundreds of model-server
//! endpoints, and per-model latency/size histograms with 20+ buckets, every sample
//! carrying 8+ labels, `", "` between labels in some families (as the EPP fixtures have),
//! `HELP`/`TYPE` lines, integer and fractional values in Go's formatting.

use std::fmt::Write as _;

/// Bucket bounds of the request-duration histograms (the EPP's own, as text).
const DURATION_BUCKETS: [&str; 21] = [
    "0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1", "1.25", "1.5", "2", "3", "4",
    "5", "6", "8", "10", "15", "20", "+Inf",
];

/// Bucket bounds of the size histograms.
const SIZE_BUCKETS: [&str; 13] = [
    "64", "128", "256", "512", "1024", "2048", "4096", "8192", "16384", "32768", "65536", "131072",
    "+Inf",
];

/// A tiny deterministic generator (xorshift64*), so every run builds the same bytes.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Builds the exposition, stopping before `target_bytes` would be passed (so a target of
/// `MAX_EXPOSITION_BYTES` stays under the cap). Endpoints and models are many: 400
/// endpoints across 8 namespaces and 120 models.
pub fn epp_exposition(target_bytes: usize) -> String {
    let mut out = String::with_capacity(target_bytes);
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut chunk = String::new();

    chunk.push_str("# HELP llm_d_epp_per_endpoint_queue_size [ALPHA] Per-endpoint queue size.\n");
    chunk.push_str("# TYPE llm_d_epp_per_endpoint_queue_size gauge\n");
    for endpoint in 0..400u64 {
        let _ = writeln!(
            chunk,
            "llm_d_epp_per_endpoint_queue_size{{inference_pool=\"pool-{p}\", model_server_endpoint=\"10.{a}.{b}.{c}:8000\", namespace=\"ns-{ns}\", pod_name=\"vllm-decode-{endpoint}-{h:x}\", port=\"8000\", role=\"decode\", zone=\"zone-{z}\", node=\"gpu-node-{n}\"}} {v}",
            p = endpoint % 4,
            a = endpoint / 256,
            b = endpoint % 256,
            c = 1 + endpoint % 250,
            ns = endpoint % 8,
            h = rng.next() & 0xff_ffff,
            z = endpoint % 3,
            n = endpoint / 8,
            v = rng.below(64),
        );
    }
    push_bounded(&mut out, &mut chunk, target_bytes);

    let mut model = 0u64;
    loop {
        let model_labels = format!(
            "fairness_id=\"tenant-{f}\",inference_pool=\"pool-{p}\",model_name=\"org-{o}/model-{model}-instruct\",namespace=\"ns-{ns}\",priority=\"{pr}\",target_model_name=\"org-{o}/model-{model}-instruct-lora-{l}\",objective=\"obj-{model}\",picker=\"epp-{pk}\"",
            f = model % 16,
            p = model % 4,
            o = model % 12,
            ns = model % 8,
            pr = model % 3,
            l = model % 5,
            pk = model % 2,
        );
        if model.is_multiple_of(2) {
            write_histogram(
                &mut chunk,
                "llm_d_epp_request_duration_seconds",
                &model_labels,
                &DURATION_BUCKETS,
                &mut rng,
                true,
            );
        } else {
            write_histogram(
                &mut chunk,
                "llm_d_epp_request_size_bytes",
                &model_labels,
                &SIZE_BUCKETS,
                &mut rng,
                false,
            );
        }
        let _ = writeln!(
            chunk,
            "llm_d_epp_running_requests{{{model_labels}, state=\"running\"}} {}",
            rng.below(500)
        );
        if !push_bounded(&mut out, &mut chunk, target_bytes) {
            return out;
        }
        model += 1;
    }
}

/// Appends `chunk` to `out` if it fits under `target`; returns whether it did.
fn push_bounded(out: &mut String, chunk: &mut String, target: usize) -> bool {
    let fits = out.len() + chunk.len() <= target;
    if fits {
        out.push_str(chunk);
    }
    chunk.clear();
    fits
}

fn write_histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds: &[&str],
    rng: &mut Xorshift,
    seconds: bool,
) {
    let _ = writeln!(out, "# HELP {name} [ALPHA] Distribution per model.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0u64;
    for le in bounds {
        cumulative += rng.below(40);
        // Half the families put ", " between labels, as some EPP fixtures do.
        let sep = if seconds { ", " } else { "," };
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
        );
    }
    let sum = if seconds {
        cumulative as f64 * 0.173_5 + rng.below(1000) as f64 * 1e-7
    } else {
        (cumulative * 1031) as f64
    };
    let mut text = Vec::new();
    grid_signals::exposition::write_value(&mut text, sum);
    let sum = String::from_utf8_lossy(&text);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

#[cfg(test)]
mod tests {
    use super::epp_exposition;

    #[test]
    fn the_exposition_is_deterministic_and_within_the_target() {
        let a = epp_exposition(1 << 20);
        assert_eq!(a, epp_exposition(1 << 20));
        assert!(a.len() <= 1 << 20);
        assert!(a.len() > (1 << 20) - 8 * 1024, "{}", a.len());
    }

    #[test]
    fn the_exposition_parses_strictly_with_many_labels() {
        let body = epp_exposition(1 << 20);
        let samples = grid_signals::exposition::parse_strict(body.as_bytes()).unwrap();
        assert!(samples.len() > 3000, "{}", samples.len());
        assert!(samples.iter().all(|s| s.labels.len() >= 8));
    }
}
