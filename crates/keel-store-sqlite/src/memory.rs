//! [`MemoryService`] over SQLite: the `memory` table, with optional expiry.
//!
//! Expiry is checked on every read, so an expired value is never returned however long it
//! waits to be removed; writes also sweep expired rows (through a partial index on
//! `expires_at`), so TTL values do not pile up on disk.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::AgentResult;
use keel_runtime::{AuthContext, MemoryService};
use rusqlite::{params, Connection};
use serde_json::Value;

use crate::codec::{decode_value, encode_value, select_text, to_nanos, SqlContext};
use crate::SqliteStore;

impl SqliteStore {
    async fn save_memory(
        &self,
        auth: &AuthContext,
        key: &str,
        value: &Value,
        ttl: Option<Duration>,
    ) -> AgentResult<()> {
        let text = encode_value(value)?;
        let (tenant, key) = (auth.namespace(), key.to_owned());
        self.write(move |conn| {
            let now = to_nanos(Utc::now());
            // A TTL too long to represent never expires, as in the in-memory store.
            let expires_at = ttl.and_then(|ttl| {
                i64::try_from(ttl.as_nanos())
                    .ok()
                    .and_then(|ttl| now.checked_add(ttl))
            });
            sweep_expired(conn, now)?;
            conn.prepare_cached(
                "INSERT INTO memory (tenant, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (tenant, key) DO UPDATE SET \
                 value = excluded.value, expires_at = excluded.expires_at",
            )
            .and_then(|mut stmt| stmt.execute(params![tenant, key, text, expires_at]))
            .context("saving a memory value")?;
            Ok(())
        })
        .await
    }
}

/// Remove every expired value (of every tenant).
fn sweep_expired(conn: &Connection, now: i64) -> AgentResult<()> {
    conn.prepare_cached("DELETE FROM memory WHERE expires_at IS NOT NULL AND expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute(params![now]))
        .context("removing expired memory values")?;
    Ok(())
}

#[async_trait]
impl MemoryService for SqliteStore {
    async fn save_value(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Option<Duration>,
    ) -> AgentResult<()> {
        self.save_memory(auth, key, &value, ttl).await
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let (tenant, key) = (auth.namespace(), key.to_owned());
        self.read(move |conn| {
            let now = to_nanos(Utc::now());
            let text = select_text(
                conn,
                "SELECT value FROM memory WHERE tenant = ?1 AND key = ?2 \
                 AND (expires_at IS NULL OR expires_at > ?3)",
                params![tenant, key, now],
                "reading a memory value",
            )?;
            text.map(|text| decode_value(&text, &format!("memory value `{key}`")))
                .transpose()
        })
        .await
    }

    async fn save_if_absent(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<bool> {
        let text = encode_value(&value)?;
        let (tenant, key) = (auth.namespace(), key.to_owned());
        // The one writer thread runs the sweep and the insert back to back: an expired value
        // is gone before the insert, and a live one makes it do nothing.
        self.write(move |conn| {
            let now = to_nanos(Utc::now());
            let expires_at = i64::try_from(ttl.as_nanos())
                .ok()
                .and_then(|ttl| now.checked_add(ttl));
            sweep_expired(conn, now)?;
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO memory (tenant, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (tenant, key) DO NOTHING",
                )
                .and_then(|mut stmt| stmt.execute(params![tenant, key, text, expires_at]))
                .context("claiming a memory key")?;
            Ok(inserted > 0)
        })
        .await
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let (tenant, key) = (auth.namespace(), key.to_owned());
        self.write(move |conn| {
            let now = to_nanos(Utc::now());
            // Only a live value counts as existing; an expired one is removed all the same.
            let live = conn
                .prepare_cached(
                    "DELETE FROM memory WHERE tenant = ?1 AND key = ?2 \
                     AND (expires_at IS NULL OR expires_at > ?3)",
                )
                .and_then(|mut stmt| stmt.execute(params![tenant, key, now]))
                .context("deleting a memory value")?;
            conn.prepare_cached("DELETE FROM memory WHERE tenant = ?1 AND key = ?2")
                .and_then(|mut stmt| stmt.execute(params![tenant, key]))
                .context("deleting a memory value")?;
            Ok(live > 0)
        })
        .await
    }
}
