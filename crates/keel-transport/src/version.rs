//! The A2A protocol version a request asks for: the `A2A-Version` header, or the query
//! parameter of that name (a server speaks 1.0 and 0.3).

use axum::http::HeaderMap;

use crate::jsonrpc::{RpcError, VERSION_NOT_SUPPORTED};

/// The header in which a client names the A2A version it speaks.
pub(crate) const VERSION_HEADER: &str = "A2A-Version";

/// The protocol version a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// A2A 1.0 (`1.0`, `1.0.x`).
    V1,
    /// A2A 0.3 (`0.3`, `0.3.x`).
    V03,
}

/// Whether a client's `A2A-Version` is one this server speaks: `1.0` or `1.0.x`.
fn version_supported(version: &str) -> bool {
    is_version(version, "1", "0")
}

fn is_version(version: &str, major: &str, minor: &str) -> bool {
    let mut parts = version.trim().split('.');
    parts.next() == Some(major)
        && parts.next() == Some(minor)
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The version named by the `A2A-Version` header, or else by the query parameter of that
/// name; `Ok(None)` when neither is given or the one given is empty (v1.0.1, 3.6.2: "Agents
/// MUST interpret empty value as 0.3 version", as an absent one), `Err` (VersionNotSupported)
/// for anything but 1.0 and 0.3.
pub(crate) fn requested_version(
    headers: &HeaderMap,
    query: &[(String, String)],
) -> Result<Option<Version>, RpcError> {
    let named = headers
        .get(VERSION_HEADER)
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .or_else(|| {
            query
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(VERSION_HEADER))
                .map(|(_, v)| v.clone())
        });
    match named {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) if version_supported(&v) => Ok(Some(Version::V1)),
        Some(v) if is_version(&v, "0", "3") => Ok(Some(Version::V03)),
        Some(v) => Err(RpcError::new(
            VERSION_NOT_SUPPORTED,
            format!("A2A version `{v}` is not supported; this server speaks 1.0 and 0.3"),
        )
        .with("supportedVersions", "1.0, 0.3")),
    }
}

/// The VersionNotSupported error of a binding that speaks A2A 1.0 only (HTTP+JSON, gRPC) for
/// a request that asks for 0.3, by naming it or by naming no version: a request without
/// `A2A-Version` is A2A 0.3 (v1.0.1, 3.6.2), on every binding, as JSON-RPC reads it too.
pub(crate) fn v1_only(binding: &str, named: bool) -> RpcError {
    let asked = if named {
        "asks for A2A 0.3"
    } else {
        "names no A2A-Version, which is A2A 0.3"
    };
    RpcError::new(
        VERSION_NOT_SUPPORTED,
        format!(
            "the request {asked}; the {binding} binding speaks A2A 1.0: send `A2A-Version: 1.0` (JSON-RPC speaks 0.3 too)"
        ),
    )
    .with("supportedVersions", "1.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_1_0_and_1_0_x_are_supported_others_are_not() {
        for ok in ["1.0", "1.0.0", "1.0.12", " 1.0 "] {
            assert!(version_supported(ok), "{ok}");
        }
        for bad in ["", "1", "1.1", "2.0", "0.9", "0.3", "1.0.", "1.0.x", "9.9"] {
            assert!(!version_supported(bad), "{bad}");
        }
    }

    #[test]
    fn version_comes_from_the_header_or_the_query_and_selects_the_protocol() {
        let mut headers = HeaderMap::new();
        assert_eq!(requested_version(&headers, &[]), Ok(None));
        let query = vec![("A2A-Version".to_owned(), "0.3".to_owned())];
        assert_eq!(requested_version(&headers, &query), Ok(Some(Version::V03)));
        headers.insert(VERSION_HEADER, "1.0".parse().unwrap());
        assert_eq!(requested_version(&headers, &query), Ok(Some(Version::V1)));
        // An empty value is no version, whichever way it comes (0.3 by the spec).
        headers.insert(VERSION_HEADER, "".parse().unwrap());
        assert_eq!(requested_version(&headers, &query), Ok(None));
        headers.remove(VERSION_HEADER);
        let empty = vec![("a2a-version".to_owned(), " ".to_owned())];
        assert_eq!(requested_version(&headers, &empty), Ok(None));
        headers.insert(VERSION_HEADER, "0.2".parse().unwrap());
        assert_eq!(
            requested_version(&headers, &[]).unwrap_err().code,
            VERSION_NOT_SUPPORTED
        );
    }
}
