//! Parses one exposition file a given number of times with the strict iterator, the way
//! the parser bench's `ours` and `ours_all_labels` rows do, for instruction counts that
//! machine load cannot move:
//!
//! ```text
//! cargo build --release -p grid-signals --example parse_file
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/parse_file FILE 20 labels
//! ```
//!
//! Run it with 0 and with N iterations; the difference over N is the cost of one parse.

use std::hint::black_box;

use grid_signals::exposition::samples;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: parse_file FILE [ITERATIONS] [samples|labels]");
    let iterations: usize = args.next().map_or(1, |n| n.parse().expect("a count"));
    let all_labels = args.next().as_deref() == Some("labels");
    let body = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut count = 0usize;
    for _ in 0..iterations {
        for sample in samples(black_box(&body)) {
            let sample = sample.unwrap_or_else(|e| panic!("{path}: {e}"));
            if all_labels {
                for pair in sample.labels {
                    black_box(pair);
                }
            }
            black_box(sample.value);
            count += 1;
        }
    }
    println!("{count} samples");
}
