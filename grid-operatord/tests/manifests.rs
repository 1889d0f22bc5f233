//! The generated CRDs and the example manifests under `docs/examples/kubernetes/` are
//! valid Kubernetes objects (`kubernetes-validate`, strict, from the `.venv` that
//! `.ci/install` makes), the example custom resources validate against the generated CRD
//! schemas, and they translate into a configuration the operator accepts.

use std::path::{Path, PathBuf};
use std::process::Command;

use grid_operatord::controller::resources::{GridNetwork, GridSite, InferenceProvider};
use grid_operatord::controller::translate::{Deployment, Resources, translate};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn venv(tool: &str) -> PathBuf {
    let path = root().join(".venv/bin").join(tool);
    assert!(
        path.exists(),
        "{} is missing: run `bash .ci/install` to create the venv with kubernetes-validate",
        path.display()
    );
    path
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("yaml"))
        })
        .collect();
    files.sort();
    files
}

fn run(mut command: Command) -> String {
    let out = command.current_dir(root()).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn the_crds_and_example_manifests_pass_kubernetes_validate_strictly() {
    let mut command = Command::new(venv("kubernetes-validate"));
    command.arg("--strict");
    command.args(yaml_files("docs/crds"));
    command.args(yaml_files("docs/examples/kubernetes"));
    let text = run(command);
    assert!(!text.contains("ERROR"), "{text}");
    for kind in [
        "customresourcedefinition/gridnetworks.grid.llm-d.io",
        "customresourcedefinition/gridsites.grid.llm-d.io",
        "customresourcedefinition/inferenceproviders.grid.llm-d.io",
        "namespace/",
        "serviceaccount/",
        "role/",
        "rolebinding/",
        "deployment/",
        "service/",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("INFO") && l.contains(kind)),
            "{kind} was not validated:\n{text}"
        );
    }
}

#[test]
fn the_example_custom_resources_validate_against_the_generated_crd_schemas() {
    let mut command = Command::new(venv("python"));
    command.args([".ci/validate-custom-resources.py", "docs/crds"]);
    command.args(yaml_files("docs/examples/kubernetes"));
    let text = run(command);
    for name in ["GridNetwork/prod", "GridSite/b", "InferenceProvider/llama"] {
        assert!(text.contains(&format!("passed for {name}")), "{text}");
    }
}

#[test]
fn a_custom_resource_with_an_unknown_field_or_mode_fails_the_schema_check() {
    let dir = tempfile::tempdir().unwrap();
    for (i, bad) in [
        "peerTrust:\n    mode: pin\n  signalTransport:\n    mode: swim\n",
        "peerTrust:\n    mode: pin\n  peerTrsut: {}\n",
    ]
    .iter()
    .enumerate()
    {
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(
            &path,
            format!("apiVersion: grid.llm-d.io/v1alpha1\nkind: GridNetwork\nmetadata:\n  name: x\nspec:\n  {bad}"),
        )
        .unwrap();
        let out = Command::new(venv("python"))
            .current_dir(root())
            .args([".ci/validate-custom-resources.py", "docs/crds"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} passed");
    }
}

#[test]
fn the_example_custom_resources_translate_into_a_valid_config() {
    let text =
        std::fs::read_to_string(root().join("docs/examples/kubernetes/resources.yaml")).unwrap();
    let mut resources = Resources::default();
    for doc in text.split("\n---\n") {
        let value: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        match value["kind"].as_str().unwrap() {
            "GridNetwork" => resources
                .networks
                .push(serde_json::from_value::<GridNetwork>(value).unwrap()),
            "GridSite" => resources
                .sites
                .push(serde_json::from_value::<GridSite>(value).unwrap()),
            "InferenceProvider" => {
                let mut p: InferenceProvider = serde_json::from_value(value).unwrap();
                // What the API server adds.
                p.metadata.uid = Some("uid-1".into());
                p.metadata.generation = Some(1);
                resources.providers.push(p);
            }
            other => panic!("unexpected kind {other}"),
        }
    }
    let deployment = Deployment {
        site: "a".into(),
        listen: grid_operatord::config::Listen {
            signals: "0.0.0.0:9443".parse().unwrap(),
            metrics: "0.0.0.0:9090".parse().unwrap(),
        },
        tls: grid_operatord::config::TlsFiles {
            cert: "/etc/grid/tls/tls.crt".into(),
            key: "/etc/grid/tls/tls.key".into(),
            ca: Some("/etc/grid/tls/ca.crt".into()),
        },
        state_label: "ConfigMap/grid-site-a".into(),
    };
    let config = translate(&deployment, &resources).unwrap();
    assert_eq!((config.peers.len(), config.providers.len()), (1, 1));
}
