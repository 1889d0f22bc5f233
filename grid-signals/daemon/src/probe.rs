//! The kubelet's probes, as both daemons answer them: `/healthz` (alive: 200 while the
//! process serves at all) and `/readyz` (200 once the daemon has what it serves from,
//! 503 before), plain text, on the listener each daemon documents.

use http::StatusCode;

/// The liveness probe's path.
pub const HEALTHZ_PATH: &str = "/healthz";
/// The readiness probe's path.
pub const READYZ_PATH: &str = "/readyz";
/// Content type of a probe's answer.
pub const CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A probe's status and body: `200 ok`, or `503 not ready: <why>` when `ready` is false.
pub fn answer(ready: bool, why_not: &str) -> (StatusCode, String) {
    if ready {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why_not}\n"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_probe_says_ok_and_one_not_ready_says_why_with_503() {
        assert_eq!(answer(true, "x"), (StatusCode::OK, "ok\n".to_owned()));
        assert_eq!(
            answer(false, "no scrape yet"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: no scrape yet\n".to_owned()
            )
        );
    }
}
