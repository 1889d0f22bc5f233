#![no_main]
//! Strict mode on arbitrary bytes. Asserts: no panic; every sample has each label name
//! once and none `__name__`, and is written back and re-parsed to the same sample; an
//! error names a line that exists and stops the iteration; the body cap holds for
//! chunked pushes, and `read_capped` never reads more than `MAX_EXPOSITION_BYTES + 1`
//! bytes from a stream however long it is.

use std::io::Read;

use grid_signals::Error;
use grid_signals::exposition::{
    BodyBuf, MAX_EXPOSITION_BYTES, OwnedSample, read_capped, samples, write_owned_sample,
};
use libfuzzer_sys::fuzz_target;

/// Repeats `data` up to `total` bytes, counting what is read.
struct Repeating {
    pattern: Vec<u8>,
    total: usize,
    read: usize,
}

impl Repeating {
    fn new(data: &[u8], total: usize) -> Self {
        // The pattern is whole copies of `data`, at least 16 KiB, so reads copy slices.
        let copies = (16 * 1024 / data.len()).max(1);
        Self {
            pattern: data.repeat(copies),
            total,
            read: 0,
        }
    }
}

impl Read for Repeating {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let start = self.read % self.pattern.len();
        let n = buf
            .len()
            .min(self.total - self.read)
            .min(self.pattern.len() - start);
        buf[..n].copy_from_slice(&self.pattern[start..start + n]);
        self.read += n;
        Ok(n)
    }
}

fn same(a: &OwnedSample, b: &OwnedSample) -> bool {
    let values = a.value.to_bits() == b.value.to_bits()
        || (a.value.is_nan() && b.value.is_nan())
        || (a.value == 0.0 && b.value == 0.0);
    let mut sorted = a.labels.clone();
    sorted.sort_by(|x, y| x.0.cmp(&y.0));
    a.name == b.name && sorted == b.labels && a.timestamp_ms == b.timestamp_ms && values
}

/// Parses `body` strictly; with `round_trip`, also writes each sample back and re-parses.
fn check_strict(body: &[u8], round_trip: bool) {
    let lines = body.split(|&b| b == b'\n').count();
    let mut iter = samples(body);
    for item in iter.by_ref() {
        match item {
            Ok(sample) => {
                assert_eq!(sample.labels.iter().count(), sample.labels.len());
                let names: Vec<&str> = sample.labels.iter().map(|(n, _)| n).collect();
                for (j, name) in names.iter().enumerate() {
                    assert!(
                        *name != "__name__" && !names[..j].contains(name),
                        "{sample:?}"
                    );
                }
                if !round_trip {
                    continue;
                }
                let owned = sample.to_owned_sample();
                let mut text = Vec::new();
                write_owned_sample(&mut text, &owned);
                let back: Vec<_> = samples(&text).collect();
                assert_eq!(back.len(), 1, "{}", String::from_utf8_lossy(&text));
                let back = back[0]
                    .as_ref()
                    .expect("written text parses")
                    .to_owned_sample();
                assert!(same(&owned, &back), "{owned:?} vs {back:?}");
            }
            Err(Error::Parse { line, column, .. }) => {
                assert!(line >= 1 && line <= lines && column >= 1);
                break;
            }
            Err(other) => panic!("strict parse gave {other:?}"),
        }
    }
    assert!(iter.next().is_none(), "iteration goes on after an error");
}

fuzz_target!(|data: &[u8]| {
    check_strict(data, true);

    // Chunked pushes: everything is accepted (fuzz inputs are far below the cap).
    let mut buf = BodyBuf::new();
    let chunk = usize::from(data.first().copied().unwrap_or(1)).max(1);
    for piece in data.chunks(chunk) {
        buf.push(piece).expect("below the cap");
    }
    assert_eq!(buf.as_bytes(), data);

    // Inputs starting with `~` also go through `read_capped` as a stream around the cap.
    if data.len() >= 2 && data[0] == b'~' {
        let total = match data[1] % 3 {
            0 => MAX_EXPOSITION_BYTES - usize::from(data[1]),
            1 => MAX_EXPOSITION_BYTES + 1,
            _ => MAX_EXPOSITION_BYTES * 4,
        };
        let mut stream = Repeating::new(data, total);
        let result = read_capped(&mut stream);
        assert!(
            stream.read <= MAX_EXPOSITION_BYTES + 1,
            "read {}",
            stream.read
        );
        match result {
            Ok(body) => {
                assert!(total <= MAX_EXPOSITION_BYTES);
                assert_eq!(body.len(), total);
                check_strict(&body, false);
            }
            Err(e) => {
                assert!(total > MAX_EXPOSITION_BYTES);
                assert_eq!(
                    e,
                    Error::BodyCap {
                        limit: MAX_EXPOSITION_BYTES
                    }
                );
            }
        }
    }
});
