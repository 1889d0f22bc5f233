//! The flow-control headers a site's router puts on the responses it serves
//! (llm-d-router's advisory flow-control band headroom), read strictly: a value the
//! gateway cannot trust is dropped and counted, never guessed at.
//!
//! | header | value | absent means |
//! | --- | --- | --- |
//! | `x-llm-d-flow-band-headroom-requests` (also `x-llm-d-flow-band-headroom`) | requests the admitting band can still take, clamped to 0 | no signal (unbounded band, not admitted through flow control, band unresolved), never 0 |
//! | `x-llm-d-flow-queue-duration-ms` | time the request waited in flow control | no signal (0 is "no queueing") |
//! | `x-llm-d-request-dropped-reason` | why the router dropped the request | not dropped |
//!
//! A value is refused when it is not a plain decimal integer (`malformed`), is negative
//! (`negative`), appears more than once, either spelling counting as the same header
//! (`duplicated`: which copy would be the router's?), or is past a bound no real band or
//! queue reaches (`absurd`).

/// The headroom header.
pub const HEADROOM_HEADER: &str = "x-llm-d-flow-band-headroom-requests";
/// The provisional spelling of the headroom header, read as the same header.
pub const HEADROOM_HEADER_PROVISIONAL: &str = "x-llm-d-flow-band-headroom";
/// The flow-control queueing time header.
pub const QUEUE_DURATION_HEADER: &str = "x-llm-d-flow-queue-duration-ms";
/// The drop reason header.
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
/// Every header whose name starts with this is the router's flow-control advice; a
/// gateway strips all of them from what it passes on and sets its own.
pub const FLOW_HEADER_PREFIX: &str = "x-llm-d-flow-";

/// Headroom past this many requests is refused as absurd: a priority band holding a
/// million requests is a broken or hostile sender, and a value this large would swamp
/// every other site's.
pub const MAX_HEADROOM_REQUESTS: u64 = 1_000_000;

/// Queueing past an hour is refused as absurd: no request waits that long in flow
/// control (its TTL expires first).
pub const MAX_QUEUE_DURATION_MS: u64 = 3_600_000;

/// Decimal digits read at most; more is absurd whatever the bound (and never overflows).
const MAX_DIGITS: usize = 12;

grid_signals::label_values! {
    /// Why one flow-control header value was not trusted (a metric label).
    pub enum FlowHeaderReject {
        /// Not a plain decimal integer (empty, a sign other than a leading minus, a
        /// fraction, letters, or bytes outside ASCII).
        Malformed,
        /// A leading minus: no band has negative room and no request waits negative time.
        Negative,
        /// The header (in either spelling) appeared more than once.
        Duplicated,
        /// Past [`MAX_HEADROOM_REQUESTS`] or [`MAX_QUEUE_DURATION_MS`].
        Absurd,
    }
}

/// Why the router dropped a request (`x-llm-d-request-dropped-reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// `rejected-saturated`: the band was full. Evidence the site is full now.
    RejectedSaturated,
    /// `rejected-no-endpoints`: no endpoint could take it.
    RejectedNoEndpoints,
    /// `rejected-ttl-expired`: it waited in flow control past its TTL.
    RejectedTtlExpired,
    /// Any other value (the set is open upstream); kept, never trusted as saturation.
    Other,
}

impl DropReason {
    fn parse(value: &[u8]) -> Self {
        match value {
            b"rejected-saturated" => Self::RejectedSaturated,
            b"rejected-no-endpoints" => Self::RejectedNoEndpoints,
            b"rejected-ttl-expired" => Self::RejectedTtlExpired,
            _ => Self::Other,
        }
    }
}

grid_signals::label_values! {
    /// Which flow-control header a value came from (a metric label).
    pub enum FlowHeader {
        /// [`HEADROOM_HEADER`] or [`HEADROOM_HEADER_PROVISIONAL`].
        Headroom,
        /// [`QUEUE_DURATION_HEADER`].
        QueueDuration,
        /// [`DROPPED_REASON_HEADER`].
        DroppedReason,
    }
}

impl FlowHeader {
    /// The header a name belongs to (ASCII case-insensitive), if any.
    pub fn of(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case(HEADROOM_HEADER)
            || name.eq_ignore_ascii_case(HEADROOM_HEADER_PROVISIONAL)
        {
            Some(Self::Headroom)
        } else if name.eq_ignore_ascii_case(QUEUE_DURATION_HEADER) {
            Some(Self::QueueDuration)
        } else if name.eq_ignore_ascii_case(DROPPED_REASON_HEADER) {
            Some(Self::DroppedReason)
        } else {
            None
        }
    }
}

