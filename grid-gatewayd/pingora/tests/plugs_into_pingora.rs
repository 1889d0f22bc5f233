//! grid's answers to Pingora's own traits, on a routing view built as the gateway builds
//! it (two sites of model `m`, not yet measured: routed by the fallback path).

use std::collections::BTreeSet;
use std::sync::Arc;

use grid_pingora::{
    ChosenFor, GridHealth, GridSelection, SiteBackends, SiteOf, backend_of, refusal,
};
use grid_score::catalog::{CandidateSpec, Catalog, ModelSpec};
use grid_score::refresh::Refresher;
use pingora_load_balancing::Backend;
use pingora_load_balancing::health_check::HealthCheck as _;
use pingora_load_balancing::selection::{BackendIter as _, BackendSelection as _};

fn candidate(site: &str, scheme: &str, authority: &str) -> CandidateSpec {
    CandidateSpec {
        site: site.into(),
        provider: "p".into(),
        scheme: scheme.into(),
        authority: authority.into(),
        prefix: String::new(),
    }
}

fn published(candidates: Vec<CandidateSpec>) -> grid_gateway::upstream::Published {
    let catalog = Arc::new(Catalog::new(&[ModelSpec {
        name: "m".into(),
        candidates,
    }]));
    let mut refresher = Refresher::new(
        catalog,
        grid_score::ScoreConfig::default(),
        grid_signals::store::StoreConfig::default(),
        None,
    );
    let view = refresher.refresh(grid_gateway::clock::wall_ms()).view;
    Arc::new(arc_swap::ArcSwap::from_pointee(view))
}

/// [`two_sites`], its backends as discovery lists them, and grid's selection over them.
fn two_sites_selected() -> (
    grid_gateway::upstream::Published,
    BTreeSet<Backend>,
    Arc<GridSelection>,
) {
    let routes = two_sites();
    let backends = SiteBackends::new(routes.clone()).list().unwrap();
    let selection = Arc::new(GridSelection::build_with_config(&backends, &routes));
    (routes, backends, selection)
}

fn two_sites() -> grid_gateway::upstream::Published {
    published(vec![
        candidate("a", "http", "127.0.0.1:8001"),
        candidate("b", "http", "127.0.0.1:8002"),
    ])
}

fn site_of(b: &Backend) -> &str {
    &b.ext
        .get::<SiteOf>()
        .expect("grid's backends carry their site")
        .site
}

#[test]
fn the_backends_are_one_per_site_each_carrying_its_site() {
    let backends = SiteBackends::new(two_sites()).list().unwrap();
    let sites: Vec<&str> = backends.iter().map(site_of).collect();
    assert_eq!(sites, ["a", "b"]);
    let a = backends.iter().next().unwrap();
    assert_eq!(a.addr.to_string(), "127.0.0.1:8001");
    assert!(!a.ext.get::<SiteOf>().unwrap().tls);
}

#[test]
fn a_base_url_without_a_port_gets_its_schemes_default_and_its_host_for_sni() {
    let routes = published(vec![
        candidate("a", "https", "127.0.0.1"),
        candidate("b", "http", "127.0.0.1"),
    ]);
    let view = routes.load();
    let upstreams = &view.catalog().models()[0].upstreams;
    let a = backend_of(&upstreams[0]).unwrap();
    assert_eq!(a.addr.to_string(), "127.0.0.1:443");
    let of = a.ext.get::<SiteOf>().unwrap();
    assert!(of.tls);
    assert_eq!(of.host, "127.0.0.1");
    assert_eq!(
        backend_of(&upstreams[1]).unwrap().addr.to_string(),
        "127.0.0.1:80"
    );
}

#[test]
fn an_authority_that_does_not_resolve_is_an_error_naming_the_site() {
    // A NUL in the name is refused before any lookup: no query leaves the machine.
    let routes = published(vec![candidate("a", "http", "bad\0host:80")]);
    let err = SiteBackends::new(routes).list().unwrap_err();
    assert!(err.to_string().contains("site a"), "{err}");
}

#[test]
fn the_selection_yields_grids_pick_then_the_other_site_for_a_retry() {
    let (_, _, selection) = two_sites_selected();
    let mut iter = selection.iter(b"m");
    let first = site_of(iter.next().expect("a pick")).to_owned();
    let second = site_of(iter.next().expect("a retry site")).to_owned();
    assert_ne!(first, second);
    assert!(iter.next().is_none(), "two tries at most");
}

