//! Live room from the response path: what each proxied response's flow-control headers
//! and outcome say about its site now, between the polls. A polled reading stands for a
//! whole peer poll; every answer is fresh. The router reads a band's headroom when it
//! builds the answer's head, for the band that admitted the request, so the value is as
//! recent as the answer; it is advisory (every client may see the same room), and an
//! absent header is no signal, never 0.
//!
//! # Data flow
//!
//! ```text
//! response headers --FlowHeaders::observe/finish--> FlowObservation (+ refusals to count)
//!   --LiveSlot::record_room(band) / record_answer / record_failure--> (request path:
//!   atomics; the band is the request's BandKey, hashed from BAND_REQUEST_HEADER)
//!   --LiveSlot::restated_headroom(band)--> the headroom header the client sees
//! request sent / exchange over --LiveSlot::in_flight (a guard)--> outstanding count
//! refresh: LiveBoard --Scorer::observe_live(key, slot.drain(), now)--> LiveState
//!   --snapshot--> each candidate's weight x live factor; the model's fresh grid headroom;
//!   a polled reading's load plus the change in this gateway's own outstanding requests
//!   since its stamp
//! ```
//!
//! # I/O boundary
//!
//! None: header names and values come in as bytes from whatever HTTP stack the caller
//! runs, time as `now_ms`. The slot's atomics are the only shared state, so a proxy's
//! request path writes without a lock and the refresh reads off it.

mod band;
mod headers;
mod outlier;
mod outstanding;
mod slot;
mod state;
mod turnover;

pub use band::{
    BAND_MAX_FORGET_MS, BAND_REQUEST_HEADER, BandKey, LIVE_ROOM_FRESH_MS, LiveRoom,
    MAX_BANDS_TRACKED,
};
pub use headers::{
    DROPPED_REASON_HEADER, DropReason, FLOW_HEADER_PREFIX, FlowHeader, FlowHeaderReject,
    FlowHeaders, FlowObservation, FlowRefusals, HEADROOM_HEADER, HEADROOM_HEADER_PROVISIONAL,
    MAX_HEADROOM_REQUESTS, MAX_QUEUE_DURATION_MS, QUEUE_DURATION_HEADER, is_flow_header,
};
pub use outlier::{
    BASE_EJECTION_MS, CONSECUTIVE_FAILURES, EJECT_FAILURE_RATIO, EJECTION_MEMORY_MS, EjectReason,
    MAX_EJECTED_SHARE, MAX_EJECTION_MS, MIN_RATIO_EXCHANGES, OutlierChange, PROBE_INTERVAL_MS,
    RATIO_HALF_LIFE_MS, Rejoin, max_ejected,
};
pub use outstanding::{OUTSTANDING_SAMPLES, OUTSTANDING_SPACING_MS};
pub use slot::{
    DEFAULT_FULL_HOLD_MS, Durations, InFlight, LOG_FIXED_BITS, LiveBoard, LiveEvidence, LiveSlot,
    MAX_FULL_HOLD_MS,
};
pub use state::{FAILURE_HALF_LIFE_MS, LIVE_ROOM_HALF_LIFE_MS, MAX_FAILURE_SCORE};
pub(crate) use state::{LiveState, LiveView};
pub use turnover::{
    FIRST_BYTE_PRECISION, FIRST_BYTE_SMOOTHING, SPEED_BASELINE_MS, SPREAD_MIN_DEGREES,
    TURNOVER_PRECISION, TURNOVER_SMOOTHING,
};
