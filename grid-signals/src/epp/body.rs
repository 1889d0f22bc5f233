//! One EPP `/metrics` body read leniently: every good line kept, every refused line
//! counted by reason, and a family grid combines left out whole when one of its lines
//! was refused.
//!
//! An EPP's exposition holds dozens of families from its plugins, and grid reads a few.
//! A strict read would turn one odd line anywhere into a failed scrape, and after the
//! stale window a serving provider would read not ready. So the body is read line by
//! line ([`crate::exposition::lines`]), and only a body with no usable line is a
//! [`super::ScrapeFailure::Parse`].
//!
//! # A refused line inside a family grid reads
//!
//! Everything readiness and load come from is still one body. But a family with a line
//! missing is not the family: ready endpoints summed over the pools read would count
//! short (down to a false zero), a request counter summed over models would seem to go
//! backwards (which reads as an EPP restart, and a restart's counts as engine answers),
//! and a histogram would lose a bucket. So a refused line whose family grid reads makes
//! that family absent from this scrape, exactly as if the EPP had not written it: for
//! the ready-endpoint series that is the spec's "a scrape without the pool's ready
//! series leaves readiness unknown", never false. The same value under another spelling
//! (an EPP in its deprecation window writes both) is still read.
//!
//! The one exception is the per-endpoint queue series: each of its samples is one
//! serving unit, read on its own by the gateway, so a refused line loses only its own
//! unit. Leaving the whole family out would read as every unit having stopped, which
//! excludes the site (`unit_series_stopped`).
//!
//! A refused line is attributed to the family its metric name names, read up to the
//! first byte that cannot be in a name; when not even a name can be read there (a bad
//! first byte, invalid UTF-8 there), to the family of the latest `# TYPE` or `# HELP`
//! line, since exporters write each family's lines together. A refused `# HELP` or
//! `# TYPE` line spoils no family: grid reads no metadata.

use super::names::{EppMetric, GENERATIONS, Generation, family_of};
use crate::exposition::{Line, Sample, SyntaxError, lines};

/// How many lines of one body were refused, per reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineRefusals([u64; SyntaxError::ALL.len()]);

impl LineRefusals {
    /// Counts one refused line.
    pub fn add(&mut self, reason: SyntaxError) {
        self.0[reason as usize] += 1;
    }

    /// Refused lines for `reason`.
    pub fn get(&self, reason: SyntaxError) -> u64 {
        self.0[reason as usize]
    }

    /// Every reason with its count, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (SyntaxError, u64)> + '_ {
        SyntaxError::ALL.iter().map(|&r| (r, self.get(r)))
    }

    /// All refused lines together.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

// Every (metric, spelling) pair has a bit of `FamilySet`'s word.
const _: () = assert!((EppMetric::RequestErrorTotal as usize + 1) * GENERATIONS <= 64);

/// Families (metric and spelling) as bits, for the few a body can spoil.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FamilySet(u64);

impl FamilySet {
    fn bit((metric, generation): (EppMetric, Generation)) -> u64 {
        1 << (metric as usize * GENERATIONS + generation as usize)
    }

    fn insert(&mut self, family: (EppMetric, Generation)) {
        self.0 |= Self::bit(family);
    }

    fn contains(self, family: (EppMetric, Generation)) -> bool {
        self.0 & Self::bit(family) != 0
    }
}

/// One EPP body, read leniently.
#[derive(Clone, Debug, Default)]
pub struct ScrapeBody<'a> {
    samples: Vec<Sample<'a>>,
    sample_lines: usize,
    refused: LineRefusals,
    unknown: FamilySet,
}

impl<'a> ScrapeBody<'a> {
    /// Reads `body`, keeping its good sample lines and counting its refused lines.
    pub fn parse(body: &'a [u8]) -> Self {
        let mut read = Self::default();
        let mut family: Option<&'a str> = None;
        let mut iter = lines(body);
        loop {
            let from = iter.offset();
            let Some(item) = iter.next() else { break };
            match item {
                Ok(Line::Sample(sample)) => read.samples.push(sample),
                Ok(Line::Type { name, .. } | Line::Help { name, .. }) => family = Some(name),
                Ok(_) => {}
                Err(crate::Error::Parse { kind, .. }) => {
                    read.refused.add(kind);
                    let text = last_line(&body[from..iter.offset()]);
                    if let Some(spoiled) = spoiled_family(text, family) {
                        read.unknown.insert(spoiled);
                    }
                }
                // `lines` reports only `Error::Parse`; a line is still counted if not.
                Err(_) => read.refused.add(SyntaxError::LineEnd),
            }
        }
        read.sample_lines = read.samples.len();
        if read.unknown != FamilySet::default() {
            let unknown = read.unknown;
            read.samples
                .retain(|s| family_of(s.name).is_none_or(|f| !unknown.contains(f)));
        }
        read
    }

