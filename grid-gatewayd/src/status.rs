//! `grid-gatewayd status --url URL`: reads a daemon's routing evidence
//! (`GET /v1/grid/routing` of a gateway's listener or an operator's metrics listener) and
//! prints it as a table, coloured only on a terminal, or passes the document through
//! (`--json`).

use std::time::Duration;

use bytes::Bytes;
use grid_daemon::evidence::{Document, MAX_DOCUMENT_BYTES, ROUTING_PATH};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long the whole read may take, connect to last byte.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the evidence could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The URL is not an `http://` URL.
    #[error("--url: {0}")]
    Url(String),
    /// The daemon could not be reached or did not answer in time.
    #[error("reading {url}: {reason}")]
    Read {
        /// What was read.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// It answered something else than a routing document.
    #[error("{url} answered {status}")]
    Status {
        /// What was read.
        url: String,
        /// Its status.
        status: u16,
    },
    /// The body is not a routing document.
    #[error("{url}: {source}")]
    Document {
        /// What was read.
        url: String,
        /// Why it is not one.
        source: grid_daemon::evidence::DocumentError,
    },
}

/// The evidence URL for `given`: the daemon's listener (`http://host:port`, where the
/// evidence path is added) or the evidence URL itself.
pub fn evidence_url(given: &str) -> Result<http::Uri, StatusError> {
    let uri: http::Uri = given
        .parse()
        .map_err(|e: http::uri::InvalidUri| StatusError::Url(e.to_string()))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(StatusError::Url(format!(
            "{given:?}: give http://host:port (the gateway's listener or the operator's metrics listener)"
        )));
    }
    if matches!(uri.path(), "" | "/") && uri.query().is_none() {
        let mut parts = uri.into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(ROUTING_PATH));
        return http::Uri::from_parts(parts).map_err(|e| StatusError::Url(e.to_string()));
    }
    Ok(uri)
}

/// Reads the document at `url`, at most [`MAX_DOCUMENT_BYTES`], within [`STATUS_TIMEOUT`].
pub async fn fetch(url: &http::Uri) -> Result<Vec<u8>, StatusError> {
    let read = |reason: String| StatusError::Read {
        url: url.to_string(),
        reason,
    };
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let resp = client.get(url.clone()).await.map_err(|e| {
            let causes =
                std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
                    e.source()
                });
            read(
                causes
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(": "),
            )
        })?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_DOCUMENT_BYTES)
            .collect()
            .await
            .map_err(|e| read(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(StatusError::Status {
                url: url.to_string(),
                status: status.as_u16(),
            });
        }
        Ok(body.to_vec())
    };
    tokio::time::timeout(STATUS_TIMEOUT, exchange)
        .await
        .map_err(|_| read(format!("no answer within {STATUS_TIMEOUT:?}")))?
}

/// What `status` prints for `body`: the document itself with `json`, else its table
/// (coloured with `colour`).
pub fn render(
    url: &http::Uri,
    body: &[u8],
    json: bool,
    colour: bool,
) -> Result<String, StatusError> {
    let doc = Document::parse(body).map_err(|source| StatusError::Document {
        url: url.to_string(),
        source,
    })?;
    if json {
        let mut text = String::from_utf8_lossy(body).into_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        return Ok(text);
    }
    Ok(doc.table(colour))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_url_gets_the_evidence_path_and_anything_but_http_is_refused() {
        assert_eq!(
            evidence_url("http://127.0.0.1:8080").unwrap().to_string(),
            "http://127.0.0.1:8080/v1/grid/routing"
        );
        assert_eq!(
            evidence_url("http://g:1/v1/grid/routing?model=m")
                .unwrap()
                .to_string(),
            "http://g:1/v1/grid/routing?model=m"
        );
        assert!(matches!(
            evidence_url("https://g:1"),
            Err(StatusError::Url(_))
        ));
        assert!(matches!(evidence_url("g:1"), Err(StatusError::Url(_))));
    }
}
