//! One report: what a gateway process tells its operator, and the admission of a request
//! that claims to carry one.

use crate::error::reported_name;
use crate::headers::{
    HEADER_CLEAN, HEADER_EPOCH, HEADER_REJECTED, HEADER_REPLICA, HEADER_SEQUENCE, HEADER_VERSION,
    Slot, WIRE_VERSION, is_ingest_header, parse_decimal, parse_flag,
};
use crate::{Ack, Epoch, Error, Replica};

/// A version-1 report. Built only through [`Report::new`] or [`parse_report`], so it never
/// claims clean at the maximum sequence or counter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Report {
    epoch: Epoch,
    sequence: u64,
    rejected: u64,
    clean: bool,
    replica: Replica,
}

impl Report {
    /// A report; refused if it claims clean at `u64::MAX`, which is reserved for terminal
    /// rejected evidence.
    pub fn new(
        epoch: Epoch,
        sequence: u64,
        rejected: u64,
        clean: bool,
        replica: Replica,
    ) -> Result<Self, Error> {
        if clean && sequence == u64::MAX {
            return Err(Error::TerminalClean {
                header: HEADER_SEQUENCE,
            });
        }
        if clean && rejected == u64::MAX {
            return Err(Error::TerminalClean {
                header: HEADER_REJECTED,
            });
        }
        Ok(Self {
            epoch,
            sequence,
            rejected,
            clean,
            replica,
        })
    }

    /// The reporting process.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Position of this report within its epoch.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Cumulative skew drops since the epoch began.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Whether the report claims no new rejection.
    pub fn clean(&self) -> bool {
        self.clean
    }

    /// The reporter's diagnostic name.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// Whether this report is at the maximum sequence or counter: no later report of the
    /// epoch can be newer or larger, so its evidence stays unresolved for good.
    pub fn is_terminal(&self) -> bool {
        self.sequence == u64::MAX || self.rejected == u64::MAX
    }

    /// The acknowledgment that names exactly this report.
    pub fn ack(&self) -> Ack {
        Ack {
            epoch: self.epoch,
            sequence: self.sequence,
        }
    }

    /// The request headers, names lowercase, in wire order.
    pub fn headers(&self) -> [(&'static str, String); 6] {
        [
            (HEADER_VERSION, WIRE_VERSION.to_string()),
            (HEADER_EPOCH, self.epoch.to_string()),
            (HEADER_SEQUENCE, self.sequence.to_string()),
            (HEADER_REJECTED, self.rejected.to_string()),
            (HEADER_CLEAN, self.clean.to_string()),
            (HEADER_REPLICA, self.replica.to_string()),
        ]
    }
}

/// Admits a request's headers and body as a version-1 report.
///
/// Headers other than `x-grid-ingest-*` (host, content-length, ...) are ignored; names
/// match ASCII case-insensitively. The version is judged first, so a caller speaking
/// another version hears "unsupported version" rather than a complaint about headers that
/// version may define; then the body (which must be empty: the daemon need read at most
/// one byte of it); then unknown or repeated headers in the order they came; then each
/// field in wire order; then the terminal-clean rule.
pub fn parse_report<I, N, V>(headers: I, body: &[u8]) -> Result<Report, Error>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut version = Slot::Absent;
    let mut epoch = Slot::Absent;
    let mut sequence = Slot::Absent;
    let mut rejected = Slot::Absent;
    let mut clean = Slot::Absent;
    let mut replica = Slot::Absent;
    let mut first_fault: Option<Error> = None;
    for (name, value) in headers {
        let (name, value) = (name.as_ref(), value.as_ref());
        if !is_ingest_header(name) {
            continue;
        }
        let is = |wanted: &str| name.eq_ignore_ascii_case(wanted.as_bytes());
        if is(HEADER_VERSION) {
            version.fill(|| parse_decimal(HEADER_VERSION, value));
        } else if is(HEADER_EPOCH) {
            note_repeat(&mut first_fault, &epoch, HEADER_EPOCH);
            epoch.fill(|| Epoch::from_hex(value));
        } else if is(HEADER_SEQUENCE) {
            note_repeat(&mut first_fault, &sequence, HEADER_SEQUENCE);
            sequence.fill(|| parse_decimal(HEADER_SEQUENCE, value));
        } else if is(HEADER_REJECTED) {
            note_repeat(&mut first_fault, &rejected, HEADER_REJECTED);
            rejected.fill(|| parse_decimal(HEADER_REJECTED, value));
        } else if is(HEADER_CLEAN) {
            note_repeat(&mut first_fault, &clean, HEADER_CLEAN);
            clean.fill(|| parse_flag(HEADER_CLEAN, value));
        } else if is(HEADER_REPLICA) {
            note_repeat(&mut first_fault, &replica, HEADER_REPLICA);
            replica.fill(|| Replica::from_bytes(value));
        } else if first_fault.is_none() {
            first_fault = Some(Error::UnknownHeader {
                name: reported_name(name),
            });
        }
    }
    let version = version.take(HEADER_VERSION)?;
    if version != WIRE_VERSION {
        return Err(Error::UnsupportedVersion { version });
    }
    if !body.is_empty() {
        return Err(Error::NonemptyBody { len: body.len() });
    }
    if let Some(fault) = first_fault {
        return Err(fault);
    }
    Report::new(
        epoch.take(HEADER_EPOCH)?,
        sequence.take(HEADER_SEQUENCE)?,
        rejected.take(HEADER_REJECTED)?,
        clean.take(HEADER_CLEAN)?,
        replica.take(HEADER_REPLICA)?,
    )
}

