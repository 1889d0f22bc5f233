//! Two rows of the fault suite (`grid-faults`, docs/operations.md#fault-suite) run as
//! tests, each asserting what the design promises for its fault: the partition of a
//! namespaced site over its veth link, and the clock step at the gateway's own operator
//! that makes the gateway reject ages (evidence it must not lose).

use grid_programs::fault_suite::{Fault, Row, WORKERS, run};

fn failed(row: &Row) -> u64 {
    row.failures.values().sum::<u64>()
        + row
            .statuses
            .iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum::<u64>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_site_leaves_preference_and_rejoins_losing_only_what_it_held() {
    let row = run(Fault::Partition).await.unwrap();
    assert_eq!(
        row.note, "veth link down",
        "root with iproute2, as here and in CI"
    );
    assert!(row.to_exclude.is_some(), "c never left preference: {row:?}");
    assert!(row.to_rejoin.is_some(), "c never came back: {row:?}");
    assert_eq!(row.to_excluded, 0, "a 200 came from an excluded site");
    // Only requests already at c when its link went down go unanswered: at most one per
    // closed-loop worker. Every later one fails over (its connect cannot complete).
    assert!(
        failed(&row) <= WORKERS as u64,
        "more lost than were in flight: {row:?}"
    );
    assert!(row.fences_lost.is_empty(), "{:?}", row.fences_lost);
    assert!(row.fences_read.0 > 0, "no fence was ever read: {row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_at_the_gateways_operator_loses_no_request_and_no_evidence() {
    let row = run(Fault::ClockStepLocal).await.unwrap();
    assert_eq!(failed(&row), 0, "{row:?}");
    assert!(
        row.to_exclude.is_none(),
        "a clock step moved site a out of preference: {row:?}"
    );
    assert!(
        row.evidence.observed > 0,
        "readings stamped before the step must read as ahead: {row:?}"
    );
    assert_eq!(row.evidence.lost(), 0, "{row:?}");
    assert!(
        !row.evidence.unresolved || row.evidence.cleared_after.is_some(),
        "GatewayAgesRejected never cleared after the clock came back: {row:?}"
    );
    assert!(row.fences_lost.is_empty(), "{:?}", row.fences_lost);
}
