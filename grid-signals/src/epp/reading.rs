//! One parsed scrape reduced to the few numbers grid reads from it.
//!
//! The scrape arrives as samples (any type implementing [`SampleView`], normally
//! [`crate::exposition::Sample`]); this module keeps the series [`super::names`]
//! recognizes, resolves old and current spellings to one value each, selects the
//! provider's pool, and counts every sample it refuses with a [`SampleRejection`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::names::{
    self, BUCKET_BOUND_LABEL, EppMetric, GENERATIONS, HistogramPart, INFLIGHT_ENDPOINT_LABEL,
    INFLIGHT_NAMESPACE_LABEL, STREAMING_LABEL,
};

/// Most distinct pools one scrape may name; past it further pools are refused, since no
/// single EPP serves more and each costs a map entry.
pub const MAX_POOLS: usize = 64;
/// Most distinct endpoints kept per per-endpoint family in one scrape.
pub const MAX_ENDPOINTS: usize = 4096;
/// Most distinct bucket bounds kept per latency histogram (the EPP's TTFT has 24 to 35).
pub const MAX_HISTOGRAM_BUCKETS: usize = 128;

/// Read access to one sample, so this module works on the parser's zero-copy samples and
/// on owned ones alike.
pub trait SampleView {
    /// The sample's metric name as written (`_bucket`/`_sum`/`_count` included).
    fn name(&self) -> &str;
    /// The unescaped value of label `name`, if present.
    fn label(&self, name: &str) -> Option<Cow<'_, str>>;
    /// The sample's value.
    fn value(&self) -> f64;
    /// Calls `f` with each label's name and unescaped value, in written order.
    fn for_each_label(&self, f: &mut dyn FnMut(&str, &str));
}

impl<T: SampleView + ?Sized> SampleView for &T {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn label(&self, name: &str) -> Option<Cow<'_, str>> {
        (**self).label(name)
    }
    fn value(&self) -> f64 {
        (**self).value()
    }
    fn for_each_label(&self, f: &mut dyn FnMut(&str, &str)) {
        (**self).for_each_label(f);
    }
}

impl SampleView for crate::exposition::Sample<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn label(&self, name: &str) -> Option<Cow<'_, str>> {
        self.labels.get(name).map(|v| v.unescaped())
    }
    fn value(&self) -> f64 {
        self.value
    }
    fn for_each_label(&self, f: &mut dyn FnMut(&str, &str)) {
        for (name, value) in self.labels {
            f(name, &value.unescaped());
        }
    }
}

impl SampleView for crate::exposition::OwnedSample {
    fn name(&self) -> &str {
        &self.name
    }
    fn label(&self, name: &str) -> Option<Cow<'_, str>> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| Cow::Borrowed(v.as_str()))
    }
    fn value(&self) -> f64 {
        self.value
    }
    fn for_each_label(&self, f: &mut dyn FnMut(&str, &str)) {
        for (name, value) in &self.labels {
            f(name, value);
        }
    }
}

crate::label_values! {
    /// Why a recognized sample was not used. Each is counted, never fatal.
    #[derive(PartialOrd, Ord)]
    pub enum SampleRejection {
        /// The value is NaN or infinite.
        NonFiniteValue,
        /// A count, gauge or counter below zero.
        NegativeValue,
        /// A pool-scoped series without its pool label.
        MissingPoolLabel,
        /// A per-endpoint series without its endpoint label(s).
        MissingEndpointLabel,
        /// A histogram bucket whose `le` is missing or not a number.
        BadBucketBound,
        /// A pool past [`MAX_POOLS`].
        TooManyPools,
        /// An endpoint past [`MAX_ENDPOINTS`].
        TooManyEndpoints,
        /// A bucket bound past [`MAX_HISTOGRAM_BUCKETS`].
        TooManyBuckets,
        /// The same name and label set a second time in one scrape; summing it again would
        /// double count (the first is kept).
        DuplicateSeries,
    }
}

/// How many samples of one scrape were refused, per reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectionCounts([u64; SampleRejection::ALL.len()]);

