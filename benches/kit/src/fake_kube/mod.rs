//! An in-process fake Kubernetes API server for the controller's tests: a hyper server on
//! 127.0.0.1 that kube's real `Client` talks to over plain HTTP, honest about what it
//! implements (the list below and `docs/crds.md`, "Testing without a cluster").
//!
//! It implements, for the resource types in [`store::RESOURCE_TYPES`]: get, list (with
//! the store's resourceVersion), create (409 `AlreadyExists`), replace and JSON merge
//! patch (409 Conflict when the body's `metadata.resourceVersion` is stale), delete (with
//! a resourceVersion precondition), the `/status` subresource (touches only `.status`;
//! main-resource writes leave `.status` alone), `metadata.generation` that moves on spec
//! changes only, a fresh `metadata.uid` per creation, watches
//! (`?watch=true&resourceVersion=N`, newline-delimited events, an ERROR event with a 410
//! Expired Status for a version older than the kept history, BOOKMARK events when
//! `allowWatchBookmarks=true`, `timeoutSeconds`), `fieldSelector=metadata.name=<name>`,
//! and Status-shaped error bodies. Faults are injected with [`Fault`]: 409 on the next N
//! writes, a 5xx, a slow answer, every watch dropped, the whole server unavailable.
//!
//! It does not implement: authentication and authorization (RBAC is not checked),
//! admission and schema validation (a CRD's `OpenAPI` schema is not applied; the
//! `kubernetes-validate` check covers the manifests instead), label selectors and any
//! field selector but `metadata.name` (400), strategic-merge, JSON and server-side-apply
//! patches (415), `generateName`, pagination (`limit` is ignored, every item is returned
//! with no `continue`), streaming lists (`sendInitialEvents`), `resourceVersionMatch`,
//! finalizers and garbage collection, `creationTimestamp` and `managedFields`, dry run,
//! protobuf, HTTP/2 and TLS, and any resource type not in the table (404).
#![allow(clippy::missing_panics_doc)] // a test fixture: every failure is the test's

pub mod store;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use store::{RESOURCE_TYPES, ResourceType, Store};

/// How often a watch that asked for bookmarks gets one (the real server: about a
/// minute; short here so tests see them).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_millis(500);
/// The longest `timeoutSeconds` a watch is held for; longer requests are cut to it.
pub const MAX_WATCH: Duration = Duration::from_secs(600);
/// The largest request body read.
pub const MAX_BODY: usize = 1 << 20;

/// A Kubernetes API error: the HTTP status and the `Status` body the real server sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status and `Status.code`.
    pub code: u16,
    /// `Status.reason`, e.g. `Conflict`.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }
    fn not_found(t: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{}.{} \"{name}\" not found", t.plural, t.prefix),
        )
    }
    fn already_exists(t: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.plural),
        )
    }
    fn conflict(t: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                t.plural
            ),
        )
    }
    fn bad_request(message: &str) -> Self {
        Self::new(400, "BadRequest", message)
    }
    fn expired(asked: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {asked} ({oldest})"),
        )
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// Which requests a [`Fault`] applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every request.
    Any,
    /// POST, PUT, PATCH and DELETE whose path contains the text (empty: every write).
    Writes(String),
    /// Any request whose path contains the text.
    Path(String),
}

/// What a [`Fault`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer 409 Conflict without writing.
    Conflict,
    /// Answer this 5xx with an `InternalError` Status.
    ServerError(u16),
    /// Wait this long, then answer normally.
    Delay(Duration),
}

/// An injected fault: `action` on the next `times` requests `target` matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which requests.
    pub target: Target,
    /// How many of them.
    pub times: u32,
    /// What happens.
    pub action: Action,
}

/// One request, as the fake saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// The method.
    pub method: Method,
    /// The path.
    pub path: String,
    /// The query string.
    pub query: String,
}

#[derive(Debug, Default)]
struct Shared {
    store: Store,
    faults: Vec<Fault>,
    log: Vec<Logged>,
    unavailable: bool,
}

