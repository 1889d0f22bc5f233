//! `grid-faults`: the fault suite (`docs/operations.md`, "Fault suite"). Runs three sites
//! on loopback with WAN-like links, injects one fault at a time on site `c` under steady
//! load through the gateway, and prints what each did as a markdown table (progress on
//! stderr).
//!
//! ```text
//! cargo run --release -p grid-programs --bin grid-faults              # every fault
//! cargo run --release -p grid-programs --bin grid-faults -- partition # only the ones named
//! ```

use grid_programs::fault_suite::{Fault, run, table};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let only: Vec<String> = std::env::args().skip(1).collect();
    if only.iter().any(|a| a == "--help" || a == "-h") {
        eprintln!("usage: grid-faults [FAULT...]; faults:");
        for f in Fault::ALL {
            eprintln!("  {}", f.name());
        }
        return std::process::ExitCode::SUCCESS;
    }
    let mut rows = Vec::new();
    for fault in Fault::ALL {
        if !only.is_empty() && !only.iter().any(|a| a == fault.name()) {
            continue;
        }
        eprintln!("grid-faults: {} ...", fault.name());
        match run(fault).await {
            Ok(row) => {
                eprintln!("{}", table(std::slice::from_ref(&row)));
                rows.push(row);
            }
            Err(e) => {
                eprintln!("grid-faults: {} did not run: {e}", fault.name());
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    print!("{}", table(&rows));
    std::process::ExitCode::SUCCESS
}
