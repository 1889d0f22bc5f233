//! Batches, revisions and the epoch/sequence fences that order them (issue 4).
