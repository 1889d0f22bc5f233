//! The routing evidence both daemons serve at `GET /v1/grid/routing` (on the gateway's
//! API listener beside `/metrics`, on the operator's metrics listener), and the table
//! `grid-gatewayd status` prints of it. The schema is `docs/evidence.md`'s.
//!
//! Both documents are reads of state the daemon already holds, encoded off the request
//! path; their size is bounded by the caps below (each list says how many entries it
//! left out).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

pub use grid_signals::wire::ROUTING_PATH;

/// The most models one gateway document lists (`?model=NAME` asks for any one of them):
/// with at most 64 candidates each, their longest names and every field present, the
/// document stays under [`MAX_DOCUMENT_BYTES`].
pub const MAX_MODELS: usize = 8;

/// The most peers one operator document lists (configured peers first, then members).
pub const MAX_PEERS: usize = 256;

/// The most providers' fences one operator document lists (its own first, then peers'):
/// every provider a store holds (`grid_signals::store::MAX_PROVIDERS`).
pub const MAX_HELD: usize = grid_signals::store::MAX_PROVIDERS;

/// The most characters of a failure's cause a document carries (longer ones are cut).
pub const MAX_CAUSE_CHARS: usize = 1_024;

/// `cause` cut to [`MAX_CAUSE_CHARS`] characters.
pub fn bounded_cause(cause: String) -> String {
    match cause.char_indices().nth(MAX_CAUSE_CHARS) {
        Some((end, _)) => cause[..end].to_owned(),
        None => cause,
    }
}

/// The largest document either daemon writes, and the most `status` reads.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// The gateway's document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayRouting {
    /// `"gateway"`.
    pub daemon: String,
    /// This gateway's site.
    pub site: String,
    /// When the document was written (ms since the Unix epoch).
    pub generated_at_ms: u64,
    /// How its polls of the operator go.
    pub operator: OperatorPolls,
    /// How far back each candidate's `recent` counts reach, in seconds.
    pub window_seconds: f64,
    /// Models, in configuration order (or the one asked for).
    pub models: Vec<ModelRouting>,
    /// Models not listed past [`MAX_MODELS`].
    pub models_left_out: usize,
}

/// The gateway's polls of its operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorPolls {
    /// Polls that succeeded.
    pub ok: u64,
    /// Polls that failed.
    pub failed: u64,
    /// Why the last one failed, while the last one did.
    pub last_failure: Option<String>,
}

/// One model's routing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelRouting {
    /// The `model` clients send.
    pub name: String,
    /// `routed_by_load`, `without_signals` (every candidate unmeasured: by capacity),
    /// `shedding` (429) or `unroutable` (503: every candidate excluded).
    pub state: String,
    /// The selection path the next request takes (`spread`, `lone`, `overflow`,
    /// `by_capacity`, `fallback`); none when it is refused.
    pub path: Option<String>,
    /// When the refresh that decided it ran (ms since the Unix epoch).
    pub refreshed_at_ms: u64,
    /// The grid's headroom for the model, as the gateway states it to clients.
    pub grid_headroom: Option<u64>,
    /// Candidates in selection, least loaded first, then those excluded.
    pub candidates: Vec<CandidateRouting>,
}

