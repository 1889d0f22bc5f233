//! Which request and response headers cross the proxy.
//!
//! Hop-by-hop headers (RFC 9110 section 7.6.1) describe one connection and must not be
//! forwarded, including any named in `Connection`. Routing headers are the gateway's own
//! word about where a request went: a client-supplied `x-grid-*` header would let it
//! pretend to downstream logs or a chained gateway that it was routed somewhere, so every
//! `x-grid-` request header is stripped before forwarding.

use arrayvec::ArrayVec;
use http::{HeaderMap, HeaderName, HeaderValue, header};

/// Prefix of the headers only the gateway may set.
pub const ROUTING_HEADER_PREFIX: &str = "x-grid-";

/// The header naming the site that served a request, added to every proxied response.
pub const SITE_HEADER: HeaderName = HeaderName::from_static("x-grid-site");

/// `site` as the value of [`SITE_HEADER`], when it can be one (a configured name always
/// can: names are checked when the configuration is read).
pub fn site_value(site: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(site).ok()
}

const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Whether `name` is hop-by-hop whatever `Connection` says.
fn always_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
        || name == header::TRANSFER_ENCODING
        || name.as_str() == "proxy-connection"
}

/// Removes hop-by-hop headers (fixed ones, `Transfer-Encoding`, `Proxy-Connection` and
/// any named in `Connection`).
///
/// One pass over the names comes first: most requests carry none of them, and then
/// nothing is hashed or removed; a site's chunked answer carries `Transfer-Encoding` and
/// no `Connection`, and then that one name is removed and `Connection` never looked up.
/// Otherwise the names present that must go are found in one more pass and only those
/// removed (a client's `Connection: keep-alive` costs one removal, not one per name that
/// could have been there).
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let (mut any, mut connection) = (false, false);
    for k in h.keys() {
        if always_hop_by_hop(k) {
            any = true;
            connection |= k == header::CONNECTION;
        }
    }
    if !any {
        return;
    }
    let mut doomed = ArrayVec::<HeaderName, DOOMED_INLINE>::new();
    let mut more = Vec::new();
    for k in h.keys() {
        let named = || {
            connection
                && grid_h1_wire::list_tokens(h, header::CONNECTION)
                    .any(|t| t.eq_ignore_ascii_case(k.as_str()))
        };
        if (always_hop_by_hop(k) || named())
            && let Err(full) = doomed.try_push(k.clone())
        {
            more.push(full.element());
        }
    }
    for k in doomed.into_iter().chain(more) {
        h.remove(k);
    }
}

/// A copy of `h` without `Host`, for a client that sets the upstream's authority itself.
pub fn without_host(h: &HeaderMap) -> HeaderMap {
    let mut h = h.clone();
    h.remove(header::HOST);
    h
}

/// Names [`strip_hop_by_hop`] holds on the stack before it needs the heap.
const DOOMED_INLINE: usize = 8;

/// Prepares a client's request headers for the upstream: hop-by-hop and routing headers
/// removed. `Host` is left to the writer of the request, which puts the site's authority
/// in its place: a site's own pool writes its own `Host` and skips the client's (no
/// removal, which hashed the name, on every request), and the TLS client's copy drops
/// it (`without_host`).
pub fn sanitize_request(h: &mut HeaderMap) {
    strip_hop_by_hop(h);
    let spoofable: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with(ROUTING_HEADER_PREFIX))
        .cloned()
        .collect();
    for k in spoofable {
        h.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[header::AUTHORIZATION], "Bearer k");
    }

    #[test]
    fn a_map_without_a_hop_by_hop_header_is_left_whole() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
        // Each fixed one alone is still found and removed.
        for name in HOP_BY_HOP.iter().cloned().chain([
            header::TRANSFER_ENCODING,
            HeaderName::from_static("proxy-connection"),
        ]) {
            let mut h = before.clone();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h, before, "{name}");
        }
    }

    #[test]
    fn more_doomed_names_than_fit_on_the_stack_are_all_removed() {
        let mut h = HeaderMap::new();
        let names: Vec<String> = (0..DOOMED_INLINE * 3)
            .map(|i| format!("x-hop-{i}"))
            .collect();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_str(&names.join(", ")).unwrap(),
        );
        for n in &names {
            h.insert(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[header::AUTHORIZATION], "Bearer k");
    }

    #[test]
    fn routing_headers_from_clients_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert("x-grid-site", HeaderValue::from_static("b"));
        h.insert("X-Grid-Anything", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("gw"));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-gridiron", HeaderValue::from_static("kept"));
        sanitize_request(&mut h);
        assert_eq!(h.len(), 3);
        assert!(h.contains_key(header::CONTENT_TYPE));
        assert!(h.contains_key("x-gridiron"));
        let h = without_host(&h);
        assert_eq!(h.len(), 2);
        assert!(!h.contains_key(header::HOST));
    }
}
