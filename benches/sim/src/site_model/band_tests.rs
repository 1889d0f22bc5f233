//! The site model's flow-control bands: which band admits a request, what it reports
//! when read, and which requests have no admission at all.

use super::*;

/// Every request runs this long unless a test says otherwise.
const SERVICE_MS: u64 = 1_000;

fn fixed(ms: u64) -> RequestSpec {
    RequestSpec {
        streaming: false,
        service_ms: Some(ms),
    }
}

/// One endpoint with one slot and no endpoint queue, so every request beyond the first
/// waits in its band.
fn gated(bands: Vec<BandConfig>) -> SiteModel {
    let mut config = SiteConfig::new("s", 1, 1);
    config.queue_per_endpoint = Some(0);
    config.bands = bands;
    SiteModel::new(config, 1).unwrap()
}

fn band(priority: Priority, capacity: Option<usize>) -> BandConfig {
    BandConfig { priority, capacity }
}

fn arrive(m: &mut SiteModel, now: u64, priority: Priority) -> Result<RequestId, Refusal> {
    m.arrive_prioritized(now, fixed(SERVICE_MS), priority)
}

fn events(m: &mut SiteModel) -> Vec<SiteEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

#[test]
fn a_request_dispatched_at_once_reports_its_band_and_no_queueing() {
    let mut m = gated(vec![band(0, Some(10))]);
    let id = arrive(&mut m, 5, 0).unwrap();
    let admitted = FlowAdmission {
        band: 0,
        queued_ms: 0,
    };
    assert!(matches!(
        events(&mut m).as_slice(),
        [SiteEvent::Started { flow: Some(f), .. }] if *f == admitted
    ));
    assert_eq!(m.admission(id), Some(admitted));
    assert_eq!(m.headroom_for(id), Some(10));
}

#[test]
fn a_held_request_reports_how_long_it_waited_in_its_band() {
    let mut m = gated(vec![]);
    arrive(&mut m, 0, 0).unwrap();
    let held = arrive(&mut m, 200, 0).unwrap();
    assert_eq!(m.admission(held), None, "not dispatched yet");
    m.advance(SERVICE_MS);
    assert_eq!(
        m.admission(held),
        Some(FlowAdmission {
            band: 0,
            queued_ms: SERVICE_MS - 200
        })
    );
}

#[test]
fn a_request_for_an_unprovisioned_band_is_admitted_by_band_0_and_keeps_it_once_that_band_appears() {
    let mut m = gated(vec![band(0, Some(10))]);
    let id = arrive(&mut m, 0, 5).unwrap();
    assert_eq!(m.admission(id).map(|a| a.band), Some(FALLBACK_PRIORITY));
    arrive(&mut m, 1, 0).unwrap();
    m.set_band(5, Some(50)).unwrap();
    assert_eq!(m.admission(id).map(|a| a.band), Some(FALLBACK_PRIORITY));
    assert_eq!(
        m.headroom_for(id),
        Some(9),
        "band 0's 10 - 1, not band 5's 50"
    );
    let later = arrive(&mut m, 2, 5).unwrap();
    assert_eq!(
        m.band_snapshot(5).map(|b| b.len),
        Some(1),
        "band 5 admits now"
    );
    m.cancel(3, later);
}

#[test]
fn a_band_of_capacity_100_holding_81_leaves_a_headroom_of_19() {
    let mut m = gated(vec![band(0, Some(100))]);
    let running = arrive(&mut m, 0, 0).unwrap();
    for t in 1..=81 {
        arrive(&mut m, t, 0).unwrap();
    }
    assert_eq!(
        m.band_snapshot(0),
        Some(BandSnapshot {
            capacity: Some(100),
            len: 81
        })
    );
    assert_eq!(m.headroom_for(running), Some(19));
}

#[test]
fn a_full_band_reports_0_and_refuses_the_next_request_as_saturated() {
    let mut m = gated(vec![band(0, Some(2))]);
    let running = arrive(&mut m, 0, 0).unwrap();
    arrive(&mut m, 1, 0).unwrap();
    arrive(&mut m, 2, 0).unwrap();
    assert_eq!(m.headroom_for(running), Some(0));
    assert_eq!(arrive(&mut m, 3, 0), Err(Refusal::Saturated));
    assert_eq!(
        Refusal::Saturated.drop_reason().as_str(),
        "rejected-saturated"
    );
    assert_eq!(m.counters().errors, 1);
    assert_eq!(m.held(), 2, "the refused request was never held");
}

#[test]
fn a_band_whose_capacity_is_lowered_below_its_length_reports_0_not_a_negative() {
    let mut m = gated(vec![band(0, Some(5))]);
    let running = arrive(&mut m, 0, 0).unwrap();
    for t in 1..=3 {
        arrive(&mut m, t, 0).unwrap();
    }
    m.set_band(0, Some(1)).unwrap();
    assert_eq!(
        m.band_snapshot(0),
        Some(BandSnapshot {
            capacity: Some(1),
            len: 3
        })
    );
    assert_eq!(m.headroom_for(running), Some(0));
}

#[test]
fn an_unbounded_band_has_no_headroom_to_report() {
    let mut m = gated(vec![]);
    let id = arrive(&mut m, 0, 0).unwrap();
    assert_eq!(m.admission(id).map(|a| a.band), Some(0));
    assert_eq!(m.headroom_for(id), None);
}

