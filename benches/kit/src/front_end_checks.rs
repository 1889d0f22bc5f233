//! The checks every front end of grid must pass the same way, run against a local grid
//! (real operators, two simulated sites `a` and `b`) through whichever front end a test
//! stands up (Envoy's external processor, Pingora), driven by the official `openai`
//! client: each request lands where grid chose, a degraded site loses its share, a shed
//! request is a 429 with `Retry-After` and the gateway's own error body. One home for each check, so a
//! front end cannot pass a weaker version of it.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use crate::local_grid::{LocalGrid, Shedding};
use crate::openai_client::answered_by;

/// The shedding a [`a_shed_request_is_a_429_with_retry_after`] stack starts with: full
/// soon after both sites fill, room again only well after, `Retry-After: 2`.
pub const SHEDDING: Shedding = Shedding {
    full_after_ms: 300,
    room_after_ms: 3_000,
    retry_after_s: 2,
};

/// How long a change at a site may take to reach routing: a scrape, a poll, the refresh.
pub const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// Requests held at each site to fill it (three times its slots over), and how long
/// each is held at most.
const HELD_PER_SITE: usize = 16;
const HELD_FOR: Duration = Duration::from_secs(60);

/// A front end standing in front of a local grid of sites `a` and `b`.
pub trait FrontEnd: Sync {
    /// The grid behind it.
    fn grid(&self) -> &LocalGrid;

    /// `count` requests through the front end with the openai client, one after
    /// another: one JSON line each (status, site, and for a refusal its body's fields).
    fn openai(
        &self,
        count: usize,
        stream: bool,
    ) -> impl Future<Output = Vec<serde_json::Value>> + Send;
}

/// Answers served by each site (`x-grid-site` of the 200s) out of `count` requests.
async fn shares(front: &impl FrontEnd, count: usize) -> HashMap<String, u64> {
    answered_by(&front.openai(count, false).await)
}

fn served(front: &impl FrontEnd, site: &str) -> u64 {
    front.grid().control(site).unwrap().stats().requests
}

/// Plain and streamed requests: each site served exactly the requests grid named it
/// for (the front end sent every one where grid said), and both idle sites take some.
///
/// # Panics
///
/// When the front end fails the check: these are a test's assertions.
pub async fn requests_land_on_the_site_grid_chose(front: &impl FrontEnd) {
    let before = (served(front, "a"), served(front, "b"));
    let mut lines = front.openai(12, false).await;
    lines.extend(front.openai(4, true).await);
    let chosen = answered_by(&lines);
    assert_eq!(
        (served(front, "a") - before.0, served(front, "b") - before.1),
        (
            chosen.get("a").copied().unwrap_or(0),
            chosen.get("b").copied().unwrap_or(0)
        ),
        "each site served exactly the requests grid named it for: {chosen:?}"
    );
    assert_eq!(chosen.len(), 2, "both idle sites take traffic: {chosen:?}");
}

/// Site `a` backs up ([`LocalGrid::back_up`]: slowed and filled behind the front end's
/// back): its EPP reports the queue, its operator relays it, grid routes
/// around it, so at least 18 of 20 requests land on `b`.
///
/// # Panics
///
/// When the front end fails the check: these are a test's assertions.
pub async fn a_degraded_site_loses_its_share(front: &impl FrontEnd) {
    let before = shares(front, 16).await;
    assert!(
        before.contains_key("a") && before.contains_key("b"),
        "{before:?}"
    );
    let _held = front
        .grid()
        .back_up("a", SEEN_WITHIN)
        .await
        .expect("the gateway sees a's queue");
    let after = shares(front, 20).await;
    let on_b = after.get("b").copied().unwrap_or(0);
    assert!(on_b >= 18, "traffic did not leave a: {after:?}");
}

/// Both sites slowed fiftyfold and filled behind the front end's back until grid sheds
/// (the stack started with [`SHEDDING`]): the next request is a 429 with
/// `Retry-After: 2`, the gateway's error body (`code` `shedding`, `type` `rate_limit_error`), and no site named.
///
/// # Panics
///
/// When the front end fails the check: these are a test's assertions.
pub async fn a_shed_request_is_a_429_with_retry_after(front: &impl FrontEnd) {
    let grid = front.grid();
    let mut held = Vec::new();
    for name in ["a", "b"] {
        grid.control(name).unwrap().degrade(50.0).unwrap();
        held.push(grid.hold_requests(name, HELD_PER_SITE, HELD_FOR));
    }
    grid.wait_until("grid sheds", SEEN_WITHIN, LocalGrid::shedding)
        .await
        .expect("grid sheds once both sites are full");
    let lines = front.openai(1, false).await;
    let line = &lines[0];
    assert_eq!(line["status"], 429, "{line}");
    assert_eq!(line["retry_after"], "2", "{line}");
    assert_eq!(line["code"], "shedding", "{line}");
    assert_eq!(line["type"], "rate_limit_error", "{line}");
    assert!(
        line["site"].is_null(),
        "a shed answer names no site: {line}"
    );
    drop(held);
}
