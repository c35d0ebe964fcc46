//! Thread storage over Redis: history (a list), the FIFO queue (a sorted set of ids plus a
//! hash of items), the key-value store (a hash) and the subagent registry (a hash per child,
//! a sorted set per parent). Writes under a lease are fenced scripts (see `scripts`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, ThreadId};
use keel_runtime::{
    encode_task_events, AuthContext, ChildThread, HistoryEntry, Lease, QueuedItem,
    SubagentRegistry, TaskWrite, ThreadHistory, ThreadKv, ThreadQueue,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::encoding::{decode, encode, micros};
use crate::keys::{fixed, kind, TenantKeys};
use crate::scripts;
use crate::RedisStore;

/// A queued item as stored: its seq is the score in the queue's sorted set, assigned by
/// Redis when the item is pushed, so it is not repeated here.
#[derive(Serialize, Deserialize)]
struct StoredQueueItem {
    id: String,
    payload: Value,
    enqueued_at: DateTime<Utc>,
}

/// A Redis list index (signed 64-bit) for a position, saturating.
fn list_index(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

/// The history entries read from the list `key`, `texts` starting after seq `before_first`.
fn history_entries(
    key: &str,
    before_first: u64,
    texts: &[String],
) -> AgentResult<Vec<HistoryEntry>> {
    let seqs = before_first + 1..;
    seqs.zip(texts)
        .map(|(seq, text)| {
            Ok(HistoryEntry {
                seq,
                message: decode(key, text)?,
            })
        })
        .collect()
}

/// A call of `script` fenced by `lease`: the lease's key first and its token the first
/// argument, as every fenced script takes them; the caller adds the rest.
fn fenced_call<'a>(
    script: &'a redis::Script,
    keys: &TenantKeys,
    lease: &Lease,
) -> redis::ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    call.key(keys.of(kind::LEASE, lease.thread_id.as_str()))
        .arg(lease.token);
    call
}

/// Add each of `items`, encoded, as the call's next arguments.
fn push_encoded<T: Serialize>(
    call: &mut redis::ScriptInvocation<'_>,
    items: &[T],
) -> AgentResult<()> {
    for item in items {
        call.arg(encode(item)?);
    }
    Ok(())
}

impl RedisStore {
    /// Run a fenced script `call` (from [`fenced_call`]): its answer, which each script
    /// gives as a number (negative where the lease was lost).
    async fn invoke_fenced(
        &self,
        call: redis::ScriptInvocation<'_>,
        what: &str,
    ) -> AgentResult<i64> {
        call.invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail(what, &e))
    }
}

impl RedisStore {
    /// Acknowledge `ids` on the lease's thread with `script` ([`scripts::ACK_QUEUE`], or
    /// [`scripts::ACK_AND_RELEASE`], which also releases the lease): fenced, so under a lease
    /// that is no longer the caller's it is [`AgentError::LeaseLost`] and changes nothing.
    async fn acknowledge(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
        script: &redis::Script,
    ) -> AgentResult<()> {
        let keys = self.keys(auth);
        let thread = lease.thread_id.as_str();
        let mut call = fenced_call(script, &keys, lease);
        call.key(keys.of(kind::QUEUE, thread))
            .key(keys.of(kind::QUEUE_ITEMS, thread))
            .key(keys.fixed(fixed::QUEUED_THREADS))
            .arg(thread);
        for id in ids {
            call.arg(id);
        }
        let outcome = self.invoke_fenced(call, "acknowledge queue items").await?;
        if outcome < 0 {
            return Err(lease.lost());
        }
        Ok(())
    }
}

/// A registered child as stored under `key`: its record, with the status kept beside it
/// (updated without rewriting the record) taking precedence when present.
fn child_of(key: &str, record: &str, status: Option<String>) -> AgentResult<ChildThread> {
    let mut child: ChildThread = decode(key, record)?;
    if let Some(status) = status {
        child.status = status;
    }
    Ok(child)
}

