//! `grid-demo`: one command runs a whole local grid on loopback.

use clap::Parser;

/// Flags of the local-grid demo.
#[derive(Debug, Parser)]
#[command(about = "Run a whole local grid on loopback and watch it route")]
struct Args {
    /// How long the scripted scenario runs, in seconds.
    #[arg(long, default_value_t = 90)]
    duration: u64,
}

fn main() {
    let args = Args::parse();
    println!(
        "grid-demo: the local grid is not assembled yet (issue 10). When it is, this command will:"
    );
    println!("  1. mint loopback certificates in a temporary directory;");
    println!(
        "  2. start three simulated sites of unequal capacity, one seen through a peer operator;"
    );
    println!("  3. start an operator per site and one gateway;");
    println!(
        "  4. drive OpenAI-style load for {} s through a scripted scenario",
        args.duration
    );
    println!(
        "     (a site degrades, one loses all endpoints and recovers, a burst is shed with 429);"
    );
    println!("  5. show a live per-site view every second and write an SVG plot at the end.");
}
