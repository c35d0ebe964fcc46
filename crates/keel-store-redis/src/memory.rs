//! [`MemoryService`] over Redis: one string key per value; a TTL is Redis's own `PX` expiry,
//! so expired values disappear without a sweeper.

use std::time::Duration;

use async_trait::async_trait;
use keel_core::AgentResult;
use keel_runtime::{AuthContext, MemoryService, MemoryWrite};
use serde_json::Value;

use crate::encoding::encode;
use crate::keys::kind;
use crate::RedisStore;

/// TTLs beyond this are stored without expiry: Redis rejects expiry times that overflow, and
/// a value kept for a century is, for every practical purpose, kept.
const LONGEST_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[async_trait]
impl MemoryService for RedisStore {
    async fn write_value(&self, auth: &AuthContext, write: MemoryWrite<'_>) -> AgentResult<bool> {
        let key = self.keys(auth).of(kind::MEMORY, write.key);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(encode(&write.value)?);
        if write.if_absent {
            // `SET NX PX`: one atomic step for every process on this Redis.
            set.arg("NX");
            if let Some(ttl) = write.ttl {
                let millis = ttl.min(LONGEST_TTL).as_nanos().div_ceil(1_000_000).max(1);
                set.arg("PX").arg(u64::try_from(millis).unwrap_or(u64::MAX));
            }
            let stored: Option<String> = set
                .query_async(&mut self.con())
                .await
                .map_err(|e| self.fail("SET NX memory", &e))?;
            return Ok(stored.is_some());
        }
        match write.ttl {
            None => {}
            // Too long for Redis to represent: kept, as a value without expiry is.
            Some(ttl) if ttl > LONGEST_TTL => {}
            Some(ttl) if ttl.is_zero() => {
                // Already expired: what was there is replaced by nothing.
                redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<()>(&mut self.con())
                    .await
                    .map_err(|e| self.fail("DEL memory", &e))?;
                return Ok(true);
            }
            Some(ttl) => {
                // Redis counts in whole milliseconds; round up so a value never expires early.
                let millis = ttl.as_nanos().div_ceil(1_000_000);
                set.arg("PX").arg(u64::try_from(millis).unwrap_or(u64::MAX));
            }
        }
        set.query_async::<()>(&mut self.con())
            .await
            .map_err(|e| self.fail("SET memory", &e))?;
        Ok(true)
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let key = self.keys(auth).of(kind::MEMORY, key);
        self.read_record("GET memory", &key, None).await
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let key = self.keys(auth).of(kind::MEMORY, key);
        let removed: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("DEL memory", &e))?;
        Ok(removed > 0)
    }
}
