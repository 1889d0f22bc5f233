//! One provider's entry: its ordering state, revision, learning lifetime and windows.

use super::learning::Lifetime;
use super::publication::Publication;
use super::window::Window;
use super::{
    Learning, MAX_HELD_BATCH_BYTES, MAX_METRICS_PER_PROVIDER, MAX_SERIES_PER_PROVIDER, PauseReason,
    Reading,
};
use crate::batch::{Fence, LabelRef, OrderGate, Revision, labels_equal};

/// What the store holds for one (site, provider).
///
/// Read by the ordering step through the accessors below; written only by the store's
/// ingest.
#[derive(Clone, Debug)]
pub struct Entry {
    site: String,
    provider: String,
    pub(crate) gate: OrderGate,
    pub(crate) revision: Option<Revision>,
    pub(crate) meta_stamp_ms: Option<u64>,
    pub(crate) lifetime: Lifetime,
    metrics: Vec<Metric>,
    series_count: usize,
    /// The last complete publication, rows as stored (store clock), for the relay.
    pub(crate) publication: Option<Publication>,
    /// When a batch for this entry was last admitted (store clock), for fence retention.
    pub(crate) touched_ms: u64,
    ttl_ms: u64,
    /// What the newest complete publication says of readiness.
    pub(crate) readiness: Option<super::ReadinessMark>,
    /// The wire bytes of the publication the gate holds, when it was read from a body:
    /// an exact repeat of them is recognized by comparison instead of decoding.
    held_bytes: HeldBytes,
}

/// The bytes of a held publication and the (fence, digest) the gate holds for it.
#[derive(Clone, Debug, Default)]
struct HeldBytes {
    bytes: Vec<u8>,
    /// `None` while `bytes` describe nothing (their buffer is kept for reuse).
    at: Option<(Fence, u64)>,
}

/// A held publication whose bytes begin the rest of a body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldMatch {
    /// How many bytes it occupies.
    pub(crate) len: usize,
    /// Its fence.
    pub(crate) fence: Fence,
    /// Its digest.
    pub(crate) digest: u64,
}

/// One metric name's series.
#[derive(Clone, Debug)]
struct Metric {
    name: String,
    series: Vec<Series>,
}

#[derive(Clone, Debug)]
struct Series {
    labels: Vec<(String, String)>,
    window: Window,
}

/// One series of an entry, as the reader sees it.
#[derive(Clone, Copy, Debug)]
pub struct SeriesView<'a> {
    series: &'a Series,
}

impl<'a> SeriesView<'a> {
    /// Its extra labels (besides `grid_site`/`grid_provider`), sorted by name.
    pub fn labels(&self) -> &'a [(String, String)] {
        &self.series.labels
    }

    /// The value of a label, if the series carries it.
    pub fn label(&self, name: &str) -> Option<&'a str> {
        self.series
            .labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The most recently admitted reading.
    pub fn latest(&self) -> Option<Reading> {
        self.series.window.latest()
    }

    /// Every held reading, oldest admitted first.
    pub fn readings(&self) -> impl DoubleEndedIterator<Item = Reading> + use<'a> {
        self.series.window.iter()
    }
}

/// Why a row could not be stored in an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowRefusal {
    /// The entry already holds [`MAX_METRICS_PER_PROVIDER`] metric names.
    Metrics,
    /// The entry already holds [`MAX_SERIES_PER_PROVIDER`] series.
    Series,
}

impl Entry {
    pub(crate) fn new(site: String, provider: String, ttl_ms: u64, now_ms: u64) -> Self {
        Self {
            site,
            provider,
            gate: OrderGate::default(),
            revision: None,
            meta_stamp_ms: None,
            lifetime: Lifetime::None,
            metrics: Vec::new(),
            series_count: 0,
            publication: None,
            touched_ms: now_ms,
            ttl_ms,
            readiness: None,
            held_bytes: HeldBytes::default(),
        }
    }

    /// `grid_site` of the provider.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// `grid_provider` of the provider.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The highest (epoch, sequence) admitted.
    pub fn fence(&self) -> Option<Fence> {
        self.gate.fence()
    }