/// One candidate (site, provider) of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CandidateRouting {
    /// `grid_site`.
    pub site: String,
    /// `grid_provider`.
    pub provider: String,
    /// `room`, `no_room`, `full`, `unmeasured` or `excluded`.
    pub standing: String,
    /// Why it is out, when it is.
    pub excluded: Option<Exclusion>,
    /// Learned capacity in requests (what it has shown it holds).
    pub capacity: f64,
    /// What it held without queueing, as that bound stands.
    pub soft_bound: Option<f64>,
    /// What it held at its limit, as that bound stands.
    pub hard_bound: Option<f64>,
    /// Smoothed rho; none when unmeasured or excluded.
    pub rho: Option<f64>,
    /// Recent worst rho (the ordering key); none when unmeasured or excluded.
    pub score: Option<f64>,
    /// Expected intake over the life of its reading (requests/s), its spread weight.
    pub headroom: Option<f64>,
    /// What its own answers put on its weight (1 = nothing).
    pub live_factor: Option<f64>,
    /// How long its requests hold a slot, learned from its answers (s).
    pub turnover_seconds: Option<f64>,
    /// Age of its newest loaded reading (s), fresh or not.
    pub signal_age_seconds: Option<f64>,
    /// The newest room signal its answers carried.
    pub live_room: Option<LiveRoom>,
    /// Its serving-failure score (decaying).
    pub failure_score: f64,
    /// Until when its own 429 holds it full (ms since the Unix epoch).
    pub full_until_ms: Option<u64>,
    /// The probability that the next request is sent here (the plan the snapshot holds).
    pub next_share: f64,
    /// What the model's requests did here over the window.
    pub recent: Recent,
}

/// Why a candidate is out of selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exclusion {
    /// `not_ready`, `no_ready_endpoints`, `unit_series_stopped` or `ejected`.
    pub reason: String,
    /// Since when (ms since the Unix epoch): the reading that said so, or the ejection.
    pub since_ms: Option<u64>,
    /// Until when at most: an ejection's end (a probe that answers ends it sooner).
    pub until_ms: Option<u64>,
}

/// A room signal from a site's answers (its flow-control headers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LiveRoom {
    /// The band's headroom it stated.
    pub headroom: Option<u64>,
    /// It said the site is full.
    pub saturated: bool,
    /// When the answer was read (ms since the Unix epoch).
    pub read_at_ms: u64,
    /// How old it is (s).
    pub age_seconds: f64,
}

/// A candidate's counts over the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Recent {
    /// First attempts routed here.
    pub picks: u64,
    /// Its share of the model's picks; none when there were none.
    pub share: Option<f64>,
    /// Its refusals before any work (429, 503).
    pub refused: u64,
    /// Its serving failures (other 5xx, resets, timeouts, failed connects).
    pub failed: u64,
    /// Requests it refused that went to another site.
    pub retried_away: u64,
    /// Requests another site refused that came here.
    pub retried_here: u64,
}

/// The operator's document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorRouting {
    /// `"operator"`.
    pub daemon: String,
    /// This operator's site.
    pub site: String,
    /// Its network.
    pub network: String,
    /// `gossip` or `poll`.
    pub mode: String,
    /// Its publisher epoch.
    pub epoch: u64,
    /// When the document was written (ms since the Unix epoch).
    pub generated_at_ms: u64,
    /// `GatewayAgesRejected`.
    pub gateway_ages_rejected: bool,
    /// Its own providers, in configuration order.
    pub providers: Vec<ProviderEvidence>,
    /// The fence of every provider held, its own first.
    pub held: Vec<HeldFence>,
    /// Fences not listed past [`MAX_HELD`].
    pub held_left_out: usize,
    /// Its peers: configured ones first, then members no configuration names.
    pub peers: Vec<PeerEvidence>,
    /// Peers not listed past [`MAX_PEERS`].
    pub peers_left_out: usize,
}

/// One of the operator's own providers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderEvidence {
    /// `grid_provider`.
    pub name: String,
    /// The readiness verdict: ready, not ready, or none (unknown, or no scrape yet).
    pub ready: Option<bool>,
    /// The verdict's reason (`grid_operator_provider_ready_reason`'s label).
    pub reason: Option<String>,
    /// The last scrape.
    pub last_scrape: Option<Exchange>,
}

/// One exchange and when it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Exchange {
    /// `poll`, `batch`, `digest` or `scrape`.
    pub kind: String,
    /// `ok` or the failure class.
    pub result: String,
    /// When it ended (ms since the Unix epoch).
    pub at_ms: u64,
    /// How long ago (s).
    pub age_seconds: f64,
}

