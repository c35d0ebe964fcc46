//! The tenant-scoped key-value store a front door keeps its own small records in (the A2A
//! transport's push notification configs and delivery cursors), so that it needs no store of
//! its own and names none.

use std::sync::Arc;
use std::time::Duration;

use keel_core::AgentResult;
use keel_runtime::{AuthContext, MemoryService};
use serde_json::Value;

/// JSON values by key, namespaced by tenant, optionally expiring ([`super::Reads::values`]).
/// Keys are the caller's: pick a prefix of your own. Every backend offers it (memory, SQLite,
/// Redis, a custom runtime), so what is kept here is shared by the replicas on one store.
#[derive(Clone)]
pub struct TenantValues {
    memory: Arc<dyn MemoryService>,
}

impl std::fmt::Debug for TenantValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantValues").finish_non_exhaustive()
    }
}

impl TenantValues {
    pub(super) fn new(memory: Arc<dyn MemoryService>) -> Self {
        Self { memory }
    }

    /// Store `value` under `key` for this tenant, replacing what was there.
    pub async fn save(&self, auth: &AuthContext, key: &str, value: Value) -> AgentResult<()> {
        self.memory.save_serialized(auth, key, value).await
    }

    /// The value under `key` for this tenant, if any and not expired.
    pub async fn load(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        self.memory.load_serialized(auth, key).await
    }

    /// Remove `key`; answers whether it existed.
    pub async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        self.memory.delete(auth, key).await
    }

    /// Store `value` under `key` for this tenant, expiring after `ttl`.
    pub async fn save_with_ttl(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<()> {
        self.memory
            .save_serialized_with_ttl(auth, key, value, ttl)
            .await
    }

    /// Store `value` under `key`, expiring after `ttl`, only if the key holds no live value;
    /// answers whether it was stored: of several callers racing for one key (in any process
    /// on the store), exactly one gets `true` until the value expires or is deleted.
    pub async fn claim(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<bool> {
        self.memory.save_if_absent(auth, key, value, ttl).await
    }
}
