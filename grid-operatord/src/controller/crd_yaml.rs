//! The CRD manifests, generated from [`super::resources`]: what `grid-operatord crds`
//! prints and what `docs/crds/` holds (a test fails when those files are stale).

use kube::CustomResourceExt as _;

use super::resources::{GridNetwork, GridSite, InferenceProvider};

/// Each CRD as `(file name under docs/crds/, YAML)`, in a fixed order.
pub fn crd_files() -> Vec<(&'static str, String)> {
    vec![
        ("gridnetworks.yaml", yaml(&GridNetwork::crd())),
        ("gridsites.yaml", yaml(&GridSite::crd())),
        ("inferenceproviders.yaml", yaml(&InferenceProvider::crd())),
    ]
}

/// Every CRD as one multi-document YAML stream, for `kubectl apply -f -`.
pub fn crds_yaml() -> String {
    let mut stream = String::new();
    for (_, text) in crd_files() {
        stream.push_str("---\n");
        stream.push_str(&text);
    }
    stream
}

fn yaml(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    // A CRD is plain data (strings, maps, lists, booleans): serializing it cannot fail.
    serde_saphyr::to_string(crd).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}
