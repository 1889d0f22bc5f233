//! The fake API server's object store: objects as JSON, one resourceVersion counter for
//! the whole store (as etcd's revision is), a bounded event history for watches, and the
//! metadata rules the real server applies (uid, generation, resourceVersion
//! preconditions, the status subresource).

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::ApiError;

/// The most events kept for watches; a watch from a resourceVersion older than the oldest
/// kept answers 410 Expired, as the real server does after etcd compaction.
pub const MAX_HISTORY: usize = 1024;
/// Live events buffered per watcher before it lags (and its stream is ended, so the
/// client re-lists, as after a real server's watch-cache overflow).
pub const WATCH_BUFFER: usize = 1024;

/// One resource type the fake serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// `api/v1` or `apis/<group>/<version>`.
    pub prefix: &'static str,
    /// The URL plural, e.g. `configmaps`.
    pub plural: &'static str,
    /// The `kind`.
    pub kind: &'static str,
    /// The `apiVersion`.
    pub api_version: &'static str,
    /// Whether writes to the main resource leave `.status` alone and `/status` exists,
    /// and whether `metadata.generation` is kept (custom resources with a status
    /// subresource; `GridSite` has none but keeps a generation as every CR does).
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (custom resources).
    pub generation: bool,
}

/// Every resource type the fake serves: the three grid CRDs, `ConfigMap` and `Lease`.
pub const RESOURCE_TYPES: &[ResourceType] = &[
    ResourceType {
        prefix: "api/v1",
        plural: "configmaps",
        kind: "ConfigMap",
        api_version: "v1",
        status_subresource: false,
        generation: false,
    },
    ResourceType {
        prefix: "apis/coordination.k8s.io/v1",
        plural: "leases",
        kind: "Lease",
        api_version: "coordination.k8s.io/v1",
        status_subresource: false,
        generation: false,
    },
    ResourceType {
        prefix: "apis/grid.llm-d.io/v1alpha1",
        plural: "gridnetworks",
        kind: "GridNetwork",
        api_version: "grid.llm-d.io/v1alpha1",
        status_subresource: true,
        generation: true,
    },
    ResourceType {
        prefix: "apis/grid.llm-d.io/v1alpha1",
        plural: "gridsites",
        kind: "GridSite",
        api_version: "grid.llm-d.io/v1alpha1",
        status_subresource: false,
        generation: true,
    },
    ResourceType {
        prefix: "apis/grid.llm-d.io/v1alpha1",
        plural: "inferenceproviders",
        kind: "InferenceProvider",
        api_version: "grid.llm-d.io/v1alpha1",
        status_subresource: true,
        generation: true,
    },
];

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Deleted.
    Deleted,
}

