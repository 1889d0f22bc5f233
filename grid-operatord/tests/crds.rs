//! The CRDs under `docs/crds/` are exactly what the resource types generate, and the
//! `crds` subcommand prints them: CI fails when a type changed and the files did not.

use grid_operatord::controller::crd_yaml::{crd_files, crds_yaml};

const REGENERATE: &str = "cargo run -p grid-operatord -- crds --out docs/crds";

#[test]
fn the_committed_crd_files_are_not_stale() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/crds");
    for (name, generated) in crd_files() {
        let committed = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("docs/crds/{name}: {e}; run `{REGENERATE}`"));
        assert!(
            committed == generated,
            "docs/crds/{name} is stale: the resource types changed; run `{REGENERATE}`"
        );
    }
    let listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed.len(),
        crd_files().len(),
        "no stray CRD file: {listed:?}"
    );
}

#[test]
fn the_crds_subcommand_prints_every_generated_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_grid-operatord"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), crds_yaml());
    assert_eq!(
        crds_yaml()
            .matches("kind: CustomResourceDefinition")
            .count(),
        3
    );
}

#[test]
fn the_binary_without_config_or_subcommand_says_what_to_give() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_grid-operatord"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
}
