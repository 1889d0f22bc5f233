//! What can be wrong with an HTTP/1.1 message on the wire, in either direction.

/// What was wrong with a site's answer on the wire.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The head is not HTTP/1.x.
    #[error("the site's answer head is malformed: {0}")]
    Head(String),
    /// The head is longer than [`MAX_ANSWER_HEAD_BYTES`](crate::MAX_ANSWER_HEAD_BYTES) or has more than
    /// [`MAX_ANSWER_HEADERS`](crate::MAX_ANSWER_HEADERS) fields.
    #[error("the site's answer head is larger than the gateway reads")]
    HeadTooLarge,
    /// A 101 (the gateway asked for no protocol switch).
    #[error("the site answered with interim status {0} where a final answer was due")]
    Interim(u16),
    /// More than [`MAX_INTERIM_ANSWERS`](crate::MAX_INTERIM_ANSWERS) 1xx answers before the final one.
    #[error("the site sent more interim answers than the gateway reads")]
    TooManyInterim,
    /// `Content-Length` is not one decimal number.
    #[error("the site's answer has an unusable content-length")]
    ContentLength,
    /// A chunk-size line is not hexadecimal, too long, or its size overflows.
    #[error("a chunked body has a malformed chunk size line")]
    ChunkSize,
    /// A chunk's data is not followed by CRLF.
    #[error("a chunked body has a chunk without its CRLF")]
    ChunkEnd,
    /// A chunk extension has a control byte (a bare CR or LF, NUL, DEL; a tab is
    /// whitespace there).
    #[error("a chunked body has a chunk extension with a control byte")]
    ChunkExtension,
    /// The body's chunk extensions are longer than [`MAX_CHUNK_EXTENSION_BYTES`](crate::MAX_CHUNK_EXTENSION_BYTES).
    #[error("a chunked body has more chunk extensions than the gateway reads")]
    ChunkExtensionsTooLarge,
    /// A trailer line is not a `name: value` field (a name that is not a token, no colon,
    /// whitespace before it, a line folded onto the one before, a control byte).
    #[error("a chunked body has a trailer that is not a field")]
    Trailer,
    /// The trailers are longer than [`MAX_TRAILER_BYTES`](crate::MAX_TRAILER_BYTES) or more than
    /// [`MAX_TRAILER_FIELDS`](crate::MAX_TRAILER_FIELDS).
    #[error("a chunked body has more trailers than the gateway reads")]
    TrailersTooLarge,
    /// A site's answer has a transfer coding other than `chunked` alone, or any in
    /// HTTP/1.0: the gateway would forward its body with the coding lost.
    #[error("the site's answer has a transfer coding the gateway does not decode")]
    AnswerCoding,
    /// The connection ended before the body did.
    #[error("the connection closed before the body's end")]
    Truncated,
    /// A client's request head is not HTTP/1.x.
    #[error("the request head is malformed: {0}")]
    RequestHead(String),
    /// A client's request head is longer than
    /// [`MAX_REQUEST_HEAD_BYTES`](crate::MAX_REQUEST_HEAD_BYTES) or has more
    /// than [`MAX_REQUEST_HEADERS`](crate::MAX_REQUEST_HEADERS) fields.
    #[error("the request head is larger than the gateway reads")]
    RequestHeadTooLarge,
    /// A client's request frames its body ambiguously (RFC 9112 section 6.3).
    #[error("the request's body framing cannot be trusted: {0}")]
    RequestFraming(&'static str),
    /// A client's request body is chunked after other transfer codings (`gzip, chunked`,
    /// `identity, chunked`, `chunked` twice): RFC 9112 section 6.1's 501, since the
    /// gateway decodes `chunked` alone and would forward the body with its coding lost.
    #[error("the request's transfer coding is not implemented: only chunked is")]
    RequestCoding,
}
