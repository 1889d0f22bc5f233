//! Provider batches as operators publish them, for the benches that need a grid's worth of
//! signals: the contract's pool series (the `grid_provider_*` verdicts and the EPP's
//! `llm_d_epp_*` averages) and one per-endpoint queue series per endpoint, 21 rows for
//! eight endpoints. The store bench and the signal-plane bench build their bodies here.

use grid_signals::batch::{Batch, BatchMeta, Fence, Row};

/// The benches' first instant, in ms since the Unix epoch. Every publisher's epoch is a
/// minute before it.
pub const T0: u64 = 1_700_000_000_000;

/// How long before `T0` the publishers started: the epoch of every fence.
const EPOCH_LEAD_MS: u64 = 60_000;

/// How old a batch's rows are when it is published: the scrape that read them.
const ROW_AGE_MS: u64 = 40;

/// The generation every provider's configuration is at.
const GENERATION: u64 = 3;

/// One row per provider of each of these, in this order.
pub const CONTRACT: [&str; 13] = grid_signals::epp::PROVIDER_SERIES;

/// One row per endpoint of this, labelled with the endpoint.
pub const PER_ENDPOINT: &str = "llm_d_epp_per_endpoint_queue_size";

/// What the contract's rows say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Distinct per site, provider, row and sequence and meaning nothing: what the store
    /// bench ingests, which reads no value.
    Arbitrary,
    /// What a serving pool with room reports: ready, every endpoint ready, a few requests
    /// running on each and none waiting, KV caches partly full, nothing held by flow
    /// control. The load moves with the site, the provider and the sequence, so sites
    /// differ and change.
    Serving,
}

/// A grid's size: its sites, each site's providers and each provider's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridShape {
    /// Sites, named `site-0..` with as many digits as the last one needs (at least two).
    pub sites: usize,
    /// Providers per site, named `provider-0..`.
    pub providers: usize,
    /// Endpoints per provider: one per-endpoint row each.
    pub endpoints: usize,
    /// What the contract's rows say.
    pub values: Values,
}

impl GridShape {
    /// Rows of one provider's batch.
    pub const fn rows_per_provider(&self) -> usize {
        CONTRACT.len() + self.endpoints
    }

    /// Providers of the whole grid.
    pub const fn providers_total(&self) -> usize {
        self.sites * self.providers
    }

    /// The name of site `site`.
    pub fn site(&self, site: usize) -> String {
        let width = self.sites.saturating_sub(1).to_string().len().max(2);
        format!("site-{site:0width$}")
    }

    /// The name of provider `provider` (of any site).
    pub fn provider(provider: usize) -> String {
        format!("provider-{provider}")
    }

    /// Provider `provider` of site `site`'s batch at `sequence`, published at `now`.
    ///
    /// # Panics
    ///
    /// When a name or value breaks the wire rules: never, for the names built here.
    pub fn batch(&self, site: usize, provider: usize, sequence: u64, now: u64) -> Batch {
        let mut rows: Vec<Row> = CONTRACT
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let value = self.value(site, provider, i, sequence);
                Row::new(*name, vec![], value, now - ROW_AGE_MS).expect("valid row")
            })
            .collect();
        rows.extend((0..self.endpoints).map(|e| {
            let endpoint = format!("10.{site}.{provider}.{e}:8000");
            let value = match self.values {
                Values::Arbitrary => ((e as u64 + sequence) % 5) as f64,
                Values::Serving => 0.0,
            };
            Row::new(
                PER_ENDPOINT,
                vec![("model_server_endpoint".to_owned(), endpoint)],
                value,
                now - ROW_AGE_MS,
            )
            .expect("valid row")
        }));
        let meta = BatchMeta::new(
            self.site(site),
            Self::provider(provider),
            format!("3f0c6d1e-{site:04}-{provider:04}-8000-00000000abcd"),
            Fence::new(T0 - EPOCH_LEAD_MS, sequence),
            rows.len() as u64,
            GENERATION,
            now,
        )
        .expect("valid metadata");
        Batch::new(meta, rows)
    }

    /// Row `row` of [`CONTRACT`] for one provider at `sequence`.
    fn value(&self, site: usize, provider: usize, row: usize, sequence: u64) -> f64 {
        let spread = (site * 7 + provider * 3) as u64 + sequence;
        match self.values {
            Values::Arbitrary => (spread + row as u64) as f64 * 0.25,
            Values::Serving => {
                let endpoints = self.endpoints as f64;
                let running = 1.0 + (spread % 6) as f64;
                match CONTRACT[row] {
                    "grid_provider_ready" => 1.0,
                    "grid_provider_ready_endpoints" | "llm_d_epp_ready_endpoints" => endpoints,
                    "grid_provider_in_flight_requests" => running * endpoints,
                    "grid_provider_ttft_p50_seconds" => 0.2,
                    "grid_provider_ttft_p90_seconds" => 0.5,
                    "grid_provider_tpot_seconds" => 0.02,
                    "llm_d_epp_average_running_requests" => running,
                    "llm_d_epp_average_kv_cache_utilization" => 0.2 + running * 0.1,
                    "llm_d_epp_std_dev_kv_cache_utilization" => 0.05,
                    _ => 0.0,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_as_wide_as_the_last_site_needs_and_at_least_two_digits() {
        let shape = |sites| GridShape {
            sites,
            providers: 1,
            endpoints: 0,
            values: Values::Arbitrary,
        };
        assert_eq!(shape(50).site(7), "site-07");
        assert_eq!(shape(1_000).site(7), "site-007");
        assert_eq!(shape(1).site(0), "site-00");
    }

    #[test]
    fn a_batch_holds_the_contract_and_one_row_per_endpoint() {
        let shape = GridShape {
            sites: 2,
            providers: 2,
            endpoints: 8,
            values: Values::Serving,
        };
        let batch = shape.batch(1, 1, 4, T0);
        assert_eq!(batch.rows.len(), shape.rows_per_provider());
        assert_eq!(batch.rows.len(), 21);
        assert_eq!(batch.meta.fence(), Fence::new(T0 - EPOCH_LEAD_MS, 4));
        let kv = batch
            .rows
            .iter()
            .find(|r| r.name() == "llm_d_epp_average_kv_cache_utilization")
            .map(Row::value);
        assert!(kv.is_some_and(|kv| kv < 1.0), "{kv:?}");
    }
}