#[test]
fn a_request_whose_band_was_removed_has_no_headroom_to_report() {
    let mut m = gated(vec![band(5, Some(4))]);
    let id = arrive(&mut m, 0, 5).unwrap();
    assert_eq!(m.headroom_for(id), Some(4));
    m.remove_band(5).unwrap();
    assert_eq!(
        m.admission(id).map(|a| a.band),
        Some(5),
        "its band stays its band"
    );
    assert_eq!(m.headroom_for(id), None);
}

#[test]
fn requests_not_admitted_through_flow_control_have_no_admission() {
    // Flow control off: nothing passes a band.
    let mut off = SiteModel::new(SiteConfig::new("s", 1, 1), 1).unwrap();
    let id = arrive(&mut off, 0, 0).unwrap();
    assert!(matches!(
        events(&mut off).as_slice(),
        [SiteEvent::Started { flow: None, .. }]
    ));
    assert_eq!((off.admission(id), off.headroom_for(id)), (None, None));

    // Refused, cancelled while held, expired while held.
    let mut config = SiteConfig::new("s", 1, 1);
    config.queue_per_endpoint = Some(0);
    config.bands = vec![band(0, Some(2))];
    config.flow_ttl_ms = Some(500);
    let mut m = SiteModel::new(config, 1).unwrap();
    let running = arrive(&mut m, 0, 0).unwrap();
    let cancelled = arrive(&mut m, 1, 0).unwrap();
    let expiring = arrive(&mut m, 2, 0).unwrap();
    assert_eq!(arrive(&mut m, 3, 0), Err(Refusal::Saturated));
    assert!(m.cancel(4, cancelled));
    assert_eq!(m.next_deadline(), Some(502), "the held request's TTL");
    m.advance(501);
    assert_eq!(m.held(), 1, "not expired a millisecond early");
    m.advance(SERVICE_MS);
    let got = events(&mut m);
    assert!(got.contains(&SiteEvent::Failed {
        id: expiring,
        at: 502,
        reason: FailReason::TtlExpired
    }));
    assert_eq!(
        FailReason::TtlExpired.drop_reason().map(DropReason::as_str),
        Some("rejected-ttl-expired")
    );
    let started: Vec<RequestId> = got
        .iter()
        .filter_map(|e| match e {
            SiteEvent::Started { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        vec![running],
        "neither the cancelled nor the expired started"
    );
    for id in [cancelled, expiring] {
        assert_eq!(m.admission(id), None);
    }
}

#[test]
fn a_slot_freed_at_the_instant_a_held_request_would_expire_takes_it() {
    let mut config = SiteConfig::new("s", 1, 1);
    config.queue_per_endpoint = Some(0);
    config.flow_ttl_ms = Some(SERVICE_MS);
    let mut m = SiteModel::new(config, 1).unwrap();
    arrive(&mut m, 0, 0).unwrap();
    let held = arrive(&mut m, 0, 0).unwrap();
    m.advance(SERVICE_MS);
    assert_eq!(
        m.admission(held),
        Some(FlowAdmission {
            band: 0,
            queued_ms: SERVICE_MS
        })
    );
}

#[test]
fn headroom_is_read_when_asked_not_remembered_from_admission() {
    let mut m = gated(vec![band(0, Some(10))]);
    let id = arrive(&mut m, 0, 0).unwrap();
    assert_eq!(m.headroom_for(id), Some(10), "at admission");
    arrive(&mut m, 1, 0).unwrap();
    arrive(&mut m, 2, 0).unwrap();
    assert_eq!(m.headroom_for(id), Some(8), "two held since");
    m.set_band(0, Some(4)).unwrap();
    assert_eq!(m.headroom_for(id), Some(2), "capacity changed since");
}

#[test]
fn the_higher_band_is_dispatched_first() {
    let mut m = gated(vec![band(5, None), band(-1, None)]);
    arrive(&mut m, 0, 0).unwrap();
    let low = arrive(&mut m, 1, -1).unwrap();
    let standard = arrive(&mut m, 2, 0).unwrap();
    let high = arrive(&mut m, 3, 5).unwrap();
    m.advance(4 * SERVICE_MS);
    let order: Vec<RequestId> = events(&mut m)
        .iter()
        .filter_map(|e| match e {
            SiteEvent::Started { id, .. } if *id != 0 => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec![high, standard, low]);
}

#[test]
fn the_model_is_the_capacity_reader_of_its_own_registry() {
    let mut m = gated(vec![]);
    m.set_band(7, Some(3)).unwrap();
    let reader: &dyn CapacityReader = &m;
    assert_eq!(
        reader.capacity_snapshot(7),
        Ok(Some(BandSnapshot {
            capacity: Some(3),
            len: 0
        }))
    );
    assert_eq!(reader.capacity_snapshot(8), Ok(None));
}

#[test]
fn a_ttl_is_accepted_at_its_bounds_and_refused_past_them() {
    let with = |ttl| {
        let mut c = SiteConfig::new("s", 1, 1);
        c.flow_ttl_ms = Some(ttl);
        SiteModel::new(c, 1).is_ok()
    };
    assert!(with(1));
    assert!(with(MAX_FLOW_TTL_MS));
    assert!(!with(0));
    assert!(!with(MAX_FLOW_TTL_MS + 1));
}
