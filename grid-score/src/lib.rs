//! Which site gets the next request.
//!
//! # I/O boundary
//!
//! Pure: time arrives as a `now_ms` parameter (milliseconds since the Unix epoch, the
//! same clock as reading stamps) and randomness through the crate's [`Rng`] trait, so
//! tests, the fuzzer and the routing simulator replay exactly. No sockets, clocks, files,
//! environment or locks on the request path; the crate never owns a metrics registry.
//!
//! # Data flow
//!
//! ```text
//! store readings + revision events --Scorer::observe/reset--> learner per site/provider
//!                                      (capacity bounds, smoothed rho, recent worst)
//!                     --Scorer::refresh(now)--> RouteTable: one immutable RouteSnapshot per
//!                                               model, least-loaded first, path decided
//! request --RouteTable::pick(model, rng)--> Decision: route / shed (429) / unavailable (503)
//!                                           / unknown model (404), plus the path taken
//! ```
//!
//! # Driving it
//!
//! A daemon and a simulator drive it the same way:
//!
//! ```
//! use grid_score::{CandidateKey, Decision, Reading, Routes, ScoreConfig, Scorer, SplitMix64};
//!
//! let mut scorer = Scorer::new(ScoreConfig::default());
//! let routes = Routes::new().with(
//!     "llama",
//!     vec![CandidateKey::new("a", "llama-a"), CandidateKey::new("b", "llama-b")],
//! );
//! // Control step, after each committed ingest: feed every fresh reading...
//! let reading = Reading { in_flight: Some(3.0), queue_depth: Some(0.0), ..Reading::new(1_000) };
//! scorer.observe(&CandidateKey::new("a", "llama-a"), &reading)?;
//! // ...(and `scorer.reset(&key)` on a revision event), then build and publish a table.
//! let table = scorer.refresh(1_000, &routes); // the daemon stores it in an ArcSwap
//!
//! // Request path: load the table once, pick, act on the decision.
//! let mut rng = SplitMix64::new(7);
//! match table.pick("llama", &mut rng) {
//!     Decision::Route { candidate, path, .. } => {
//!         assert_eq!(&**candidate.site(), "a"); // "b" has no reading: least preferred
//!         let _ = path.as_str(); // metrics label
//!     }
//!     Decision::Shed { retry_after_ms } | Decision::Unavailable { retry_after_ms } => {
//!         let _ = retry_after_ms; // 429 / 503 with Retry-After
//!     }
//!     Decision::UnknownModel => {} // 404
//! }
//! # Ok::<(), grid_score::Error>(())
//! ```
//!
//! A gateway fed by `grid_signals::store` calls [`from_store::sync`] before each refresh:
//! it turns the store's entries into readings and its events into resets.
//!
//! # The routing core of an embedding proxy
//!
//! What a proxy embedding grid needs beside its HTTP stack lives here too, so the
//! gateway daemon, the routing simulator, the fuzz targets and an embedder run one core:
//!
//! ```text
//! relay body --refresh::Refresher::ingest--> store --refresh(now)--> routing::RoutingView
//! answer heads --catalog::Upstream::live--> live slots --refresh_live(now)--> RoutingView
//! request body --model_field::find_model--> model --RoutingView::pick/route--> Route
//! ```
//!
//! ```
//! use std::sync::Arc;
//! use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
//! use grid_score::refresh::Refresher;
//! use grid_score::routing::Route;
//! use grid_score::{ScoreConfig, SplitMix64};
//! use grid_signals::store::StoreConfig;
//!
//! let catalog = Catalog::new(&[ModelSpec {
//!     name: "llama".into(),
//!     candidates: vec![CandidateSpec {
//!         site: "a".into(), provider: "llama-a".into(),
//!         scheme: "http".into(), authority: "10.0.0.1:8000".into(), prefix: String::new(),
//!     }],
//! }]);
//! let mut refresher = Refresher::new(Arc::new(catalog), ScoreConfig::default(), StoreConfig::default(), None);
//! // Each poll: ingest the operator's relay body (dated by its `Date`), then refresh.
//! let now = 1_700_000_000_000;
//! refresher.ingest(b"", now, now);
//! let view = refresher.refresh(now).view; // publish it (the gateway: an ArcSwap)
//! // Each request: the model from the body, then a decision from the one view loaded.
//! let model = grid_score::model_field::find_model(br#"{"model":"llama","messages":[]}"#).unwrap();
//! let decision = view.pick(&model, &mut SplitMix64::new(7));
//! match view.route(&model, &decision) {
//!     Route::To { upstream, .. } => assert_eq!(&*upstream.site, "a"),
//!     other => panic!("{other:?}"),
//! }
//! ```
//!
//! The table is immutable and cheap to share; a pick never allocates, locks or reads the
//! store. [`ScoreMetrics`] mirrors a table into gauges and counts decisions; the
//! `fuzzing` module (feature `fuzzing`) decodes arbitrary bytes into input sequences and checks the
//! invariants, for cargo-fuzz and for users who fuzz their own drivers.
#![deny(clippy::disallowed_methods)]

mod capacity;
pub mod catalog;
mod config;
mod error;
pub mod from_store;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod hash;
mod headroom;
mod learner;
pub mod live;
mod metrics;
pub mod model_field;
mod reading;
pub mod refresh;
pub mod retry;
mod rho;
pub mod routing;
mod scorer;
mod select;
mod shed;
mod snapshot;
mod tally;

pub use capacity::{BOUND_HALF_LIFE_MS, CAPACITY_FLOOR, SOFT_BOUND_HEADROOM};
pub use config::{
    DEFAULT_FRESH_FOR_MS, DEFAULT_FULL_AFTER_MS, DEFAULT_ROOM_AFTER_MS,
    DEFAULT_SHED_RETRY_AFTER_MS, DEFAULT_TURNOVER_MS, DEFAULT_UNAVAILABLE_RETRY_AFTER_MS,
    ScoreConfig, ShedConfig,
};
pub use error::{Error, RejectReason};
pub use grid_signals::rng::{Rng, SplitMix64};
pub use hash::{FastBuild, WordHash};
pub use headroom::{
    MIN_SPREAD_MS, PACE_BACKOFF_WAITING_PER_SLOT, PACE_DOWN, PACE_FLOOR, PACE_PERIOD_MS,
    PACE_RECOVER_WAITING_PER_SLOT, PACE_UP,
};
pub use learner::{ExcludeReason, Observed};
pub use metrics::ScoreMetrics;
pub use reading::{CandidateKey, EppPool, Reading, UnitQueues};
pub use rho::{MAX_RECENT_SAMPLES, RECENT_WINDOW_MS, RHO_CAP, RHO_SMOOTHING};
pub use scorer::{MAX_CANDIDATES, Routes, ScoreInput, Scorer};
pub use select::{Decision, Outcome};
pub use shed::{ShedState, SiteSaturation};
pub use snapshot::{
    Candidate, CandidateEvidence, CandidateState, Excluded, LIVE_FACTOR_FLOOR, MAX_TURNOVER_MS,
    Path, Refusals, RouteSnapshot, RouteTable, SPEED_MARGIN, Signal, UNMEASURED,
};
