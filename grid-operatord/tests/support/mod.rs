//! Shared test support: certificates and fake EPPs.
#![allow(dead_code)]

pub mod fake_epp;
pub mod pki;
pub mod site;