    /// Whether nothing in the body could be used: some line was refused and no sample
    /// line parsed. Only then is the scrape a `parse` failure; a body with no lines at
    /// all, or only comments, answered without samples (readiness unknown).
    pub fn is_unusable(&self) -> bool {
        self.sample_lines == 0 && self.refused.total() > 0
    }

    /// The lines refused, per reason.
    pub fn refused(&self) -> &LineRefusals {
        &self.refused
    }

    /// Sample lines that parsed, before any family was left out.
    pub fn sample_lines(&self) -> usize {
        self.sample_lines
    }

    /// Whether a refused line left `metric` under `generation`'s spelling out of this
    /// body.
    pub fn is_unknown(&self, metric: EppMetric, generation: Generation) -> bool {
        self.unknown.contains((metric, generation))
    }

    /// The samples to read: the good lines, less the families left out.
    pub fn samples(&self) -> &[Sample<'a>] {
        &self.samples
    }

    /// [`Self::samples`], owned.
    pub fn into_samples(self) -> Vec<Sample<'a>> {
        self.samples
    }
}

/// The last line of `consumed` (blank lines, then one line and its `\n`).
fn last_line(consumed: &[u8]) -> &[u8] {
    let text = consumed.strip_suffix(b"\n").unwrap_or(consumed);
    memchr::memrchr(b'\n', text).map_or(text, |at| &text[at + 1..])
}

