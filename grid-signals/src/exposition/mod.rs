//! Prometheus text exposition, format 0.0.4: the parser, its 1 MiB body cap and the
//! writer.
//!
//! Every load signal arrives as exposition text (EPP `/metrics`, a peer's
//! `/v1/site/signals`, the operator's relay), so this is the one place that decides what
//! text is acceptable.
//!
//! # Data flow
//!
//! ```text
//! transport chunks --BodyBuf / read_capped (1 MiB cap: BodyCap)--> body bytes
//! body --samples / parse_strict--> Sample<'_>... or the first Error::Parse   (whole bodies)
//! body --lines--> Result<Line<'_>, Error> per non-blank line   (EPP scrapes; peer batches)
//! samples --write_sample / write_type / write_help--> exposition text        (serve, relay)
//! ```
//!
//! Parsing is zero-copy and, in strict mode, allocation-free: a [`Sample`] borrows its
//! name, label text and escaped values from the body, and labels are split on demand.
//! The grammar is written with nom; the hot scans (names, quoted values, value tokens)
//! classify eight bytes per step, lines are found with memchr, and UTF-8 is checked in
//! long runs rather than per line.
//!
//! # What is accepted
//!
//! One grammar, text 0.0.4 as exporters write it, judges every line in both modes; the
//! modes differ only in what a refused line costs. grid asks every source for
//! `text/plain;version=0.0.4` (the scraper's `Accept`), so that is the format read; the
//! few `OpenMetrics` forms an exporter may still send are read as 0.0.4 reads them.
//!
//! - Samples: `name [{labels}] value [timestamp]`, with blanks (spaces, tabs) allowed
//!   between any two tokens, between the name and `{` too; `", "` between labels and a
//!   trailing comma; escapes `\\`, `\"`, `\n` in label values (any other escape is an
//!   error); every float Go prints (`NaN`, `+Inf`, `-Inf`, exponents); an optional
//!   integer millisecond timestamp; `\r\n`. An `OpenMetrics` exemplar after the value
//!   (`# {trace_id="..."} 1`) is skipped.
//! - Label names: each at most once per sample, and never `__name__`, which the metric
//!   name sets (`duplicate_label`): Prometheus refuses such a series, and a sample whose
//!   labels say two things cannot be read either way.
//! - `# HELP name text` and `# TYPE name type` (the 0.0.4 types and the `OpenMetrics`
//!   ones) are the only special comments; their names are checked.
//! - `# UNIT name unit` is reported as [`Line::Unit`] when it has that shape and is a
//!   [`Line::Comment`] otherwise (`# UNIT `, `# UNIT - x`): 0.0.4 gives it no meaning, so
//!   it never refuses a line.
//! - `# EOF` is reported as [`Line::Eof`] and ends nothing: 0.0.4 has no end marker, so
//!   lines after it are read like the ones before, in both modes.
//! - Any other `#` line is a comment; blank lines are nothing.
//!
//! Strict mode ([`samples`], [`parse_strict`]) stops at the first refused line and
//! reports it, for callers that take a body whole or not at all. Lenient mode
//! ([`lines`]) reports every line's result and goes on, and the caller keeps the good
//! lines and counts the bad ones by [`SyntaxError`]: the operator reads EPP scrapes so,
//! where one odd line from a plugin must not hide the load signals around it
//! (`crate::epp::ScrapeBody`), and the store reads grid-written peer and relay bodies so
//! under its batch rules, where a refused line spoils its own batch (`docs/wire.md`).

mod body_cap;
mod cursor;
mod grammar;
mod labels;
mod lenient;
mod sample;
mod scan;
mod strict;
mod syntax_error;
mod value;
mod writer;

pub use body_cap::{BodyBuf, READ_CHUNK_BYTES, read_capped};
pub use labels::{LabelIter, LabelValue, Labels};
pub use lenient::{Lines, lines};
pub use sample::{Line, MetricType, OwnedSample, Sample};
pub use strict::{Samples, parse_strict, samples};
pub use syntax_error::SyntaxError;
pub use writer::{write_help, write_owned_sample, write_sample, write_type, write_value};

pub(crate) use scan::{is_label_name, is_metric_name};

/// The most bytes of one exposition body anyone reads: past it the body is `BodyCap`.
pub const MAX_EXPOSITION_BYTES: usize = 1 << 20;
