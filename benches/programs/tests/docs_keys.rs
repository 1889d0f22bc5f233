//! Every configuration key the docs name exists: each backticked key path in docs/ whose
//! first part is a top-level key of either daemon's file (`operator.pollIntervalSeconds`,
//! `peers[].timeoutSeconds`, `models[0].candidates[1].baseUrl`, ...) is set in that
//! daemon's shipped example and the file is read by the daemon's own parser, which
//! refuses unknown keys: a key the docs name that neither parser knows fails the test.

use std::path::{Path, PathBuf};

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

/// The backticked spans of `text`.
fn spans(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

/// Last parts that make a span a file or host name (`operator.md`, `operator.a.example`),
/// not a key path.
const NOT_KEYS: [&str; 12] = [
    "md", "toml", "yaml", "yml", "json", "crt", "pem", "example", "rs", "svg", "test", "local",
];

/// `span` as a key path (`[N]` read as `[]`), when it reads as one.
fn key_path(span: &str) -> Option<Vec<(String, bool)>> {
    if span
        .rsplit('.')
        .next()
        .is_some_and(|last| span.contains('.') && NOT_KEYS.contains(&last))
    {
        return None;
    }
    let mut parts = Vec::new();
    for part in span.split('.') {
        let (name, rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let array = !rest.is_empty();
        let index_ok = rest.is_empty()
            || (rest.starts_with('[')
                && rest.ends_with(']')
                && rest[1..rest.len() - 1].bytes().all(|b| b.is_ascii_digit()));
        let name_ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !(index_ok && name_ok) {
            return None;
        }
        parts.push((name.to_owned(), array));
    }
    Some(parts)
}

/// Sets the key `path` in `table` (descending into the first element of an array of
/// tables, creating what is missing); `false` when the path runs through a value that is
/// not a table (a file name such as `site.crt`, not a key).
fn set(table: &mut toml::Table, path: &[(String, bool)]) -> bool {
    let Some(((name, array), rest)) = path.split_first() else {
        return false;
    };
    if rest.is_empty() {
        table
            .entry(name.clone())
            .or_insert_with(|| toml::Value::String("docs-key-probe".into()));
        return true;
    }
    let entry = table.entry(name.clone()).or_insert_with(|| {
        if *array {
            toml::Value::Array(vec![toml::Value::Table(toml::Table::new())])
        } else {
            toml::Value::Table(toml::Table::new())
        }
    });
    let inner = match entry {
        toml::Value::Table(t) => t,
        toml::Value::Array(items) => match items.first_mut() {
            Some(toml::Value::Table(t)) => t,
            _ => return false,
        },
        _ => return false,
    };
    set(inner, rest)
}

/// Whether the daemon whose example is `example` knows `path`: its parser does not refuse
/// the file for an unknown field (the example alone has none, so any is the path's).
fn known(example: &toml::Table, path: &[(String, bool)], parse: &dyn Fn(&str) -> String) -> bool {
    let mut table = example.clone();
    if !set(&mut table, path) {
        return false;
    }
    !parse(&toml::to_string(&table).unwrap()).contains("unknown field")
}

fn example(name: &str) -> toml::Table {
    toml::from_str(&std::fs::read_to_string(docs().join("examples").join(name)).unwrap()).unwrap()
}

fn gateway_refusal(text: &str) -> String {
    grid_gateway::Config::from_toml_str(text)
        .err()
        .map(|e| format!("{e:?} {e}"))
        .unwrap_or_default()
}

fn operator_refusal(text: &str) -> String {
    grid_operatord::config::Config::from_toml(text, Path::new("operator.toml"))
        .err()
        .map(|e| format!("{e:?} {e}"))
        .unwrap_or_default()
}

/// Every key path the docs name, with where: `(file, span)`.
fn documented(roots: &[String]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(docs())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md"));
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for span in spans(&text) {
            let Some(path) = key_path(span) else { continue };
            let root = &path[0].0;
            let nested = path.len() > 1 || path[0].1;
            if roots.contains(root) && (nested || root.chars().any(|c| c.is_ascii_uppercase())) {
                let name = file.file_name().unwrap().to_string_lossy().into_owned();
                found.push((name, span.to_owned()));
            }
        }
    }
    found
}

#[test]
fn every_configuration_key_the_docs_name_is_one_a_daemon_reads() {
    let (gateway, operator) = (example("gateway.toml"), example("operator.toml"));
    // The examples themselves are read by their daemons.
    assert_eq!(gateway_refusal(&toml::to_string(&gateway).unwrap()), "");
    assert_eq!(operator_refusal(&toml::to_string(&operator).unwrap()), "");
    let mut roots: Vec<String> = gateway.keys().chain(operator.keys()).cloned().collect();
    // Top-level keys the examples leave at their defaults.
    roots.extend(
        [
            "extProcListen",
            "availability",
            "routing",
            "intervals",
            "signalTransport",
        ]
        .map(String::from),
    );
    let named = documented(&roots);
    assert!(named.len() > 60, "{} keys found: {named:?}", named.len());
    let unknown: Vec<_> = named
        .iter()
        .filter(|(_, span)| {
            let path = key_path(span).unwrap();
            let mut probe = path.clone();
            // A file name under a key (`site.crt`) is not a key path.
            if !set(&mut gateway.clone(), &probe) && !set(&mut operator.clone(), &probe) {
                return false;
            }
            probe.truncate(path.len());
            !known(&gateway, &probe, &gateway_refusal)
                && !known(&operator, &probe, &operator_refusal)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "keys the docs name that no daemon reads: {unknown:?}"
    );
}

#[test]
fn a_key_no_daemon_reads_is_found() {
    let gateway = example("gateway.toml");
    let path = key_path("availability.shedding.full_after_ms").unwrap();
    assert!(!known(&gateway, &path, &gateway_refusal));
    let path = key_path("availability.shedding.fullAfterSeconds").unwrap();
    assert!(known(&gateway, &path, &gateway_refusal));
    let path = key_path("models[0].candidates[1].baseUrl").unwrap();
    assert!(known(&gateway, &path, &gateway_refusal));
    let operator = example("operator.toml");
    assert!(!known(&operator, &path, &operator_refusal), "a gateway key");
}

/// grid-score's settings the gateway's file sets under another name: a runbook names the
/// file's key, not the field.
const SCORE_FIELDS_WITH_KEYS: [&str; 6] = [
    "full_after_ms",
    "room_after_ms",
    "retry_after_ms",
    "unavailable_retry_after_ms",
    "unavailable_retry_after_s",
    "turnover_ms",
];

#[test]
fn the_operations_runbook_names_the_files_keys_not_grid_scores_fields() {
    let text = std::fs::read_to_string(docs().join("operations.md")).unwrap();
    let stale: Vec<&str> = spans(&text)
        .filter(|s| SCORE_FIELDS_WITH_KEYS.contains(s))
        .collect();
    assert!(stale.is_empty(), "{stale:?}");
}

/// The defaults a page's configuration table gives, by key (`| `key` | default | ...`).
fn table_defaults(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((key.to_owned(), (*cells.get(2)?).to_owned()))
        })
        .collect()
}

