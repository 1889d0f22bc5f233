//! `grid-pingora`: a Pingora proxy that sends each OpenAI-style request to the site grid
//! picks. Run: `grid-pingora gateway.toml` (the gateway's own configuration file: its
//! `listen`, `operator`, `tls` and `models`).
//!
//! grid plugs in as round-robin or Ketama would: a `LoadBalancer<GridSelection>` whose
//! key is the request's model, its backends grid's sites, grid's poller a background
//! service beside it (`grid_pingora::proxy`).

use anyhow::Context as _;
use grid_gateway::Config;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: grid-pingora GATEWAY_CONFIG")?;
    let config = Config::load(path.as_ref())?;
    let server = grid_pingora::proxy::server(&config)?;
    println!("grid-pingora serving on {}", config.listen);
    server.run_forever()
}