    /// The revision of the newest admitted metadata (complete or not).
    pub fn revision(&self) -> Option<&Revision> {
        self.revision.as_ref()
    }

    /// When the newest admitted metadata was published, in store clock.
    pub fn metadata_stamp_ms(&self) -> Option<u64> {
        self.meta_stamp_ms
    }

    /// Whether learning may use this provider at `now_ms`.
    pub fn learning(&self, now_ms: u64) -> Learning<'_> {
        match &self.lifetime {
            Lifetime::None => Learning::Paused(PauseReason::MetadataMissing),
            Lifetime::Invalidated => Learning::Paused(PauseReason::ZeroSamples),
            Lifetime::Live { revision, since_ms } => {
                if self.metadata_fresh(now_ms) {
                    Learning::Allowed {
                        revision,
                        since_ms: *since_ms,
                    }
                } else {
                    Learning::Paused(PauseReason::MetadataStale)
                }
            }
        }
    }

    /// Whether the newest metadata is at most one TTL old at `now_ms`.
    pub fn metadata_fresh(&self, now_ms: u64) -> bool {
        self.meta_stamp_ms
            .is_some_and(|s| s.saturating_add(self.ttl_ms) >= now_ms)
    }

    /// The metric names held.
    pub fn metric_names(&self) -> impl Iterator<Item = &str> {
        self.metrics.iter().map(|m| m.name.as_str())
    }

    /// The series of `metric` (one per label set; several for per-endpoint series).
    pub fn series<'a>(&'a self, metric: &str) -> impl Iterator<Item = SeriesView<'a>> + use<'a> {
        self.metric(metric)
            .into_iter()
            .flat_map(|m| m.series.iter().map(|series| SeriesView { series }))
    }

    /// The most recently admitted reading of the series `metric` with exactly the extra
    /// labels `labels` (any order; `&[]` for the unlabeled series).
    pub fn latest(&self, metric: &str, labels: &[(&str, &str)]) -> Option<Reading> {
        self.metric(metric)?
            .series
            .iter()
            .find(|s| labels_equal(&s.labels, labels))?
            .window
            .latest()
    }

    /// The reading of the series `metric` with exactly the extra labels `labels` in the
    /// provider's last complete publication, while that publication is at most one TTL
    /// old at `now_ms`: what the relay carries right now (see
    /// [`super::Store::encode_relay`]).
    ///
    /// Unlike [`Self::latest`], which keeps a reading until the TTL expires it, a series
    /// the newest publication no longer carries is `None` at once, so an exporter built
    /// on this never shows a value the store no longer holds.
    pub fn published(&self, metric: &str, labels: &[(&str, &str)], now_ms: u64) -> Option<Reading> {
        let (value, stamp_ms) = self.held_publication(now_ms)?.find(metric, labels)?;
        Some(Reading { value, stamp_ms })
    }

    /// The provider's last complete publication while it is at most one TTL old at
    /// `now_ms`: what the relay carries, and what a member serves when pulled.
    pub(crate) fn held_publication(&self, now_ms: u64) -> Option<&Publication> {
        self.publication
            .as_ref()
            .filter(|p| p.meta().stamp_ms().saturating_add(self.ttl_ms) >= now_ms)
    }

    /// The newest stamp of any reading held.
    pub fn newest_at(&self) -> Option<u64> {
        self.metrics
            .iter()
            .flat_map(|m| &m.series)
            .filter_map(|s| s.window.newest_ms())
            .max()
    }

    /// The newest stamp of any reading of `metric`.
    pub fn metric_newest_at(&self, metric: &str) -> Option<u64> {
        self.series(metric)
            .filter_map(|s| s.series.window.newest_ms())
            .max()
    }

    /// The worst (highest) value of any series of `metric` stamped within `window_ms`
    /// before `now_ms` (the window is clamped to the TTL).
    ///
    /// Highest is worst for every load series grid orders on (queue depth, running
    /// requests, KV-cache use, latency, error ratio); for a series where lower is worse,
    /// read [`Self::series`] instead. A drained burst therefore keeps the provider
    /// penalized until it leaves the window.
    pub fn window_worst(&self, metric: &str, now_ms: u64, window_ms: u64) -> Option<f64> {
        let since = now_ms.saturating_sub(window_ms.min(self.ttl_ms));
        self.metric(metric)?
            .series
            .iter()
            .filter_map(|s| s.window.worst_since(since))
            .reduce(f64::max)
    }

    /// How many series are held.
    pub fn series_count(&self) -> usize {
        self.series_count
    }

    fn metric(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name == name)
    }

    /// Appends one reading (stamp already in store clock) to the series `name` with the
    /// extra labels `labels` (sorted by name), creating the series within the caps.
    ///
    /// Looks the series up by the borrowed name and labels: only a new series allocates.
    pub(crate) fn store_row(
        &mut self,
        name: &str,
        labels: &[LabelRef<'_>],
        reading: Reading,
    ) -> Result<(), RowRefusal> {
        let metric_at = if let Some(i) = self.metrics.iter().position(|m| m.name == name) {
            i
        } else {
            if self.metrics.len() >= MAX_METRICS_PER_PROVIDER {
                return Err(RowRefusal::Metrics);
            }
            if self.series_count >= MAX_SERIES_PER_PROVIDER {
                return Err(RowRefusal::Series);
            }
            self.metrics.push(Metric {
                name: name.to_owned(),
                series: Vec::new(),
            });
            self.metrics.len() - 1
        };
        let metric = &mut self.metrics[metric_at];
        let same = |held: &[(String, String)]| {
            held.len() == labels.len()
                && held
                    .iter()
                    .zip(labels)
                    .all(|((hn, hv), (n, v))| hn == n && *hv == **v)
        };
        if let Some(series) = metric.series.iter_mut().find(|s| same(&s.labels)) {
            series.window.push(reading);
            return Ok(());
        }
        if self.series_count >= MAX_SERIES_PER_PROVIDER {
            return Err(RowRefusal::Series);
        }
        let mut window = Window::default();
        window.push(reading);
        metric.series.push(Series {
            labels: labels
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_ref().to_owned()))
                .collect(),
            window,
        });
        self.series_count += 1;
        Ok(())
    }

    /// Remembers the wire bytes of the publication the gate now holds at `fence` with
    /// `digest`, when they are known, end a line and fit [`MAX_HELD_BATCH_BYTES`];
    /// forgets older ones otherwise.
    pub(crate) fn hold_bytes(&mut self, raw: Option<&[u8]>, fence: Fence, digest: u64) {
        let held = &mut self.held_bytes;
        held.bytes.clear();
        held.at = None;
        if let Some(raw) = raw.filter(|r| r.len() <= MAX_HELD_BATCH_BYTES && r.ends_with(b"\n")) {
            held.bytes.extend_from_slice(raw);
            held.at = Some((fence, digest));
        }
    }

    /// The held publication, if `rest` begins with its exact bytes.
    pub(crate) fn held_bytes(&self, rest: &[u8]) -> Option<HeldMatch> {
        let (fence, digest) = self.held_bytes.at?;
        let bytes = &self.held_bytes.bytes;
        rest.starts_with(bytes).then_some(HeldMatch {
            len: bytes.len(),
            fence,
            digest,
        })
    }

    #[cfg(test)]
    pub(crate) fn holds_bytes(&self) -> bool {
        self.held_bytes.at.is_some()
    }

    /// Drops readings older than the TTL and series left empty.
    pub(crate) fn expire(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(self.ttl_ms);
        let mut count = 0;
        for metric in &mut self.metrics {
            metric.series.retain_mut(|s| {
                s.window.expire(cutoff);
                !s.window.is_empty()
            });
            count += metric.series.len();
        }
        self.metrics.retain(|m| !m.series.is_empty());
        self.series_count = count;
    }

    /// Whether nothing but the fence is left.
    pub(crate) fn holds_no_readings(&self) -> bool {
        self.series_count == 0
    }
}
