//! Arbitrary request bodies through the gateway's `model` field scan.
//!
//! Asserts: no panic on any input; an accepted name is 1 to `MAX_MODEL_NAME_BYTES` bytes;
//! trailing JSON whitespace never changes the verdict (the accepted name, or the kind of
//! refusal: a truncated body's error offset moves to the new end); and a body that is a
//! prefix cut of an accepted one (the object left unclosed) is never accepted; and where
//! serde_json reads the body as an object whose `model` is a string, an accepted name is
//! that string (the scan skips string content a word at a time: this holds it to a full
//! parser's reading of every string it crosses).
#![no_main]

use grid_score::model_field::{MAX_MODEL_NAME_BYTES, find_model};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let verdict = find_model(body);
    if let Ok(name) = &verdict {
        assert!(!name.is_empty() && name.len() <= MAX_MODEL_NAME_BYTES);
        let cut = &body[..body
            .iter()
            .rposition(|&b| b == b'}')
            .expect("an object ends in }")];
        assert!(find_model(cut).is_err(), "an unclosed object was accepted");
    }
    if let (Ok(name), Ok(serde_json::Value::Object(object))) =
        (&verdict, serde_json::from_slice::<serde_json::Value>(body))
        && let Some(serde_json::Value::String(model)) = object.get("model")
    {
        assert_eq!(name, model, "serde_json reads another model");
    }
    let mut padded = body.to_vec();
    padded.extend_from_slice(b" \n\t\r");
    match (find_model(&padded), verdict) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => {
            assert_eq!(a.as_str(), b.as_str());
        }
        (a, b) => panic!("trailing whitespace changed {b:?} into {a:?}"),
    }
});
