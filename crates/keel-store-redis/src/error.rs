//! Turning Redis failures into actionable [`AgentError::Storage`] messages that name the
//! server but never its password.

use std::sync::Arc;

use keel_core::AgentError;

/// The server's URL with any password masked, plus the secrets to scrub from error text.
#[derive(Clone)]
pub(crate) struct ServerName {
    shown: Arc<str>,
    secrets: Arc<[String]>,
}

impl ServerName {
    /// Remember `url` for messages, masking the password of its user info and any
    /// `password=`/`pass=` query parameter.
    pub(crate) fn new(url: &str) -> Self {
        let mut secrets = Vec::new();
        let mut shown = String::with_capacity(url.len());
        let (head, query) = match url.split_once('?') {
            Some((head, query)) => (head, Some(query)),
            None => (url, None),
        };
        match head.split_once("://") {
            Some((scheme, rest)) => {
                let authority_end = rest.find('/').unwrap_or(rest.len());
                let (authority, path) = rest.split_at(authority_end);
                shown.push_str(scheme);
                shown.push_str("://");
                match authority.rsplit_once('@') {
                    Some((userinfo, host)) => {
                        match userinfo.split_once(':') {
                            Some((user, password)) => {
                                secrets.push(password.to_owned());
                                shown.push_str(user);
                                shown.push_str(":***");
                            }
                            None => shown.push_str(userinfo),
                        }
                        shown.push('@');
                        shown.push_str(host);
                    }
                    None => shown.push_str(authority),
                }
                shown.push_str(path);
            }
            None => shown.push_str(head),
        }
        if let Some(query) = query {
            shown.push('?');
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, value))
                        if name.eq_ignore_ascii_case("password")
                            || name.eq_ignore_ascii_case("pass") =>
                    {
                        secrets.push(value.to_owned());
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            shown.push_str(&pairs.join("&"));
        }
        // A password may reach an error message percent-decoded; scrub that form too.
        let decoded: Vec<String> = secrets.iter().map(|s| percent_decode(s)).collect();
        secrets.extend(decoded);
        secrets.retain(|s| !s.is_empty());
        // Longest first, so a secret containing another is scrubbed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Self {
            shown: Arc::from(shown),
            secrets: secrets.into(),
        }
    }

    /// The URL with its password masked.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every occurrence of the password masked.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in self.secrets.iter() {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }

    /// A Redis failure during `op`, with a hint at what to check.
    pub(crate) fn error(&self, op: &str, err: &redis::RedisError) -> AgentError {
        let hint = if err.is_connection_refusal() {
            "; is Redis running and listening at that address?"
        } else if err.is_timeout() {
            "; the server did not answer in time (overloaded, or a network problem?)"
        } else if err.is_io_error() || err.is_connection_dropped() {
            "; the connection failed and will be re-established on the next call"
        } else if err.code() == Some("WRONGTYPE") {
            "; a key under Keel's prefix holds data of another type: is another application \
             writing under the same prefix?"
        } else if err.code() == Some("NOAUTH") || err.code() == Some("WRONGPASS") {
            "; check the user and password in the Redis URL"
        } else {
            ""
        };
        AgentError::storage_source(
            "redis",
            format!("{op} at {}", self.shown),
            ScrubbedError(format!("{}{hint}", self.scrub(&err.to_string()))),
        )
    }
}

/// A Redis client error as text with the password masked: the source of Redis storage
/// errors. The client's own error is not kept, since its text may quote the URL.
#[derive(Debug)]
struct ScrubbedError(String);

impl std::fmt::Display for ScrubbedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScrubbedError {}

/// Decode `%XX` escapes; anything malformed is kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_in_user_info_is_masked() {
        let name = ServerName::new("redis://user:s3cr%21t@db.example:6380/2");
        assert_eq!(name.shown(), "redis://user:***@db.example:6380/2");
        assert_eq!(
            name.scrub("auth s3cr%21t / s3cr!t failed"),
            "auth *** / *** failed"
        );
    }

    #[test]
    fn password_without_user_and_in_query_is_masked() {
        assert_eq!(
            ServerName::new("redis://:pw@127.0.0.1").shown(),
            "redis://:***@127.0.0.1"
        );
        let unix = ServerName::new("redis+unix:///tmp/redis.sock?db=1&pass=hunter2");
        assert_eq!(unix.shown(), "redis+unix:///tmp/redis.sock?db=1&pass=***");
        assert!(!unix.scrub("bad hunter2").contains("hunter2"));
    }

    #[test]
    fn url_without_credentials_is_shown_as_is() {
        let name = ServerName::new("redis://127.0.0.1:6379");
        assert_eq!(name.shown(), "redis://127.0.0.1:6379");
        assert_eq!(name.scrub("text"), "text");
    }
}
