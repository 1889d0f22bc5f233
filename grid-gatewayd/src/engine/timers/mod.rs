//! Waits without a timer per request: a deadline moved only when it fires, and futures
//! woken by what they wait for.

pub(crate) mod deadline_timer;
pub(crate) mod when_woken;