/// Whether a response header is the router's flow-control advice, which a gateway must
/// not pass on as its own (ASCII case-insensitive prefix [`FLOW_HEADER_PREFIX`]).
pub fn is_flow_header(name: &str) -> bool {
    name.len() >= FLOW_HEADER_PREFIX.len()
        && name.as_bytes()[..FLOW_HEADER_PREFIX.len()]
            .eq_ignore_ascii_case(FLOW_HEADER_PREFIX.as_bytes())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field<T> {
    Absent,
    Value(T),
    Refused(FlowHeaderReject),
}

impl<T> Field<T> {
    fn set(&mut self, parsed: Result<T, FlowHeaderReject>) {
        *self = match self {
            Self::Absent => match parsed {
                Ok(v) => Self::Value(v),
                Err(r) => Self::Refused(r),
            },
            _ => Self::Refused(FlowHeaderReject::Duplicated),
        };
    }

    fn value(self) -> Option<T> {
        match self {
            Self::Value(v) => Some(v),
            _ => None,
        }
    }

    fn refused(self) -> Option<FlowHeaderReject> {
        match self {
            Self::Refused(r) => Some(r),
            _ => None,
        }
    }
}

/// What one response said, as far as it could be trusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowObservation {
    /// Requests the admitting band can still take; `None` is no signal, never 0.
    pub headroom: Option<u64>,
    /// Time the request waited in flow control, ms; `None` is no signal.
    pub queue_ms: Option<u64>,
    /// Why the router dropped it, when it did.
    pub dropped: Option<DropReason>,
}

impl FlowObservation {
    /// The response is evidence that its site is full now: the band had no room, or the
    /// router refused the request as saturated.
    pub fn saturated(&self) -> bool {
        self.headroom == Some(0) || self.dropped == Some(DropReason::RejectedSaturated)
    }

    /// Whether it carries any room signal at all.
    pub fn has_room_signal(&self) -> bool {
        self.headroom.is_some() || self.saturated()
    }
}

/// Reads one response's headers: feed every header with [`FlowHeaders::observe`], then
/// take the [`FlowObservation`] and the refusals with [`FlowHeaders::finish`].
/// Allocation-free, so it runs on the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowHeaders {
    headroom: Field<u64>,
    queue_ms: Field<u64>,
    dropped: Field<DropReason>,
}

impl Default for FlowHeaders {
    fn default() -> Self {
        Self {
            headroom: Field::Absent,
            queue_ms: Field::Absent,
            dropped: Field::Absent,
        }
    }
}

/// Refusals of one response: at most one per header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowRefusals([Option<(FlowHeader, FlowHeaderReject)>; 3]);

impl FlowRefusals {
    /// Each refused header and why.
    pub fn iter(&self) -> impl Iterator<Item = (FlowHeader, FlowHeaderReject)> + '_ {
        self.0.iter().flatten().copied()
    }

    /// Nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

impl FlowHeaders {
    /// A reader that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one response header; headers that are not flow-control ones are ignored.
    /// Returns which flow header it was, if any.
    pub fn observe(&mut self, name: &str, value: &[u8]) -> Option<FlowHeader> {
        let header = FlowHeader::of(name)?;
        match header {
            FlowHeader::Headroom => self.headroom.set(parse_count(value, MAX_HEADROOM_REQUESTS)),
            FlowHeader::QueueDuration => {
                self.queue_ms.set(parse_count(value, MAX_QUEUE_DURATION_MS));
            }
            FlowHeader::DroppedReason => self.dropped.set(parse_reason(value)),
        }
        Some(header)
    }

    /// What the response said, and what was refused.
    pub fn finish(self) -> (FlowObservation, FlowRefusals) {
        let observation = FlowObservation {
            headroom: self.headroom.value(),
            queue_ms: self.queue_ms.value(),
            dropped: self.dropped.value(),
        };
        let refusals = FlowRefusals([
            self.headroom.refused().map(|r| (FlowHeader::Headroom, r)),
            self.queue_ms
                .refused()
                .map(|r| (FlowHeader::QueueDuration, r)),
            self.dropped
                .refused()
                .map(|r| (FlowHeader::DroppedReason, r)),
        ]);
        (observation, refusals)
    }
}

/// HTTP optional whitespace around a field value.
fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A plain decimal count: ASCII digits only, at most `max`.
pub(crate) fn parse_count(value: &[u8], max: u64) -> Result<u64, FlowHeaderReject> {
    let v = trim_ows(value);
    let (negative, digits) = match v {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, v),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(FlowHeaderReject::Malformed);
    }
    if negative {
        return Err(FlowHeaderReject::Negative);
    }
    if digits.len() > MAX_DIGITS {
        return Err(FlowHeaderReject::Absurd);
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    if n > max {
        return Err(FlowHeaderReject::Absurd);
    }
    Ok(n)
}

