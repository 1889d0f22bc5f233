//! Wrappers around a site's answer body on its way to the client.

pub mod coalesce;
pub(crate) mod idle;
