//! One writer per site: a `coordination.k8s.io` Lease elects which operator replica
//! publishes. A replica that does not hold the Lease waits before it persists an epoch or
//! publishes anything; the holder renews it, and a replica takes over once the holder has
//! not renewed for a whole lease duration (a killed writer, say).
//!
//! Expiry is judged the way client-go's leader election judges it: by how long this
//! process has watched the same record go unrenewed, on its own monotonic clock, never by
//! comparing another host's `renewTime` with this host's wall clock. The judgement
//! ([`Observer`]) is pure; [`acquire`] and [`hold`] feed it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};

use super::api::{Answer, bounded};
use crate::Error;
use crate::clock::Clock;

/// The Lease is this prefix followed by the site name.
pub const LEASE_PREFIX: &str = "grid-operator-";
/// How long a holder that stopped renewing keeps the Lease (client-go's default).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews, and a waiting replica re-reads (a third of the duration,
/// so two renewals can fail before the Lease lapses).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(5);

/// The election's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// [`LEASE_DURATION`].
    pub duration: Duration,
    /// [`RENEW_INTERVAL`].
    pub renew: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            duration: LEASE_DURATION,
            renew: RENEW_INTERVAL,
        }
    }
}

/// What one reading of the Lease means for this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody holds it, or the holder let it lapse: take it.
    Free,
    /// This replica holds it.
    Mine,
    /// Another replica holds it; it lapses in this many milliseconds unless renewed.
    Held {
        /// Time left, by this process's observation.
        lapses_in_ms: u64,
    },
}

/// Watches one Lease's record change over time.
#[derive(Clone, Debug, Default)]
pub struct Observer {
    /// The record last seen (its resourceVersion) and when it was first seen, in
    /// milliseconds on the caller's monotonic clock.
    seen: Option<(String, u64)>,
}

impl Observer {
    /// Judges a reading at `now_ms` (monotonic): `holder` and `version` of the record,
    /// `None` when the Lease does not exist.
    pub fn observe(
        &mut self,
        record: Option<(&str, &str)>,
        me: &str,
        duration: Duration,
        now_ms: u64,
    ) -> Verdict {
        let Some((holder, version)) = record else {
            self.seen = None;
            return Verdict::Free;
        };
        if holder.is_empty() {
            return Verdict::Free;
        }
        if holder == me {
            return Verdict::Mine;
        }
        let since = match &self.seen {
            Some((v, at)) if v == version => *at,
            _ => {
                self.seen = Some((version.to_owned(), now_ms));
                now_ms
            }
        };
        let held_for = now_ms.saturating_sub(since);
        let duration_ms = duration.as_millis() as u64;
        if held_for >= duration_ms {
            Verdict::Free
        } else {
            Verdict::Held {
                lapses_in_ms: duration_ms - held_for,
            }
        }
    }
}

fn lease_name(site: &str) -> String {
    format!("{LEASE_PREFIX}{site}")
}

/// Now on the operator's clock (the one its stamps and epochs read), as a Lease time.
fn now_micro(clock: &Clock) -> MicroTime {
    let ms = i64::try_from(clock.wall_ms()).unwrap_or(i64::MAX);
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_millisecond(ms)
            .unwrap_or(k8s_openapi::jiff::Timestamp::MAX),
    )
}

fn spec_for(me: &str, timing: Timing, previous: Option<&LeaseSpec>, now: MicroTime) -> LeaseSpec {
    let taking_over = previous
        .and_then(|p| p.holder_identity.as_deref())
        .is_some_and(|h| h != me);
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(
            i32::try_from(timing.duration.as_secs().max(1)).unwrap_or(i32::MAX),
        ),
        acquire_time: if taking_over || previous.is_none() {
            Some(now.clone())
        } else {
            previous.and_then(|p| p.acquire_time.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if taking_over {
            transitions + 1
        } else {
            transitions
        }),
        ..LeaseSpec::default()
    }
}

/// One attempt to take or renew the Lease: `true` when this replica holds it after the
/// call.
async fn try_take(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    timing: Timing,
    observer: &mut Observer,
    clock: &Clock,
) -> Result<bool, Error> {
    let fail = |message: String| Error::Kube {
        operation: "reading or writing the Lease",
        message,
    };
    let current = match bounded(api.get(name)).await {
        Answer::Ok(l) => Some(l),
        Answer::NotFound => None,
        Answer::Conflict => return Ok(false),
        Answer::Failed(m) => return Err(fail(m)),
    };
    let record = current.as_ref().map(|l| {
        (
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            l.metadata.resource_version.clone().unwrap_or_default(),
        )
    });
    let now = crate::clock::monotonic_ms();
    match observer.observe(
        record.as_ref().map(|(h, v)| (h.as_str(), v.as_str())),
        me,
        timing.duration,
        now,
    ) {
        Verdict::Held { .. } => return Ok(false),
        Verdict::Free | Verdict::Mine => {}
    }
    let pp = PostParams::default();
    let answer = match current {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec_for(me, timing, None, now_micro(clock))),
            };
            bounded(api.create(&pp, &lease)).await
        }
        Some(mut lease) => {
            lease.spec = Some(spec_for(me, timing, lease.spec.as_ref(), now_micro(clock)));
            // The read's resourceVersion rides along: of two replicas taking a lapsed
            // Lease at once, one gets 409.
            bounded(api.replace(name, &pp, &lease)).await
        }
    };
    match answer {
        Answer::Ok(_) => Ok(true),
        Answer::Conflict | Answer::NotFound => Ok(false),
        Answer::Failed(m) => Err(fail(m)),
    }
}

