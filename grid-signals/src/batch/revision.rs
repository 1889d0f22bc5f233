//! A provider revision: what a learner's history is valid for.

/// The identity of what a provider's learned history describes.
///
/// A change of any part means the history no longer applies: a new `uid` is a recreated
/// object, a new `generation` a spec change, a new `epoch` a restarted publisher whose
/// counters started over.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Revision {
    /// The provider object's UID (opaque; distinguishes same-name recreations).
    pub uid: String,
    /// The provider's config generation (advanced by spec changes only).
    pub generation: u64,
    /// The publisher epoch that carried it.
    pub epoch: u64,
}
