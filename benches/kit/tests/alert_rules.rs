//! The alert rules shipped in docs/alerts are checked and unit-tested by Prometheus's own
//! `promtool` (Debian's `prometheus` package, installed by `.ci/install`): every rule
//! parses, and every alert has a test that fires it and one that must not.

use std::path::PathBuf;

fn alerts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/alerts")
}

/// The names after `key` on lines of `text` that start (after blanks and `- `) with it.
fn names(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start().trim_start_matches("- ");
            l.strip_prefix(key).map(|rest| rest.trim().to_owned())
        })
        .collect()
}

#[test]
fn promtool_checks_every_alert_rule() {
    let report = grid_kit::promtool::check_rules(&alerts_dir().join("grid.rules.yml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(report.contains("SUCCESS"), "{report}");
}

#[test]
fn promtool_unit_tests_pass_and_every_alert_has_its_own_test() {
    let dir = alerts_dir();
    let report = grid_kit::promtool::test_rules(&dir.join("grid.rules.test.yml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(report.contains("SUCCESS"), "{report}");
    let rules = std::fs::read_to_string(dir.join("grid.rules.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("grid.rules.test.yml")).unwrap();
    let alerts = names(&rules, "alert:");
    assert!(alerts.len() >= 10, "{alerts:?}");
    let test_names = names(&tests, "name:");
    let evaluated = names(&tests, "alertname:");
    for alert in &alerts {
        assert!(test_names.contains(alert), "no test named {alert}");
        assert!(
            evaluated.iter().filter(|a| *a == alert).count() >= 2,
            "{alert}: a case that fires and one that does not"
        );
    }
}

#[test]
fn a_broken_rule_is_refused_by_promtool() {
    // The check is real: promtool refuses a rule whose expression does not parse.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.rules.yml");
    std::fs::write(
        &path,
        "groups:\n  - name: g\n    rules:\n      - alert: Bad\n        expr: grid_gateway_model_routable ==\n",
    )
    .unwrap();
    assert!(grid_kit::promtool::check_rules(&path).is_err());
}
