//! What a provider's publication says about whether it can serve, coarsened to exactly
//! what a gateway's exclusion verdict tells apart, and the store's readiness generation:
//! a counter that moves whenever that changes for any provider held.
//!
//! A poller that sent the generation it last saw is answered at once when it moved
//! ([`crate::long_poll`]), so a site leaving or rejoining selection crosses the grid
//! within a scrape instead of a peer poll.

use crate::epp::{
    EPP_PER_ENDPOINT_QUEUE, EPP_READY_ENDPOINTS, READY, READY_REASON, READY_REASON_LABEL,
    ReadyReasonLabel,
};

/// What a publication says about readiness, as the gateway's exclusion verdict reads it
/// (grid-score's learner): the operator's verdict and whether it reached it without
/// reading the EPP, whether the EPP's ready-endpoint count is zero, and whether per-unit
/// series are present. Two publications with the same mark leave every gateway's
/// exclusion as it was; any change to one of these may move it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadinessMark {
    /// `grid_provider_ready` read as ready (>= 0.5), not ready, or absent.
    pub ready: Option<bool>,
    /// The not-ready verdict's reason says the operator could not read the EPP.
    pub unread: bool,
    /// The relayed ready-endpoint count is positive (`Some(true)`), zero, or absent.
    pub endpoints: Option<bool>,
    /// Per-unit (per-endpoint queue) series are present.
    pub units: bool,
}

impl ReadinessMark {
    /// Folds one row of a publication into the mark.
    pub(crate) fn row<'l>(
        &mut self,
        name: &str,
        mut labels: impl Iterator<Item = (&'l str, &'l str)>,
        value: f64,
    ) {
        if name == READY {
            self.ready = Some(value >= 0.5);
        } else if name == READY_REASON {
            self.unread |= labels.any(|(label, text)| {
                label == READY_REASON_LABEL
                    && ReadyReasonLabel::parse(text).is_some_and(ReadyReasonLabel::is_unread)
            });
        } else if name == EPP_READY_ENDPOINTS {
            self.endpoints = Some(value > 0.0);
        } else if name == EPP_PER_ENDPOINT_QUEUE {
            self.units = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row: its name, labels and value.
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);

    fn mark(rows: &[Row<'_>]) -> ReadinessMark {
        let mut m = ReadinessMark::default();
        for (name, labels, value) in rows {
            m.row(name, labels.iter().copied(), *value);
        }
        m
    }

    #[test]
    fn the_mark_reads_the_verdict_the_endpoint_count_and_the_unit_series() {
        let ready = mark(&[
            (READY, &[], 1.0),
            ("llm_d_epp_ready_endpoints", &[], 2.0),
            (
                "llm_d_epp_per_endpoint_queue_size",
                &[("model_server_endpoint", "e1")],
                0.0,
            ),
        ]);
        assert_eq!(
            ready,
            ReadinessMark {
                ready: Some(true),
                unread: false,
                endpoints: Some(true),
                units: true
            }
        );
        let zero = mark(&[(READY, &[], 1.0), ("llm_d_epp_ready_endpoints", &[], 0.0)]);
        assert_ne!(ready, zero);
        assert_eq!(zero.endpoints, Some(false));
        let unread = mark(&[
            (READY, &[], 0.0),
            (READY_REASON, &[("reason", "scrape_timeout")], 1.0),
        ]);
        assert_eq!((unread.ready, unread.unread), (Some(false), true));
        let shown = mark(&[
            (READY, &[], 0.0),
            (READY_REASON, &[("reason", "no_ready_endpoints")], 1.0),
        ]);
        assert_eq!((shown.ready, shown.unread), (Some(false), false));
    }

    #[test]
    fn load_alone_never_moves_the_mark() {
        let a = mark(&[
            ("llm_d_epp_ready_endpoints", &[], 2.0),
            ("llm_d_epp_average_queue_size", &[], 0.0),
        ]);
        let b = mark(&[
            ("llm_d_epp_ready_endpoints", &[], 7.0),
            ("llm_d_epp_average_queue_size", &[], 40.0),
        ]);
        assert_eq!(a, b);
    }
}
