//! The Prometheus exposition both daemons serve on `GET /metrics`: prometheus-client
//! writes `OpenMetrics`; a caller whose `Accept` names it gets that, everyone else
//! (`curl`, `promtool check metrics`, a Prometheus configured for text) gets text 0.0.4.
//! One home, so the operator and the gateway answer the same way.

use std::fmt::Write as _;

use prometheus_client::registry::Registry;

/// Content type of the `OpenMetrics` answer (what prometheus-client writes), served to
/// callers whose `Accept` names it, as a Prometheus server's does.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the Prometheus text answer, served to everyone else (`curl`,
/// `promtool check metrics`).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What to answer a `GET /metrics` whose request headers are `headers`: the body and its
/// content type, chosen from `Accept`.
pub fn negotiate_for(registry: &Registry, headers: &http::HeaderMap) -> (String, &'static str) {
    let accept = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok());
    negotiate(registry, accept)
}

/// What to answer a `GET /metrics` whose `Accept` headers are `accept`: the body and
/// its content type.
pub fn negotiate<'a>(
    registry: &Registry,
    accept: impl IntoIterator<Item = &'a str>,
) -> (String, &'static str) {
    let openmetrics = render(registry);
    if wants_openmetrics(accept) {
        (openmetrics, OPENMETRICS_CONTENT_TYPE)
    } else {
        (to_text_004(&openmetrics), TEXT_CONTENT_TYPE)
    }
}

/// Whether any `Accept` value names `OpenMetrics`.
pub fn wants_openmetrics<'a>(accept: impl IntoIterator<Item = &'a str>) -> bool {
    accept
        .into_iter()
        .any(|v| v.contains("application/openmetrics-text"))
}

/// The text of `registry` as `/metrics` answers it.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Rewrites prometheus-client's `OpenMetrics` text as Prometheus text 0.0.4: a counter's
/// `HELP` and `TYPE` name its `_total` samples (`OpenMetrics` names the family without the
/// suffix), and the OpenMetrics-only `# UNIT` and `# EOF` lines are dropped.
pub fn to_text_004(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(previous) = help.replace(rest) {
                push_line(&mut out, "# HELP ", previous);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let rename = kind == "counter" && !name.ends_with("_total");
            let suffix = if rename { "_total" } else { "" };
            if let Some(h) = help.take() {
                let (help_name, text) = h.split_once(' ').unwrap_or((h, ""));
                if help_name == name {
                    let _ = writeln!(out, "# HELP {name}{suffix} {text}");
                } else {
                    push_line(&mut out, "# HELP ", h);
                }
            }
            let _ = writeln!(out, "# TYPE {name}{suffix} {kind}");
            continue;
        }
        if let Some(h) = help.take() {
            push_line(&mut out, "# HELP ", h);
        }
        push_line(&mut out, "", line);
    }
    if let Some(h) = help {
        push_line(&mut out, "# HELP ", h);
    }
    out
}

fn push_line(out: &mut String, prefix: &str, line: &str) {
    out.push_str(prefix);
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_renamed_to_their_samples_and_openmetrics_lines_dropped() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total{k=\"v\"} 1\n\
                  # HELP g A gauge.\n# TYPE g gauge\n# UNIT g seconds\ng 2\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total{k=\"v\"} 1\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 2\n"
        );
    }

    #[test]
    fn a_help_without_a_type_is_kept() {
        assert_eq!(
            to_text_004("# HELP x Lonely.\nx 1\n"),
            "# HELP x Lonely.\nx 1\n"
        );
    }
}
