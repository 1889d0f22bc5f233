//! Header admission for `POST /v1/site/signals/ingest` from arbitrary header lists and
//! bodies.
//!
//! Input: byte 0 picks the caller (odd: a peer); the rest is `name:value` lines, then an
//! empty line, then the body. Names and values are raw bytes (no trimming), so repeated,
//! oversized, non-ASCII and case-mixed headers all occur.
//!
//! Asserts: no panic; every refusal is typed (a `RefusalReason` with a documented status)
//! and the receiver gives exactly the refusal admission gave; a peer is always refused as
//! unauthorized; an admitted report round-trips through its own headers, never claims
//! clean at `u64::MAX`, and is acknowledged with its exact echo once persisted.
#![no_main]

use grid_feedback::{
    Ack, Caller, Receiver, ReceiverInput, ReceiverMetrics, RefusalReason, Reply, Request,
    RequestId, WriteOutcome, parse_report,
};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000_000;

fn split(data: &[u8]) -> (Vec<(&[u8], &[u8])>, &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let headers = head
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| match line.iter().position(|b| *b == b':') {
            Some(colon) => (&line[..colon], &line[colon + 1..]),
            None => (line, &[][..]),
        })
        .collect();
    (headers, body)
}

fn assert_typed(reply: &Reply) -> Option<RefusalReason> {
    match reply {
        Reply::Acknowledge(_) => {
            assert_eq!(reply.status(), 204);
            None
        }
        Reply::Refuse(error) => {
            let reason = error.refusal().expect("every refusal is typed");
            assert!(RefusalReason::ALL.contains(&reason));
            assert!([400, 403, 409, 413, 503].contains(&reason.status()));
            assert_eq!(reply.status(), reason.status());
            Some(reason)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let caller = if selector & 1 == 1 {
        Caller::Peer
    } else {
        Caller::Local
    };
    let (headers, body) = split(rest);
    let admitted = parse_report(headers.iter().copied(), body);
    // The gateway reads the same vocabulary back from responses.
    let _ = Ack::from_headers(headers.iter().copied());

    if let Ok(report) = &admitted {
        assert!(!(report.clean() && report.is_terminal()));
        let again = parse_report(report.headers(), b"");
        assert_eq!(again.as_ref(), Ok(report));
    }
    if let Err(error) = &admitted {
        let reason = error.refusal().expect("admission refusals are typed");
        assert!(
            reason.status() == 400 || reason.status() == 413,
            "{reason:?}"
        );
    }

    let mut receiver = Receiver::new(NOW, ReceiverMetrics::default());
    receiver.handle(
        NOW,
        ReceiverInput::Request(Request {
            id: RequestId(1),
            caller,
            headers: &headers,
            body,
            deadline_ms: NOW + 5_000,
        }),
    );
    if let Some(write) = receiver.poll_write() {
        assert_eq!(caller, Caller::Local);
        assert!(
            receiver.poll_response().is_none(),
            "no answer before the write"
        );
        receiver.handle(
            NOW,
            ReceiverInput::WriteResult {
                write: write.id,
                outcome: WriteOutcome::Persisted,
            },
        );
    }
    let response = receiver.poll_response().expect("every request is answered");
    assert_eq!(response.request, RequestId(1));
    let reason = assert_typed(&response.reply);
    match (caller, &admitted) {
        (Caller::Peer, _) => assert_eq!(reason, Some(RefusalReason::Unauthorized)),
        (Caller::Local, Err(error)) => {
            assert_eq!(response.reply, Reply::Refuse(error.clone()));
        }
        (Caller::Local, Ok(report)) => {
            assert_eq!(response.reply, Reply::Acknowledge(report.ack()));
            assert_eq!(
                receiver
                    .state()
                    .reporter(report.epoch())
                    .map(|r| r.sequence),
                Some(report.sequence())
            );
        }
    }
    assert!(receiver.poll_response().is_none());
});
