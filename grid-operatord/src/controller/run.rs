//! The controller's supervision loop: translate the resources, start the very driver the
//! file mode starts, and keep it in step with the resources.
//!
//! A change of the providers (a spec change, which moves a generation; a recreation,
//! which changes a UID; a provider added or removed) and, under gossip, of the trust (a
//! peer added or removed, its pins, the mode or CA) is taken over live by the running
//! driver, in the same epoch ([`Running::reconfigure`]): receivers reset the learning of
//! exactly the providers whose revision moved, and the next handshake verifies under the
//! new trust. Any other change that translates into another [`Config`] stops the driver
//! and starts it again in-process: the fences and the feedback state are persisted and
//! restored across it, and the new process epoch sits above the high-water mark. A
//! status-only update translates into an equal configuration and changes nothing. A
//! changed mode, or trust under poll, ends the loop with the driver's own
//! [`Error::ModeChanged`] / [`Error::TrustChanged`], for Kubernetes to restart the pod.
//! A change that does not validate is counted and logged; the running configuration
//! stays.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use prometheus_client::registry::Registry;

use super::api::{ControllerMetrics, Operation};
use super::source::KubeConfigSource;
use super::state_store::KubeStateStore;
use crate::Error;
use crate::config::{Config, ConfigSource};
use crate::driver::{self, HeldListener, Options, Running};

/// How long a driver start keeps being tried again while a Kubernetes API call it makes
/// first fails (the state `ConfigMap` read, the epoch mark written above it): an API
/// server just started or briefly overloaded, or a `RoleBinding` not yet in force, is
/// waited out in-process rather than ending the pod into a crash-loop backoff. No attempt
/// starts past it; the last one's error ends the operator.
pub const START_RETRY_WITHIN: Duration = Duration::from_secs(60);

/// The pause before the second start attempt; each next pause doubles, up to
/// [`START_RETRY_PAUSE_MAX`].
pub const START_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The longest pause between two start attempts.
pub const START_RETRY_PAUSE_MAX: Duration = Duration::from_secs(8);

/// What a caller learns about each driver start (tests follow restarts with it).
pub type Started = tokio::sync::watch::Sender<Option<StartedDriver>>;

/// One driver start.
#[derive(Clone, Debug)]
pub struct StartedDriver {
    /// How many starts came before this one in this process.
    pub restarts: u64,
    /// How many changes (providers, or trust under gossip) this start took over live
    /// since it began.
    pub reconfigured: u64,
    /// The configuration it runs (its provider list the latest one taken).
    pub config: Config,
    /// Its signals listener.
    pub signals_addr: std::net::SocketAddr,
    /// Its `/metrics` listener.
    pub metrics_addr: std::net::SocketAddr,
    /// Its publisher epoch.
    pub epoch: u64,
    /// Each provider's verdict as the scrape loop holds it. Its list is the provider
    /// list in force: a change taken over live shows in `config` as soon as it is handed
    /// over, and here once the scrape loop has put it in force (between passes, so at
    /// most one scrape timeout later), which is when a removed provider's withdrawal is
    /// served.
    pub verdicts: tokio::sync::watch::Receiver<crate::providers::Verdicts>,
}

/// Which replica this is, when replicas elect their writer with a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Election {
    /// This replica's identity (the pod name).
    pub identity: String,
    /// Lease duration and renew interval.
    pub timing: super::lease::Timing,
}