#[async_trait]
impl ThreadHistory for RedisStore {
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64> {
        let keys = self.keys(auth);
        let mut call = fenced_call(&scripts::APPEND_HISTORY, &keys, lease);
        call.key(keys.of(kind::HISTORY, lease.thread_id.as_str()));
        push_encoded(&mut call, messages)?;
        // The whole step's messages go in one fenced EVALSHA: all land, or none.
        let length = self.invoke_fenced(call, "append history").await?;
        u64::try_from(length).map_err(|_| lease.lost())
    }

    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        if limit == 0 || after_seq >= i64::MAX as u64 {
            return Ok(Vec::new());
        }
        let key = self.keys(auth).of(kind::HISTORY, thread_id.as_str());
        // Entry seq n sits at list index n - 1, so `seq > after_seq` starts at index after_seq.
        let start = list_index(after_seq);
        let stop = start.saturating_add(list_index(limit as u64) - 1);
        let texts: Vec<String> = redis::cmd("LRANGE")
            .arg(&key)
            .arg(start)
            .arg(stop)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read history", &e))?;
        history_entries(&key, after_seq, &texts)
    }

    async fn read_history_before(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        before_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        if limit == 0 || before_seq <= 1 {
            return Ok(Vec::new());
        }
        let key = self.keys(auth).of(kind::HISTORY, thread_id.as_str());
        let (first, texts): (i64, Vec<String>) = scripts::READ_HISTORY_BEFORE
            .key(&key)
            .arg(before_seq.min(i64::MAX as u64))
            .arg(limit.min(i64::MAX as usize))
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read history", &e))?;
        let first = u64::try_from(first).unwrap_or_default();
        history_entries(&key, first, &texts)
    }
}

#[async_trait]
impl ThreadQueue for RedisStore {
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let keys = self.keys(auth);
        let thread = thread_id.as_str();
        let stored = StoredQueueItem {
            id: uuid::Uuid::now_v7().to_string(),
            payload,
            enqueued_at: Utc::now(),
        };
        let seq: u64 = scripts::PUSH_QUEUE
            .key(keys.of(kind::QUEUE_SEQ, thread))
            .key(keys.of(kind::QUEUE, thread))
            .key(keys.of(kind::QUEUE_ITEMS, thread))
            .key(keys.fixed(fixed::QUEUED_THREADS))
            .arg(&stored.id)
            .arg(encode(&stored)?)
            .arg(thread)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("push to queue", &e))?;
        Ok(QueuedItem {
            id: stored.id,
            seq,
            payload: stored.payload,
            enqueued_at: stored.enqueued_at,
        })
    }

    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = self.keys(auth);
        let items_key = keys.of(kind::QUEUE_ITEMS, thread_id.as_str());
        let rows: Vec<(String, u64, Option<String>)> = scripts::PEEK_QUEUE
            .key(keys.of(kind::QUEUE, thread_id.as_str()))
            .key(&items_key)
            .arg(list_index(limit as u64) - 1)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("peek queue", &e))?;
        rows.into_iter()
            .map(|(id, seq, text)| {
                let text = text.ok_or_else(|| {
                    AgentError::storage(format!(
                        "Redis hash `{items_key}` lacks queued item {id} that the queue lists; \
                         were keys under Keel's prefix changed by hand?"
                    ))
                })?;
                let stored: StoredQueueItem = decode(&items_key, &text)?;
                Ok(QueuedItem {
                    id: stored.id,
                    seq,
                    payload: stored.payload,
                    enqueued_at: stored.enqueued_at,
                })
            })
            .collect()
    }

    async fn ack_queue(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        self.acknowledge(auth, lease, ids, &scripts::ACK_QUEUE)
            .await
    }
    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
        let len: u64 = redis::cmd("ZCARD")
            .arg(self.keys(auth).of(kind::QUEUE, thread_id.as_str()))
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("count queue", &e))?;
        Ok(usize::try_from(len).unwrap_or(usize::MAX))
    }

    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        // One field per thread with queued work, which the engine's per-tenant limit keeps
        // few. Queues that have not been pushed to or acknowledged since this hash was kept
        // are not counted until they are.
        let counts: Vec<u64> = redis::cmd("HVALS")
            .arg(self.keys(auth).fixed(fixed::QUEUED_THREADS))
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("count a tenant's queued work", &e))?;
        Ok(counts
            .into_iter()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .fold(0, usize::saturating_add))
    }

    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        let threads: Vec<String> = redis::cmd("HKEYS")
            .arg(self.keys(auth).fixed(fixed::QUEUED_THREADS))
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list the threads with queued work", &e))?;
        Ok(threads.into_iter().map(ThreadId::from).collect())
    }
}

#[async_trait]
impl ThreadKv for RedisStore {
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>> {
        let hash = self.keys(auth).of(kind::KV, thread_id.as_str());
        self.read_record("read key-value entry", &hash, Some(key))
            .await
    }

    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        // Size caps are checked by `keel_runtime::Validated`; the key count needs the script
        // below.
        let hash = self.keys(auth).of(kind::KV, thread_id.as_str());
        if value.is_null() {
            return redis::cmd("HDEL")
                .arg(&hash)
                .arg(key)
                .query_async::<()>(&mut self.con())
                .await
                .map_err(|e| self.fail("delete key-value entry", &e));
        }
        // Count check and write in one script, so concurrent writers cannot overshoot the cap.
        let stored: i64 = scripts::KV_SET
            .key(&hash)
            .arg(key)
            .arg(encode(&value)?)
            .arg(self.kv_limits.max_keys)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("write key-value entry", &e))?;
        if stored == 0 {
            return Err(self.kv_limits.too_many_keys());
        }
        Ok(())
    }

    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
        let mut keys: Vec<String> = redis::cmd("HKEYS")
            .arg(self.keys(auth).of(kind::KV, thread_id.as_str()))
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list key-value keys", &e))?;
        keys.sort();
        Ok(keys)
    }
}

