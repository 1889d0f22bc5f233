//! One declaration for each closed label set: the enum, its label values, `ALL` and the
//! `prometheus-client` encoding come from one list, so a reason cannot be added without
//! its label or left out of the pre-registered set.
//!
//! prometheus-client's own `EncodeLabelValue` derive writes a variant's Rust name
//! (`BodyCap`); grid's label values are snake case (`body_cap`), so this small macro
//! stands in where the derive cannot serve.

/// Declares a closed label-value enum: each variant with its label, `ALL` in
/// declaration order, a `const fn as_str` and an `EncodeLabelValue` implementation.
///
/// ```
/// grid_signals::label_values! {
///     /// How one poll ended.
///     #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
///     pub enum Outcome {
///         /// It worked.
///         Ok = "ok",
///         /// The body was too large.
///         BodyCap = "body_cap",
///     }
/// }
/// assert_eq!(Outcome::ALL, [Outcome::Ok, Outcome::BodyCap]);
/// assert_eq!(Outcome::BodyCap.as_str(), "body_cap");
/// ```
#[macro_export]
macro_rules! label_values {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $label:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order: what is pre-registered at 0.
            $vis const ALL: [Self; $crate::label_values!(@count $($variant)+)] = [$(Self::$variant),+];

            /// The metric label value.
            $vis const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $label, )+
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
    use prometheus_client::registry::Registry;

    crate::label_values! {
        /// A test set.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        enum Reason {
            /// One.
            First = "first",
            /// Two.
            SecondOne = "second_one",
        }
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        reason: Reason,
    }

    #[test]
    fn a_declared_set_encodes_its_labels_and_lists_every_value() {
        let family = Family::<Labels, Counter>::default();
        for reason in Reason::ALL {
            family.get_or_create(&Labels { reason }).inc();
        }
        let mut registry = Registry::default();
        registry.register("t", "test", family);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("t_total{reason=\"first\"} 1"), "{text}");
        assert!(text.contains("t_total{reason=\"second_one\"} 1"), "{text}");
    }
}