/// Everything [`run`] runs with.
pub struct Setup {
    /// The API client.
    pub client: kube::Client,
    /// The namespace watched and written.
    pub namespace: String,
    /// The resources, followed.
    pub source: Arc<KubeConfigSource>,
    /// The driver's knobs.
    pub options: Options,
    /// The controller's series (shared across in-process restarts).
    pub metrics: ControllerMetrics,
    /// The writer election, if replicas elect one.
    pub election: Option<Election>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("namespace", &self.namespace)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

/// Runs the operator from `source` until `stop` resolves (then the driver is shut down,
/// persisting the fences) or the driver ends (a declared mode or trust change, or a
/// failure).
pub async fn run(
    setup: Setup,
    started: Started,
    stop: impl Future<Output = ()>,
) -> Result<(), Error> {
    let Setup {
        client,
        namespace,
        source,
        options,
        metrics,
        election,
    } = setup;
    let namespace = namespace.as_str();
    let mut stop = std::pin::pin!(stop);
    let site = source.deployment().site.clone();
    // Bound once: the standby's probes and then every driver start serve it in turn.
    let metrics_listener = HeldListener::bind(source.deployment().listen.metrics).await?;
    // A standby waits here, before it persists an epoch or publishes anything.
    let Some(mut held) = elect(
        &client,
        namespace,
        &site,
        election.as_ref(),
        &options,
        &metrics_listener,
        &metrics,
        &mut stop,
    )
    .await?
    else {
        return Ok(());
    };
    let mut restarts = 0u64;
    loop {
        let config = source.load()?;
        // The Lease keeps being renewed while the driver starts (a start failing on the
        // API is tried again for longer than a lease lasts), and a stop is heard.
        let starting = start_driver(
            &client,
            namespace,
            &config,
            &source,
            &options,
            &metrics,
            &metrics_listener,
        );
        let mut running = tokio::select! {
            started = starting => started?,
            e = &mut held => return Err(e),
            () = &mut stop => {
                if let Some(e) = &election {
                    super::lease::release(&client, namespace, &site, &e.identity).await;
                }
                return Ok(());
            }
        };
        let ready = tokio::spawn(super::ready::run(
            Api::namespaced(client.clone(), namespace),
            running.verdicts.clone(),
            metrics.clone(),
            options.clock.clone(),
        ));
        started.send_replace(Some(StartedDriver {
            restarts,
            reconfigured: 0,
            config: config.clone(),
            signals_addr: running.signals_addr,
            metrics_addr: running.metrics_addr,
            epoch: running.epoch,
            verdicts: running.verdicts.clone(),
        }));
        let mut config = config;
        let outcome = loop {
            let change = tokio::select! {
                result = running.wait() => break Some(result),
                change = changed(&source, &config, &metrics) => change,
                () = &mut stop => break Some(Ok(())),
                e = &mut held => break Some(Err(e)),
            };
            match change {
                Change::Live(next) => {
                    config = take_over(&running, &config, *next, &started, &metrics);
                }
                Change::Restart => break None,
                Change::Exit(e) => break Some(Err(e)),
            }
        };
        ready.abort();
        let Some(result) = outcome else {
            tracing::info!(
                "the resources changed the configuration; restarting the operator's tasks with it"
            );
            shutdown(running).await?;
            restarts += 1;
            continue;
        };
        // Persisted first, released after: a successor never starts before this
        // process's fences are written.
        let stopped = shutdown(running).await;
        if let Some(e) = &election
            && !matches!(result, Err(Error::LeaseLost { .. }))
        {
            super::lease::release(&client, namespace, &site, &e.identity).await;
        }
        return result.and(stopped);
    }
}

/// Starts the driver on `config`, its state in `namespace`'s site `ConfigMap`, serving
/// `/metrics` on `metrics_listener`; a start failing on an API call is tried again
/// ([`retrying_api_failures`]).
async fn start_driver(
    client: &kube::Client,
    namespace: &str,
    config: &Config,
    source: &Arc<KubeConfigSource>,
    options: &Options,
    metrics: &ControllerMetrics,
    metrics_listener: &HeldListener,
) -> Result<Running, Error> {
    let state = Arc::new(
        KubeStateStore::new(
            client.clone(),
            namespace,
            &config.site,
            &config.network,
            metrics.clone(),
        )
        .with_clock(options.clock.clone()),
    );
    let source: Arc<dyn ConfigSource> = source.clone();
    retrying_api_failures(|| {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        driver::start_with(
            config.clone(),
            Some(source.clone()),
            state.clone(),
            options.clone(),
            registry,
            Some(metrics_listener),
        )
    })
    .await
}

/// Runs `attempt` until it succeeds, fails other than on a Kubernetes API call, or the
/// next attempt would start past [`START_RETRY_WITHIN`]; pauses between attempts from
/// [`START_RETRY_PAUSE`], doubling to [`START_RETRY_PAUSE_MAX`]. Each failed call is
/// counted where it was made (`grid_operator_kube_failures_total`).
async fn retrying_api_failures<T, F, Fut>(mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let began = tokio::time::Instant::now();
    let mut pause = START_RETRY_PAUSE;
    loop {
        match attempt().await {
            Err(e @ (Error::Kube { .. } | Error::KubeConflict { .. }))
                if began.elapsed() + pause <= START_RETRY_WITHIN =>
            {
                tracing::warn!(error = %e, retry_in = ?pause, "the operator could not start: a Kubernetes API call failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(START_RETRY_PAUSE_MAX);
            }
            done => return done,
        }
    }
}

/// What ends a writer's tenure: the Lease lost.
type Tenure = std::pin::Pin<Box<dyn Future<Output = Error> + Send>>;

/// With an election, waits as a standby until this replica holds the site's Lease, then
/// keeps it (the tenure ends with [`Error::LeaseLost`]); without one, a tenure that never
/// ends. `None` when `stop` resolved first.
#[allow(clippy::too_many_arguments)]
async fn elect(
    client: &kube::Client,
    namespace: &str,
    site: &str,
    election: Option<&Election>,
    options: &Options,
    metrics_listener: &HeldListener,
    metrics: &ControllerMetrics,
    stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Tenure>, Error> {
    let Some(e) = election else {
        return Ok(Some(Box::pin(std::future::pending())));
    };
    let acquired = async {
        super::lease::acquire(
            client,
            namespace,
            site,
            &e.identity,
            e.timing,
            &options.clock,
        )
        .await;
    };
    if !as_standby(metrics_listener, metrics, acquired, stop).await? {
        return Ok(None);
    }
    Ok(Some(Box::pin(super::lease::hold(
        client.clone(),
        namespace.to_owned(),
        site.to_owned(),
        e.identity.clone(),
        e.timing,
        options.clock.clone(),
    ))))
}

/// Waits as a standby until `acquired` resolves (`true`: this replica holds the Lease)
/// or `stop` does (`false`). Meanwhile its probes answer on `metrics_listener`, alive and
/// not ready; their server has stopped when this returns, and the listener stays bound
/// for the driver.
async fn as_standby(
    metrics_listener: &HeldListener,
    metrics: &ControllerMetrics,
    acquired: impl Future<Output = ()>,
    stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<bool, Error> {
    let probes = standby_probes(metrics_listener, metrics)?;
    let held = tokio::select! {
        () = acquired => true,
        () = stop => false,
    };
    probes.abort();
    let _ = probes.await;
    Ok(held)
}

/// A standby's server on `metrics_listener`, answering the probes (alive, not ready) and
/// the controller's series until the task is aborted.
fn standby_probes(
    metrics_listener: &HeldListener,
    metrics: &ControllerMetrics,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let (listener, bound) = metrics_listener.share()?;
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    tracing::info!(metrics = %bound, "a standby: waiting for the site's Lease; /readyz answers 503 until it is held");
    Ok(tokio::spawn(crate::metrics::serve_standby(
        listener,
        Arc::new(registry),
    )))
}

/// Hands a change taken over live to the running driver; the configuration now
/// running. One that cannot be applied (an unreadable CA bundle) is counted as a
/// configuration that does not validate: the running one stays, and the next change is
/// tried afresh.
fn take_over(
    running: &Running,
    current: &Config,
    next: Config,
    started: &Started,
    metrics: &ControllerMetrics,
) -> Config {
    match running.reconfigure(current, &next) {
        Ok(()) => {
            started.send_modify(|s| {
                if let Some(s) = s {
                    s.reconfigured += 1;
                    s.config = next.clone();
                }
            });
        }
        Err(e) => {
            metrics.failed(Operation::InvalidConfig);
            tracing::warn!(error = %e, "the changed configuration cannot be applied; keeping the running one");
        }
    }
    next
}

async fn shutdown(running: Running) -> Result<(), Error> {
    running.shutdown().await
}

/// What a change of the resources asks of the running driver.
#[derive(Debug)]
enum Change {
    /// What [`Config::takes_over_live`] allows changed: taken over live, in the same
    /// epoch.
    Live(Box<Config>),
    /// Something else a driver is built from changed: start it again in-process.
    Restart,
    /// A process-global declaration changed (mode, or trust under poll): Kubernetes
    /// restarts the pod.
    Exit(Error),
}

/// Resolves once the resources declare something else than `current`. A change that
/// does not validate is counted and waited out. Unlike a file, a resource is never read
/// half written, so one reading is enough to act on.
async fn changed(
    source: &KubeConfigSource,
    current: &Config,
    metrics: &ControllerMetrics,
) -> Change {
    let mut changes = source.changes();
    let mut reported = None;
    loop {
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
        // Every network counts, not only the one served: a second GridNetwork created
        // with another mode after the start also sends the pod back to Kubernetes (whose
        // restart then refuses the two).
        let running = current.transport.as_str();
        let networks = source.resources().networks;
        if let Some(other) = networks
            .iter()
            .map(super::translate::declared_mode)
            .find(|m| *m != running)
        {
            return Change::Exit(Error::ModeChanged {
                running,
                declared: other.to_owned(),
            });
        }
        match source.load() {
            Ok(next) if next == *current => reported = None,
            Ok(next) if current.takes_over_live(&next) => {
                return Change::Live(Box::new(next));
            }
            // Only the poll path restarts on a peer trust change (it judges peers only
            // under the trust it started with): under gossip the trust is taken over live,
            // above.
            Ok(next) => {
                let under_poll = current.transport == crate::config::TransportMode::Poll;
                return match current.trust_differs(&next) {
                    Some(field) if under_poll => Change::Exit(Error::TrustChanged { field }),
                    _ => Change::Restart,
                };
            }
            Err(e) => {
                let text = e.to_string();
                if reported.as_ref() != Some(&text) {
                    metrics.failed(Operation::InvalidConfig);
                    tracing::warn!(error = %text, "the resources do not validate; serving the last good configuration");
                    reported = Some(text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_failure() -> Error {
        Error::Kube {
            operation: "reading the state ConfigMap",
            message: "503".into(),
        }
    }

    /// Runs [`retrying_api_failures`] over `answers` in turn (the last one repeated); the
    /// outcome, how many attempts were made, and when each began.
    async fn attempts(
        answers: Vec<fn() -> Result<u32, Error>>,
    ) -> (Result<u32, Error>, Vec<Duration>) {
        let began = tokio::time::Instant::now();
        let mut at = Vec::new();
        let outcome = retrying_api_failures(|| {
            at.push(began.elapsed());
            let answer = answers[(at.len() - 1).min(answers.len() - 1)];
            async move { answer() }
        })
        .await;
        (outcome, at)
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_failing_on_api_calls_is_tried_again_with_doubling_pauses_until_it_succeeds() {
        let (outcome, at) = attempts(vec![
            || Err(api_failure()),
            || {
                Err(Error::KubeConflict {
                    operation: "writing the epoch mark",
                })
            },
            || Ok(7),
        ])
        .await;
        assert_eq!(outcome.unwrap(), 7);
        assert_eq!(
            at,
            [Duration::ZERO, START_RETRY_PAUSE, START_RETRY_PAUSE * 3]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_start_attempt_begins_past_the_retry_bound_and_the_last_error_ends_the_start() {
        let (outcome, at) = attempts(vec![|| Err(api_failure())]).await;
        assert!(matches!(outcome, Err(Error::Kube { .. })), "{outcome:?}");
        let last = *at.last().unwrap();
        assert!(last <= START_RETRY_WITHIN, "{at:?}");
        let pauses: Vec<Duration> = at
            .windows(2)
            .map(|w| w[1].checked_sub(w[0]).unwrap())
            .collect();
        assert_eq!(pauses[0], START_RETRY_PAUSE);
        assert!(pauses.iter().all(|p| *p <= START_RETRY_PAUSE_MAX));
        assert_eq!(*pauses.last().unwrap(), START_RETRY_PAUSE_MAX, "{pauses:?}");
        // The next pause would have begun an attempt past the bound.
        assert!(last + START_RETRY_PAUSE_MAX > START_RETRY_WITHIN, "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_failing_other_than_on_an_api_call_ends_at_once() {
        let (outcome, at) = attempts(vec![|| {
            Err(Error::Bind {
                addr: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
                source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
            })
        }])
        .await;
        assert!(matches!(outcome, Err(Error::Bind { .. })), "{outcome:?}");
        assert_eq!(at, [Duration::ZERO]);
    }
}
