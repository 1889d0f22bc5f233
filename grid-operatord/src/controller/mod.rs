//! Controller mode: the operator configured by Kubernetes resources instead of a file.
//!
//! The resources ([`resources`]: `GridNetwork`, `GridSite`, `InferenceProvider`) are
//! turned into the same [`crate::config::Config`] the file mode builds ([`translate`], a
//! pure function), so the driver does not know which mode it runs in.
//!
//! ```text
//! API server --watch ([`source`], kube-runtime reflectors)--> [`translate`] --> Config
//!   --> [`run`]: driver::start_with (the file mode's driver), restarted in-process on a
//!       configuration change, ended on a mode or trust change
//! driver --StateStore ([`state_store`])--> ConfigMap (high-water mark, fences),
//!                                         GridNetwork status (GatewayAgesRejected)
//! driver verdicts --[`ready`]--> InferenceProvider status (Ready), via [`conditions`]
//! replicas --[`lease`]--> one writer per site
//! ```
//!
//! Every API call goes through [`api`], bounded by [`api::API_CALL_TIMEOUT`].

pub mod api;
pub mod conditions;
pub mod crd_yaml;
pub mod lease;
pub mod ready;
pub mod resources;
pub mod run;
pub mod source;
pub mod state_store;
pub mod translate;
