//! Every real exposition in the shared fixtures parses strictly and leniently without a
//! single refused line.

use std::path::PathBuf;

use grid_signals::exposition::{lines, parse_strict};

fn fixture_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    let mut files = Vec::new();
    for dir in ["epp", "prometheus"] {
        let entries = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("fixtures dir {}: {e}", root.join(dir).display()));
        for entry in entries {
            files.push(entry.unwrap().path());
        }
    }
    files.sort();
    files
}

#[test]
fn every_fixture_parses_strictly_and_leniently() {
    let files = fixture_files();
    assert!(files.len() >= 41, "found only {} fixtures", files.len());
    for path in files {
        let body = std::fs::read(&path).unwrap();
        let strict = parse_strict(&body).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!strict.is_empty(), "{} has no samples", path.display());
        let refused = lines(&body).filter(Result::is_err).count();
        assert_eq!(refused, 0, "{}", path.display());
    }
}