/// A running fake API server. Dropping it stops it.
pub struct FakeKube {
    /// Where it listens (plain HTTP).
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    drops: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for FakeKube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKube")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed())
        .expect("static parts are valid")
}

fn error(e: &ApiError) -> Response<Body> {
    full(e.code, &e.status())
}

/// A parsed resource path.
#[derive(Debug)]
struct Route {
    t: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn route(path: &str) -> Result<Route, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    };
    let path = path.trim_start_matches('/');
    let t_prefix = RESOURCE_TYPES
        .iter()
        .map(|t| t.prefix)
        .find(|p| path.starts_with(p) && path[p.len()..].starts_with('/'))
        .ok_or_else(not_found)?;
    let rest: Vec<&str> = path[t_prefix.len() + 1..].split('/').collect();
    let (namespace, rest) = match rest.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => {
            (Some((*ns).to_owned()), rest.to_vec())
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, status) = match rest.as_slice() {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (*plural, Some((*name).to_owned()), true),
        _ => return Err(not_found()),
    };
    let t = RESOURCE_TYPES
        .iter()
        .find(|t| t.prefix == t_prefix && t.plural == plural)
        .ok_or_else(not_found)?;
    if status && !t.status_subresource {
        return Err(not_found());
    }
    if name.is_some() && namespace.is_none() {
        return Err(not_found());
    }
    Ok(Route {
        t,
        namespace,
        name,
        status,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                if let Some(b) = hex {
                    out.push(b);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

impl FakeKube {
    /// Starts an empty fake on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (drops, _) = watch::channel(0u64);
        let (s, d) = (shared.clone(), drops.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (s, d) = (s.clone(), d.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (s, d) = (s.clone(), d.clone());
                        async move { Ok::<_, Infallible>(handle(s, d, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            shared,
            drops,
            task,
        }
    }

    /// The base URL for `kube::Config::new`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs `f` on the store (seed objects, read what the operator wrote).
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.shared.lock().store)
    }

    /// Creates an object as a user would (`kubectl create`): `plural` names the type.
    pub fn create(&self, plural: &str, namespace: &str, object: Value) -> Value {
        let t = type_of(plural);
        self.with_store(|s| s.create(t, namespace, object)).unwrap()
    }

    /// Replaces an object's spec (main resource, unconditionally), as `kubectl replace`.
    pub fn replace(&self, plural: &str, namespace: &str, object: Value) -> Value {
        let t = type_of(plural);
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let mut object = object;
        if let Some(m) = object["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        self.with_store(|s| s.replace(t, namespace, &name, object, false))
            .unwrap()
    }

    /// One object, if it exists.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let t = type_of(plural);
        self.with_store(|s| s.get(t, namespace, name).ok())
    }

    /// Deletes an object.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) {
        let t = type_of(plural);
        self.with_store(|s| s.delete(t, namespace, name, None))
            .unwrap();
    }

    /// Injects a fault; faults apply in the order injected.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    /// Makes every request answer 503 (`true`) or the fake serve again (`false`); open
    /// watches are dropped when it goes away.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.shared.lock().unavailable = unavailable;
        if unavailable {
            self.drop_watches();
        }
    }

    /// Ends every open watch stream now (the client sees the stream close).
    pub fn drop_watches(&self) {
        self.drops.send_modify(|n| *n += 1);
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.shared.lock().log.clone()
    }

    /// Writes (POST, PUT, PATCH, DELETE) so far whose path contains `text`.
    pub fn writes_to(&self, text: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|l| is_write(&l.method) && l.path.contains(text))
            .count()
    }
}

/// The resource type of `plural`; a test naming another is a bug in the test.
pub fn type_of(plural: &str) -> &'static ResourceType {
    RESOURCE_TYPES
        .iter()
        .find(|t| t.plural == plural)
        .unwrap_or_else(|| panic!("the fake serves no `{plural}`"))
}

