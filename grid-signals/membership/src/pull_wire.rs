//! The wire forms of a gossip pull, read from and written for other members: the query
//! naming the registers asked for, and the digest listing every batch a member holds
//! (`GET /v1/site/membership/batch` and `/digest`, served over the signals listener;
//! `docs/wire.md#gossip`). Pure parsers, so the fuzzers reach them.

use grid_signals::batch::Fence;

use crate::Version;
use crate::member::{MAX_SITE_NAME_BYTES, is_label};
use crate::overlay::MAX_PROVIDER_NAME_BYTES;
use crate::pulls::MAX_REGISTERS_PER_PULL;

/// The largest digest accepted; [`crate::overlay::MAX_VERSIONS`] lines of the
/// longest names fit, and it is below the fetch client's body cap.
pub const MAX_DIGEST_BYTES: usize = 4096 * 160;
const _: () = assert!(MAX_DIGEST_BYTES <= grid_signals::exposition::MAX_EXPOSITION_BYTES);

/// The query of a batch pull: `site=..&provider=..` for each register asked for, in
/// that order, at most [`MAX_REGISTERS_PER_PULL`] of them, each name a DNS label.
pub fn parse_batch_query(query: &str) -> Option<Vec<(&str, &str)>> {
    let mut registers = Vec::new();
    let mut pairs = query.split('&');
    while let Some(first) = pairs.next() {
        let second = pairs.next()?;
        let register = match (first.split_once('=')?, second.split_once('=')?) {
            (("site", s), ("provider", p)) | (("provider", p), ("site", s)) => (s, p),
            _ => return None,
        };
        if !is_label(register.0, MAX_SITE_NAME_BYTES)
            || !is_label(register.1, MAX_PROVIDER_NAME_BYTES)
            || registers.len() == MAX_REGISTERS_PER_PULL
        {
            return None;
        }
        registers.push(register);
    }
    (!registers.is_empty()).then_some(registers)
}

/// The query asking for these versions' registers (what [`parse_batch_query`] reads).
pub fn batch_query(versions: &[Version]) -> String {
    let mut query = String::new();
    for v in versions {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str("site=");
        query.push_str(&v.site);
        query.push_str("&provider=");
        query.push_str(&v.provider);
    }
    query
}

/// One line per batch held: `site provider epoch sequence`.
pub fn write_digest<'a>(held: impl Iterator<Item = (&'a str, &'a str, Fence)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (site, provider, fence) in held {
        out.extend_from_slice(
            format!("{site} {provider} {} {}\n", fence.epoch, fence.sequence).as_bytes(),
        );
    }
    out
}

/// Reads a digest; `None` when any line is not one version.
pub fn parse_digest(body: &[u8]) -> Option<Vec<Version>> {
    let text = std::str::from_utf8(body).ok()?;
    text.lines()
        .take(crate::overlay::MAX_VERSIONS + 1)
        .map(|line| {
            let mut f = line.split(' ');
            let (site, provider) = (f.next()?, f.next()?);
            let (epoch, sequence) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            (f.next().is_none()
                && is_label(site, MAX_SITE_NAME_BYTES)
                && is_label(provider, MAX_PROVIDER_NAME_BYTES))
            .then(|| Version {
                site: site.to_owned(),
                provider: provider.to_owned(),
                epoch,
                sequence,
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|v| v.len() <= crate::overlay::MAX_VERSIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_query_names_both_labels_of_each_register_and_nothing_else() {
        assert_eq!(
            parse_batch_query("site=a&provider=llama"),
            Some(vec![("a", "llama")])
        );
        assert_eq!(
            parse_batch_query("provider=llama&site=a&site=b&provider=qwen"),
            Some(vec![("a", "llama"), ("b", "qwen")])
        );
        for bad in [
            "site=a",
            "site=a&provider=",
            "site=a&provider=l&provider=m",
            "site=a&site=b",
            "site=a/b&provider=l",
            "site=a&provider=l&x=1",
            "site=a&provider=l&",
            "",
        ] {
            assert_eq!(parse_batch_query(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_pull_asks_for_at_most_max_registers_and_one_more_is_refused() {
        let versions = |n: usize| -> Vec<Version> {
            (0..n)
                .map(|i| Version {
                    site: format!("s{i}"),
                    provider: "m".into(),
                    epoch: 1,
                    sequence: 1,
                })
                .collect()
        };
        let most = batch_query(&versions(MAX_REGISTERS_PER_PULL));
        let parsed = parse_batch_query(&most).unwrap();
        assert_eq!(parsed.len(), MAX_REGISTERS_PER_PULL);
        assert_eq!(parsed[7], ("s7", "m"));
        assert_eq!(
            parse_batch_query(&batch_query(&versions(MAX_REGISTERS_PER_PULL + 1))),
            None
        );
    }

    #[test]
    fn a_digest_round_trips_and_any_bad_line_refuses_it_whole() {
        let held = [("a", "m", Fence::new(5, 7)), ("b", "n", Fence::new(6, 1))];
        let body = write_digest(held.iter().copied());
        let parsed = parse_digest(&body).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            (parsed[1].site.as_str(), parsed[1].epoch, parsed[1].sequence),
            ("b", 6, 1)
        );
        for bad in ["a m 5\n", "a m 5 7 8\n", "a m x 7\n", "a/ m 5 7\n"] {
            assert_eq!(parse_digest(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_digest_of_the_most_registers_is_read_and_one_more_is_refused() {
        use crate::overlay::MAX_VERSIONS;
        let names: Vec<String> = (0..=MAX_VERSIONS).map(|i| format!("p{i}")).collect();
        let held = |n: usize| {
            write_digest(
                names[..n]
                    .iter()
                    .map(|p| ("a", p.as_str(), Fence::new(1, 1))),
            )
        };
        let most = held(MAX_VERSIONS);
        assert!(most.len() <= MAX_DIGEST_BYTES);
        assert_eq!(parse_digest(&most).map(|v| v.len()), Some(MAX_VERSIONS));
        assert_eq!(parse_digest(&held(MAX_VERSIONS + 1)), None);
    }
}
