//! Reading an error's chain of causes: clients decide what a failure was (a TLS refusal,
//! a connect bound, a kernel timeout) by what lies somewhere under a library's error.

use std::error::Error;

/// Whether `error` or any error under it (through [`Error::source`]) satisfies `is`.
pub fn any(error: &(dyn Error + 'static), is: impl Fn(&(dyn Error + 'static)) -> bool) -> bool {
    std::iter::successors(Some(error), |&e| e.source()).any(is)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_cause_is_found_at_any_depth_and_an_absent_one_is_not() {
        let e = Outer(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let timed_out = |e: &(dyn Error + 'static)| {
            e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        };
        assert!(any(&e, timed_out));
        assert!(any(&e, <dyn Error>::is::<Outer>), "the error itself counts");
        assert!(!any(&e, <dyn Error>::is::<std::fmt::Error>));
    }
}
