//! The test kit's fake Kubernetes API server, driven by kube's real `Client`: what the
//! controller's tests rely on it to do the way a real API server does.

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use grid_kit::fake_kube::{Action, FakeKube, Fault, Target};
use grid_operatord::controller::resources::{
    GridNetwork, GridNetworkSpec, GridNetworkStatus, Intervals, PeerTrust, TrustModeName,
};
use kube::api::{Api, DeleteParams, ListParams, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde_json::json;

const NS: &str = "grid";

fn client(fake: &FakeKube) -> kube::Client {
    let mut config = kube::Config::new(fake.url().parse().unwrap());
    config.default_namespace = NS.into();
    // kube retries 503s up to 15 times with a backoff growing to 1000 s; the operator turns
    // that off (every wait bounded), and so do these tests.
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn network(name: &str) -> GridNetwork {
    GridNetwork::new(
        name,
        GridNetworkSpec {
            signal_transport: None,
            peer_trust: PeerTrust {
                mode: TrustModeName::Pin,
                trust_domain: None,
            },
            intervals: None,
        },
    )
}

fn api(fake: &FakeKube) -> Api<GridNetwork> {
    Api::namespaced(client(fake), NS)
}

/// Creates `GridNetwork` `prod`, as most cases start.
async fn create_prod(api: &Api<GridNetwork>) -> GridNetwork {
    api.create(&PostParams::default(), &network("prod"))
        .await
        .unwrap()
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected a Status error, got {other}"),
    }
}

#[tokio::test]
async fn a_created_object_gets_a_uid_generation_one_and_is_listed_with_a_resource_version() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    let made = create_prod(&api).await;
    assert!(made.metadata.uid.is_some());
    assert_eq!(made.metadata.generation, Some(1));
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(rv, fake.with_store(|s| s.resource_version()));
    let again = api
        .create(&PostParams::default(), &network("prod"))
        .await
        .unwrap_err();
    assert_eq!(api_error(again), (409, "AlreadyExists".into()));
    let missing = api.get("nope").await.unwrap_err();
    assert_eq!(api_error(missing), (404, "NotFound".into()));
}

#[tokio::test]
async fn a_write_with_a_stale_resource_version_is_refused_with_409_conflict() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    let first = create_prod(&api).await;
    let mut newer = first.clone();
    newer.spec.intervals = Some(Intervals::default());
    newer.spec.peer_trust.mode = TrustModeName::Spiffe;
    api.replace("prod", &PostParams::default(), &newer)
        .await
        .unwrap();
    // `first` still carries the old resourceVersion.
    let stale = api
        .replace("prod", &PostParams::default(), &first)
        .await
        .unwrap_err();
    assert_eq!(api_error(stale), (409, "Conflict".into()));
}

#[tokio::test]
async fn the_status_subresource_touches_only_status_and_keeps_the_generation() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    let mut made = create_prod(&api).await;
    made.status = Some(GridNetworkStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    made.spec.peer_trust.mode = TrustModeName::Spiffe; // ignored by /status
    let written = api
        .replace_status("prod", &PostParams::default(), &made)
        .await
        .unwrap();
    assert_eq!(written.metadata.generation, Some(1));
    assert_eq!(written.spec.peer_trust.mode, TrustModeName::Pin);
    assert_eq!(written.status.unwrap().observed_generation, Some(1));
    // A main-resource write changes the spec, moves the generation and keeps the status.
    let mut spec_change = api.get("prod").await.unwrap();
    spec_change.spec.peer_trust.mode = TrustModeName::Spiffe;
    spec_change.status = None;
    let after = api
        .replace("prod", &PostParams::default(), &spec_change)
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(after.status.unwrap().observed_generation, Some(1));
}

#[tokio::test]
async fn a_recreated_object_of_the_same_name_gets_a_new_uid() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    let first = create_prod(&api).await;
    api.delete("prod", &DeleteParams::default()).await.unwrap();
    let second = create_prod(&api).await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_gets_a_410_expired_event() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    create_prod(&api).await;
    fake.with_store(grid_kit::fake_kube::store::Store::compact);
    let mut events = api
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected a 410 event, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_delivers_changes_after_its_version_and_bookmarks_when_asked() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    let made = create_prod(&api).await;
    let rv = made.metadata.resource_version.clone().unwrap();
    let mut events = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default().timeout(10)
            },
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    api.delete("prod", &DeleteParams::default()).await.unwrap();
    let mut saw_delete = false;
    let mut saw_bookmark = false;
    while !(saw_delete && saw_bookmark) {
        match tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Deleted(n)) => saw_delete = n.metadata.name.as_deref() == Some("prod"),
            Some(WatchEvent::Bookmark(_)) => saw_bookmark = true,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn injected_faults_answer_conflict_server_errors_and_slowly_then_stop() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    fake.inject(Fault {
        target: Target::Writes(String::new()),
        times: 2,
        action: Action::Conflict,
    });
    for _ in 0..2 {
        let e = api
            .create(&PostParams::default(), &network("prod"))
            .await
            .unwrap_err();
        assert_eq!(api_error(e).0, 409);
    }
    create_prod(&api).await;
    fake.inject(Fault {
        target: Target::Any,
        times: 1,
        action: Action::ServerError(500),
    });
    assert_eq!(
        api_error(api.get("prod").await.unwrap_err()),
        (500, "InternalError".into())
    );
    fake.inject(Fault {
        target: Target::Path("gridnetworks".into()),
        times: 1,
        action: Action::Delay(Duration::from_millis(300)),
    });
    let started = tokio::time::Instant::now();
    api.get("prod").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    fake.set_unavailable(true);
    assert_eq!(api_error(api.get("prod").await.unwrap_err()).0, 503);
    fake.set_unavailable(false);
    api.get("prod").await.unwrap();
}

#[tokio::test]
async fn the_kube_runtime_watcher_recovers_from_a_dropped_watch_and_a_compaction() {
    let fake = FakeKube::start().await;
    let api = api(&fake);
    api.create(&PostParams::default(), &network("one"))
        .await
        .unwrap();
    // The watcher is a lazy stream: a task polls it, so it re-watches on its own.
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let task = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event {
                let _ = tx.send(n.metadata.name.unwrap());
            }
        }
    });
    let next = async |seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(next(&mut seen).await, "one");
    let watches = || {
        fake.log()
            .iter()
            .filter(|l| l.query.contains("watch=true"))
            .count()
    };
    while watches() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fake.drop_watches();
    fake.with_store(grid_kit::fake_kube::store::Store::compact);
    api.create(&PostParams::default(), &network("two"))
        .await
        .unwrap();
    loop {
        if next(&mut seen).await == "two" {
            break;
        }
    }
    assert!(watches() >= 2, "the dropped watch was re-established");
    task.abort();
}

#[tokio::test]
async fn label_selectors_and_non_merge_patches_are_refused_not_misapplied() {
    let fake = FakeKube::start().await;
    fake.create(
        "gridnetworks",
        NS,
        json!({"metadata": {"name": "prod"}, "spec": {"peerTrust": {"mode": "pin"}}}),
    );
    let api = api(&fake);
    let e = api
        .list(&ListParams::default().labels("a=b"))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 400);
    let strategic = kube::api::Patch::Strategic(json!({"spec": {}}));
    let e = api
        .patch("prod", &PatchParams::default(), &strategic)
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 415);
    let merge = kube::api::Patch::Merge(json!({"spec": {"intervals": {"scrapeSeconds": 2.0}}}));
    let patched = api
        .patch("prod", &PatchParams::default(), &merge)
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
}
