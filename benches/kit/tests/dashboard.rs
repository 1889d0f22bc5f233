//! The Grafana dashboard shipped in docs/dashboards. Grafana's own dashboard linter is not
//! obtainable here (the Go module proxy refuses `github.com/grafana/dashboard-linter`), so
//! the dashboard is checked against what it must agree with: its structure is a Grafana
//! dashboard's, every query parses as `PromQL` (Prometheus's `promtool check rules`), and
//! every series a query or an alert rule names is one the daemons of a running local grid
//! export on their `/metrics`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use grid_kit::local_grid::{Cadence, GridSpec, LocalGrid, SiteSpec, TransportMode};
use grid_sim::site_model::SiteConfig;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(docs().join("dashboards/grid.json")).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every query of the dashboard: its panels' targets and its query variables.
fn queries(d: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push(
                t["expr"]
                    .as_str()
                    .expect("every target has an expr")
                    .to_owned(),
            );
        }
    }
    for var in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"]["query"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// The series names a `PromQL` text names: every `grid_` identifier outside quotes.
fn series_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut quoted = false;
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'"' {
            quoted = !quoted;
            i += 1;
            continue;
        }
        let starts = !quoted
            && expr[i..].starts_with("grid_")
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if starts {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

/// What an exposition declares and carries: `# TYPE` families and sample names.
fn exported(text: &str, into: &mut BTreeSet<String>) {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(family) = rest.split_whitespace().next() {
                into.insert(family.to_owned());
                into.insert(format!("{family}_total"));
            }
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            into.insert(name.to_owned());
        }
    }
}

#[test]
fn the_dashboard_is_shaped_as_grafana_reads_it() {
    let d = dashboard();
    assert!(
        d["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40)
    );
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["schemaVersion"].as_u64().is_some());
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vars.contains(&"datasource"), "{vars:?}");
    let mut ids = BTreeSet::new();
    for panel in d["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id reused"
        );
        let g = &panel["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "{title}: {g}");
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            !title.is_empty() && panel["description"].as_str().is_some(),
            "{panel}"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        let refs: BTreeSet<&str> = targets.iter().filter_map(|t| t["refId"].as_str()).collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds");
    }
}

#[test]
fn every_dashboard_query_parses_as_promql() {
    // Each query as a recording rule, Grafana's variables given values a query would have.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries(&dashboard()).iter().enumerate() {
        if q.starts_with("label_values(") {
            continue;
        }
        let q = q
            .replace("$__rate_interval", "1m")
            .replace("$gateway_job", ".+")
            .replace("$operator_job", ".+");
        let _ = writeln!(
            rules,
            "      - record: dashboard:query_{i}\n        expr: '{}'",
            q.replace('\'', "''")
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard.rules.yml");
    std::fs::write(&path, &rules).unwrap();
    if let Err(e) = grid_kit::promtool::check_rules(&path) {
        panic!("{e}\n{rules}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_the_alerts_name_is_exported_by_a_running_grid() {
    let spec = GridSpec {
        model: "llama".to_owned(),
        sites: vec![
            SiteSpec::simulated(SiteConfig::new("a", 1, 2), "llama", 50.0, 3),
            SiteSpec::simulated(SiteConfig::new("b", 1, 2), "llama", 50.0, 4),
        ],
        cadence: Cadence::FAST,
        transport: TransportMode::Poll,
        shedding: None,
    };
    let grid = LocalGrid::start_measured(&spec, Duration::from_secs(20))
        .await
        .unwrap();
    let mut names = BTreeSet::new();
    let gateway = grid_kit::operator_harness::read_metrics(grid.gateway_addr())
        .await
        .unwrap();
    exported(&gateway, &mut names);
    for site in ["a", "b"] {
        let addr = grid.operator_metrics_addr(site).unwrap();
        exported(
            &grid_kit::operator_harness::read_metrics(addr)
                .await
                .unwrap(),
            &mut names,
        );
    }
    grid.shutdown().await;
    let rules = std::fs::read_to_string(docs().join("alerts/grid.rules.yml")).unwrap();
    let mut wanted = BTreeSet::new();
    for q in queries(&dashboard()) {
        wanted.extend(series_names(&q));
    }
    let in_dashboard = wanted.len();
    wanted.extend(series_names(&rules));
    assert!(in_dashboard >= 25, "{wanted:?}");
    let missing: Vec<&String> = wanted.iter().filter(|n| !names.contains(*n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn a_series_name_is_read_outside_quotes_only() {
    let names = series_names(
        r#"sum by (site) (rate(grid_gateway_retries_total{cause="grid_x"}[1m])) / grid_a:b"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["grid_a:b", "grid_gateway_retries_total"]
    );
}
