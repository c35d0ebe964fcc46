//! [`MemoryService`] over SQLite: the `memory` table, with optional expiry.
//!
//! Expiry is checked on every read, so an expired value is never returned however long it
//! waits to be removed; writes also sweep expired rows (through a partial index on
//! `expires_at`), so TTL values do not pile up on disk.

use async_trait::async_trait;
use chrono::Utc;
use keel_core::AgentResult;
use keel_runtime::{memory_expiry_nanos, AuthContext, MemoryService, MemoryWrite};
use rusqlite::{params, Connection};
use serde_json::Value;

use crate::codec::{decode_value, encode_value, select_text, to_nanos, SqlContext};
use crate::SqliteStore;

/// Store a value, replacing what the key holds.
const SAVE: &str = "INSERT INTO memory (tenant, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (tenant, key) DO UPDATE SET \
     value = excluded.value, expires_at = excluded.expires_at";
/// Store a value unless the key holds one (run after the sweep, so a live one).
const CLAIM: &str = "INSERT INTO memory (tenant, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (tenant, key) DO NOTHING";

/// Remove every expired value (of every tenant).
fn sweep_expired(conn: &Connection, now: i64) -> AgentResult<()> {
    conn.prepare_cached("DELETE FROM memory WHERE expires_at IS NOT NULL AND expires_at <= ?1")
        .and_then(|mut stmt| stmt.execute(params![now]))
        .context("removing expired memory values")?;
    Ok(())
}

#[async_trait]
impl MemoryService for SqliteStore {
    async fn write_value(&self, auth: &AuthContext, write: MemoryWrite<'_>) -> AgentResult<bool> {
        let text = encode_value(&write.value)?;
        let (tenant, key, ttl) = (self.tenant(auth).await?, write.key.to_owned(), write.ttl);
        let (sql, doing) = if write.if_absent {
            (CLAIM, "claiming a memory key")
        } else {
            (SAVE, "saving a memory value")
        };
        // The one writer thread runs the sweep and the insert back to back: an expired value
        // is gone before the insert, and a live one makes a claim do nothing.
        self.write(move |conn| {
            let now = to_nanos(Utc::now());
            sweep_expired(conn, now)?;
            let expires_at = memory_expiry_nanos(now, ttl);
            let stored = conn
                .prepare_cached(sql)
                .and_then(|mut stmt| stmt.execute(params![tenant, key, text, expires_at]))
                .context(doing)?;
            Ok(stored > 0)
        })
        .await
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let (tenant, key) = (self.tenant(auth).await?, key.to_owned());
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

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let (tenant, key) = (self.tenant(auth).await?, key.to_owned());
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
