//! Turning Redis failures into actionable [`AgentError::Storage`] messages that name the
//! server but never its password.

use std::sync::Arc;

use keel_core::AgentError;
use percent_encoding::percent_decode_str;
use url::Url;

/// The server's URL with any password masked, plus the secrets to scrub from error text.
#[derive(Clone)]
pub(crate) struct ServerName {
    shown: Arc<str>,
    secrets: Arc<[String]>,
}

impl ServerName {
    /// Remember `url` for messages, masking the password of its user info and any
    /// `password=`/`pass=` query parameter. Text that does not parse as a URL, or only as an
    /// opaque `scheme:rest` (no `/` after the colon, as in `user:password@host`), is shown as
    /// its scheme alone and scrubbed whole: where its password is cannot be told.
    pub(crate) fn new(url: &str) -> Self {
        let mut secrets = Vec::new();
        let shown = match Url::parse(url) {
            Ok(parsed) if !parsed.cannot_be_a_base() => mask(parsed, &mut secrets),
            _ => {
                // Any part of it may be the password: scrub it whole.
                secrets.push(url.to_owned());
                scheme_only(url)
            }
        };
        // A password may reach an error message percent-decoded; scrub that form too.
        let decoded: Vec<String> = secrets
            .iter()
            .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
            .collect();
        secrets.extend(decoded);
        secrets.retain(|s| !s.is_empty());
        // Longest first, so a secret containing another is scrubbed whole.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
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

    /// A Redis failure during `op`, with a hint at what to check: a server that cannot be
    /// reached is [`AgentError::StoreUnavailable`], anything else [`AgentError::Storage`].
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
        let operation = format!("{op} at {}", self.shown);
        let source = ScrubbedError(format!("{}{hint}", self.scrub(&err.to_string())));
        if unreachable(err) {
            AgentError::store_unavailable("redis", operation, source)
        } else {
            AgentError::storage_source("redis", operation, source)
        }
    }
}

/// Whether `err` says the server could not be reached (refused, timed out, connection lost
/// or not re-established) or cannot serve yet (`LOADING` its data after a restart), rather
/// than that it refused or failed the command.
fn unreachable(err: &redis::RedisError) -> bool {
    err.is_connection_refusal()
        || err.is_timeout()
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.code() == Some("LOADING")
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

/// `url` as text with the password of its user info and of its `password=`/`pass=` query
/// parameters replaced by `***`; the passwords, as written and as decoded, go to `secrets`.
fn mask(mut url: Url, secrets: &mut Vec<String>) -> String {
    if let Some(password) = url.password() {
        secrets.push(password.to_owned());
        // Cannot fail: a URL with a password has a host.
        let _ = url.set_password(Some("***"));
    }
    let Some(query) = url.query() else {
        return url.into();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            // Decoded as the Redis client reads the query (`+` is a space).
            let decoded = url::form_urlencoded::parse(pair.as_bytes()).next();
            match (decoded, pair.split_once('=')) {
                (Some((name, value)), Some((raw_name, raw_value)))
                    if name.eq_ignore_ascii_case("password")
                        || name.eq_ignore_ascii_case("pass") =>
                {
                    secrets.push(raw_value.to_owned());
                    secrets.push(value.into_owned());
                    format!("{raw_name}=***")
                }
                _ => pair.to_owned(),
            }
        })
        .collect();
    let masked = pairs.join("&");
    url.set_query(Some(&masked));
    url.into()
}

/// What is shown of a URL that did not parse: its scheme, if it starts with one, then `://***`.
fn scheme_only(url: &str) -> String {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|scheme| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
    match scheme {
        Some(scheme) => format!("{scheme}://***"),
        None => "***".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each URL as shown, and a text naming its password as scrubbed: the password is masked
    /// in the user info, without a user, in the query (in every form the client decodes it)
    /// and with characters the parser escapes; a URL without one is shown as it is.
    #[test]
    fn passwords_are_masked_where_the_url_holds_them() {
        for (url, shown, text, scrubbed) in [
            (
                "redis://user:s3cr%21t@db.example:6380/2",
                "redis://user:***@db.example:6380/2",
                "auth s3cr%21t / s3cr!t failed",
                "auth *** / *** failed",
            ),
            (
                "redis://:pw@127.0.0.1",
                "redis://:***@127.0.0.1",
                "bad pw",
                "bad ***",
            ),
            (
                "redis+unix:///tmp/redis.sock?db=1&pass=hunter2",
                "redis+unix:///tmp/redis.sock?db=1&pass=***",
                "bad hunter2",
                "bad ***",
            ),
            (
                "redis+unix:///tmp/r.sock?PASSWORD=a%2Bb+c&db=2",
                "redis+unix:///tmp/r.sock?PASSWORD=***&db=2",
                "a%2Bb+c a+b+c a+b c",
                "*** *** ***",
            ),
            (
                "redis://u:p w\"x@db.example",
                "redis://u:***@db.example",
                "p w\"x / p%20w%22x",
                "*** / ***",
            ),
            (
                "redis://127.0.0.1:6379",
                "redis://127.0.0.1:6379",
                "text",
                "text",
            ),
        ] {
            let name = ServerName::new(url);
            assert_eq!(name.shown(), shown, "{url}");
            assert_eq!(name.scrub(text), scrubbed, "{url}");
        }
    }

    #[test]
    fn unparsable_url_shows_only_its_scheme() {
        for (url, shown) in [
            ("redis://user:hunter2@db.example:notaport/0", "redis://***"),
            ("redis://:hunter2@[::1/0", "redis://***"),
            ("user:hunter2@db.example", "user://***"),
            (":hunter2@db.example", "***"),
            ("hunter2", "***"),
        ] {
            let name = ServerName::new(url);
            assert_eq!(name.shown(), shown, "{url}");
            assert!(!name.scrub(&format!("bad URL {url}")).contains("hunter2"));
        }
    }
}
