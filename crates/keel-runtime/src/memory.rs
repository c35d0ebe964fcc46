//! Tenant-namespaced key-value memory for skills: caches, state, knowledge.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;
use keel_core::AgentResult;
use serde_json::Value;

use crate::AuthContext;

/// JSON values by key, namespaced by tenant, optionally expiring.
#[async_trait]
pub trait MemoryService: Send + Sync {
    /// Store `value` under `key` for this tenant, replacing what was there.
    async fn save_serialized(&self, auth: &AuthContext, key: &str, value: Value)
        -> AgentResult<()>;
    /// Like [`MemoryService::save_serialized`], but the value expires after `ttl`.
    async fn save_serialized_with_ttl(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<()>;
    /// The value under `key` for this tenant, if any and not expired.
    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>>;
    /// Remove `key`; answers whether it existed.
    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool>;
}

/// A [`MemoryService`] over a concurrent hash map.
#[derive(Debug, Default)]
pub struct InMemoryMemoryService {
    values: DashMap<(String, String), (Value, Option<Instant>)>,
}

impl InMemoryMemoryService {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl MemoryService for InMemoryMemoryService {
    async fn save_serialized(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        self.values
            .insert((auth.namespace(), key.to_owned()), (value, None));
        Ok(())
    }

    async fn save_serialized_with_ttl(
        &self,
        auth: &AuthContext,
        key: &str,
        value: Value,
        ttl: Duration,
    ) -> AgentResult<()> {
        let expires = Instant::now().checked_add(ttl);
        self.values
            .insert((auth.namespace(), key.to_owned()), (value, expires));
        Ok(())
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        let key = (auth.namespace(), key.to_owned());
        let now = Instant::now();
        // Expired entries are removed on read, so a TTL frees memory without a sweeper.
        self.values
            .remove_if(&key, |_, (_, expires)| expires.is_some_and(|e| e <= now));
        Ok(self.values.get(&key).map(|v| v.0.clone()))
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        let now = Instant::now();
        Ok(self
            .values
            .remove(&(auth.namespace(), key.to_owned()))
            .is_some_and(|(_, (_, expires))| expires.is_none_or(|e| e > now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn values_are_isolated_per_tenant() {
        let store = InMemoryMemoryService::new();
        let alice = AuthContext::new("app", "alice");
        let bob = AuthContext::new("app", "bob");
        store
            .save_serialized(&alice, "k", json!({"n": 1}))
            .await
            .unwrap();
        assert_eq!(
            store.load_serialized(&alice, "k").await.unwrap(),
            Some(json!({"n": 1}))
        );
        assert_eq!(store.load_serialized(&bob, "k").await.unwrap(), None);
        assert!(!store.delete(&bob, "k").await.unwrap());
        assert!(store.delete(&alice, "k").await.unwrap());
        assert_eq!(store.load_serialized(&alice, "k").await.unwrap(), None);
    }
}