/// The fence of one provider held.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeldFence {
    /// `grid_site`.
    pub site: String,
    /// `grid_provider`.
    pub provider: String,
    /// The highest publisher epoch admitted.
    pub epoch: u64,
    /// The highest sequence admitted in it.
    pub sequence: u64,
}

/// One peer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerEvidence {
    /// The peer's site.
    pub name: String,
    /// Configured (`peers[]`), or a member no configuration names.
    pub configured: bool,
    /// `alive`, `down`, `unknown` (not heard of), or `off` (membership does not run).
    pub membership: String,
    /// The last poll or gossip exchange with it.
    pub last_exchange: Option<Exchange>,
    /// When one last succeeded (ms since the Unix epoch).
    pub last_ok_ms: Option<u64>,
    /// Why it is not polled now, when it is not (`member_down`).
    pub skipped: Option<String>,
}

/// Either document, told apart by its `daemon` field.
#[derive(Clone, Debug, PartialEq)]
pub enum Document {
    /// A gateway's.
    Gateway(GatewayRouting),
    /// An operator's.
    Operator(OperatorRouting),
}

/// Why a body is not a document.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// Larger than [`MAX_DOCUMENT_BYTES`].
    #[error("the document is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    /// Not JSON of either schema.
    #[error("not a routing document: {0}")]
    Schema(String),
}

impl Document {
    /// Reads a body: its `daemon` field says which schema it follows.
    pub fn parse(body: &[u8]) -> Result<Self, DocumentError> {
        #[derive(Deserialize)]
        struct Kind {
            daemon: String,
        }
        if body.len() > MAX_DOCUMENT_BYTES {
            return Err(DocumentError::TooLarge);
        }
        let schema = |e: serde_json::Error| DocumentError::Schema(e.to_string());
        let kind: Kind = serde_json::from_slice(body).map_err(schema)?;
        match kind.daemon.as_str() {
            "gateway" => Ok(Self::Gateway(serde_json::from_slice(body).map_err(schema)?)),
            "operator" => Ok(Self::Operator(
                serde_json::from_slice(body).map_err(schema)?,
            )),
            other => Err(DocumentError::Schema(format!("unknown daemon {other:?}"))),
        }
    }

    /// The document as a table a person reads in a terminal; `colour` adds ANSI colours
    /// (give it only when writing to a terminal).
    pub fn table(&self, colour: bool) -> String {
        match self {
            Self::Gateway(g) => gateway_table(g, colour),
            Self::Operator(o) => operator_table(o, colour),
        }
    }
}

/// `text` painted `code` when colouring.
fn paint(text: &str, code: &str, colour: bool) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

/// The colour of a standing or state: green for room, yellow for pressure, red for out.
fn tone(word: &str) -> &'static str {
    match word {
        "room" | "routed_by_load" | "ok" | "alive" | "ready" => "32",
        "no_room" | "full" | "unmeasured" | "without_signals" | "shedding" | "unknown" => "33",
        _ => "31",
    }
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

/// Rows padded to their columns' widths (by characters, before any colour), each cell
/// painted by `paint_cell` afterwards so escapes never skew the alignment.
fn grid_rows(
    out: &mut String,
    header: &[&str],
    rows: &[Vec<String>],
    paint_cell: &dyn Fn(usize, &str) -> String,
) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>, out: &mut String| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            text.push_str("  ");
            text.push_str(&paint_cell(i, cell));
            if i + 1 < cells.len() {
                text.push_str(&" ".repeat(pad));
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(header.iter().map(|h| (*h).to_owned()).collect(), out);
    for row in rows {
        line(row.clone(), out);
    }
}

