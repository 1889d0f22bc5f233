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
fn a_custom_resource_with_an_unknown_field_a_bad_mode_or_a_malformed_url_or_pin_fails_the_schema_check()
 {
    let dir = tempfile::tempdir().unwrap();
    let pin = "AB:".repeat(31) + "AB";
    let site = |spec: &str| ("GridSite", spec.to_owned());
    let provider = |endpoint: &str, path: &str| {
        (
            "InferenceProvider",
            format!("metricsConfig:\n    endpoint: \"{endpoint}\"\n    path: \"{path}\"\n"),
        )
    };
    let bad = [
        (
            "GridNetwork",
            "peerTrust:\n    mode: pin\n  signalTransport:\n    mode: swim\n".to_owned(),
        ),
        (
            "GridNetwork",
            "peerTrust:\n    mode: pin\n  peerTrsut: {}\n".to_owned(),
        ),
        // Not https; no host; whitespace.
        site("signalsEndpoint: \"http://b.example/v1/site/signals\"\n"),
        site("signalsEndpoint: \"https:///v1/site/signals\"\n"),
        site("signalsEndpoint: \"https://b example/\"\n"),
        // 63 hex digits; a letter that is not hex.
        site(&format!(
            "signalsEndpoint: \"https://b/\"\n  fingerprints: [\"{}\"]\n",
            &pin[1..]
        )),
        site(&format!(
            "signalsEndpoint: \"https://b/\"\n  fingerprints: [\"{}G\"]\n",
            &pin[..pin.len() - 1]
        )),
        // A path in the base URL; a scheme the scraper does not speak; a relative path.
        provider("http://epp:9090/metrics", "/metrics"),
        provider("ftp://epp:9090", "/metrics"),
        provider("http://epp:9090", "metrics"),
    ];
    for (i, (kind, spec)) in bad.iter().enumerate() {
        let out = schema_check(&dir.path().join(format!("bad{i}.yaml")), kind, spec);
        assert!(!out.status.success(), "{kind} {spec} passed");
    }
    // The same shapes, well formed, pass: the patterns refuse the mistakes only.
    let good = [
        site(&format!(
            "signalsEndpoint: \"https://b.example:8443/v1/site/signals\"\n  fingerprints: [\"{pin}\", \"{}\"]\n",
            pin.replace(':', "").to_lowercase()
        )),
        provider("https://epp.ns.svc:9090/", "/epp/metrics"),
    ];
    for (i, (kind, spec)) in good.iter().enumerate() {
        let out = schema_check(&dir.path().join(format!("good{i}.yaml")), kind, spec);
        assert!(
            out.status.success(),
            "{kind} {spec} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// Writes a custom resource of `kind` with `spec` at `path` and checks it against the
/// generated CRD schemas.
fn schema_check(path: &Path, kind: &str, spec: &str) -> std::process::Output {
    std::fs::write(
        path,
        format!("apiVersion: grid.llm-d.io/v1alpha1\nkind: {kind}\nmetadata:\n  name: x\nspec:\n  {spec}"),
    )
    .unwrap();
    Command::new(venv("python"))
        .current_dir(root())
        .args([".ci/validate-custom-resources.py", "docs/crds"])
        .arg(path)
        .output()
        .unwrap()
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