impl RejectionCounts {
    /// Counts one refusal.
    pub fn add(&mut self, reason: SampleRejection) {
        self.0[reason as usize] += 1;
    }
    /// Refusals for `reason`.
    pub fn get(&self, reason: SampleRejection) -> u64 {
        self.0[reason as usize]
    }
    /// Every reason with its count, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (SampleRejection, u64)> + '_ {
        SampleRejection::ALL.iter().map(|&r| (r, self.get(r)))
    }
    /// All refusals together.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// A cumulative histogram summed over every label set that was read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, ascending by bound; `+Inf` last when present.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

impl Histogram {
    fn add_bucket(&mut self, le: f64, value: f64) -> Result<(), SampleRejection> {
        match self.buckets.binary_search_by(|(b, _)| b.total_cmp(&le)) {
            Ok(i) => self.buckets[i].1 += value,
            Err(_) if self.buckets.len() >= MAX_HISTOGRAM_BUCKETS => {
                return Err(SampleRejection::TooManyBuckets);
            }
            Err(i) => self.buckets.insert(i, (le, value)),
        }
        Ok(())
    }
}

/// The cumulative counters of one scrape that latency and the engine-answer rule read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// Streaming requests' time to first token.
    pub ttft: Option<Histogram>,
    /// Streaming requests' time per output token.
    pub tpot: Option<Histogram>,
    /// All requests.
    pub requests: Option<f64>,
    /// Failed requests; `None` when the family is absent, which an EPP does until its
    /// first error (a counter vector with no children is not exposed).
    pub errors: Option<f64>,
}

/// What grid reads from one scrape, for the provider's pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScrapeReading {
    /// Distinct pools the EPP reported pool gauges for (all pools, not only the selected
    /// one): more than one means the unlabeled in-flight count cannot be attributed.
    pub pools_seen: usize,
    /// Endpoints with fresh metrics; `None` when the scrape carries no ready-endpoint
    /// series for the pool (for example vLLM's own `/metrics`).
    pub ready_endpoints: Option<f64>,
    /// Average running requests per ready endpoint.
    pub average_running: Option<f64>,
    /// Average queued requests per ready endpoint.
    pub average_queue: Option<f64>,
    /// Average KV-cache utilization.
    pub average_kv_cache: Option<f64>,
    /// KV-cache utilization spread.
    pub std_dev_kv_cache: Option<f64>,
    /// Queued requests per endpoint (the per-unit series); empty when absent.
    pub per_endpoint_queue: BTreeMap<String, f64>,
    /// In-flight requests summed over endpoints, each endpoint at its largest count across
    /// producer instances; `None` without the EPP's in-flight load producer.
    pub inflight_requests: Option<f64>,
    /// Requests flow control holds for the pool, summed over fairness/priority/model.
    pub flow_control_queue: Option<f64>,
    /// Latency and request counters (not pool-scoped: the EPP labels them by model).
    pub counters: Counters,
    /// Samples refused while reading.
    pub rejected: RejectionCounts,
}

/// Which pool of a multi-pool EPP the provider is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PoolSelector {
    /// Every pool the EPP reports, combined (sums of counts, ready-weighted averages).
    #[default]
    All,
    /// Only the pool with this `name` / `inference_pool` label value.
    Named(String),
}

impl PoolSelector {
    fn selects(&self, pool: &str) -> bool {
        match self {
            Self::All => true,
            Self::Named(name) => name == pool,
        }
    }
}

/// The per-pool gauges, in the order a pool's array holds them; each slot below is
/// taken from this list, so the two cannot disagree.
const POOL_METRICS: [EppMetric; 5] = [
    EppMetric::ReadyEndpoints,
    EppMetric::AverageRunning,
    EppMetric::AverageQueue,
    EppMetric::AverageKvCache,
    EppMetric::StdDevKvCache,
];
const POOL_GAUGES: usize = POOL_METRICS.len();
const READY: usize = pool_slot(EppMetric::ReadyEndpoints);
const RUNNING: usize = pool_slot(EppMetric::AverageRunning);
const QUEUE: usize = pool_slot(EppMetric::AverageQueue);
const KV: usize = pool_slot(EppMetric::AverageKvCache);
const KV_STD: usize = pool_slot(EppMetric::StdDevKvCache);

/// Where `metric` sits in a pool's gauges; evaluated at compile time for the slots.
const fn pool_slot(metric: EppMetric) -> usize {
    match gauge_slot(metric) {
        Some(i) => i,
        None => panic!("not a per-pool gauge"),
    }
}