fn is_write(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The fault due for this request, consumed.
fn due_fault(shared: &mut Shared, method: &Method, path: &str) -> Option<Action> {
    let i = shared.faults.iter().position(|f| {
        f.times > 0
            && match &f.target {
                Target::Any => true,
                Target::Writes(text) => is_write(method) && path.contains(text.as_str()),
                Target::Path(text) => path.contains(text.as_str()),
            }
    })?;
    let fault = &mut shared.faults[i];
    fault.times -= 1;
    let action = fault.action.clone();
    if fault.times == 0 {
        shared.faults.remove(i);
    }
    Some(action)
}

/// The injected fault's answer, if one is due and answers instead of the store.
async fn fault_answer(
    shared: &Mutex<Shared>,
    method: &Method,
    path: &str,
    query: &str,
) -> Option<Response<Body>> {
    let (fault, unavailable) = {
        let mut s = shared.lock();
        s.log.push(Logged {
            method: method.clone(),
            path: path.to_owned(),
            query: query.to_owned(),
        });
        (due_fault(&mut s, method, path), s.unavailable)
    };
    if unavailable {
        return Some(error(&ApiError::new(
            503,
            "ServiceUnavailable",
            "the fake API server is unavailable",
        )));
    }
    match fault {
        Some(Action::Conflict) if is_write(method) => {
            let name = path
                .rsplit('/')
                .find(|s| *s != "status")
                .unwrap_or_default();
            Some(error(&ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on \"{name}\": the object has been modified; please apply your changes to the latest version and try again (injected)"
                ),
            )))
        }
        Some(Action::ServerError(code)) => Some(error(&ApiError::new(
            code,
            "InternalError",
            "injected server error",
        ))),
        Some(Action::Delay(by)) => {
            tokio::time::sleep(by).await;
            None
        }
        _ => None,
    }
}

/// The `metadata.name` a field selector names; any other selector is refused.
fn name_selector(params: &[(String, String)]) -> Result<Option<String>, ApiError> {
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if param("labelSelector").is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "labelSelector is not implemented by the fake",
        ));
    }
    match param("fieldSelector").filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(sel) => match sel.strip_prefix("metadata.name=") {
            Some(name) if !name.contains(',') => Ok(Some(name.to_owned())),
            _ => Err(ApiError::bad_request(
                "only fieldSelector=metadata.name=<name> is implemented by the fake",
            )),
        },
    }
}