#[async_trait]
impl SubagentRegistry for RedisStore {
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
        let keys = self.keys(auth);
        scripts::REGISTER_CHILD
            .key(keys.of(kind::CHILD, child.thread_id.as_str()))
            .key(keys.of(kind::CHILDREN, child.parent_thread_id.as_str()))
            .arg(encode(child)?)
            .arg(&child.status)
            .arg(child.parent_thread_id.as_str())
            .arg(micros(child.created_at))
            .arg(child.thread_id.as_str())
            .arg(keys.of(kind::CHILDREN, ""))
            .invoke_async::<i64>(&mut self.con())
            .await
            .map_err(|e| self.fail("register subagent", &e))?;
        Ok(())
    }

    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>> {
        let keys = self.keys(auth);
        let child_prefix = keys.of(kind::CHILD, "");
        let rows: Vec<(String, Option<String>, Option<String>)> = scripts::CHILDREN
            .key(keys.of(kind::CHILDREN, parent.as_str()))
            .arg(&child_prefix)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list subagents", &e))?;
        let mut children = Vec::with_capacity(rows.len());
        for (id, record, status) in rows {
            let key = format!("{child_prefix}{id}");
            let Some(record) = record else {
                return Err(AgentError::storage(format!(
                    "Redis key `{key}` is missing although its parent lists it; were keys \
                     under Keel's prefix deleted by hand?"
                )));
            };
            children.push(child_of(&key, &record, status)?);
        }
        // The score orders by microseconds; this restores the exact (created_at, id) order.
        ChildThread::sort_oldest_first(&mut children);
        Ok(children)
    }

    async fn child(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
    ) -> AgentResult<Option<ChildThread>> {
        let key = self.keys(auth).of(kind::CHILD, child.as_str());
        let (record, status): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("record")
            .arg("status")
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read subagent", &e))?;
        let Some(record) = record else {
            return Ok(None);
        };
        child_of(&key, &record, status).map(Some)
    }

    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()> {
        let updated: i64 = scripts::SET_CHILD_STATUS
            .key(self.keys(auth).of(kind::CHILD, child.as_str()))
            .arg(status)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("update subagent status", &e))?;
        if updated == 0 {
            return Err(ChildThread::not_registered(child));
        }
        Ok(())
    }
}

#[async_trait]
impl keel_runtime::StepStore for RedisStore {
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task: &keel_core::Task,
        write: TaskWrite,
        events: &[keel_core::TaskEvent],
    ) -> AgentResult<()> {
        if write == TaskWrite::SnapshotAndLog {
            // The step script appends only; the engine then saves the snapshot on its own.
            return Err(AgentError::Unsupported {
                what: "`StepStore::persist_step` saving a task's snapshot on Redis".into(),
            });
        }
        let task_id = &task.id;
        let keys = self.keys(auth);
        let mut call = fenced_call(&scripts::PERSIST_STEP, &keys, lease);
        call.key(keys.of(kind::HISTORY, lease.thread_id.as_str()))
            .key(keys.of(kind::TASK, task_id.as_str()))
            .key(keys.of(kind::TASK_EVENTS, task_id.as_str()))
            .arg(history.len());
        push_encoded(&mut call, history)?;
        for event in encode_task_events(events, task_id, Some(&task.thread_id))? {
            call.arg(event);
        }
        // History and task log of one persist point in one EVALSHA: both land, or neither.
        let outcome = self.invoke_fenced(call, "persist step").await?;
        match outcome {
            -1 => Err(lease.lost()),
            -2 => Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            }),
            _ => Ok(()),
        }
    }

    // One script: the task's snapshot, its log entries and the run's record (decision 278).
    async fn save_task_and_run(
        &self,
        auth: &AuthContext,
        task: &keel_core::Task,
        events: &[keel_core::TaskEvent],
        record: &keel_runtime::RunRecord,
        report: &keel_core::stored::JsonText,
    ) -> AgentResult<()> {
        let text = record.text_with_report(report)?;
        self.save_with_events(auth, task, events, Some((record, text)))
            .await
    }

    // One script: the acknowledgement, then the release under the same fence.
    async fn ack_and_release(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        self.acknowledge(auth, lease, ids, &scripts::ACK_AND_RELEASE)
            .await
    }
}
