//! Pending asynchronous tool calls (seed 004), found by their id alone so that a callback can
//! be routed to its tenant without trusting a tenant the caller names.

use async_trait::async_trait;
use dashmap::DashMap;
use keel_core::{AgentError, AgentResult, ThreadId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::AuthContext;

/// Where an asynchronous tool call stands. A call starts `Pending` and moves once, to
/// `Delivered` (its result arrived) or `Expired` (its deadline passed first); both are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AsyncCallState {
    /// Waiting for its callback.
    Pending,
    /// Its result was accepted.
    Delivered,
    /// Its deadline passed before a result was accepted.
    Expired,
}

impl AsyncCallState {
    /// The state's stored name (`pending`, `delivered`, `expired`).
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncCallState::Pending => "pending",
            AsyncCallState::Delivered => "delivered",
            AsyncCallState::Expired => "expired",
        }
    }

    /// The state stored as `name` (see [`AsyncCallState::as_str`]); any other name is
    /// [`AgentError::Storage`] saying that `what` (the call or where it is kept) holds it.
    pub fn from_stored(name: &str, what: &str) -> AgentResult<Self> {
        match name {
            "pending" => Ok(AsyncCallState::Pending),
            "delivered" => Ok(AsyncCallState::Delivered),
            "expired" => Ok(AsyncCallState::Expired),
            other => Err(AgentError::storage(format!(
                "{what} holds the unknown asynchronous-call state `{other}`"
            ))),
        }
    }
}

/// One asynchronous tool call as stored: its id (the one the callback URL names, random and
/// unguessable), the tenant and thread that own it, its state, and the engine's own record
/// (task, secret hash, deadline, result), which the store keeps without reading it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AsyncCall {
    /// The call's id.
    pub call_id: String,
    /// The tenant that dispatched it.
    pub auth: AuthContext,
    /// The thread it belongs to.
    pub thread_id: ThreadId,
    /// Where it stands.
    pub state: AsyncCallState,
    /// The engine's record.
    pub record: Value,
}

/// The index of asynchronous tool calls. Unlike the other stores it answers
/// [`find_async_call`](AsyncCallStore::find_async_call) without an [`AuthContext`]: a callback
/// arrives with only a call id and that call's secret, and the call's record says whose it
/// is. Writes still name the tenant, and a transition of another tenant's call changes
/// nothing.
///
/// ```
/// use keel_runtime::{AsyncCall, AsyncCallState, AsyncCallStore, AuthContext, InMemoryAsyncCallStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// let store = InMemoryAsyncCallStore::new();
/// let auth = AuthContext::new("app", "alice");
/// let call = AsyncCall {
///     call_id: "c1".into(),
///     auth: auth.clone(),
///     thread_id: "t1".into(),
///     state: AsyncCallState::Pending,
///     record: serde_json::json!({}),
/// };
/// store.put_async_call(&call).await?;
/// let (from, to) = (AsyncCallState::Pending, AsyncCallState::Delivered);
/// assert!(store.transition_async_call(&auth, "c1", from, to, serde_json::json!({"out": 1})).await?);
/// // The second of two deliveries finds the call no longer pending.
/// assert!(!store.transition_async_call(&auth, "c1", from, to, serde_json::json!({})).await?);
/// assert_eq!(store.find_async_call("c1").await?.unwrap().state, AsyncCallState::Delivered);
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait AsyncCallStore: Send + Sync {
    /// Save `call` (insert, or replace a call with the same id).
    async fn put_async_call(&self, call: &AsyncCall) -> AgentResult<()>;
    /// The call with this id, whoever owns it; `Ok(None)` when there is none.
    async fn find_async_call(&self, call_id: &str) -> AgentResult<Option<AsyncCall>>;
    /// Atomically move `auth`'s call `call_id` from state `from` to `to` and replace its
    /// record with `record`. `Ok(true)` when it moved; `Ok(false)`, changing nothing, when
    /// the call is unknown, another tenant's, or not in state `from` (so of two concurrent
    /// deliveries exactly one moves it).
    async fn transition_async_call(
        &self,
        auth: &AuthContext,
        call_id: &str,
        from: AsyncCallState,
        to: AsyncCallState,
        record: Value,
    ) -> AgentResult<bool> {
        let step = AsyncCallMove {
            auth,
            call_id,
            from,
            to,
            record,
        };
        self.move_call(step).await
    }

    /// Carry out [`AsyncCallStore::transition_async_call`] as one atomic step: what a
    /// backend implements.
    async fn move_call(&self, step: AsyncCallMove<'_>) -> AgentResult<bool>;
}

/// One move of [`AsyncCallStore::transition_async_call`]: `auth`'s call `call_id` goes from
/// `from` to `to` with `record` as its new record, or nothing changes.
#[derive(Debug, Clone)]
pub struct AsyncCallMove<'a> {
    /// The tenant that must own the call.
    pub auth: &'a AuthContext,
    /// The call.
    pub call_id: &'a str,
    /// The state it must be in.
    pub from: AsyncCallState,
    /// The state it moves to.
    pub to: AsyncCallState,
    /// Its new record.
    pub record: Value,
}

/// An [`AsyncCallStore`] over a concurrent hash map.
#[derive(Debug, Default)]
pub struct InMemoryAsyncCallStore {
    calls: DashMap<String, AsyncCall, foldhash::fast::RandomState>,
}

impl InMemoryAsyncCallStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl AsyncCallStore for InMemoryAsyncCallStore {
    async fn put_async_call(&self, call: &AsyncCall) -> AgentResult<()> {
        self.calls.insert(call.call_id.clone(), call.clone());
        Ok(())
    }

    async fn find_async_call(&self, call_id: &str) -> AgentResult<Option<AsyncCall>> {
        Ok(self.calls.get(call_id).map(|c| c.clone()))
    }

    async fn move_call(&self, step: AsyncCallMove<'_>) -> AgentResult<bool> {
        // The entry's shard lock makes the check and the write one step.
        let Some(mut call) = self.calls.get_mut(step.call_id) else {
            return Ok(false);
        };
        if call.auth != *step.auth || call.state != step.from {
            return Ok(false);
        }
        call.state = step.to;
        call.record = step.record;
        Ok(true)
    }
}