impl EventType {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches deliver it.
#[derive(Clone, Debug)]
pub struct Event {
    /// The store's resourceVersion after the change.
    pub rv: u64,
    /// Which resource type (its plural).
    pub plural: &'static str,
    /// The object's namespace.
    pub namespace: String,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (before it, for a deletion, with the new version).
    pub object: Value,
}

type Key = (&'static str, String, String);

/// Objects and their history.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    uids: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// Watches from a version below this are refused with 410.
    oldest: u64,
    live: broadcast::Sender<Event>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            rv: 1,
            uids: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            oldest: 1,
            live: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

/// Where a watch starts: events to replay, then live ones above `after`.
#[derive(Debug)]
pub struct WatchStart {
    /// Events already due, oldest first.
    pub replay: Vec<Event>,
    /// Live events; skip those at or below `after`.
    pub live: broadcast::Receiver<Event>,
    /// The last version replayed.
    pub after: u64,
}

fn meta(object: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    object
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    object["metadata"]
        .as_object_mut()
        .expect("made an object above")
}

/// The `metadata.resourceVersion` a write body carries as its precondition, if any.
fn precondition(body: &Value) -> Option<&str> {
    meta(body)
        .get("resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The object without what the server owns, to tell a spec change from none.
fn desired(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("status");
        map.remove("metadata");
    }
    copy
}

impl Store {
    /// The store's current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Forgets every event so far, as an etcd compaction does: a watch from any version
    /// below the current one then answers 410 Expired.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest = self.rv;
    }

    /// One object.
    pub fn get(&self, t: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(t.plural, ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(t, name))
    }

    /// Every object of `t` in `ns` (every namespace when `None`), sorted by namespace and
    /// name, with the list's resourceVersion.
    pub fn list(&self, t: &ResourceType, ns: Option<&str>) -> (Vec<Value>, u64) {
        let items = self
            .objects
            .iter()
            .filter(|((p, n, _), _)| *p == t.plural && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect();
        (items, self.rv)
    }

    /// Creates an object: 409 `AlreadyExists` when the name is taken.
    pub fn create(
        &mut self,
        t: &ResourceType,
        ns: &str,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        let name = meta(&body)
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "metadata.name is required (generateName is not implemented by the fake)",
                )
            })?
            .to_owned();
        let key = (t.plural, ns.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(t, &name));
        }
        if t.status_subresource
            && let Some(map) = body.as_object_mut()
        {
            map.remove("status");
        }
        body["apiVersion"] = json!(t.api_version);
        body["kind"] = json!(t.kind);
        self.uids += 1;
        self.rv += 1;
        let (rv, uid) = (self.rv, format!("fake-uid-{}", self.uids));
        let m = meta_mut(&mut body);
        m.insert("namespace".into(), json!(ns));
        m.insert("uid".into(), json!(uid));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        if t.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        self.objects.insert(key, body.clone());
        self.record(t, ns, EventType::Added, body.clone());
        Ok(body)
    }

    /// Replaces an object (`status` false: the main resource; true: `/status`). A body
    /// resourceVersion other than the stored one is refused with 409 Conflict; an absent
    /// one writes unconditionally. An update that changes nothing keeps the version and
    /// sends no event, as the real server does.
    pub fn replace(
        &mut self,
        t: &ResourceType,
        ns: &str,
        name: &str,
        body: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let key = (t.plural, ns.to_owned(), name.to_owned());
        let existing = self.get(t, ns, name)?;
        if meta(&body)
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return Err(ApiError::bad_request(
                "metadata.name does not match the URL",
            ));
        }
        if let Some(expected) = precondition(&body) {
            let current = meta(&existing)
                .get("resourceVersion")
                .and_then(Value::as_str);
            if current != Some(expected) {
                return Err(ApiError::conflict(t, name));
            }
        }
        let mut next = if status {
            let mut next = existing.clone();
            match body.get("status") {
                Some(s) => next["status"] = s.clone(),
                None => {
                    if let Some(map) = next.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
            next
        } else {
            let mut next = body;
            next["apiVersion"] = json!(t.api_version);
            next["kind"] = json!(t.kind);
            if t.status_subresource {
                match existing.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(map) = next.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
            }
            let old = meta(&existing).clone();
            let m = meta_mut(&mut next);
            for owned in [
                "uid",
                "namespace",
                "name",
                "generation",
                "creationTimestamp",
            ] {
                match old.get(owned) {
                    Some(v) => m.insert(owned.into(), v.clone()),
                    None => m.remove(owned),
                };
            }
            if t.generation && desired(&next) != desired(&existing) {
                let g = old.get("generation").and_then(Value::as_i64).unwrap_or(0);
                meta_mut(&mut next).insert("generation".into(), json!(g + 1));
            }
            next
        };
        meta_mut(&mut next).insert(
            "resourceVersion".into(),
            meta(&existing)
                .get("resourceVersion")
                .cloned()
                .unwrap_or(Value::Null),
        );
        if next == existing {
            return Ok(existing);
        }
        self.rv += 1;
        meta_mut(&mut next).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.objects.insert(key, next.clone());
        self.record(t, ns, EventType::Modified, next.clone());
        Ok(next)
    }

    /// Applies a JSON merge patch (RFC 7386), then writes as [`Store::replace`] does; a
    /// `metadata.resourceVersion` in the patch is its precondition.
    pub fn merge_patch(
        &mut self,
        t: &ResourceType,
        ns: &str,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let existing = self.get(t, ns, name)?;
        if let Some(expected) = precondition(patch)
            && meta(&existing)
                .get("resourceVersion")
                .and_then(Value::as_str)
                != Some(expected)
        {
            return Err(ApiError::conflict(t, name));
        }
        let mut next = existing;
        merge(&mut next, patch);
        meta_mut(&mut next).remove("resourceVersion");
        self.replace(t, ns, name, next, status)
    }

    /// Deletes an object; a `preconditions.resourceVersion` in the options is checked.
    pub fn delete(
        &mut self,
        t: &ResourceType,
        ns: &str,
        name: &str,
        options: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let key = (t.plural, ns.to_owned(), name.to_owned());
        let existing = self.get(t, ns, name)?;
        let expected = options
            .and_then(|o| o.pointer("/preconditions/resourceVersion"))
            .and_then(Value::as_str);
        if let Some(expected) = expected
            && meta(&existing)
                .get("resourceVersion")
                .and_then(Value::as_str)
                != Some(expected)
        {
            return Err(ApiError::conflict(t, name));
        }
        self.objects.remove(&key);
        self.rv += 1;
        let mut gone = existing;
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.record(t, ns, EventType::Deleted, gone.clone());
        Ok(gone)
    }

    /// Where a watch of `t` in `ns` from version `from` starts. `None` (or `0`) means
    /// "any": every current object as ADDED, then what follows. A version below the
    /// oldest kept event is 410 Expired.
    pub fn watch(
        &self,
        t: &ResourceType,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, ApiError> {
        let live = self.live.subscribe();
        let matches = |e: &Event| e.plural == t.plural && ns.is_none_or(|ns| ns == e.namespace);
        match from.filter(|v| *v != 0) {
            None => {
                let (items, rv) = self.list(t, ns);
                let replay = items
                    .into_iter()
                    .map(|object| Event {
                        rv,
                        plural: t.plural,
                        namespace: meta(&object)
                            .get("namespace")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        kind: EventType::Added,
                        object,
                    })
                    .collect();
                Ok(WatchStart {
                    replay,
                    live,
                    after: rv,
                })
            }
            Some(v) if v < self.oldest => Err(ApiError::expired(v, self.oldest)),
            Some(v) => Ok(WatchStart {
                replay: self
                    .history
                    .iter()
                    .filter(|e| e.rv > v && matches(e))
                    .cloned()
                    .collect(),
                live,
                after: self.rv.max(v),
            }),
        }
    }

    fn record(&mut self, t: &ResourceType, ns: &str, kind: EventType, object: Value) {
        let event = Event {
            rv: self.rv,
            plural: t.plural,
            namespace: ns.to_owned(),
            kind,
            object,
        };
        self.history.push_back(event.clone());
        while self.history.len() > MAX_HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.oldest = old.rv;
            }
        }
        // No watcher is not an error: the event stays in the history.
        let _ = self.live.send(event);
    }
}