fn gateway_table(g: &GatewayRouting, colour: bool) -> String {
    let mut out = String::new();
    let operator = match &g.operator.last_failure {
        Some(cause) => paint(&format!("last poll failed: {cause}"), "31", colour),
        None => paint(
            &format!("polls succeed ({} ok)", g.operator.ok),
            "32",
            colour,
        ),
    };
    let _ = writeln!(
        out,
        "gateway {}: operator {operator}; recent = last {:.0} s",
        g.site, g.window_seconds
    );
    for m in &g.models {
        let path = m.path.as_deref().unwrap_or("refused");
        let _ = writeln!(
            out,
            "\nmodel {}: {} (next request: {path})",
            m.name,
            paint(&m.state, tone(&m.state), colour)
        );
        let rows: Vec<Vec<String>> = m
            .candidates
            .iter()
            .map(|c| {
                let standing = match &c.excluded {
                    Some(x) => format!("excluded: {}", x.reason),
                    None => c.standing.clone(),
                };
                let room = c.live_room.as_ref().map_or_else(
                    || "-".to_owned(),
                    |r| {
                        let said = if r.saturated {
                            "full".to_owned()
                        } else {
                            r.headroom.map_or_else(|| "-".to_owned(), |h| h.to_string())
                        };
                        format!("{said} ({:.1}s ago)", r.age_seconds)
                    },
                );
                let bounds = format!("{}..{}", num(c.soft_bound, 1), num(c.hard_bound, 1));
                vec![
                    c.site.clone(),
                    c.provider.clone(),
                    standing,
                    format!("{:.1}", c.capacity),
                    bounds,
                    num(c.rho, 2),
                    room,
                    num(c.signal_age_seconds, 1),
                    format!("{:.0}%", c.next_share * 100.0),
                    c.recent
                        .share
                        .map_or_else(|| "-".to_owned(), |s| format!("{:.0}%", s * 100.0)),
                    c.recent.picks.to_string(),
                    format!("{}/{}", c.recent.refused, c.recent.failed),
                    format!("{}/{}", c.recent.retried_away, c.recent.retried_here),
                ]
            })
            .collect();
        grid_rows(
            &mut out,
            &[
                "SITE",
                "PROVIDER",
                "STANDING",
                "CAPACITY",
                "BOUNDS",
                "RHO",
                "LIVE ROOM",
                "AGE s",
                "NEXT",
                "SHARE",
                "PICKS",
                "REFUSED/FAILED",
                "RETRIED AWAY/HERE",
            ],
            &rows,
            &|col, cell| {
                if col == 2 {
                    let word = cell.split(':').next().unwrap_or(cell);
                    paint(cell, tone(word), colour)
                } else {
                    cell.to_owned()
                }
            },
        );
    }
    if g.models_left_out > 0 {
        let _ = writeln!(
            out,
            "\n{} more models not listed (ask for one with ?model=NAME)",
            g.models_left_out
        );
    }
    out
}