#[test]
fn a_chosen_backend_counts_a_request_sent_there_in_flight_at_its_site_until_it_ends() {
    let (routes, backends, selection) = two_sites_selected();
    let mut iter = selection.iter(b"m");
    let first = iter.next().expect("a pick").clone();
    let retry = iter.next().expect("a retry site").clone();
    let view = routes.load();
    let slot_of = |b: &Backend| {
        view.catalog()
            .get("m")
            .unwrap()
            .upstreams
            .iter()
            .find(|u| *u.site == *site_of(b))
            .unwrap()
            .live_shared()
    };
    for backend in [&first, &retry] {
        let chosen = backend
            .ext
            .get::<ChosenFor>()
            .expect("a chosen backend's slot");
        assert!(
            Arc::ptr_eq(&chosen.0, &slot_of(backend)),
            "{}",
            site_of(backend)
        );
    }
    let slot = slot_of(&first);
    // As the proxy holds it: from the attempt's send until its context is dropped.
    let in_flight = first.ext.get::<ChosenFor>().unwrap().0.in_flight();
    assert_eq!(slot.drain().outstanding, 1);
    assert_eq!(slot_of(&retry).drain().outstanding, 0);
    drop(in_flight);
    assert_eq!(slot.drain().outstanding, 0);
    let listed = backends
        .iter()
        .find(|b| site_of(b) == site_of(&first))
        .unwrap();
    assert!(
        listed.ext.get::<ChosenFor>().is_none(),
        "the listed backend itself is left as discovery made it"
    );
}

#[test]
fn the_selection_yields_nothing_for_a_model_grid_does_not_serve_or_without_a_view() {
    let (routes, backends, selection) = two_sites_selected();
    assert!(selection.iter(b"other").next().is_none());
    assert!(selection.iter(&[0xff, 0xfe]).next().is_none(), "not UTF-8");
    let viewless = Arc::new(GridSelection::build(&backends));
    assert!(viewless.iter(b"m").next().is_none());
    let none = Arc::new(GridSelection::build_with_config(&BTreeSet::new(), &routes));
    assert!(
        none.iter(b"m").next().is_none(),
        "no backend listed for the pick"
    );
}

#[test]
fn a_refusal_for_an_unknown_model_is_the_gateways_404_and_none_when_grid_routes() {
    let routes = two_sites();
    let view = routes.load();
    let refused = refusal(&view, "other").expect("an unknown model is refused");
    assert_eq!(refused.status(), 404);
    let body: serde_json::Value = serde_json::from_slice(refused.body()).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(refusal(&view, "m").is_none(), "m routes: nothing to refuse");
}

#[tokio::test]
async fn health_is_grids_a_routed_site_is_healthy_and_an_unlisted_backend_is_not() {
    let routes = two_sites();
    let health = GridHealth::new(routes.clone());
    for backend in SiteBackends::new(routes).list().unwrap() {
        health
            .check(&backend)
            .await
            .expect("grid routes to both sites");
    }
    let stranger = Backend::new("127.0.0.1:9").unwrap();
    assert!(health.check(&stranger).await.is_err());
    assert!(!health.routes_to("z"));
    assert_eq!(health.health_threshold(true), 1);
}

#[test]
fn the_body_limit_is_the_gateways_up_to_what_pingora_can_replay_and_refused_above_it() {
    use grid_gateway::config::{OperatorConfig, TlsFiles};
    let mut config = grid_gateway::Config::new(
        "a",
        "127.0.0.1:0".parse().unwrap(),
        OperatorConfig::new("https://127.0.0.1:9", "operator.a.grid"),
        TlsFiles::new("gateway.crt", "gateway.key", None::<&str>),
    );
    config.body_limit_bytes = grid_pingora::MAX_REPLAYED_BODY_BYTES;
    assert_eq!(
        grid_pingora::body_limit(&config).unwrap(),
        grid_pingora::MAX_REPLAYED_BODY_BYTES
    );
    config.body_limit_bytes = grid_pingora::MAX_REPLAYED_BODY_BYTES + 1;
    let refused = grid_pingora::body_limit(&config).unwrap_err();
    assert!(
        refused.to_string().contains("bodyLimitBytes"),
        "names the key: {refused}"
    );
}
