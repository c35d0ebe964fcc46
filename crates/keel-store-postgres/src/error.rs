//! PostgreSQL failures as Keel's error kinds: the one place driver errors are mapped.

use keel_core::AgentError;
use tokio_postgres::error::SqlState;

/// The backend name in errors.
pub(crate) const BACKEND: &str = "postgres";

/// A driver error during `op`: a server that cannot be reached (refused, lost connection,
/// shutting down or starting up) is [`AgentError::StoreUnavailable`], since the same call may
/// succeed once it is back; anything else [`AgentError::Storage`]. tokio-postgres never puts
/// the password in its messages, so they are kept as they are.
pub(crate) fn fail(op: &str, err: tokio_postgres::Error) -> AgentError {
    // tokio-postgres says which kind of failure only in its text: a TLS failure (an untrusted
    // certificate, a server without TLS under `sslmode=require`) is a setting to change, not
    // an outage, and the usual case (Debian's packages turn TLS on with a self-signed
    // certificate, which `sslmode=prefer` then tries) needs the hint.
    let text = err.to_string();
    if text.starts_with("error performing TLS handshake") {
        return AgentError::Storage {
            backend: BACKEND,
            operation: op.to_owned(),
            source: keel_core::ErrorSource::message(format!(
                "{text}: Keel verifies the server's certificate against this machine's trusted \
                 roots; give the server a certificate they trust, or add `sslmode=disable` to \
                 the URL on a network you trust"
            )),
        };
    }
    if unreachable(&err) {
        AgentError::store_unavailable(BACKEND, op, err)
    } else {
        AgentError::storage_source(BACKEND, op, err)
    }
}

/// `fail` for `op`, to hand to `map_err`.
pub(crate) fn doing(op: &'static str) -> impl Fn(tokio_postgres::Error) -> AgentError {
    move |err| fail(op, err)
}

/// A connection the pool could not hand out: the server's own error when it gave one, else
/// (a timeout, a closed pool) the store is unavailable.
pub(crate) fn pool(err: deadpool_postgres::PoolError) -> AgentError {
    match err {
        deadpool_postgres::PoolError::Backend(err) => fail("connecting", err),
        other => AgentError::store_unavailable(BACKEND, "connecting", other),
    }
}

/// Whether `err` says the server could not be reached rather than that it refused the
/// statement.
fn unreachable(err: &tokio_postgres::Error) -> bool {
    if let Some(code) = err.code() {
        return code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code);
    }
    err.is_closed()
        || std::error::Error::source(err).is_some_and(|source| source.is::<std::io::Error>())
        || err.to_string().contains("timeout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_store_unavailable() {
        // Port 1 on loopback: nothing listens there.
        let err = tokio_postgres::connect("host=127.0.0.1 port=1", tokio_postgres::NoTls)
            .await
            .err()
            .expect("nothing listens on port 1");
        let mapped = fail("connecting", err);
        assert!(
            matches!(
                mapped,
                AgentError::StoreUnavailable {
                    backend: "postgres",
                    ..
                }
            ),
            "{mapped:?}"
        );
    }
}
