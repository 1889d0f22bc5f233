//! One declaration for each closed label set: the enum, its label values, `ALL` and the
//! `prometheus-client` encoding come from one list, so a reason cannot be added without
//! its label or left out of the pre-registered set.
//!
//! prometheus-client's own `EncodeLabelValue` derive writes a variant's Rust name
//! (`BodyCap`); grid's label values are snake case (`body_cap`), so this small macro
//! stands in where the derive cannot serve. The label value is the variant's name in
//! snake case, worked out at compile time: a variant and its label cannot drift apart,
//! and a reader finds `unknown_session` by its variant `UnknownSession`.
//!
//! Every set is `Clone, Copy, Debug, PartialEq, Eq, Hash` (what a family's key needs); the
//! declaration adds only what it needs beyond that (an order, `#[non_exhaustive]`).
//!
//! A set declared with its label's name (`label "reason";`) is a whole label set of its
//! own: `Family<Refusal, Counter>` needs no wrapper struct, and [`register_zeroed`]
//! registers such a family with every value already exposed at 0, so a dashboard and an
//! alert see each series before its first increment. Two closed sets in a tuple
//! (`Family<(Kind, Outcome), Counter>`) are labelled in tuple order and pre-created for
//! every combination.

use std::hash::Hash;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Metric, Registry};

/// A label set whose every value is known: a [`label_values!`](crate::label_values) enum
/// declared with its label's name, or a pair of them.
pub trait ClosedLabels: Clone + Eq + Hash + EncodeLabelSet {
    /// Every value, in declaration order (for a pair, the first set's order outermost).
    fn values() -> impl Iterator<Item = Self>;
}

impl<A: ClosedLabels, B: ClosedLabels> ClosedLabels for (A, B) {
    fn values() -> impl Iterator<Item = Self> {
        A::values().flat_map(|a| B::values().map(move |b| (a.clone(), b)))
    }
}

/// A family with the series of every value of `L` created at the metric's zero.
pub fn zeroed<L: ClosedLabels, M: Default>() -> Family<L, M> {
    let family = Family::default();
    for labels in L::values() {
        drop(family.get_or_create(&labels));
    }
    family
}

/// Registers a [`zeroed`] family as `name` with `help` in `registry` and returns its
/// handle (clones share the series).
pub fn register_zeroed<L, M>(registry: &mut Registry, name: &str, help: &str) -> Family<L, M>
where
    L: ClosedLabels,
    M: Default,
    Family<L, M>: Metric,
{
    let family = zeroed::<L, M>();
    registry.register(name, help, family.clone());
    family
}

/// How long `name` (an ASCII `CamelCase` identifier) is in snake case: one byte more for
/// each capital after the first character.
#[doc(hidden)]
#[must_use]
pub const fn snake_case_len(name: &str) -> usize {
    let bytes = name.as_bytes();
    let mut len = bytes.len();
    let mut i = 1;
    while i < bytes.len() {
        if bytes[i].is_ascii_uppercase() {
            len += 1;
        }
        i += 1;
    }
    len
}

/// `name` (an ASCII `CamelCase` identifier) in snake case, as `N` bytes
/// ([`snake_case_len`]): `UnknownSession` is `unknown_session`, `Http2` is `http2`.
#[doc(hidden)]
#[must_use]
pub const fn snake_case<const N: usize>(name: &str) -> [u8; N] {
    let bytes = name.as_bytes();
    let mut out = [0u8; N];
    let (mut i, mut j) = (0, 0);
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_uppercase() {
            if i > 0 {
                out[j] = b'_';
                j += 1;
            }
            out[j] = c.to_ascii_lowercase();
        } else {
            out[j] = c;
        }
        i += 1;
        j += 1;
    }
    out
}

/// The bytes [`snake_case`] made, as the label's text (checked at compile time).
#[doc(hidden)]
#[must_use]
pub const fn snake_case_str(bytes: &'static [u8]) -> &'static str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => panic!("a Rust identifier in snake case is ASCII"),
    }
}