/// RFC 7386: objects merge key by key, `null` deletes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Some(map) = target.as_object_mut() else {
        return;
    };
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps() -> &'static ResourceType {
        &RESOURCE_TYPES[0]
    }

    #[test]
    fn a_watch_from_the_oldest_kept_event_works_and_one_before_it_is_expired() {
        let mut s = Store::default();
        s.create(
            maps(),
            "ns",
            json!({"metadata": {"name": "cm"}, "data": {"n": "0"}}),
        )
        .unwrap();
        let first = s.resource_version();
        for i in 1..=MAX_HISTORY {
            s.replace(
                maps(),
                "ns",
                "cm",
                json!({"metadata": {"name": "cm"}, "data": {"n": i.to_string()}}),
                false,
            )
            .unwrap();
        }
        // MAX_HISTORY + 1 events written: the first one was dropped from the history.
        assert_eq!(s.history.len(), MAX_HISTORY);
        let err = s.watch(maps(), Some("ns"), Some(first - 1)).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        let from_oldest = s.watch(maps(), Some("ns"), Some(first)).unwrap();
        assert_eq!(from_oldest.replay.len(), MAX_HISTORY);
    }

    #[test]
    fn an_update_that_changes_nothing_keeps_the_version_and_sends_no_event() {
        let mut s = Store::default();
        let made = s
            .create(
                maps(),
                "ns",
                json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}),
            )
            .unwrap();
        let rv = s.resource_version();
        let same = s.replace(maps(), "ns", "cm", made, false).unwrap();
        assert_eq!(s.resource_version(), rv);
        assert_eq!(same["metadata"]["resourceVersion"], rv.to_string());
        assert_eq!(s.history.len(), 1);
    }

    #[test]
    fn a_merge_patch_deletes_with_null_and_merges_objects() {
        let mut target = json!({"a": {"b": 1, "c": 2}, "d": 3});
        merge(&mut target, &json!({"a": {"b": null, "e": 4}, "d": [1]}));
        assert_eq!(target, json!({"a": {"c": 2, "e": 4}, "d": [1]}));
    }
}
