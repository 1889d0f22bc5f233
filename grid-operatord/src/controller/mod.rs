//! Controller mode: the operator configured by Kubernetes resources instead of a file.
//!
//! The resources ([`resources`]: `GridNetwork`, `GridSite`, `InferenceProvider`) are
//! turned into the same [`crate::config::Config`] the file mode builds ([`translate`], a
//! pure function), so the driver does not know which mode it runs in.

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