/// Waits until this replica (`me`) holds the site's Lease. API failures are logged and
/// retried at the renew interval: a replica that cannot reach the API server cannot know
/// it may publish. The Lease's times are read from `clock`, the operator's.
pub async fn acquire(
    client: &kube::Client,
    namespace: &str,
    site: &str,
    me: &str,
    timing: Timing,
    clock: &Clock,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = lease_name(site);
    let mut observer = Observer::default();
    let mut logged = false;
    loop {
        match try_take(&api, &name, me, timing, &mut observer, clock).await {
            Ok(true) => {
                tracing::info!(lease = %name, identity = me, "holding the site's Lease: this replica publishes");
                return;
            }
            Ok(false) if !logged => {
                tracing::info!(lease = %name, identity = me, "another replica holds the site's Lease; waiting");
                logged = true;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the site's Lease could not be read or taken; retrying");
            }
        }
        tokio::time::sleep(timing.renew).await;
    }
}

/// Renews the Lease every renew interval; ends with [`Error::LeaseLost`] when another
/// replica holds it or no renewal succeeded for a whole lease duration (then another
/// replica may have taken over, so this one must stop publishing).
pub async fn hold(
    client: kube::Client,
    namespace: String,
    site: String,
    me: String,
    timing: Timing,
    clock: Clock,
) -> Error {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let name = lease_name(&site);
    let mut observer = Observer::default();
    let mut renewed = crate::clock::monotonic_ms();
    loop {
        tokio::time::sleep(timing.renew).await;
        match try_take(&api, &name, &me, timing, &mut observer, &clock).await {
            Ok(true) => renewed = crate::clock::monotonic_ms(),
            Ok(false) => return Error::LeaseLost { lease: name },
            Err(e) => tracing::warn!(error = %e, "renewing the site's Lease failed"),
        }
        if crate::clock::monotonic_ms().saturating_sub(renewed)
            >= timing.duration.as_millis() as u64
        {
            return Error::LeaseLost { lease: name };
        }
    }
}

/// Gives the Lease up on a graceful stop, so a waiting replica takes over at its next
/// read instead of one lease duration later. Best effort: a failure only means the
/// successor waits for the lapse.
pub async fn release(client: &kube::Client, namespace: &str, site: &str, me: &str) {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = lease_name(site);
    let Answer::Ok(mut lease) = bounded(api.get(&name)).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(me) {
        return;
    }
    spec.holder_identity = None;
    if let Answer::Ok(_) = bounded(api.replace(&name, &PostParams::default(), &lease)).await {
        tracing::info!(lease = %name, "released the site's Lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn an_absent_or_unheld_lease_is_free_and_ones_own_is_mine() {
        let mut o = Observer::default();
        assert_eq!(o.observe(None, "a", D, 0), Verdict::Free);
        assert_eq!(o.observe(Some(("", "1")), "a", D, 0), Verdict::Free);
        assert_eq!(o.observe(Some(("a", "1")), "a", D, 0), Verdict::Mine);
    }

    #[test]
    fn another_holders_lease_lapses_one_duration_after_its_record_stopped_changing() {
        let mut o = Observer::default();
        assert_eq!(
            o.observe(Some(("b", "1")), "a", D, 1_000),
            Verdict::Held {
                lapses_in_ms: 15_000
            }
        );
        assert_eq!(
            o.observe(Some(("b", "1")), "a", D, 15_999),
            Verdict::Held { lapses_in_ms: 1 }
        );
        assert_eq!(o.observe(Some(("b", "1")), "a", D, 16_000), Verdict::Free);
    }

    #[test]
    fn a_renewal_seen_restarts_the_holders_duration() {
        let mut o = Observer::default();
        o.observe(Some(("b", "1")), "a", D, 0);
        assert_eq!(
            o.observe(Some(("b", "2")), "a", D, 14_000),
            Verdict::Held {
                lapses_in_ms: 15_000
            }
        );
        assert_eq!(o.observe(Some(("b", "2")), "a", D, 29_000), Verdict::Free);
    }

    #[test]
    fn the_default_timing_renews_three_times_per_duration() {
        let t = Timing::default();
        assert_eq!(t.duration, LEASE_DURATION);
        assert_eq!(t.renew * 3, t.duration);
    }
}
