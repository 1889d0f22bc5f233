//! The site side: connections to sites, the cap on requests in flight toward each, and
//! what each answer tells about its site.

pub(crate) mod answer_evidence;
pub(crate) mod answer_timing;
pub(crate) mod pool;
pub(crate) mod slots;
