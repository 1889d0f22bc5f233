//! The flow-control response headers the simulated site's EPP layer owns, the request
//! header that asks for a band, and the model-server layer's spoofed copies.
//!
//! The EPP layer writes its headers last, over whatever the model-server layer put
//! there: every backend copy of an EPP-owned header is removed first, so a model server
//! cannot spoof the advisory signal (llm-d's response-header ownership).

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use grid_sim::site_model::{
    BandSnapshot, CapacityReader, DropReason, FALLBACK_PRIORITY, Priority, SnapshotError,
};

/// The request header naming the flow-control band a request asks for, an integer
/// (`x-sim-priority: 5`); absent asks for [`FALLBACK_PRIORITY`]. llm-d derives the
/// priority from the request's inference objective; the simulator takes it directly.
pub const PRIORITY_HEADER: &str = "x-sim-priority";
/// Request capacity minus current length of the band that admitted the request, clamped
/// to 0, read when the response head is built (advisory, never a reservation).
pub const FLOW_BAND_HEADROOM_HEADER: &str = "x-llm-d-flow-band-headroom-requests";
/// How long the request waited in flow control, in ms (`0`: not queued).
pub const FLOW_QUEUE_DURATION_HEADER: &str = "x-llm-d-flow-queue-duration-ms";
/// Why flow control dropped the request, on its error answer.
pub const REQUEST_DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
/// Every header whose name starts so is EPP-owned, whatever follows (the provisional
/// spellings included).
pub const FLOW_HEADER_PREFIX: &str = "x-llm-d-flow-";
/// The value the model-server layer spoofs into every EPP-owned header when
/// `spoof_flow_headers` is on: far from anything a test site's bands hold.
pub const SPOOFED_VALUE: &str = "999";

/// Where the EPP layer's capacity reader comes from: the live band registry, or a
/// failure mode that must only leave the headroom header out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapacityReaderMode {
    /// The model's own registry, read at response-header time.
    #[default]
    Live,
    /// No capacity reader is wired.
    Absent,
    /// A reader whose every snapshot read fails.
    Failing,
}

/// A capacity reader that cannot read anything.
struct Unreadable;

impl CapacityReader for Unreadable {
    fn capacity_snapshot(&self, _: Priority) -> Result<Option<BandSnapshot>, SnapshotError> {
        Err(SnapshotError)
    }
}

impl CapacityReaderMode {
    /// The reader this mode stands for, given the live one.
    pub(super) fn reader(self, live: &dyn CapacityReader) -> Option<&dyn CapacityReader> {
        match self {
            Self::Live => Some(live),
            Self::Absent => None,
            Self::Failing => Some(&Unreadable),
        }
    }
}

/// What the EPP layer says about one request on its response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct FlowSignal {
    /// [`FLOW_BAND_HEADROOM_HEADER`], omitted when `None`.
    pub headroom: Option<u64>,
    /// [`FLOW_QUEUE_DURATION_HEADER`], omitted when `None` (not through flow control).
    pub queued_ms: Option<u64>,
    /// [`REQUEST_DROPPED_REASON_HEADER`], on a dropped request's answer.
    pub dropped: Option<DropReason>,
}

fn is_epp_owned(name: &HeaderName) -> bool {
    name.as_str().starts_with(FLOW_HEADER_PREFIX) || name == REQUEST_DROPPED_REASON_HEADER
}

/// The EPP layer: removes every EPP-owned header the backend set, then writes `signal`.
pub(super) fn own(headers: &mut HeaderMap, signal: FlowSignal) {
    let backend: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_epp_owned(n))
        .cloned()
        .collect();
    for name in backend {
        headers.remove(name);
    }
    let numbers = [
        (FLOW_BAND_HEADROOM_HEADER, signal.headroom),
        (FLOW_QUEUE_DURATION_HEADER, signal.queued_ms),
    ];
    for (name, value) in numbers {
        if let Some(value) = value {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
    if let Some(reason) = signal.dropped {
        headers.insert(
            HeaderName::from_static(REQUEST_DROPPED_REASON_HEADER),
            HeaderValue::from_static(reason.as_str()),
        );
    }
}

/// The model-server layer misbehaving: it puts its own copies of the EPP-owned headers
/// on its answer (a provisional spelling too), which the EPP layer must not pass on.
pub(super) fn spoof(headers: &mut HeaderMap) {
    for name in [
        FLOW_BAND_HEADROOM_HEADER,
        "x-llm-d-flow-band-headroom",
        FLOW_QUEUE_DURATION_HEADER,
        REQUEST_DROPPED_REASON_HEADER,
    ] {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(SPOOFED_VALUE),
        );
    }
}

/// The band a request asks for: [`PRIORITY_HEADER`] as an integer, [`FALLBACK_PRIORITY`]
/// when absent; `None` when present but not one integer.
pub(super) fn requested_priority(headers: &HeaderMap) -> Option<Priority> {
    let mut values = headers.get_all(PRIORITY_HEADER).iter();
    let Some(value) = values.next() else {
        return Some(FALLBACK_PRIORITY);
    };
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_copies_are_removed_and_only_the_epp_values_remain() {
        let mut headers = HeaderMap::new();
        spoof(&mut headers);
        headers.insert("x-other", HeaderValue::from_static("kept"));
        own(
            &mut headers,
            FlowSignal {
                headroom: Some(3),
                queued_ms: None,
                dropped: None,
            },
        );
        assert_eq!(headers.get_all(FLOW_BAND_HEADROOM_HEADER).iter().count(), 1);
        assert_eq!(headers[FLOW_BAND_HEADROOM_HEADER], "3");
        assert!(!headers.contains_key("x-llm-d-flow-band-headroom"));
        assert!(!headers.contains_key(FLOW_QUEUE_DURATION_HEADER));
        assert!(!headers.contains_key(REQUEST_DROPPED_REASON_HEADER));
        assert_eq!(headers["x-other"], "kept");
    }

    #[test]
    fn the_priority_header_is_one_integer_or_absent() {
        let with = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(PRIORITY_HEADER, HeaderValue::from_str(v).unwrap());
            }
            requested_priority(&h)
        };
        assert_eq!(with(&[]), Some(FALLBACK_PRIORITY));
        assert_eq!(with(&["5"]), Some(5));
        assert_eq!(with(&[" -1 "]), Some(-1));
        assert_eq!(with(&["high"]), None);
        assert_eq!(with(&["1", "2"]), None);
        assert_eq!(with(&["99999999999"]), None);
    }
}
