//! Prometheus text exposition (format 0.0.4, plus the `OpenMetrics` `# UNIT` and `# EOF`
//! lines): the parser, its 1 MiB body cap and the writer.
//!
//! Every load signal arrives as exposition text (EPP `/metrics`, a peer's
//! `/v1/site/signals`, the operator's relay), so this is the one place that decides what
//! text is acceptable.
//!
//! # Data flow
//!
//! ```text
//! transport chunks --BodyBuf / read_capped (1 MiB cap: BodyCap)--> body bytes
//! body --samples / parse_strict--> Sample<'_>... or the first Error::Parse   (peers, relay)
//! body --lines--> Result<Line<'_>, Error> per non-blank line                 (EPP scrapes)
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
//! Prometheus text 0.0.4 as exporters write it: `# HELP`, `# TYPE` (the 0.0.4 types and
//! the `OpenMetrics` ones), `# UNIT`, `# EOF`, other `#` comments, blank lines, `\r\n`,
//! blanks around tokens, `", "` between labels and a trailing comma, escapes `\\`,
//! `\"`, `\n` in label values (any other escape is an error), every float Go prints
//! (`NaN`, `+Inf`, `-Inf`, exponents) and an optional integer millisecond timestamp. An
//! `OpenMetrics` exemplar after the value (`# {trace_id="..."} 1`) is skipped. In strict
//! mode nothing but blank lines may follow `# EOF`.

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