/// ```
/// use prometheus_client::metrics::counter::Counter;
///
/// grid_signals::label_values! {
///     label "reason";
///     /// Why a request was refused.
///     pub enum Refusal {
///         /// Too large.
///         Oversized,
///     }
/// }
/// let mut registry = prometheus_client::registry::Registry::default();
/// let refused = grid_signals::labels::register_zeroed::<Refusal, Counter>(
///     &mut registry,
///     "refused",
///     "Requests refused, by reason",
/// );
/// refused.get_or_create(&Refusal::Oversized).inc();
/// assert_eq!(Refusal::LABEL, "reason");
/// ```
#[macro_export]
macro_rules! label_values {
    (
        label $key:literal;
        $(#[$meta:meta])*
        $vis:vis enum $name:ident { $($body:tt)* }
    ) => {
        $crate::label_values! {
            $(#[$meta])*
            $vis enum $name { $($body)* }
        }

        impl $name {
            /// The metric label's name.
            $vis const LABEL: &'static str = $key;
        }

        impl $crate::__label_support::EncodeLabelSet for $name {
            fn encode(
                &self,
                encoder: &mut $crate::__label_support::LabelSetEncoder<'_>,
            ) -> ::core::fmt::Result {
                $crate::__label_support::EncodeLabelSet::encode(
                    &[(Self::LABEL, self.as_str())],
                    encoder,
                )
            }
        }

        impl $crate::labels::ClosedLabels for $name {
            fn values() -> impl ::core::iter::Iterator<Item = Self> {
                Self::ALL.into_iter()
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order: what is pre-registered at 0.
            $vis const ALL: [Self; $crate::label_values!(@count $($variant)+)] = [$(Self::$variant),+];

            /// The metric label value.
            $vis const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => {
                        const LABEL: &str = $crate::labels::snake_case_str(
                            &$crate::labels::snake_case::<
                                { $crate::labels::snake_case_len(stringify!($variant)) },
                            >(stringify!($variant)),
                        );
                        LABEL
                    } )+
                }
            }
        }

        impl $crate::__label_support::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut $crate::__label_support::LabelValueEncoder<'_>,
            ) -> ::core::fmt::Result {
                ::core::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
    (@count) => { 0usize };
    (@count $head:ident $($tail:ident)*) => { 1usize + $crate::label_values!(@count $($tail)*) };
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;

    use super::register_zeroed;

    crate::label_values! {
        label "reason";
        /// A test set.
        enum Reason {
            /// One.
            First,
            /// Two.
            SecondOne,
        }
    }

    crate::label_values! {
        label "kind";
        /// Another test set.
        enum Kind {
            /// A.
            Batch,
            /// B.
            Digest,
        }
    }

    crate::label_values! {
        /// Names of every form a label is written from.
        enum Names {
            /// One word.
            Ok,
            /// A digit inside a word.
            Http2Stream,
            /// A one-letter word between two others.
            RejectedASite,
            /// A long run of words.
            VersionsFullAtTheLimit,
        }
    }

    #[test]
    fn a_label_value_is_its_variants_name_in_snake_case() {
        let labels: Vec<&str> = Names::ALL.iter().map(|n| n.as_str()).collect();
        assert_eq!(
            labels,
            [
                "ok",
                "http2_stream",
                "rejected_a_site",
                "versions_full_at_the_limit"
            ]
        );
        assert_eq!(Reason::SecondOne.as_str(), "second_one");
        assert_eq!(
            super::snake_case_len("UnknownSession"),
            "unknown_session".len()
        );
    }

    /// What a label set was written as before the enum encoded itself.
    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        reason: Reason,
    }

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn a_registered_closed_set_exposes_every_value_at_zero_under_its_declared_label() {
        let mut registry = Registry::default();
        let family = register_zeroed::<Reason, Counter>(&mut registry, "t", "test");
        assert_eq!(Reason::LABEL, "reason");
        let text = exposition(&registry);
        assert!(text.contains("t_total{reason=\"first\"} 0"), "{text}");
        assert!(text.contains("t_total{reason=\"second_one\"} 0"), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("t_total")).count(),
            Reason::ALL.len(),
            "{text}"
        );
        family.get_or_create(&Reason::SecondOne).inc();
        assert!(
            exposition(&registry).contains("t_total{reason=\"second_one\"} 1"),
            "the handle returned is the family registered"
        );
    }

    #[test]
    fn a_declared_label_encodes_exactly_as_a_derived_one_field_struct() {
        let mut own = Registry::default();
        let family = register_zeroed::<Reason, Gauge>(&mut own, "g", "test");
        family.get_or_create(&Reason::First).set(3);
        let mut derived = Registry::default();
        let wrapped = Family::<Labels, Gauge>::default();
        derived.register("g", "test", wrapped.clone());
        wrapped
            .get_or_create(&Labels {
                reason: Reason::First,
            })
            .set(3);
        drop(wrapped.get_or_create(&Labels {
            reason: Reason::SecondOne,
        }));
        let mut own_lines: Vec<_> = exposition(&own).lines().map(str::to_owned).collect();
        let mut derived_lines: Vec<_> = exposition(&derived).lines().map(str::to_owned).collect();
        own_lines.sort();
        derived_lines.sort();
        assert_eq!(own_lines, derived_lines);
    }

    #[test]
    fn a_pair_of_closed_sets_is_labelled_in_order_and_zeroed_for_every_combination() {
        let mut registry = Registry::default();
        let family = register_zeroed::<(Kind, Reason), Counter>(&mut registry, "p", "test");
        family.get_or_create(&(Kind::Digest, Reason::First)).inc();
        let text = exposition(&registry);
        for (kind, reason, value) in [
            ("batch", "first", 0),
            ("batch", "second_one", 0),
            ("digest", "first", 1),
            ("digest", "second_one", 0),
        ] {
            let line = format!("p_total{{kind=\"{kind}\",reason=\"{reason}\"}} {value}");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert_eq!(text.lines().filter(|l| l.starts_with("p_total")).count(), 4);
    }
}
