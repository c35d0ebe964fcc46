//! [`AsyncCallStore`] over Redis: one hash per call at `<prefix>async-call:<id>`, outside every
//! tenant's `{namespace}` (a callback names only the call), holding the owner in its fields. A
//! transition is one script that compares the tenant and the state before it writes, so of two
//! concurrent deliveries, from any number of processes, exactly one moves the call.

use std::sync::LazyLock;

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult, ThreadId};
use keel_runtime::{AsyncCall, AsyncCallMove, AsyncCallState, AsyncCallStore, AuthContext};
use redis::Script;
use serde_json::Value;

use crate::RedisStore;

/// Move a call between states if it belongs to the tenant and is in the expected state.
///
/// KEYS: the call's hash. ARGV: tenant namespace, from, to, record. Returns 1 when it moved,
/// else 0.
static TRANSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local fields = redis.call('HMGET', KEYS[1], 'tenant', 'state')
if fields[1] ~= ARGV[1] or fields[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'record', ARGV[4])
return 1
",
    )
});

impl RedisStore {
    /// The key of a call. Tenant keys are `<prefix>{…}:`; this one has no brace after the
    /// prefix, so it can never be one of them.
    fn async_call_key(&self, call_id: &str) -> String {
        format!("{}async-call:{call_id}", self.prefix())
    }
}

#[async_trait]
impl AsyncCallStore for RedisStore {
    async fn put_async_call(&self, call: &AsyncCall) -> AgentResult<()> {
        let record = serde_json::to_string(&call.record).map_err(AgentError::internal)?;
        // One HSET of every field replaces a previous call with the same id whole.
        redis::cmd("HSET")
            .arg(self.async_call_key(&call.call_id))
            .arg("tenant")
            .arg(call.auth.namespace())
            .arg("app_name")
            .arg(&call.auth.app_name)
            .arg("user_name")
            .arg(&call.auth.user_name)
            .arg("thread_id")
            .arg(call.thread_id.as_str())
            .arg("state")
            .arg(call.state.as_str())
            .arg("record")
            .arg(record)
            .query_async::<()>(&mut self.con())
            .await
            .map_err(|e| self.fail("HSET async call", &e))
    }

    async fn find_async_call(&self, call_id: &str) -> AgentResult<Option<AsyncCall>> {
        let key = self.async_call_key(call_id);
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&key)
            .arg("app_name")
            .arg("user_name")
            .arg("thread_id")
            .arg("state")
            .arg("record")
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("HMGET async call", &e))?;
        let [Some(app_name), Some(user_name), Some(thread_id), Some(state), Some(record)] =
            <[Option<String>; 5]>::try_from(fields).unwrap_or_default()
        else {
            return Ok(None);
        };
        let record: Value = serde_json::from_str(&record).map_err(|e| {
            AgentError::storage(format!(
                "Redis key `{key}` holds a record that is not JSON: {e}"
            ))
        })?;
        Ok(Some(AsyncCall {
            call_id: call_id.to_owned(),
            auth: AuthContext::new(app_name, user_name),
            thread_id: ThreadId::from(thread_id),
            state: AsyncCallState::from_stored(&state, &format!("Redis key `{key}`"))?,
            record,
        }))
    }

    async fn move_call(&self, step: AsyncCallMove<'_>) -> AgentResult<bool> {
        let record = serde_json::to_string(&step.record).map_err(AgentError::internal)?;
        let moved: i64 = TRANSITION
            .key(self.async_call_key(step.call_id))
            .arg(step.auth.namespace())
            .arg(step.from.as_str())
            .arg(step.to.as_str())
            .arg(record)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("move async call", &e))?;
        Ok(moved == 1)
    }
}
