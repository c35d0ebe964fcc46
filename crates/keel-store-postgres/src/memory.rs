//! [`MemoryService`] over PostgreSQL: the `memory` table, with optional expiry.
//!
//! Expiry is checked on every read, so an expired value is never returned; writes of
//! expiring values also sweep expired rows (through a partial index), so TTL values do not
//! pile up.

use async_trait::async_trait;
use chrono::Utc;
use keel_core::AgentResult;
use keel_runtime::{memory_expiry_nanos, AuthContext, MemoryService, MemoryWrite};
use serde_json::Value;

use crate::codec::{decode_value, encode_value, execute, to_nanos};
use crate::PostgresStore;

/// Store the value (listeners are told after: a cancel request is a memory value).
const SAVE: &str = "\
INSERT INTO memory (tenant, key, value, expires_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at";
/// Store unless a live value is there (an expired one is replaced); 1 row when stored.
const SAVE_IF_ABSENT: &str = "\
INSERT INTO memory (tenant, key, value, expires_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
WHERE memory.expires_at IS NOT NULL AND memory.expires_at <= $5";
const SWEEP: &str = "DELETE FROM memory WHERE expires_at IS NOT NULL AND expires_at <= $1";
const LOAD: &str = "SELECT value FROM memory WHERE tenant = $1 AND key = $2 \
     AND (expires_at IS NULL OR expires_at > $3)";
/// Delete the key; whether it held a live value.
const DELETE: &str = "DELETE FROM memory WHERE tenant = $1 AND key = $2 \
     RETURNING expires_at IS NULL OR expires_at > $3";

impl PostgresStore {
    /// The row `sql` gives for the tenant's `key`, bound as (tenant, key, now) so that a
    /// lapsed value counts as gone: what reading and deleting a value share.
    async fn key_as_of_now(
        &self,
        sql: &str,
        auth: &AuthContext,
        key: &str,
        op: &'static str,
    ) -> AgentResult<Option<tokio_postgres::Row>> {
        let now = to_nanos(Utc::now());
        self.query_opt(sql, &[&auth.namespace(), &key, &now], op)
            .await
    }
}

#[async_trait]
impl MemoryService for PostgresStore {
    async fn write_value(&self, auth: &AuthContext, write: MemoryWrite<'_>) -> AgentResult<bool> {
        let text = encode_value(&write.value)?;
        let now = to_nanos(Utc::now());
        let (tenant, key) = (auth.namespace(), write.key);
        let expires_at = memory_expiry_nanos(now, write.ttl);
        let client = self.client().await?;
        if write.if_absent {
            // One statement: the check and the write are atomic under concurrent claimers.
            let stored = execute(
                &client,
                SAVE_IF_ABSENT,
                &[&tenant, &key, &text, &expires_at, &now],
                "claiming a memory key",
            )
            .await?;
            if stored > 0 {
                self.announce_memory(auth, key);
            }
            return Ok(stored > 0);
        }
        if write.ttl.is_some() {
            execute(&client, SWEEP, &[&now], "removing expired memory values").await?;
        }
        execute(
            &client,
            SAVE,
            &[&tenant, &key, &text, &expires_at],
            "saving a memory value",
        )
        .await?;
        self.announce_memory(auth, key);
        Ok(true)
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let row = self
            .key_as_of_now(LOAD, auth, key, "reading a memory value")
            .await?;
        row.map(|row| decode_value(row.get(0), &format!("memory value `{key}`")))
            .transpose()
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let row = self
            .key_as_of_now(DELETE, auth, key, "deleting a memory value")
            .await?;
        Ok(row.is_some_and(|row| row.get::<_, bool>(0)))
    }
}