/// A drop reason: a token of lowercase letters, digits and dashes.
fn parse_reason(value: &[u8]) -> Result<DropReason, FlowHeaderReject> {
    let v = trim_ows(value);
    if v.is_empty()
        || v.len() > 64
        || !v
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return Err(FlowHeaderReject::Malformed);
    }
    Ok(DropReason::parse(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(headers: &[(&str, &[u8])]) -> (FlowObservation, Vec<(FlowHeader, FlowHeaderReject)>) {
        let mut h = FlowHeaders::new();
        for (n, v) in headers {
            h.observe(n, v);
        }
        let (o, r) = h.finish();
        (o, r.iter().collect())
    }

    #[test]
    fn a_plain_count_is_read_and_absence_is_no_signal_never_zero() {
        let (o, r) = read(&[(HEADROOM_HEADER, b"19"), (QUEUE_DURATION_HEADER, b"0")]);
        assert_eq!(
            (o.headroom, o.queue_ms, o.dropped),
            (Some(19), Some(0), None)
        );
        assert!(r.is_empty() && !o.saturated() && o.has_room_signal());
        let (o, r) = read(&[("content-type", b"text/event-stream")]);
        assert_eq!(o, FlowObservation::default());
        assert!(r.is_empty() && !o.has_room_signal());
    }

    #[test]
    fn the_provisional_spelling_and_any_case_are_the_same_header() {
        let (o, _) = read(&[("X-LLM-D-Flow-Band-Headroom", b" 7\t")]);
        assert_eq!(o.headroom, Some(7));
        let (o, r) = read(&[(HEADROOM_HEADER, b"7"), (HEADROOM_HEADER_PROVISIONAL, b"7")]);
        assert_eq!(o.headroom, None, "two copies: which is the router's?");
        assert_eq!(
            r,
            vec![(FlowHeader::Headroom, FlowHeaderReject::Duplicated)]
        );
    }

    #[test]
    fn malformed_negative_and_absurd_values_are_dropped_with_their_reason() {
        for (value, reason) in [
            (&b""[..], FlowHeaderReject::Malformed),
            (b"1.5", FlowHeaderReject::Malformed),
            (b"+3", FlowHeaderReject::Malformed),
            (b"0x10", FlowHeaderReject::Malformed),
            (b"-", FlowHeaderReject::Malformed),
            (b"-4", FlowHeaderReject::Negative),
            (b"1000001", FlowHeaderReject::Absurd),
            (b"99999999999999999999999", FlowHeaderReject::Absurd),
            ("１２".as_bytes(), FlowHeaderReject::Malformed),
        ] {
            let (o, r) = read(&[(HEADROOM_HEADER, value)]);
            assert_eq!(o.headroom, None, "{value:?}");
            assert_eq!(r, vec![(FlowHeader::Headroom, reason)], "{value:?}");
        }
    }

    #[test]
    fn bounds_are_inclusive_and_one_past_is_absurd() {
        let max = MAX_HEADROOM_REQUESTS.to_string();
        assert_eq!(
            read(&[(HEADROOM_HEADER, max.as_bytes())]).0.headroom,
            Some(MAX_HEADROOM_REQUESTS)
        );
        let past = (MAX_HEADROOM_REQUESTS + 1).to_string();
        assert_eq!(read(&[(HEADROOM_HEADER, past.as_bytes())]).0.headroom, None);
        let max = MAX_QUEUE_DURATION_MS.to_string();
        assert_eq!(
            read(&[(QUEUE_DURATION_HEADER, max.as_bytes())]).0.queue_ms,
            Some(MAX_QUEUE_DURATION_MS)
        );
        let past = (MAX_QUEUE_DURATION_MS + 1).to_string();
        assert_eq!(
            read(&[(QUEUE_DURATION_HEADER, past.as_bytes())]).1,
            vec![(FlowHeader::QueueDuration, FlowHeaderReject::Absurd)]
        );
    }

    #[test]
    fn a_saturated_rejection_or_zero_headroom_is_evidence_of_a_full_site() {
        let (o, _) = read(&[(DROPPED_REASON_HEADER, b"rejected-saturated")]);
        assert!(o.saturated() && o.has_room_signal());
        let (o, _) = read(&[(HEADROOM_HEADER, b"0")]);
        assert!(o.saturated());
        let (o, _) = read(&[(DROPPED_REASON_HEADER, b"rejected-ttl-expired")]);
        assert_eq!(o.dropped, Some(DropReason::RejectedTtlExpired));
        assert!(!o.saturated());
        let (o, _) = read(&[(DROPPED_REASON_HEADER, b"something-new")]);
        assert_eq!(o.dropped, Some(DropReason::Other));
        let (o, r) = read(&[(DROPPED_REASON_HEADER, b"Rejected Saturated")]);
        assert_eq!(o.dropped, None);
        assert_eq!(
            r,
            vec![(FlowHeader::DroppedReason, FlowHeaderReject::Malformed)]
        );
    }

    #[test]
    fn only_the_flow_prefix_is_stripped() {
        assert!(is_flow_header("x-llm-d-flow-band-headroom-requests"));
        assert!(is_flow_header("X-LLM-D-FLOW-anything"));
        assert!(!is_flow_header("x-llm-d-request-dropped-reason"));
        assert!(!is_flow_header("x-llm-d-flo"));
        assert!(!is_flow_header("content-type"));
    }
}
