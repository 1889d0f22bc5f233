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

/// Every leaf field path under `spec` and `status` of a CRD's schema (`spec.a.b`), not
/// descending into the metav1.Condition items or the opaque feedback evidence.
fn field_paths(schema: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        out.push(prefix.to_owned());
        return;
    };
    for (name, sub) in props {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        if ["conditions", "gatewayFeedback"].contains(&name.as_str()) {
            out.push(path);
        } else {
            field_paths(sub, &path, out);
        }
    }
}

#[test]
fn docs_crds_md_documents_every_field_and_every_condition_reason() {
    use grid_signals::epp::ReadyReason;
    use kube::CustomResourceExt as _;
    let doc = include_str!("../../docs/crds.md");
    let crds = [
        grid_operatord::controller::resources::GridNetwork::crd(),
        grid_operatord::controller::resources::GridSite::crd(),
        grid_operatord::controller::resources::InferenceProvider::crd(),
    ];
    for crd in crds {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut paths = Vec::new();
        for part in ["spec", "status"] {
            if let Some(sub) = schema.pointer(&format!("/openAPIV3Schema/properties/{part}")) {
                field_paths(sub, part, &mut paths);
            }
        }
        assert!(paths.len() >= 3, "{paths:?}");
        for path in paths {
            assert!(
                doc.contains(&format!("`{path}`")),
                "docs/crds.md does not document {}.{path}",
                crd.spec.names.kind
            );
        }
    }
    let reasons: Vec<ReadyReason> = ReadyReason::all().collect();
    assert_eq!(
        reasons.len(),
        grid_signals::epp::ReadyReasonLabel::ALL.len(),
        "every Ready reason is listed here"
    );
    for reason in reasons {
        assert!(
            doc.contains(&format!("| `{}` |", reason.as_str())),
            "docs/crds.md does not list Ready reason {}",
            reason.as_str()
        );
    }
    for reason in [
        "ReadingsRejected",
        "NoRejectedReadings",
        "UnresolvedEvidenceExpired",
    ] {
        assert!(doc.contains(&format!("| `{reason}` |")), "{reason}");
    }
}
