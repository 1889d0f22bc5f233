//! `metav1.Condition` bookkeeping, pure: given the conditions an object holds and the one
//! the operator now states, the list to write, or `None` when nothing changed (then no
//! write is made at all).
//!
//! Kubernetes' convention, kept exactly: `lastTransitionTime` moves only when the
//! condition's `status` changes (a new reason or message under the same status keeps it),
//! and `observedGeneration` names the `metadata.generation` the statement was made for.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The `Ready` condition type of an `InferenceProvider`.
pub const READY: &str = "Ready";
/// The longest condition message written (the API server's limit is 32768 bytes); a
/// longer one is cut at a character boundary.
pub const MAX_MESSAGE_LEN: usize = 32_768;

/// One condition as the operator states it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stated {
    /// `type`, e.g. [`READY`].
    pub kind: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// CamelCase reason from a closed set.
    pub reason: &'static str,
    /// For a human.
    pub message: String,
    /// When the status changed, if the caller knows better than "now" (the feedback
    /// receiver tracks its own transitions); `None` uses `now` on a status change.
    pub transition: Option<Time>,
}

/// The conditions to write so that `existing` says `stated` for `generation`, or `None`
/// when it already does (same status, reason, message and observed generation).
pub fn apply(
    existing: &[Condition],
    stated: &Stated,
    generation: Option<i64>,
    now: Time,
) -> Option<Vec<Condition>> {
    let message = truncate(&stated.message);
    let previous = existing.iter().find(|c| c.type_ == stated.kind);
    if let Some(p) = previous
        && p.status == stated.status
        && p.reason == stated.reason
        && p.message == message
        && p.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match previous {
        Some(p) if p.status == stated.status => p.last_transition_time.clone(),
        _ => stated.transition.clone().unwrap_or(now),
    };
    let next = Condition {
        type_: stated.kind.to_owned(),
        status: stated.status.to_owned(),
        reason: stated.reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    };
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ != stated.kind)
        .cloned()
        .collect();
    out.push(next);
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    Some(out)
}

/// A Kubernetes time from milliseconds since the Unix epoch (clamped to what the API
/// represents).
pub fn time_of_ms(ms: u64) -> Time {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(ms)
            .unwrap_or(k8s_openapi::jiff::Timestamp::MAX),
    )
}

fn truncate(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_LEN {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: &'static str, reason: &'static str) -> Stated {
        Stated {
            kind: READY,
            status,
            reason,
            message: format!("{reason}."),
            transition: None,
        }
    }

    /// `EndpointsReady` at generation 3, written at 1 s: what every case below starts
    /// from.
    fn written_first() -> Vec<Condition> {
        apply(
            &[],
            &ready("True", "EndpointsReady"),
            Some(3),
            time_of_ms(1_000),
        )
        .unwrap()
    }

    /// The write `stated` at `generation` makes over [`written_first`] at 5 s, if any.
    fn then(stated: &Stated, generation: i64) -> Option<Vec<Condition>> {
        apply(
            &written_first(),
            stated,
            Some(generation),
            time_of_ms(5_000),
        )
    }

    #[test]
    fn the_first_statement_is_written_with_now_as_its_transition() {
        let written = written_first();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].last_transition_time, time_of_ms(1_000));
        assert_eq!(written[0].observed_generation, Some(3));
    }

    #[test]
    fn the_same_statement_again_writes_nothing() {
        assert_eq!(then(&ready("True", "EndpointsReady"), 3), None);
    }

    #[test]
    fn a_new_reason_under_the_same_status_keeps_the_transition_time() {
        let second = then(&ready("True", "EngineAnswering"), 3).unwrap();
        assert_eq!(second[0].reason, "EngineAnswering");
        assert_eq!(second[0].last_transition_time, time_of_ms(1_000));
    }

    #[test]
    fn a_status_change_moves_the_transition_time() {
        let second = then(&ready("False", "NoReadyEndpoints"), 3).unwrap();
        assert_eq!(second[0].last_transition_time, time_of_ms(5_000));
    }

    #[test]
    fn a_new_generation_alone_is_written_with_the_transition_kept() {
        let second = then(&ready("True", "EndpointsReady"), 4).unwrap();
        assert_eq!(second[0].observed_generation, Some(4));
        assert_eq!(second[0].last_transition_time, time_of_ms(1_000));
    }

    #[test]
    fn other_condition_types_are_kept_untouched() {
        let other = Condition {
            type_: "Aaa".into(),
            status: "True".into(),
            reason: "Theirs".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: time_of_ms(7),
        };
        let written = apply(
            std::slice::from_ref(&other),
            &ready("True", "EndpointsReady"),
            Some(1),
            time_of_ms(1_000),
        )
        .unwrap();
        assert_eq!(written[0], other);
        assert_eq!(written.len(), 2);
    }

    #[test]
    fn a_known_transition_time_is_used_on_a_status_change() {
        let mut stated = ready("True", "ReadingsRejected");
        stated.transition = Some(time_of_ms(42));
        let written = apply(&[], &stated, Some(1), time_of_ms(1_000)).unwrap();
        assert_eq!(written[0].last_transition_time, time_of_ms(42));
    }

    #[test]
    fn messages_are_cut_at_max_message_len_on_a_character_boundary() {
        let mut stated = ready("True", "EndpointsReady");
        stated.message = "é".repeat(MAX_MESSAGE_LEN);
        let written = apply(&[], &stated, None, time_of_ms(0)).unwrap();
        assert!(written[0].message.len() <= MAX_MESSAGE_LEN);
        assert!(written[0].message.len() >= MAX_MESSAGE_LEN - 1);
        stated.message = "a".repeat(MAX_MESSAGE_LEN);
        assert_eq!(
            apply(&[], &stated, None, time_of_ms(0)).unwrap()[0]
                .message
                .len(),
            MAX_MESSAGE_LEN
        );
    }
}