/// Remembers the first repeated header in arrival order, so the refusal names the header
/// that repeated first rather than whichever the field order reaches first.
fn note_repeat<T>(first_fault: &mut Option<Error>, slot: &Slot<T>, header: &'static str) {
    if first_fault.is_none() && !matches!(slot, Slot::Absent) {
        *first_fault = Some(Error::RepeatedHeader { header });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::{MAX_DECIMAL_LEN, MAX_REPLICA_LEN};

    fn report(sequence: u64, rejected: u64, clean: bool) -> Report {
        Report::new(
            Epoch::new(0xfeed).unwrap(),
            sequence,
            rejected,
            clean,
            Replica::new("gw-0").unwrap(),
        )
        .unwrap()
    }

    fn wire(report: &Report) -> Vec<(String, String)> {
        report
            .headers()
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone()))
            .collect()
    }

    fn with(mut headers: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
        headers.retain(|(n, _)| n != name);
        headers.push((name.to_owned(), value.to_owned()));
        headers
    }

    fn without(mut headers: Vec<(String, String)>, name: &str) -> Vec<(String, String)> {
        headers.retain(|(n, _)| n != name);
        headers
    }

    #[test]
    fn encoded_headers_are_admitted_as_the_same_report() {
        for r in [
            report(1, 0, true),
            report(7, 3, false),
            report(u64::MAX, u64::MAX, false),
        ] {
            assert_eq!(parse_report(wire(&r), b""), Ok(r));
        }
    }

    #[test]
    fn unrelated_headers_are_ignored_and_names_match_in_any_case() {
        let mut headers: Vec<(String, String)> = wire(&report(2, 1, false))
            .into_iter()
            .map(|(n, v)| (n.to_ascii_uppercase(), v))
            .collect();
        headers.push(("content-length".into(), "0".into()));
        headers.push(("host".into(), "operator".into()));
        assert_eq!(parse_report(headers, b""), Ok(report(2, 1, false)));
    }

    #[test]
    fn every_missing_header_is_refused_by_name() {
        for (name, _) in report(1, 0, true).headers() {
            assert_eq!(
                parse_report(without(wire(&report(1, 0, true)), name), b""),
                Err(Error::MissingHeader { header: name })
            );
        }
    }

    #[test]
    fn every_repeated_header_is_refused_even_with_the_same_value() {
        for (name, value) in report(1, 0, true).headers() {
            let mut headers = wire(&report(1, 0, true));
            headers.push((name.to_owned(), value));
            assert_eq!(
                parse_report(headers, b""),
                Err(Error::RepeatedHeader { header: name })
            );
        }
    }

    #[test]
    fn an_unknown_ingest_header_is_refused() {
        let headers = with(wire(&report(1, 0, true)), "x-grid-ingest-extra", "1");
        assert_eq!(
            parse_report(headers, b""),
            Err(Error::UnknownHeader {
                name: "x-grid-ingest-extra".into()
            })
        );
    }

    #[test]
    fn another_version_is_unsupported_before_anything_else_is_judged() {
        let headers = with(vec![], HEADER_VERSION, "2");
        assert_eq!(
            parse_report(headers, b"body"),
            Err(Error::UnsupportedVersion { version: 2 })
        );
        let headers = with(wire(&report(1, 0, true)), HEADER_VERSION, "v1");
        assert!(matches!(
            parse_report(headers, b""),
            Err(Error::MalformedHeader {
                header: HEADER_VERSION,
                ..
            })
        ));
    }

    #[test]
    fn any_body_byte_is_refused() {
        assert_eq!(
            parse_report(wire(&report(1, 0, true)), b"x"),
            Err(Error::NonemptyBody { len: 1 })
        );
    }

    #[test]
    fn the_maximum_sequence_or_counter_cannot_claim_clean() {
        let headers = with(
            wire(&report(1, 0, true)),
            HEADER_SEQUENCE,
            &u64::MAX.to_string(),
        );
        assert_eq!(
            parse_report(headers, b""),
            Err(Error::TerminalClean {
                header: HEADER_SEQUENCE
            })
        );
        let headers = with(
            wire(&report(1, 0, true)),
            HEADER_REJECTED,
            &u64::MAX.to_string(),
        );
        assert_eq!(
            parse_report(headers, b""),
            Err(Error::TerminalClean {
                header: HEADER_REJECTED
            })
        );
        let almost = u64::MAX - 1;
        assert!(
            Report::new(
                report(1, 0, true).epoch,
                almost,
                almost,
                true,
                report(1, 0, true).replica
            )
            .is_ok()
        );
    }

    #[test]
    fn oversized_values_are_refused_at_one_past_each_limit() {
        let base = wire(&report(1, 0, true));
        let cases = [
            (HEADER_SEQUENCE, "1".repeat(MAX_DECIMAL_LEN + 1)),
            (HEADER_REJECTED, "1".repeat(MAX_DECIMAL_LEN + 1)),
            (HEADER_EPOCH, "1".repeat(17)),
            (HEADER_REPLICA, "a".repeat(MAX_REPLICA_LEN + 1)),
            (HEADER_CLEAN, "truee".repeat(2)),
            (HEADER_VERSION, "1".repeat(MAX_DECIMAL_LEN + 1)),
        ];
        for (name, value) in cases {
            let result = parse_report(with(base.clone(), name, &value), b"");
            assert!(
                matches!(result, Err(Error::OversizedHeader { header, .. }) if header == name),
                "{name}: {result:?}"
            );
        }
        let at = with(base, HEADER_REPLICA, &"a".repeat(MAX_REPLICA_LEN));
        assert!(parse_report(at, b"").is_ok());
    }

    #[test]
    fn a_comma_joined_value_is_malformed() {
        let headers = with(wire(&report(1, 0, true)), HEADER_SEQUENCE, "1, 2");
        assert!(matches!(
            parse_report(headers, b""),
            Err(Error::MalformedHeader {
                header: HEADER_SEQUENCE,
                ..
            })
        ));
    }
}