fn operator_table(o: &OperatorRouting, colour: bool) -> String {
    let mut out = String::new();
    let ages = if o.gateway_ages_rejected {
        paint("GatewayAgesRejected True", "31", colour)
    } else {
        "GatewayAgesRejected False".to_owned()
    };
    let _ = writeln!(
        out,
        "operator {} (network {}, {} mode, epoch {}): {ages}",
        o.site, o.network, o.mode, o.epoch
    );
    let exchange = |e: &Option<Exchange>| {
        e.as_ref().map_or_else(
            || "-".to_owned(),
            |e| format!("{} {} ({:.1}s ago)", e.kind, e.result, e.age_seconds),
        )
    };
    let _ = writeln!(out, "\nproviders");
    let rows: Vec<Vec<String>> = o
        .providers
        .iter()
        .map(|p| {
            let ready = match p.ready {
                Some(true) => "ready",
                Some(false) => "not_ready",
                None => "unknown",
            };
            vec![
                p.name.clone(),
                ready.to_owned(),
                p.reason.clone().unwrap_or_else(|| "-".to_owned()),
                exchange(&p.last_scrape),
            ]
        })
        .collect();
    grid_rows(
        &mut out,
        &["PROVIDER", "READY", "REASON", "LAST SCRAPE"],
        &rows,
        &|col, cell| {
            if col == 1 {
                paint(cell, tone(cell), colour)
            } else {
                cell.to_owned()
            }
        },
    );
    let _ = writeln!(out, "\npeers");
    let rows: Vec<Vec<String>> = o
        .peers
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                if p.configured { "configured" } else { "member" }.to_owned(),
                p.membership.clone(),
                exchange(&p.last_exchange),
                p.skipped.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    grid_rows(
        &mut out,
        &["PEER", "FROM", "MEMBERSHIP", "LAST EXCHANGE", "SKIPPED"],
        &rows,
        &|col, cell| {
            if col == 2 {
                paint(cell, tone(cell), colour)
            } else {
                cell.to_owned()
            }
        },
    );
    let _ = writeln!(out, "\nfences held");
    let rows: Vec<Vec<String>> = o
        .held
        .iter()
        .map(|h| {
            vec![
                h.site.clone(),
                h.provider.clone(),
                h.epoch.to_string(),
                h.sequence.to_string(),
            ]
        })
        .collect();
    grid_rows(
        &mut out,
        &["SITE", "PROVIDER", "EPOCH", "SEQUENCE"],
        &rows,
        &|_, cell| cell.to_owned(),
    );
    for (n, what) in [(o.peers_left_out, "peers"), (o.held_left_out, "fences")] {
        if n > 0 {
            let _ = writeln!(out, "{n} more {what} not listed");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator() -> OperatorRouting {
        OperatorRouting {
            daemon: "operator".into(),
            site: "a".into(),
            network: "prod".into(),
            mode: "poll".into(),
            epoch: 7,
            generated_at_ms: 1,
            gateway_ages_rejected: true,
            providers: vec![ProviderEvidence {
                name: "llama".into(),
                ready: Some(false),
                reason: Some("no_ready_endpoints".into()),
                last_scrape: None,
            }],
            held: vec![],
            held_left_out: 0,
            peers: vec![],
            peers_left_out: 0,
        }
    }

    #[test]
    fn a_table_is_coloured_only_when_asked_and_aligned_either_way() {
        let doc = Document::Operator(operator());
        let plain = doc.table(false);
        assert!(!plain.contains('\x1b'), "{plain}");
        assert!(plain.contains("not_ready") && plain.contains("no_ready_endpoints"));
        let coloured = doc.table(true);
        assert!(coloured.contains("\x1b[31mnot_ready\x1b[0m"), "{coloured}");
        // Without its escapes, the coloured table is the plain one.
        let stripped = coloured
            .replace("\x1b[31m", "")
            .replace("\x1b[32m", "")
            .replace("\x1b[33m", "")
            .replace("\x1b[0m", "");
        assert_eq!(stripped, plain);
    }

    #[test]
    fn a_cause_is_cut_at_its_cap_in_characters() {
        let at = "é".repeat(MAX_CAUSE_CHARS);
        assert_eq!(bounded_cause(at.clone()), at);
        assert_eq!(bounded_cause(format!("{at}x")), at);
    }

    #[test]
    fn a_document_is_read_by_its_daemon_field_and_refused_past_its_cap() {
        let body = serde_json::to_vec(&operator()).unwrap();
        assert!(matches!(Document::parse(&body), Ok(Document::Operator(_))));
        assert!(matches!(
            Document::parse(br#"{"daemon":"toaster"}"#),
            Err(DocumentError::Schema(_))
        ));
        let mut big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
        big[..body.len()].copy_from_slice(&body);
        assert!(matches!(
            Document::parse(&big),
            Err(DocumentError::TooLarge)
        ));
        let mut exact = vec![b' '; MAX_DOCUMENT_BYTES];
        exact[..body.len()].copy_from_slice(&body);
        assert!(Document::parse(&exact).is_ok());
    }
}
