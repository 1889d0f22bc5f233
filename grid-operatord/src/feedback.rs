//! Drives grid-feedback's [`Receiver`] for `POST /v1/site/signals/ingest`: the single
//! writer that persists every accepted report before its 204 goes out.
//!
//! One task owns the receiver. Request handlers send it the verified caller, the headers
//! and at most one byte of body, and wait for the reply. The task performs each write the
//! receiver asks for through the [`StateStore`] on a blocking thread, feeds back the
//! outcome, and fires the receiver's deadline timer, so the whole operation stays within
//! [`INGEST_BUDGET`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use grid_feedback::{
    Caller, ConditionStatus, INGEST_BUDGET, Receiver, ReceiverInput, RefusalReason, Reply, Request,
    RequestId, WriteId, WriteOutcome, deadline_for,
};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::state::StateStore;

/// Requests waiting for the feedback task; more are refused at once as `busy` (503 with
/// `x-grid-ingest-refusal: busy`, counted like the receiver's own refusals).
pub(crate) const FEEDBACK_QUEUE: usize = 64;

struct Job {
    caller: Caller,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    received_ms: u64,
    reply: oneshot::Sender<Reply>,
}

/// Submits reports to the feedback task.
#[derive(Clone, Debug)]
pub struct FeedbackHandle {
    tx: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl FeedbackHandle {
    /// Hands one request to the receiver and waits for its reply. Refused without one,
    /// for the handler to answer 503 naming why: `busy` when [`FEEDBACK_QUEUE`] requests
    /// already wait (or the task is gone), `deadline` when [`INGEST_BUDGET`] ran out.
    pub async fn submit(
        &self,
        caller: Caller,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Vec<u8>,
        received_ms: u64,
    ) -> Result<Reply, RefusalReason> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Job {
                caller,
                headers,
                body,
                received_ms,
                reply,
            })
            .map_err(|_| RefusalReason::Busy)?;
        match tokio::time::timeout(INGEST_BUDGET, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(RefusalReason::Busy),
            Err(_) => Err(RefusalReason::Deadline),
        }
    }
}

/// Starts the feedback task; it ends when every handle is dropped.
pub(crate) fn spawn(
    receiver: Receiver,
    store: Arc<dyn StateStore>,
    ages_rejected: Gauge,
    clock: Clock,
) -> (FeedbackHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(FEEDBACK_QUEUE);
    // Exported before the task runs, so a restored condition is visible from the start.
    ages_rejected.set(i64::from(
        receiver.condition().status == ConditionStatus::True,
    ));
    let task = tokio::spawn(run(receiver, store, ages_rejected, clock, rx));
    (FeedbackHandle { tx }, task)
}

type PendingWrite = (WriteId, tokio::task::JoinHandle<Result<(), crate::Error>>);

async fn run(
    mut receiver: Receiver,
    store: Arc<dyn StateStore>,
    ages_rejected: Gauge,
    clock: Clock,
    mut rx: mpsc::Receiver<Job>,
) {
    let mut waiting: HashMap<RequestId, oneshot::Sender<Reply>> = HashMap::new();
    let mut next_id = 0u64;
    let mut writing: Option<PendingWrite> = None;
    let mut reported: Option<ConditionStatus> = None;
    loop {
        if writing.is_none()
            && let Some(write) = receiver.poll_write()
        {
            let store = store.clone();
            let state = write.state;
            writing = Some((
                write.id,
                tokio::task::spawn_blocking(move || store.store_feedback(&state)),
            ));
        }
        // The condition is exported before any reply goes out, so a gateway that got its
        // 204 never reads an older condition.
        let condition = receiver.condition();
        if reported != Some(condition.status) {
            ages_rejected.set(i64::from(condition.status == ConditionStatus::True));
            // True is a problem an operator must act on; False (the healthy start
            // included) is the all-clear, logged without alarm.
            if condition.status == ConditionStatus::True {
                tracing::warn!(
                    condition = grid_feedback::CONDITION_TYPE,
                    status = ?condition.status,
                    reason = condition.reason.as_str(),
                    message = %condition.message,
                    "gateway feedback condition"
                );
            } else {
                tracing::info!(
                    condition = grid_feedback::CONDITION_TYPE,
                    status = ?condition.status,
                    reason = condition.reason.as_str(),
                    message = %condition.message,
                    "gateway feedback condition"
                );
            }
            reported = Some(condition.status);
        }
        while let Some(response) = receiver.poll_response() {
            if let Some(tx) = waiting.remove(&response.request) {
                let _ = tx.send(response.reply);
            }
        }
        let timer = receiver
            .poll_timeout()
            .map(|deadline| Duration::from_millis(deadline.saturating_sub(clock.wall_ms())));
        let write_done = async {
            match writing.as_mut() {
                Some((_, handle)) => handle.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            job = rx.recv() => {
                let Some(job) = job else { break };
                let id = RequestId(next_id);
                next_id += 1;
                waiting.insert(id, job.reply);
                let headers: Vec<(&[u8], &[u8])> =
                    job.headers.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
                receiver.handle(clock.wall_ms(), ReceiverInput::Request(Request {
                    id,
                    caller: job.caller,
                    headers: &headers,
                    body: &job.body,
                    deadline_ms: deadline_for(job.received_ms),
                }));
            }
            result = write_done => {
                let outcome = match result {
                    Ok(Ok(())) => WriteOutcome::Persisted,
                    // A resourceVersion race: the receiver retries with a fresh read, at
                    // most three attempts in all, counting `conflict` per 409.
                    Ok(Err(crate::Error::KubeConflict { .. })) => WriteOutcome::Conflict,
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "persisting gateway feedback failed");
                        WriteOutcome::Failed
                    }
                    Err(_) => WriteOutcome::Failed,
                };
                if let Some((write, _)) = writing.take() {
                    receiver.handle(clock.wall_ms(), ReceiverInput::WriteResult { write, outcome });
                }
            }
            () = async { tokio::time::sleep(timer.unwrap_or_default()).await }, if timer.is_some() => {
                receiver.handle(clock.wall_ms(), ReceiverInput::Timeout);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_holds_exactly_feedback_queue_requests() {
        // No task drains this channel: submissions stay queued.
        let (tx, rx) = mpsc::channel(FEEDBACK_QUEUE);
        let handle = FeedbackHandle { tx };
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..FEEDBACK_QUEUE {
            let h = handle.clone();
            waiting.spawn(async move { h.submit(Caller::Local, Vec::new(), Vec::new(), 0).await });
        }
        for _ in 0..200 {
            if rx.len() == FEEDBACK_QUEUE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rx.len(), FEEDBACK_QUEUE);
        let refused = tokio::time::timeout(
            Duration::from_millis(500),
            handle.submit(Caller::Local, Vec::new(), Vec::new(), 0),
        )
        .await
        .expect("refused without waiting");
        assert_eq!(refused, Err(RefusalReason::Busy));
        waiting.abort_all();
    }
}