/// The family a refused line belongs to, if grid reads it and a refused line there makes
/// it unknown (see the module docs); `current` is the latest metadata line's name.
fn spoiled_family<'a>(line: &'a [u8], current: Option<&'a str>) -> Option<(EppMetric, Generation)> {
    let line = line.trim_ascii_start();
    if line.first() == Some(&b'#') {
        return None;
    }
    let len = line
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b':'))
        .unwrap_or(line.len());
    let name = std::str::from_utf8(&line[..len])
        .ok()
        .filter(|n| n.bytes().next().is_some_and(|b| !b.is_ascii_digit()));
    let family = family_of(name.or(current)?)?;
    (family.0 != EppMetric::PerEndpointQueue).then_some(family)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epp::{PoolSelector, read_scrape};

    const READY: &str = "# TYPE llm_d_epp_ready_endpoints gauge\n\
        llm_d_epp_ready_endpoints{name=\"a\"} 2\n\
        llm_d_epp_ready_endpoints{name=\"b\"} 3\n";

    #[test]
    fn good_lines_are_kept_and_bad_ones_counted_by_reason() {
        let body = format!(
            "{READY}# TYPE plugin_x gauge\nplugin_x{{a=\"1\",a=\"2\"}} 1\nplugin_x 1x\n\
             plugin_x{{k=\"v\"}} 4\n"
        );
        let read = ScrapeBody::parse(body.as_bytes());
        assert_eq!(read.refused().get(SyntaxError::DuplicateLabel), 1);
        assert_eq!(read.refused().get(SyntaxError::Value), 1);
        assert_eq!(read.refused().total(), 2);
        assert_eq!(read.sample_lines(), 3);
        assert!(!read.is_unusable());
        let reading = read_scrape(read.samples(), &PoolSelector::All);
        assert_eq!(reading.ready_endpoints, Some(5.0));
    }

    #[test]
    fn a_refused_line_of_a_combined_family_leaves_that_family_out_whole() {
        let body = format!("{READY}llm_d_epp_ready_endpoints{{name=\"c\"}} NaNx\n");
        let read = ScrapeBody::parse(body.as_bytes());
        assert!(read.is_unknown(EppMetric::ReadyEndpoints, Generation::Current));
        assert!(read.samples().is_empty());
        assert!(!read.is_unusable(), "the body had usable lines");
        // Readiness reads no ready series rather than 5 of the pools' endpoints.
        let reading = read_scrape(read.samples(), &PoolSelector::All);
        assert_eq!(reading.ready_endpoints, None);
    }

    #[test]
    fn the_same_value_under_another_spelling_is_still_read() {
        let body = format!(
            "{READY}llm_d_epp_ready_endpoints{{name=\"c\",name=\"d\"}} 1\n\
             inference_pool_ready_pods{{name=\"a\"}} 2\ninference_pool_ready_pods{{name=\"b\"}} 3\n"
        );
        let read = ScrapeBody::parse(body.as_bytes());
        let reading = read_scrape(read.samples(), &PoolSelector::All);
        assert_eq!(reading.ready_endpoints, Some(5.0));
    }

    #[test]
    fn a_line_without_a_readable_name_belongs_to_the_family_above_it() {
        let mut body = READY.as_bytes().to_vec();
        body.extend_from_slice(b"\xffllm_d_epp_ready_endpoints{name=\"c\"} 1\n");
        body.extend_from_slice(b"# TYPE other gauge\n9other 1\n");
        let read = ScrapeBody::parse(&body);
        assert_eq!(read.refused().get(SyntaxError::Utf8), 1);
        assert_eq!(read.refused().get(SyntaxError::MetricName), 1);
        assert!(read.is_unknown(EppMetric::ReadyEndpoints, Generation::Current));
        // A bad histogram line, by its bucket name or under its family's `# TYPE`.
        let hist = "# TYPE llm_d_epp_request_ttft_seconds histogram\n\
                    llm_d_epp_request_ttft_seconds_bucket{le=\"1\"} 1\n\
                    llm_d_epp_request_ttft_seconds_bucket{le=\"+Inf\" 2\n\
                    1bad 3\n";
        let read = ScrapeBody::parse(hist.as_bytes());
        assert!(read.is_unknown(EppMetric::Ttft, Generation::Current));
        assert!(read.samples().is_empty());
    }

    #[test]
    fn a_refused_per_endpoint_line_loses_only_its_own_unit() {
        let body = "llm_d_epp_per_endpoint_queue_size{name=\"p\",model_server_endpoint=\"e1\"} 1\n\
                    llm_d_epp_per_endpoint_queue_size{name=\"p\",model_server_endpoint=\"e2} 2\n\
                    llm_d_epp_per_endpoint_queue_size{name=\"p\",model_server_endpoint=\"e3\"} 3\n";
        let read = ScrapeBody::parse(body.as_bytes());
        assert_eq!(read.refused().total(), 1);
        assert!(!read.is_unknown(EppMetric::PerEndpointQueue, Generation::Current));
        let reading = read_scrape(read.samples(), &PoolSelector::All);
        assert_eq!(reading.per_endpoint_queue.len(), 2);
    }

    #[test]
    fn refused_metadata_spoils_no_family() {
        let body = format!("# TYPE llm_d_epp_ready_endpoints gauges\n{READY}");
        let read = ScrapeBody::parse(body.as_bytes());
        assert_eq!(read.refused().get(SyntaxError::MetricType), 1);
        let reading = read_scrape(read.samples(), &PoolSelector::All);
        assert_eq!(reading.ready_endpoints, Some(5.0));
    }

    #[test]
    fn only_a_body_with_refused_lines_and_no_sample_is_unusable() {
        assert!(ScrapeBody::parse(b"<html>\n<body>oops</body>\n").is_unusable());
        assert!(ScrapeBody::parse(b"# TYPE m gauge\nm{\n").is_unusable());
        assert!(!ScrapeBody::parse(b"").is_unusable());
        assert!(!ScrapeBody::parse(b"# only a comment\n").is_unusable());
        assert!(!ScrapeBody::parse(b"bad line\nm 1\n").is_unusable());
        // Usable even when every sample belonged to a family left out.
        let read = ScrapeBody::parse(
            b"llm_d_epp_ready_endpoints{name=\"p\"} 1\nllm_d_epp_ready_endpoints{name=\"q\"} x\n",
        );
        assert!(read.samples().is_empty() && !read.is_unusable());
    }
}
