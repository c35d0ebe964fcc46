//! The four config operations (create, get, list, delete) and the config index, stored
//! in the engine's tenant values under the tenant's keys.

use keel_core::{AgentError, AgentResult, TaskId};
use keel_runtime::AuthContext;
use serde_json::json;

use super::guard::check_new_target;
use super::{config_key, cursor_key, index_key, Active, Push};
use crate::jsonrpc::{RpcError, INVALID_PARAMS, TASK_NOT_FOUND};
use crate::push_config::PushConfig;

fn rpc(err: AgentError) -> RpcError {
    RpcError::from_agent_error(&err)
}

fn config_not_found(task_id: &TaskId, config_id: &str) -> RpcError {
    RpcError::new(
        TASK_NOT_FOUND,
        format!("task {task_id} has no push notification config `{config_id}`"),
    )
    .with("taskId", task_id.as_str())
    .with("configId", config_id)
}

impl Push {
    async fn require_task(&self, auth: &AuthContext, task_id: &TaskId) -> Result<(), RpcError> {
        self.inner
            .reads
            .task(auth, task_id)
            .await
            .map(|_| ())
            .map_err(rpc)
    }

    /// Check a webhook URL before it is stored: the SSRF guard (a host that does not
    /// resolve yet is checked at delivery).
    pub(crate) async fn check_url(&self, url: &str) -> Result<(), RpcError> {
        check_new_target(url, &self.inner.targets)
            .await
            .map(|_| ())
            .map_err(|reason| {
                RpcError::new(INVALID_PARAMS, format!("invalid url: {reason}"))
                    .with("field", "url")
                    .with("description", reason)
            })
    }

    /// `CreateTaskPushNotificationConfig`: store the config (replacing one with the same id)
    /// and start delivering the task's updates from `from` (a log index; `None`: from now).
    pub(crate) async fn create(
        &self,
        auth: &AuthContext,
        mut config: PushConfig,
        from: Option<usize>,
    ) -> Result<PushConfig, RpcError> {
        self.require_task(auth, &config.task_id).await?;
        self.check_url(&config.url).await?;
        if config.id.is_empty() {
            config.id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        }
        let values = self.values();
        let task_id = config.task_id.clone();
        {
            let _writes = self.inner.writes.lock().await;
            let value = serde_json::to_value(&config).map_err(|e| rpc(AgentError::internal(e)))?;
            values
                .save(auth, &config_key(&task_id, &config.id), value)
                .await
                .map_err(rpc)?;
            let mut index = self.index(auth, &task_id).await.map_err(rpc)?;
            if !index.contains(&config.id) {
                index.push(config.id.clone());
            }
            values
                .save(auth, &index_key(&task_id), json!(index))
                .await
                .map_err(rpc)?;
            // Deliveries start now (or at `from`) unless a watcher already has a cursor.
            if values
                .load(auth, &cursor_key(&task_id))
                .await
                .map_err(rpc)?
                .is_none()
            {
                let start = match from {
                    Some(from) => from,
                    None => self
                        .inner
                        .reads
                        .task_events(auth, &task_id)
                        .await
                        .map_err(rpc)?
                        .len(),
                };
                values
                    .save(auth, &cursor_key(&task_id), json!(start))
                    .await
                    .map_err(rpc)?;
            }
            let mut active = self.active().await.map_err(rpc)?;
            let entry = Active {
                auth: auth.clone(),
                task_id: task_id.clone(),
            };
            if !active.contains(&entry) {
                active.push(entry);
                self.save_active(&active).await.map_err(rpc)?;
            }
        }
        tracing::info!(task_id = %task_id, config_id = %config.id, "push notification config created");
        self.watch(auth.clone(), task_id);
        Ok(config)
    }

    /// `GetTaskPushNotificationConfig`.
    pub(crate) async fn get(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> Result<PushConfig, RpcError> {
        self.require_task(auth, task_id).await?;
        self.load_config(auth, task_id, config_id)
            .await
            .map_err(rpc)?
            .ok_or_else(|| config_not_found(task_id, config_id))
    }

    /// `ListTaskPushNotificationConfigs`.
    pub(crate) async fn list(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> Result<Vec<PushConfig>, RpcError> {
        self.require_task(auth, task_id).await?;
        self.configs(auth, task_id).await.map_err(rpc)
    }

    /// `DeleteTaskPushNotificationConfig`. Idempotent, as A2A requires: deleting a config that
    /// is already gone (or never was) succeeds, for a task the caller can see.
    pub(crate) async fn delete(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> Result<(), RpcError> {
        self.require_task(auth, task_id).await?;
        let _writes = self.inner.writes.lock().await;
        let values = self.values();
        values
            .delete(auth, &config_key(task_id, config_id))
            .await
            .map_err(rpc)?;
        let mut index = self.index(auth, task_id).await.map_err(rpc)?;
        let before = index.len();
        index.retain(|id| id != config_id);
        if index.len() != before {
            values
                .save(auth, &index_key(task_id), json!(index))
                .await
                .map_err(rpc)?;
        }
        Ok(())
    }

    async fn index(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Vec<String>> {
        Ok(self
            .values()
            .load(auth, &index_key(task_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default())
    }

    async fn load_config(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> AgentResult<Option<PushConfig>> {
        Ok(self
            .values()
            .load(auth, &config_key(task_id, config_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok()))
    }

    pub(super) async fn configs(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<PushConfig>> {
        let mut configs = Vec::new();
        for id in self.index(auth, task_id).await? {
            if let Some(config) = self.load_config(auth, task_id, &id).await? {
                configs.push(config);
            }
        }
        Ok(configs)
    }
}
