//! Tenant-namespaced key-value memory for skills: caches, state, knowledge.

use async_trait::async_trait;
use dashmap::DashMap;
use keel_core::AgentResult;
use serde_json::Value;

use crate::AuthContext;

/// JSON values by key, namespaced by tenant.
#[async_trait]
pub trait MemoryService: Send + Sync {
    /// Store `value` under `key` for this tenant, replacing what was there.
    async fn save_serialized(&self, auth: &AuthContext, key: &str, value: Value)
        -> AgentResult<()>;
    /// The value under `key` for this tenant, if any.
    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>>;
    /// Remove `key`; answers whether it existed.
    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool>;
}

/// A [`MemoryService`] over a concurrent hash map.
#[derive(Debug, Default)]
pub struct InMemoryMemoryService {
    values: DashMap<(String, String), Value>,
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
            .insert((auth.namespace(), key.to_owned()), value);
        Ok(())
    }

    async fn load_serialized(&self, auth: &AuthContext, key: &str) -> AgentResult<Option<Value>> {
        Ok(self
            .values
            .get(&(auth.namespace(), key.to_owned()))
            .map(|v| v.clone()))
    }

    async fn delete(&self, auth: &AuthContext, key: &str) -> AgentResult<bool> {
        Ok(self
            .values
            .remove(&(auth.namespace(), key.to_owned()))
            .is_some())
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
