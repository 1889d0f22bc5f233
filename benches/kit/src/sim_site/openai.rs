//! The OpenAI-compatible shapes the simulated model server answers with: enough for
//! `OpenAI` clients and the gateway to treat it as a vLLM server.

use serde_json::{Value, json};

/// Which inference API a request called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings` (never streamed; only prefills).
    Embeddings,
}

impl Api {
    /// The API a path names, if any.
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Self::Chat),
            "/v1/completions" => Some(Self::Completions),
            "/v1/embeddings" => Some(Self::Embeddings),
            _ => None,
        }
    }
}

/// What the server reads from a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The `model` field, when present.
    pub model: Option<String>,
    /// The `stream` field (false when absent).
    pub stream: bool,
}

/// Reads `model` and `stream` from a JSON request body; `None` when it is not a JSON
/// object or the fields have the wrong types.
pub fn parse_request(body: &[u8]) -> Option<Parsed> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let model = match object.get("model") {
        None => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return None,
    };
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return None,
    };
    Some(Parsed { model, stream })
}

/// The text a simulated completion "generates", one word per streamed chunk.
pub const WORDS: [&str; 8] = [
    "Simulated ",
    "tokens ",
    "from ",
    "a ",
    "grid ",
    "test ",
    "site",
    ".",
];

/// A non-streamed answer.
pub fn full_response(api: Api, id: u64, model: &str, endpoint: &str) -> Value {
    let text: String = WORDS.concat();
    let usage = json!({"prompt_tokens": 16, "completion_tokens": WORDS.len(), "total_tokens": 16 + WORDS.len()});
    match api {
        Api::Chat => json!({
            "id": format!("chatcmpl-{endpoint}-{id}"),
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }),
        Api::Completions => json!({
            "id": format!("cmpl-{endpoint}-{id}"),
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": usage,
        }),
        Api::Embeddings => json!({
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3, 0.4]}],
            "usage": {"prompt_tokens": 16, "total_tokens": 16},
        }),
    }
}

/// One server-sent event carrying streamed chunk `i` (a word, or with `last` the
/// finish reason), as `data: {...}\n\n`.
pub fn stream_chunk(api: Api, id: u64, model: &str, endpoint: &str, i: usize) -> String {
    let last = i >= WORDS.len();
    let finish = if last { json!("stop") } else { Value::Null };
    let word = if last { "" } else { WORDS[i] };
    let chunk = match api {
        Api::Chat | Api::Embeddings => {
            let delta = if i == 0 {
                json!({"role": "assistant", "content": word})
            } else {
                json!({"content": word})
            };
            json!({
                "id": format!("chatcmpl-{endpoint}-{id}"),
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })
        }
        Api::Completions => json!({
            "id": format!("cmpl-{endpoint}-{id}"),
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "text": word, "finish_reason": finish}],
        }),
    };
    format!("data: {chunk}\n\n")
}

/// The event that ends a stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str, code: u16) -> Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

/// `GET /v1/models`.
pub fn models(model: &str) -> Value {
    json!({"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "grid-sim"}]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_fields_are_read_and_bad_types_refused() {
        assert_eq!(
            parse_request(br#"{"model":"m","stream":true,"messages":[]}"#),
            Some(Parsed {
                model: Some("m".into()),
                stream: true
            })
        );
        assert_eq!(
            parse_request(b"{}"),
            Some(Parsed {
                model: None,
                stream: false
            })
        );
        assert_eq!(parse_request(br#"{"stream":"yes"}"#), None);
        assert_eq!(parse_request(br#"{"model":3}"#), None);
        assert_eq!(parse_request(b"[1]"), None);
        assert_eq!(parse_request(b"{"), None);
    }

    #[test]
    fn the_last_chunk_carries_the_finish_reason() {
        let last = stream_chunk(Api::Chat, 1, "m", "e", WORDS.len());
        assert!(last.contains(r#""finish_reason":"stop""#), "{last}");
        let first = stream_chunk(Api::Chat, 1, "m", "e", 0);
        assert!(first.contains(r#""role":"assistant""#), "{first}");
        assert!(first.starts_with("data: {") && first.ends_with("}\n\n"));
    }
}
