//! A2A's `messageId` as an idempotency key: a SendMessage repeated with the same `messageId`
//! (a client retrying after a timeout, a dropped connection or a store error) answers with the
//! task the first one made instead of making a second one and running its tools again.
//!
//! Before a message that starts a task reaches the engine, the tenant's key-value store
//! (`Reads::values`, the store every replica shares) is claimed for the agent and message id,
//! holding the id the new task will take (`SendOptions::task_id`): the mapping is durable
//! before the task exists, so a crash between the task's creation and the answer cannot lose
//! it. A repeat finds the claim and answers with that task once the task's log holds the
//! message; a claim whose task never appeared (the first request failed before creating it)
//! is honoured by creating the task under the claimed id. Keys are namespaced by tenant, so
//! another tenant's same message id is another message.

use std::time::Duration;

use keel_agent::reads::Reads;
use keel_core::{AgentError, AgentResult, TaskEvent, TaskId};
use keel_runtime::AuthContext;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// How long a message id keeps naming its task: a day of retries.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request that finds its message id claimed but no task yet waits for the
/// request that claimed it to create the task (that takes a store write, milliseconds),
/// before it takes the claim over as that of a request that failed.
const CREATION_GRACE: Duration = Duration::from_secs(2);

/// How often that wait looks.
const CREATION_POLL: Duration = Duration::from_millis(50);

/// What a message id stands for, for one tenant and agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Not accepted before: the task the message starts takes this id.
    Fresh(TaskId),
    /// Accepted before: it made this task, whose log holds it.
    Seen(TaskId),
}

/// The key of a message id: hashed, so that an id of any length makes a short key, and
/// scoped by agent, since the agents of one server share a tenant's store.
fn key(agent: &str, message_id: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(agent.as_bytes());
    hash.update([0]);
    hash.update(message_id.as_bytes());
    format!("a2a.message.{:x}", hash.finalize())
}

/// Claim `message_id` for a new task of `agent`, or find the task it already made.
pub(crate) async fn claim(
    reads: &Reads,
    auth: &AuthContext,
    agent: &str,
    message_id: &str,
) -> AgentResult<Claim> {
    let key = key(agent, message_id);
    let values = reads.values();
    let task_id = loop {
        let fresh = TaskId::new();
        // The task id alone, as a JSON string: a claim a request, kept for a day, is the
        // smallest value that names its task.
        if values
            .claim(auth, &key, json!(fresh.as_str()), KEPT_FOR)
            .await?
        {
            return Ok(Claim::Fresh(fresh));
        }
        // Claimed before; `None`: the claim expired in between, so claim again.
        if let Some(task_id) = values
            .load(auth, &key)
            .await?
            .as_ref()
            .and_then(claimed_task)
        {
            break TaskId::from(task_id);
        }
    };
    let deadline = tokio::time::Instant::now() + CREATION_GRACE;
    loop {
        if holds_message(reads, auth, &task_id, message_id).await? {
            return Ok(Claim::Seen(task_id));
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::debug!(%task_id, "a claimed message id never made its task; making it now");
            return Ok(Claim::Fresh(task_id));
        }
        tokio::time::sleep(CREATION_POLL).await;
    }
}

/// The task a claim names: its value, or the `taskId` of the object that claims written
/// before the claim was the id alone hold (kept for a day, so read for a day).
fn claimed_task(claimed: &Value) -> Option<&str> {
    claimed
        .as_str()
        .or_else(|| claimed.get("taskId").and_then(Value::as_str))
}

/// Drop the claim of `message_id`: its message made no task (refused before anything was
/// stored, or answered with a message), so a repeat is a new attempt.
pub(crate) async fn release(
    reads: &Reads,
    auth: &AuthContext,
    agent: &str,
    message_id: &str,
) -> AgentResult<()> {
    reads.values().delete(auth, &key(agent, message_id)).await?;
    Ok(())
}

/// Whether the task exists and its log holds the message `message_id`: the message was
/// accepted (a task's first message is saved with the task, in one write).
pub(crate) async fn holds_message(
    reads: &Reads,
    auth: &AuthContext,
    task_id: &TaskId,
    message_id: &str,
) -> AgentResult<bool> {
    match reads.task_events(auth, task_id).await {
        Ok(events) => Ok(events.iter().any(
            |event| matches!(event, TaskEvent::Message { message } if message.message_id.as_str() == message_id),
        )),
        Err(AgentError::TaskNotFound { .. }) => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_agent::reads::Reads;
    use keel_llm::MockLlm;
    use keel_runtime::{AuthContext, Services};

    use serde_json::json;

    use super::{claim, claimed_task, key, release, Claim};

    #[tokio::test]
    async fn a_released_claim_is_fresh_again_at_once_and_tenants_claim_apart() {
        let reads = Reads::new(Arc::new(Services::in_memory(Arc::new(MockLlm::new()))));
        let (alice, bob) = (AuthContext::new("a", "alice"), AuthContext::new("b", "bob"));
        let Claim::Fresh(first) = claim(&reads, &alice, "echo", "m-1").await.unwrap() else {
            panic!("a new message id is fresh");
        };
        let Claim::Fresh(other) = claim(&reads, &bob, "echo", "m-1").await.unwrap() else {
            panic!("another tenant's message id is its own");
        };
        assert_ne!(first, other);
        release(&reads, &alice, "echo", "m-1").await.unwrap();
        // Released: a new claim with a new id (a kept claim would answer the old one, after
        // the creation grace).
        let again = claim(&reads, &alice, "echo", "m-1").await.unwrap();
        assert!(
            matches!(&again, Claim::Fresh(id) if *id != first),
            "{again:?}"
        );
    }

    #[tokio::test]
    async fn a_claim_is_its_task_id_and_one_written_as_an_object_still_names_its_task() {
        let reads = Reads::new(Arc::new(Services::in_memory(Arc::new(MockLlm::new()))));
        let auth = AuthContext::new("a", "alice");
        let Claim::Fresh(task_id) = claim(&reads, &auth, "echo", "m-1").await.unwrap() else {
            panic!("a new message id is fresh");
        };
        let stored = reads
            .values()
            .load(&auth, &key("echo", "m-1"))
            .await
            .unwrap();
        assert_eq!(stored, Some(json!(task_id.as_str())), "the id alone");
        for (value, named) in [
            (json!(task_id.as_str()), Some(task_id.as_str())),
            (json!({"taskId": task_id.as_str()}), Some(task_id.as_str())),
            (json!({"other": 1}), None),
        ] {
            assert_eq!(claimed_task(&value), named, "{value}");
        }
    }

    #[test]
    fn keys_are_short_and_differ_by_agent_and_message() {
        let long = "m".repeat(1 << 20);
        assert!(key("echo", &long).len() < 100);
        assert_ne!(key("echo", "m-1"), key("other", "m-1"));
        assert_ne!(key("echo", "m-1"), key("echo", "m-2"));
        assert_eq!(key("echo", "m-1"), key("echo", "m-1"));
    }
}