const fn gauge_slot(metric: EppMetric) -> Option<usize> {
    let mut i = 0;
    while i < POOL_METRICS.len() {
        if POOL_METRICS[i] as u32 == metric as u32 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Everything one spelling generation contributed, before generations are resolved.
#[derive(Default)]
struct GenerationData {
    seen: u32,
    pool_gauges: BTreeMap<String, [Option<f64>; POOL_GAUGES]>,
    per_endpoint: BTreeMap<String, BTreeMap<String, f64>>,
    flow_control: BTreeMap<String, f64>,
    inflight: BTreeMap<(String, String), f64>,
    ttft: Histogram,
    tpot: Histogram,
    requests: f64,
    errors: f64,
}

fn bit(metric: EppMetric) -> u32 {
    1 << (metric as u32)
}

impl GenerationData {
    fn has(&self, metric: EppMetric) -> bool {
        self.seen & bit(metric) != 0
    }
}

fn cap_insert<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    key: K,
    cap: usize,
    over: SampleRejection,
) -> Result<&mut V, SampleRejection>
where
    V: Default,
{
    if !map.contains_key(&key) && map.len() >= cap {
        return Err(over);
    }
    Ok(map.entry(key).or_default())
}

/// Reduces one parsed scrape to a [`ScrapeReading`] for the selected pool.
///
/// Never fails: a sample it cannot use is counted in [`ScrapeReading::rejected`] and the
/// rest of the scrape is still read.
pub fn read_scrape<I>(samples: I, pool: &PoolSelector) -> ScrapeReading
where
    I: IntoIterator,
    I::Item: SampleView,
{
    let mut data: [GenerationData; GENERATIONS] = Default::default();
    let mut rejected = RejectionCounts::default();
    let mut series = BTreeSet::new();
    for sample in samples {
        let Some(found) = names::recognize(sample.name()) else {
            continue;
        };
        if !series.insert(series_key(&sample)) {
            rejected.add(SampleRejection::DuplicateSeries);
            continue;
        }
        let slot = &mut data[found.generation as usize];
        match accept(slot, found, &sample) {
            Ok(true) => slot.seen |= bit(found.metric),
            Ok(false) => {}
            Err(reason) => rejected.add(reason),
        }
    }
    resolve(&data, pool, rejected)
}

/// The sample's identity: name and labels in written order, unescaped, so the same
/// series written with `", "` or `","` between labels is still the same series.
fn series_key<S: SampleView>(sample: &S) -> String {
    let mut key = String::from(sample.name());
    sample.for_each_label(&mut |name, value| {
        key.push('\u{0}');
        key.push_str(name);
        key.push('\u{0}');
        key.push_str(value);
    });
    key
}

/// Files one recognized sample; `Ok(false)` when it is deliberately not read (a
/// non-streaming latency sample).
fn accept<S: SampleView>(
    slot: &mut GenerationData,
    found: names::Recognized,
    sample: &S,
) -> Result<bool, SampleRejection> {
    let value = sample.value();
    if !value.is_finite() {
        return Err(SampleRejection::NonFiniteValue);
    }
    if value < 0.0 {
        return Err(SampleRejection::NegativeValue);
    }
    let metric = found.metric;
    if let Some(part) = found.part {
        if sample.label(STREAMING_LABEL).is_some_and(|s| s != "true") {
            return Ok(false);
        }
        let hist = if metric == EppMetric::Ttft {
            &mut slot.ttft
        } else {
            &mut slot.tpot
        };
        match part {
            HistogramPart::Bucket => hist.add_bucket(bucket_bound(sample)?, value)?,
            HistogramPart::Sum => hist.sum += value,
            HistogramPart::Count => hist.count += value,
        }
        return Ok(true);
    }
    match metric {
        EppMetric::RequestTotal => slot.requests += value,
        EppMetric::RequestErrorTotal => slot.errors += value,
        EppMetric::InflightRequests => {
            let name = sample
                .label(INFLIGHT_ENDPOINT_LABEL)
                .ok_or(SampleRejection::MissingEndpointLabel)?;
            let namespace = sample.label(INFLIGHT_NAMESPACE_LABEL).unwrap_or_default();
            let entry = cap_insert(
                &mut slot.inflight,
                (namespace.into_owned(), name.into_owned()),
                MAX_ENDPOINTS,
                SampleRejection::TooManyEndpoints,
            )?;
            // Each producer instance counts the same endpoint; the largest is the truth
            // least likely to have missed requests.
            *entry = entry.max(value);
        }
        _ => {
            let pool_label = metric
                .pool_label()
                .ok_or(SampleRejection::MissingPoolLabel)?;
            let pool = sample
                .label(pool_label)
                .ok_or(SampleRejection::MissingPoolLabel)?
                .into_owned();
            if metric == EppMetric::FlowControlQueue {
                *cap_insert(
                    &mut slot.flow_control,
                    pool,
                    MAX_POOLS,
                    SampleRejection::TooManyPools,
                )? += value;
            } else if metric == EppMetric::PerEndpointQueue {
                let endpoint = sample
                    .label(names::endpoint_label(found.generation))
                    .ok_or(SampleRejection::MissingEndpointLabel)?
                    .into_owned();
                let endpoints = cap_insert(
                    &mut slot.per_endpoint,
                    pool,
                    MAX_POOLS,
                    SampleRejection::TooManyPools,
                )?;
                let entry = cap_insert(
                    endpoints,
                    endpoint,
                    MAX_ENDPOINTS,
                    SampleRejection::TooManyEndpoints,
                )?;
                *entry = entry.max(value);
            } else if let Some(index) = gauge_slot(metric) {
                let gauges = cap_insert(
                    &mut slot.pool_gauges,
                    pool,
                    MAX_POOLS,
                    SampleRejection::TooManyPools,
                )?;
                gauges[index] = Some(value);
            }
        }
    }
    Ok(true)
}

fn bucket_bound<S: SampleView>(sample: &S) -> Result<f64, SampleRejection> {
    let le = sample
        .label(BUCKET_BOUND_LABEL)
        .ok_or(SampleRejection::BadBucketBound)?;
    let bound = match le.as_ref() {
        "+Inf" | "Inf" => f64::INFINITY,
        text => text
            .parse::<f64>()
            .map_err(|_| SampleRejection::BadBucketBound)?,
    };
    if bound.is_nan() {
        return Err(SampleRejection::BadBucketBound);
    }
    Ok(bound)
}

/// The most current generation that carried `metric`, if any did.
fn best(data: &[GenerationData; GENERATIONS], metric: EppMetric) -> Option<&GenerationData> {
    data.iter().find(|d| d.has(metric))
}

fn resolve(
    data: &[GenerationData; GENERATIONS],
    pool: &PoolSelector,
    rejected: RejectionCounts,
) -> ScrapeReading {
    let mut reading = ScrapeReading {
        rejected,
        ..ScrapeReading::default()
    };
    // Per pool, each gauge from its own most current spelling.
    let mut pools: BTreeMap<&str, [Option<f64>; POOL_GAUGES]> = BTreeMap::new();
    for (index, metric) in POOL_METRICS.into_iter().enumerate() {
        let Some(gen_data) = best(data, metric) else {
            continue;
        };
        for (name, gauges) in &gen_data.pool_gauges {
            if let Some(v) = gauges[index] {
                pools.entry(name.as_str()).or_default()[index] = Some(v);
            }
        }
    }
    reading.pools_seen = pools.len();
    let selected: Vec<[Option<f64>; POOL_GAUGES]> = pools
        .iter()
        .filter(|(name, _)| pool.selects(name))
        .map(|(_, g)| *g)
        .collect();
    combine_pools(&selected, &mut reading);

    if let Some(gen_data) = best(data, EppMetric::PerEndpointQueue) {
        for (_, endpoints) in gen_data
            .per_endpoint
            .iter()
            .filter(|(name, _)| pool.selects(name))
        {
            for (endpoint, &v) in endpoints {
                let entry = reading
                    .per_endpoint_queue
                    .entry(endpoint.clone())
                    .or_insert(v);
                *entry = entry.max(v);
            }
        }
    }
    if let Some(gen_data) = best(data, EppMetric::FlowControlQueue) {
        let mut held = gen_data
            .flow_control
            .iter()
            .filter(|(name, _)| pool.selects(name))
            .peekable();
        if held.peek().is_some() {
            reading.flow_control_queue = Some(held.map(|(_, v)| v).sum());
        }
    }
    if let Some(gen_data) = best(data, EppMetric::InflightRequests) {
        reading.inflight_requests = Some(gen_data.inflight.values().sum());
    }
    reading.counters = Counters {
        ttft: best(data, EppMetric::Ttft).map(|d| d.ttft.clone()),
        tpot: best(data, EppMetric::Tpot).map(|d| d.tpot.clone()),
        requests: best(data, EppMetric::RequestTotal).map(|d| d.requests),
        errors: best(data, EppMetric::RequestErrorTotal).map(|d| d.errors),
    };
    reading
}

/// Folds the selected pools into one: counts add, averages weigh by ready endpoints, and
/// spreads combine as pooled standard deviations.
fn combine_pools(selected: &[[Option<f64>; POOL_GAUGES]], reading: &mut ScrapeReading) {
    if let [only] = selected {
        reading.ready_endpoints = only[READY];
        reading.average_running = only[RUNNING];
        reading.average_queue = only[QUEUE];
        reading.average_kv_cache = only[KV];
        reading.std_dev_kv_cache = only[KV_STD];
        return;
    }
    let readies: Vec<f64> = selected.iter().filter_map(|g| g[READY]).collect();
    reading.ready_endpoints = (!readies.is_empty()).then(|| readies.iter().sum());
    let weighted_mean = |index: usize| -> Option<f64> {
        let (mut num, mut den) = (0.0, 0.0);
        for g in selected {
            if let (Some(v), Some(w)) = (g[index], g[READY]) {
                num += v * w;
                den += w;
            }
        }
        (den > 0.0).then(|| num / den)
    };
    reading.average_running = weighted_mean(RUNNING);
    reading.average_queue = weighted_mean(QUEUE);
    reading.average_kv_cache = weighted_mean(KV);
    reading.std_dev_kv_cache = reading.average_kv_cache.and_then(|mean| {
        let (mut second_moment, mut den) = (0.0, 0.0);
        for g in selected {
            if let (Some(sd), Some(m), Some(w)) = (g[KV_STD], g[KV], g[READY]) {
                second_moment += w * (sd * sd + m * m);
                den += w;
            }
        }
        (den > 0.0).then(|| (second_moment / den - mean * mean).max(0.0).sqrt())
    });
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A minimal owned sample for unit tests that do not need the text parser.
    use std::borrow::Cow;

    use super::SampleView;

    /// A sample written as `(name, labels, value)`.
    pub(crate) struct Fake(
        pub &'static str,
        pub &'static [(&'static str, &'static str)],
        pub f64,
    );

    impl SampleView for Fake {
        fn name(&self) -> &str {
            self.0
        }
        fn label(&self, name: &str) -> Option<Cow<'_, str>> {
            self.1
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| Cow::Borrowed(*v))
        }
        fn value(&self) -> f64 {
            self.2
        }
        fn for_each_label(&self, f: &mut dyn FnMut(&str, &str)) {
            for (k, v) in self.1 {
                f(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::Fake;
    use super::*;

    fn read(samples: Vec<Fake>) -> ScrapeReading {
        read_scrape(samples, &PoolSelector::All)
    }

    #[test]
    fn current_spelling_wins_over_the_old_one_in_the_same_scrape() {
        let r = read(vec![
            Fake("inference_pool_ready_pods", &[("name", "p1")], 7.0),
            Fake("llm_d_epp_ready_endpoints", &[("name", "p1")], 3.0),
            Fake(
                "inference_objective_request_total",
                &[("model_name", "m")],
                100.0,
            ),
            Fake("llm_d_epp_request_total", &[("model_name", "m")], 40.0),
        ]);
        assert_eq!(r.ready_endpoints, Some(3.0));
        assert_eq!(r.counters.requests, Some(40.0));
    }

    #[test]
    fn old_spelling_is_read_when_it_is_the_only_one() {
        let r = read(vec![
            Fake("inference_pool_ready_pods", &[("name", "p1")], 2.0),
            Fake(
                "inference_pool_per_pod_queue_size",
                &[("name", "p1"), ("model_server_pod", "pod-a")],
                4.0,
            ),
        ]);
        assert_eq!(r.ready_endpoints, Some(2.0));
        assert_eq!(r.per_endpoint_queue.get("pod-a"), Some(&4.0));
    }

    #[test]
    fn inflight_takes_each_endpoints_largest_producer_then_sums() {
        let r = read(vec![
            Fake(
                "llm_d_epp_inflight_requests",
                &[
                    ("endpoint_name", "a"),
                    ("namespace", "ns"),
                    ("producer_name", "x"),
                ],
                3.0,
            ),
            Fake(
                "llm_d_epp_inflight_requests",
                &[
                    ("endpoint_name", "a"),
                    ("namespace", "ns"),
                    ("producer_name", "y"),
                ],
                5.0,
            ),
            Fake(
                "llm_d_epp_inflight_requests",
                &[
                    ("endpoint_name", "b"),
                    ("namespace", "ns"),
                    ("producer_name", "x"),
                ],
                2.0,
            ),
        ]);
        assert_eq!(r.inflight_requests, Some(7.0));
    }

    #[test]
    fn non_streaming_latency_samples_are_not_read() {
        let r = read(vec![
            Fake(
                "llm_d_epp_request_ttft_seconds_count",
                &[("streaming", "true")],
                10.0,
            ),
            Fake(
                "llm_d_epp_request_ttft_seconds_count",
                &[("streaming", "false")],
                99.0,
            ),
        ]);
        assert_eq!(r.counters.ttft.map(|h| h.count), Some(10.0));
    }

    #[test]
    fn refused_samples_are_counted_by_reason_and_the_rest_is_read() {
        let r = read(vec![
            Fake("llm_d_epp_ready_endpoints", &[], 1.0),
            Fake("llm_d_epp_average_queue_size", &[("name", "p")], f64::NAN),
            Fake("llm_d_epp_average_running_requests", &[("name", "p")], -1.0),
            Fake(
                "llm_d_epp_request_ttft_seconds_bucket",
                &[("le", "soon")],
                1.0,
            ),
            Fake("llm_d_epp_per_endpoint_queue_size", &[("name", "p")], 1.0),
            Fake("llm_d_epp_ready_endpoints", &[("name", "p")], 2.0),
        ]);
        assert_eq!(r.ready_endpoints, Some(2.0));
        assert_eq!(r.rejected.get(SampleRejection::MissingPoolLabel), 1);
        assert_eq!(r.rejected.get(SampleRejection::NonFiniteValue), 1);
        assert_eq!(r.rejected.get(SampleRejection::NegativeValue), 1);
        assert_eq!(r.rejected.get(SampleRejection::BadBucketBound), 1);
        assert_eq!(r.rejected.get(SampleRejection::MissingEndpointLabel), 1);
        assert_eq!(r.rejected.total(), 5);
    }

    #[test]
    fn a_series_written_twice_is_read_once() {
        let r = read(vec![
            Fake("llm_d_epp_request_total", &[("model_name", "m")], 5.0),
            Fake("llm_d_epp_request_total", &[("model_name", "m")], 5.0),
            Fake("llm_d_epp_request_total", &[("model_name", "n")], 1.0),
        ]);
        assert_eq!(r.counters.requests, Some(6.0));
        assert_eq!(r.rejected.get(SampleRejection::DuplicateSeries), 1);
    }

    #[test]
    fn every_rejection_reason_has_a_distinct_label() {
        let labels: BTreeSet<_> = SampleRejection::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), SampleRejection::ALL.len());
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    #[test]
    fn pools_are_kept_up_to_the_cap_and_refused_one_past_it() {
        for (pools, refused) in [(MAX_POOLS, 0), (MAX_POOLS + 1, 1)] {
            let samples: Vec<Fake> = (0..pools)
                .map(|i| {
                    let labels: &'static [(&'static str, &'static str)] =
                        Box::leak(vec![("name", leak(format!("p{i}")))].into_boxed_slice());
                    Fake("llm_d_epp_ready_endpoints", labels, 1.0)
                })
                .collect();
            let r = read(samples);
            assert_eq!(r.pools_seen, MAX_POOLS, "{pools} pools");
            assert_eq!(r.rejected.get(SampleRejection::TooManyPools), refused);
        }
    }

    #[test]
    fn endpoints_are_kept_up_to_the_cap_and_refused_one_past_it() {
        for (endpoints, refused) in [(MAX_ENDPOINTS, 0), (MAX_ENDPOINTS + 1, 1)] {
            let samples: Vec<Fake> = (0..endpoints)
                .map(|i| {
                    let labels: &'static [(&'static str, &'static str)] = Box::leak(
                        vec![
                            ("name", "p"),
                            ("model_server_endpoint", leak(format!("e{i}"))),
                        ]
                        .into_boxed_slice(),
                    );
                    Fake("llm_d_epp_per_endpoint_queue_size", labels, 1.0)
                })
                .collect();
            let r = read(samples);
            assert_eq!(r.per_endpoint_queue.len(), MAX_ENDPOINTS);
            assert_eq!(r.rejected.get(SampleRejection::TooManyEndpoints), refused);
        }
    }

    #[test]
    fn buckets_are_kept_up_to_the_cap_and_refused_one_past_it() {
        for (bounds, refused) in [(MAX_HISTOGRAM_BUCKETS, 0), (MAX_HISTOGRAM_BUCKETS + 1, 1)] {
            let samples: Vec<Fake> = (0..bounds)
                .map(|i| {
                    let labels: &'static [(&'static str, &'static str)] =
                        Box::leak(vec![("le", leak(format!("{i}")))].into_boxed_slice());
                    Fake("llm_d_epp_request_ttft_seconds_bucket", labels, 1.0)
                })
                .collect();
            let r = read(samples);
            assert_eq!(
                r.counters.ttft.map(|h| h.buckets.len()),
                Some(MAX_HISTOGRAM_BUCKETS)
            );
            assert_eq!(r.rejected.get(SampleRejection::TooManyBuckets), refused);
        }
    }

    #[test]
    fn several_pools_combine_counts_and_weigh_averages_by_ready_endpoints() {
        let r = read(vec![
            Fake("llm_d_epp_ready_endpoints", &[("name", "a")], 1.0),
            Fake("llm_d_epp_ready_endpoints", &[("name", "b")], 3.0),
            Fake("llm_d_epp_average_running_requests", &[("name", "a")], 8.0),
            Fake("llm_d_epp_average_running_requests", &[("name", "b")], 4.0),
            Fake(
                "llm_d_epp_average_kv_cache_utilization",
                &[("name", "a")],
                0.5,
            ),
            Fake(
                "llm_d_epp_average_kv_cache_utilization",
                &[("name", "b")],
                0.5,
            ),
            Fake(
                "llm_d_epp_std_dev_kv_cache_utilization",
                &[("name", "a")],
                0.1,
            ),
            Fake(
                "llm_d_epp_std_dev_kv_cache_utilization",
                &[("name", "b")],
                0.1,
            ),
            Fake(
                "llm_d_epp_flow_control_queue_size",
                &[("inference_pool", "a"), ("priority", "0")],
                2.0,
            ),
            Fake(
                "llm_d_epp_flow_control_queue_size",
                &[("inference_pool", "a"), ("priority", "1")],
                1.0,
            ),
            Fake(
                "llm_d_epp_flow_control_queue_size",
                &[("inference_pool", "b")],
                4.0,
            ),
        ]);
        assert_eq!(r.pools_seen, 2);
        assert_eq!(r.ready_endpoints, Some(4.0));
        assert_eq!(r.average_running, Some(5.0));
        assert_eq!(r.flow_control_queue, Some(7.0));
        let sd = r.std_dev_kv_cache.unwrap();
        assert!((sd - 0.1).abs() < 1e-12, "{sd}");

        let only_a = read_scrape(
            [
                Fake("llm_d_epp_ready_endpoints", &[("name", "a")], 1.0),
                Fake("llm_d_epp_ready_endpoints", &[("name", "b")], 3.0),
                Fake(
                    "llm_d_epp_flow_control_queue_size",
                    &[("inference_pool", "a")],
                    2.0,
                ),
            ],
            &PoolSelector::Named("a".into()),
        );
        assert_eq!(
            (
                only_a.pools_seen,
                only_a.ready_endpoints,
                only_a.flow_control_queue
            ),
            (2, Some(1.0), Some(2.0))
        );
    }
}