async fn handle(
    shared: Arc<Mutex<Shared>>,
    drops: watch::Sender<u64>,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let q = parts.uri.query().unwrap_or_default().to_owned();
    if let Some(answer) = fault_answer(&shared, &parts.method, &path, &q).await {
        return answer;
    }
    let params = query(&q);
    let (route, selected) = match route(&path).and_then(|r| Ok((r, name_selector(&params)?))) {
        Ok(r) => r,
        Err(e) => return error(&e),
    };
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if parts.method == Method::GET
        && route.name.is_none()
        && param("watch").is_some_and(|w| w == "true" || w == "1")
    {
        let from = param("resourceVersion").and_then(|v| v.parse().ok());
        let timeout = param("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .map_or(MAX_WATCH, |s: u64| Duration::from_secs(s).min(MAX_WATCH));
        let bookmarks = param("allowWatchBookmarks") == Some("true");
        return watch_stream(
            &shared,
            drops.subscribe(),
            route.t,
            route.namespace,
            selected,
            from,
            timeout,
            bookmarks,
        );
    }
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Ok(bytes) = http_body_util::Limited::new(body, MAX_BODY).collect().await else {
        return error(&ApiError::new(
            413,
            "RequestEntityTooLarge",
            "body too large",
        ));
    };
    let call = Call {
        method: parts.method,
        route,
        selected,
        content_type,
        body: bytes.to_bytes(),
    };
    match dispatch(&mut shared.lock().store, call) {
        Ok((code, v)) => full(code, &v),
        Err(e) => error(&e),
    }
}

/// One non-watch request, parsed.
struct Call {
    method: Method,
    route: Route,
    selected: Option<String>,
    content_type: String,
    body: Bytes,
}

/// Answers one non-watch request from the store.
fn dispatch(store: &mut Store, call: Call) -> Result<(u16, Value), ApiError> {
    let json_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&call.body)
            .map_err(|e| ApiError::bad_request(&format!("body is not JSON: {e}")))
    };
    let Route {
        t,
        namespace,
        name,
        status,
    } = call.route;
    let ns = namespace.clone().unwrap_or_default();
    match (call.method, name) {
        (Method::GET, None) => {
            let (items, rv) = store.list(t, namespace.as_deref());
            let items: Vec<Value> = items
                .into_iter()
                .filter(|o| {
                    call.selected
                        .as_deref()
                        .is_none_or(|n| o["metadata"]["name"] == n)
                })
                .collect();
            Ok((
                200,
                json!({
                    "kind": format!("{}List", t.kind),
                    "apiVersion": t.api_version,
                    "metadata": {"resourceVersion": rv.to_string()},
                    "items": items,
                }),
            ))
        }
        (Method::GET, Some(name)) => store.get(t, &ns, &name).map(|v| (200, v)),
        (Method::POST, None) if !status => json_body()
            .and_then(|b| store.create(t, &ns, b))
            .map(|v| (201, v)),
        (Method::PUT, Some(name)) => json_body()
            .and_then(|b| store.replace(t, &ns, &name, b, status))
            .map(|v| (200, v)),
        (Method::PATCH, Some(name)) => {
            if call
                .content_type
                .starts_with("application/merge-patch+json")
            {
                json_body()
                    .and_then(|b| store.merge_patch(t, &ns, &name, &b, status))
                    .map(|v| (200, v))
            } else {
                Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the fake implements only merge patches, not {}",
                        call.content_type
                    ),
                ))
            }
        }
        (Method::DELETE, Some(name)) if !status => {
            let options = if call.body.is_empty() {
                None
            } else {
                json_body().ok()
            };
            store
                .delete(t, &ns, &name, options.as_ref())
                .map(|v| (200, v))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the fake does not implement this verb here",
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn watch_stream(
    shared: &Arc<Mutex<Shared>>,
    mut drops: watch::Receiver<u64>,
    t: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    from: Option<u64>,
    timeout: Duration,
    bookmarks: bool,
) -> Response<Body> {
    let start = shared.lock().store.watch(t, namespace.as_deref(), from);
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(16);
    let shared = shared.clone();
    drops.mark_unchanged();
    tokio::spawn(async move {
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        let mut start = match start {
            Ok(s) => s,
            Err(e) => {
                let _ = tx
                    .send_data(line(json!({"type": "ERROR", "object": e.status()})))
                    .await;
                return;
            }
        };
        let wanted = |o: &Value| name.as_deref().is_none_or(|n| o["metadata"]["name"] == n);
        for e in std::mem::take(&mut start.replay) {
            if wanted(&e.object)
                && tx
                    .send_data(line(json!({"type": e.kind.as_str(), "object": e.object})))
                    .await
                    .is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut bookmark = tokio::time::interval(BOOKMARK_INTERVAL);
        bookmark.tick().await;
        loop {
            tokio::select! {
                () = &mut deadline => return,
                _ = drops.changed() => return,
                _ = bookmark.tick(), if bookmarks => {
                    let rv = shared.lock().store.resource_version();
                    let mark = json!({"type": "BOOKMARK", "object": {
                        "kind": t.kind, "apiVersion": t.api_version,
                        "metadata": {"resourceVersion": rv.to_string()},
                    }});
                    if tx.send_data(line(mark)).await.is_err() {
                        return;
                    }
                }
                event = start.live.recv() => {
                    let Ok(e) = event else { return };
                    if e.rv <= start.after || e.plural != t.plural
                        || namespace.as_deref().is_some_and(|ns| ns != e.namespace)
                        || !wanted(&e.object)
                    {
                        continue;
                    }
                    if tx.send_data(line(json!({"type": e.kind.as_str(), "object": e.object}))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(body.boxed())
        .expect("static parts are valid")
}
