//! [`MemoryService`] over Redis: one string key per value; a TTL is Redis's own `PX` expiry,
//! so expired values disappear without a sweeper.

use std::time::Duration;

use async_trait::async_trait;
use keel_core::AgentResult;
use keel_runtime::{AuthContext, MemoryService};
use serde_json::Value;

use crate::encoding::encode;
use crate::keys::kind;
use crate::RedisStore;

/// TTLs beyond this are stored without expiry: Redis rejects expiry times that overflow, and
/// a value kept for a century is, for every practical purpose, kept.
const LONGEST_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[async_trait]
impl MemoryService for RedisStore {
    async fn save_value(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Option<Duration>,
    ) -> AgentResult<()> {
        let key = self.keys(auth).of(kind::MEMORY, key);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(encode(&value)?);
        match ttl {
            None => {}
            // Too long for Redis to represent: kept, as a value without expiry is.
            Some(ttl) if ttl > LONGEST_TTL => {}
            Some(ttl) if ttl.is_zero() => {
                // Already expired: what was there is replaced by nothing.
                return redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<()>(&mut self.con())
                    .await
                    .map_err(|e| self.fail("DEL memory", &e));
            }
            Some(ttl) => {
                // Redis counts in whole milliseconds; round up so a value never expires early.
                let millis = ttl.as_nanos().div_ceil(1_000_000);
                set.arg("PX").arg(u64::try_from(millis).unwrap_or(u64::MAX));
            }
        }
        set.query_async::<()>(&mut self.con())
            .await
            .map_err(|e| self.fail("SET memory", &e))
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let key = self.keys(auth).of(kind::MEMORY, key);
        self.read_record("GET memory", &key, None).await
    }

    async fn save_if_absent(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<bool> {
        let key = self.keys(auth).of(kind::MEMORY, key);
        // `SET NX PX`: one atomic step for every process on this Redis.
        let millis = ttl.min(LONGEST_TTL).as_nanos().div_ceil(1_000_000).max(1);
        let stored: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(encode(&value)?)
            .arg("NX")
            .arg("PX")
            .arg(u64::try_from(millis).unwrap_or(u64::MAX))
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("SET NX memory", &e))?;
        Ok(stored.is_some())
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