#[test]
fn a_default_given_in_prose_is_the_one_its_table_gives() {
    for page in ["gateway.md", "operator.md"] {
        let text = std::fs::read_to_string(docs().join(page)).unwrap();
        let defaults = table_defaults(&text);
        let flat = text.replace('\n', " ");
        for (key, default) in &defaults {
            let said = format!("`{key}` (default ");
            for (at, _) in flat.match_indices(&said) {
                let rest = &flat[at + said.len()..];
                let stated = rest.split(')').next().unwrap_or_default();
                // "2 s" in prose for a table's "2" (seconds keys), or the same text.
                let number = stated.trim_end_matches(" s").trim();
                assert!(
                    number == default.trim() || stated.trim() == default.trim(),
                    "{page}: `{key}` defaults to {default:?} in its table but {stated:?} in prose"
                );
            }
        }
    }
}

#[test]
fn the_operator_example_says_gossip_is_the_default_and_both_modes_are_read() {
    let text = std::fs::read_to_string(docs().join("examples/operator.toml")).unwrap();
    let about_mode: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("[signalTransport]"))
        .take_while(|l| !l.starts_with("mode"))
        .collect();
    let said = about_mode.join("\n");
    assert!(said.contains("`gossip` (the default"), "{said}");
    assert!(!said.contains("refused"), "{said}");
    for mode in ["gossip", "poll"] {
        let mut table = example("operator.toml");
        table["signalTransport"]["mode"] = toml::Value::String(mode.into());
        assert_eq!(
            operator_refusal(&toml::to_string(&table).unwrap()),
            "",
            "{mode}"
        );
    }
}

#[test]
fn the_fault_suites_documented_duration_covers_its_holds_and_is_not_double_them() {
    use grid_programs::fault_suite::{Fault, WARMUP};
    let held: std::time::Duration = Fault::ALL.iter().map(|f| WARMUP + f.hold()).sum();
    for (page, marker) in [
        ("docs/operations.md", "# every fault, ~"),
        ("README.md", "# the fault suite (~"),
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(page);
        let text = std::fs::read_to_string(path).unwrap();
        let at = text
            .find(marker)
            .unwrap_or_else(|| panic!("{page}: {marker}"));
        let minutes: u64 = text[at + marker.len()..]
            .split(" min")
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{page}: no minutes after {marker}"));
        let said = std::time::Duration::from_secs(minutes * 60);
        // Starting three sites and letting them settle adds to the holds, but less than
        // the holds themselves (322 s measured against 258 s held).
        assert!(
            said >= held && said <= held * 2,
            "{page}: ~{minutes} min for {held:?} of holds"
        );
    }
}
