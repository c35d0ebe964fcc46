//! Thread storage over PostgreSQL: history ([`ThreadHistory`]), the durable FIFO queue
//! ([`ThreadQueue`]), the per-thread key-value store ([`ThreadKv`]) and the subagent registry
//! ([`SubagentRegistry`]).

use async_trait::async_trait;
use chrono::Utc;
use keel_core::conversation::LlmMessage;
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{
    AuthContext, ChildThread, HistoryEntry, Lease, QueuedItem, SubagentRegistry, ThreadHistory,
    ThreadKv, ThreadQueue,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use crate::codec::{
    decode_record, decode_value, encode_all, encode_record, encode_value, execute, from_nanos,
    from_sql_int, query_opt, to_nanos, to_sql_int, transaction, ByKey, Params,
};
use crate::error::doing;
use crate::leases::{fence, fence_args};
use crate::PostgresStore;

/// The `INSERT` of `$history` (a `text[]`) after the thread's last entry, for a fenced `WITH`
/// whose thread is `$2`; `$from` is what must hold for anything to be written.
macro_rules! append_history {
    ($history:literal, $from:literal) => {
        concat!(
            "INSERT INTO thread_history (tenant, thread_id, seq, body)
    SELECT $1, $2, (SELECT COALESCE(MAX(seq), 0) FROM thread_history
                    WHERE tenant = $1 AND thread_id = $2) + h.ord, h.body
    FROM ",
            $from,
            ", unnest(",
            $history,
            "::text[]) WITH ORDINALITY AS h(body, ord)"
        )
    };
}
pub(crate) use append_history;

/// Append `$5` to the thread's history under the fence; whether the fence held, and the seq
/// of the last entry.
const APPEND_HISTORY: &str = concat!(
    "WITH ",
    fence!(),
    ", last AS (
    SELECT COALESCE(MAX(seq), 0) AS seq FROM thread_history WHERE tenant = $1 AND thread_id = $2
), appended AS (",
    append_history!("$5", "lease"),
    ")
SELECT EXISTS (SELECT 1 FROM lease), (SELECT seq FROM last) + cardinality($5::text[])"
);
const READ_HISTORY: &str = "SELECT seq, body FROM thread_history \
     WHERE tenant = $1 AND thread_id = $2 AND seq > $3 ORDER BY seq LIMIT $4";

/// The newest entries before a seq, newest first (answered oldest first).
const READ_HISTORY_BEFORE: &str = "SELECT seq, body FROM thread_history \
     WHERE tenant = $1 AND thread_id = $2 AND seq < $3 ORDER BY seq DESC LIMIT $4";

/// Number the item with the thread's queue counter (which survives acks, so seqs only grow)
/// and queue it, in one statement.
const PUSH: &str = "\
WITH counter AS (
    INSERT INTO threads (tenant, thread_id, last_queue_seq) VALUES ($1, $2, 1)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET last_queue_seq = threads.last_queue_seq + 1
    RETURNING last_queue_seq
)
INSERT INTO thread_queue (tenant, thread_id, seq, id, payload, enqueued_at)
SELECT $1, $2, last_queue_seq, $3, $4, $5 FROM counter RETURNING seq";
const PEEK: &str = "SELECT id, seq, payload, enqueued_at FROM thread_queue \
     WHERE tenant = $1 AND thread_id = $2 ORDER BY seq LIMIT $3";
/// Remove the items `$5` under the fence; whether it held.
const ACK: &str = concat!(
    "WITH ",
    fence!(),
    ", acked AS (
    DELETE FROM thread_queue
    WHERE tenant = $1 AND thread_id = $2 AND id = ANY($5::text[]) AND EXISTS (SELECT 1 FROM lease)
)
SELECT EXISTS (SELECT 1 FROM lease)"
);
/// [`ACK`], and the lease released in the same statement (whatever the fence says, as
/// `release_lease` does: only this token's lease goes).
pub(crate) const ACK_AND_RELEASE: &str = concat!(
    "WITH ",
    fence!(),
    ", acked AS (
    DELETE FROM thread_queue
    WHERE tenant = $1 AND thread_id = $2 AND id = ANY($5::text[]) AND EXISTS (SELECT 1 FROM lease)
), released AS (
    DELETE FROM leases WHERE tenant = $1 AND thread_id = $2 AND token = $3
)
SELECT EXISTS (SELECT 1 FROM lease)"
);
const QUEUE_LEN: &str = "SELECT count(*) FROM thread_queue WHERE tenant = $1 AND thread_id = $2";
const TENANT_QUEUE_LEN: &str = "SELECT count(*) FROM thread_queue WHERE tenant = $1";
const QUEUED_THREADS: &str = "SELECT DISTINCT thread_id FROM thread_queue WHERE tenant = $1";

const KV_GET: &str =
    "SELECT value FROM thread_kv WHERE tenant = $1 AND thread_id = $2 AND key = $3";
const KV_DELETE: &str = "DELETE FROM thread_kv WHERE tenant = $1 AND thread_id = $2 AND key = $3";
/// Lock the thread's counter row, so the key count below is not raced by another writer.
const KV_LOCK: &str = "\
INSERT INTO threads (tenant, thread_id) VALUES ($1, $2)
ON CONFLICT (tenant, thread_id) DO UPDATE SET last_queue_seq = threads.last_queue_seq";
/// Write a key if it exists or the thread holds fewer than `$5` keys; 0 rows when refused.
const KV_SET: &str = "\
INSERT INTO thread_kv (tenant, thread_id, key, value)
SELECT $1, $2, $3, $4
WHERE EXISTS (SELECT 1 FROM thread_kv WHERE tenant = $1 AND thread_id = $2 AND key = $3)
   OR (SELECT count(*) FROM thread_kv WHERE tenant = $1 AND thread_id = $2) < $5
ON CONFLICT (tenant, thread_id, key) DO UPDATE SET value = excluded.value";
const KV_KEYS: &str = "SELECT key FROM thread_kv WHERE tenant = $1 AND thread_id = $2 ORDER BY key";

const REGISTER_CHILD: &str = "\
INSERT INTO subagents (tenant, thread_id, parent_thread_id, created_at, body)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, thread_id) DO UPDATE SET
    parent_thread_id = excluded.parent_thread_id, created_at = excluded.created_at,
    body = excluded.body";
const CHILDREN: &str = "SELECT thread_id, body FROM subagents \
     WHERE tenant = $1 AND parent_thread_id = $2 ORDER BY created_at, thread_id";
const CHILD: ByKey<ChildThread> = ByKey {
    sql: "SELECT body FROM subagents WHERE tenant = $1 AND thread_id = $2",
    op: "reading a subagent",
    noun: "subagent",
    decode: decode_record,
};
const CHILD_FOR_UPDATE: &str =
    "SELECT body FROM subagents WHERE tenant = $1 AND thread_id = $2 FOR UPDATE";
const SET_CHILD: &str = "UPDATE subagents SET body = $3 WHERE tenant = $1 AND thread_id = $2";

#[async_trait]
impl ThreadHistory for PostgresStore {
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64> {
        let bodies = encode_all(messages)?;
        let row = self
            .fenced_row(
                auth,
                lease,
                APPEND_HISTORY,
                &[&bodies],
                "appending to a thread's history",
            )
            .await?;
        from_sql_int(row.get(1), "history seq")
    }

    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let rows = self
            .history_rows(READ_HISTORY, auth, thread_id, after_seq, limit)
            .await?;
        history_entries(&rows, thread_id)
    }

    async fn read_history_before(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        before_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let mut rows = self
            .history_rows(READ_HISTORY_BEFORE, auth, thread_id, before_seq, limit)
            .await?;
        rows.reverse();
        history_entries(&rows, thread_id)
    }
}

impl PostgresStore {
    /// The (seq, body) rows `sql` selects for a thread, bound as (tenant, thread, seq bound,
    /// limit): the one query shape both history reads page with.
    async fn history_rows(
        &self,
        sql: &str,
        auth: &AuthContext,
        thread_id: &ThreadId,
        seq_bound: u64,
        limit: usize,
    ) -> AgentResult<Vec<tokio_postgres::Row>> {
        self.query(
            sql,
            &[
                &auth.namespace(),
                &thread_id.as_str(),
                &to_sql_int(seq_bound),
                &to_sql_int(limit),
            ],
            "reading a thread's history",
        )
        .await
    }

    /// Run `sql`, a write fenced by `lease`, in the thread's write order: bound to the fence
    /// (tenant, thread, token, now) and then `args`. Its row, or [`Lease::lost`] when the
    /// first column says the lease did not hold; what every fenced thread write shares.
    pub(crate) async fn fenced_row(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        sql: &str,
        args: &Params<'_>,
        op: &'static str,
    ) -> AgentResult<tokio_postgres::Row> {
        self.fenced(auth, lease, sql, args, op, false).await
    }

    /// [`Self::fenced_row`], which also releases the lease when `releases`: such a write goes
    /// after the thread's lease operations sent before it, as a release does
    /// ([`WriteOrder`](crate::leases::WriteOrder)).
    pub(crate) async fn fenced(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        sql: &str,
        args: &Params<'_>,
        op: &'static str,
        releases: bool,
    ) -> AgentResult<tokio_postgres::Row> {
        let (tenant, thread, token, now) = fence_args(auth, lease);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&tenant, &thread, &token, &now];
        params.extend_from_slice(args);
        let stripe = self.order.stripe(&tenant, &thread);
        let _in_order = match releases {
            false => (Some(stripe.read().await), None),
            true => (None, Some(stripe.write().await)),
        };
        let row = self.query_one(sql, &params, op).await?;
        if !row.get::<_, bool>(0) {
            return Err(lease.lost());
        }
        Ok(row)
    }
}

/// History rows (seq, body) as entries.
fn history_entries(
    rows: &[tokio_postgres::Row],
    thread_id: &ThreadId,
) -> AgentResult<Vec<HistoryEntry>> {
    rows.iter()
        .map(|row| {
            let seq: i64 = row.get(0);
            Ok(HistoryEntry {
                seq: from_sql_int(seq, "history seq")?,
                message: decode_record(
                    row.get(1),
                    &format!("history entry {seq} of thread {thread_id}"),
                )?,
            })
        })
        .collect()
}

/// The count in the first column of `row`.
fn count(row: &tokio_postgres::Row) -> usize {
    usize::try_from(row.get::<_, i64>(0)).unwrap_or(0)
}

/// A queue item about to be written: its id, payload text and time, made once for every
/// statement that queues one (`push_queue`, and a task saved with its queue item).
pub(crate) struct NewItem {
    pub(crate) id: String,
    pub(crate) text: String,
    pub(crate) nanos: i64,
    payload: Value,
    enqueued_at: chrono::DateTime<Utc>,
}

impl NewItem {
    pub(crate) fn of(payload: Value) -> AgentResult<NewItem> {
        let enqueued_at = Utc::now();
        Ok(NewItem {
            id: uuid::Uuid::now_v7().to_string(),
            text: encode_value(&payload)?,
            nanos: to_nanos(enqueued_at),
            payload,
            enqueued_at,
        })
    }

    /// The item as queued, its sequence number the statement's first column.
    pub(crate) fn queued(self, row: &tokio_postgres::Row) -> AgentResult<QueuedItem> {
        Ok(QueuedItem {
            id: self.id,
            seq: from_sql_int(row.get(0), "queue seq")?,
            payload: self.payload,
            enqueued_at: self.enqueued_at,
        })
    }
}

#[async_trait]
impl ThreadQueue for PostgresStore {
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let item = NewItem::of(payload)?;
        let row = self
            .query_one(
                PUSH,
                &[
                    &auth.namespace(),
                    &thread_id.as_str(),
                    &item.id,
                    &item.text,
                    &item.nanos,
                ],
                "queueing an item",
            )
            .await?;
        item.queued(&row)
    }

    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        let rows = self
            .query(
                PEEK,
                &[&auth.namespace(), &thread_id.as_str(), &to_sql_int(limit)],
                "reading a thread's queue",
            )
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.get(0);
                Ok(QueuedItem {
                    payload: decode_value(row.get(2), &format!("queued item {id}"))?,
                    seq: from_sql_int(row.get(1), "queue seq")?,
                    enqueued_at: from_nanos(row.get(3)),
                    id,
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
        self.fenced_row(auth, lease, ACK, &[&ids], "acknowledging queued items")
            .await?;
        Ok(())
    }

    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
        let row = self
            .query_one(
                QUEUE_LEN,
                &[&auth.namespace(), &thread_id.as_str()],
                "counting a thread's queue",
            )
            .await?;
        Ok(count(&row))
    }

    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        let row = self
            .query_one(
                TENANT_QUEUE_LEN,
                &[&auth.namespace()],
                "counting a tenant's queued work",
            )
            .await?;
        Ok(count(&row))
    }

    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        let rows = self
            .query(
                QUEUED_THREADS,
                &[&auth.namespace()],
                "listing the threads with queued work",
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| ThreadId::from(row.get::<_, String>(0)))
            .collect())
    }
}

#[async_trait]
impl ThreadKv for PostgresStore {
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>> {
        let row = self
            .query_opt(
                KV_GET,
                &[&auth.namespace(), &thread_id.as_str(), &key],
                "reading a thread key",
            )
            .await?;
        row.map(|row| decode_value(row.get(0), &format!("key `{key}` of thread {thread_id}")))
            .transpose()
    }

    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        let (tenant, thread) = (auth.namespace(), thread_id.as_str());
        let mut client = self.client().await?;
        if value.is_null() {
            execute(
                &client,
                KV_DELETE,
                &[&tenant, &thread, &key],
                "deleting a thread key",
            )
            .await?;
            return Ok(());
        }
        // Size caps are checked by `keel_runtime::Validated`; the key count needs the lock.
        let text = encode_value(&value)?;
        let limits = self.kv_limits();
        let tx = transaction(&mut client, "writing a thread key").await?;
        execute(&tx, KV_LOCK, &[&tenant, &thread], "writing a thread key").await?;
        let written = execute(
            &tx,
            KV_SET,
            &[&tenant, &thread, &key, &text, &to_sql_int(limits.max_keys)],
            "writing a thread key",
        )
        .await?;
        if written == 0 {
            return Err(limits.too_many_keys());
        }
        tx.commit().await.map_err(doing("writing a thread key"))
    }

    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
        let rows = self
            .query(
                KV_KEYS,
                &[&auth.namespace(), &thread_id.as_str()],
                "listing a thread's keys",
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

#[async_trait]
impl SubagentRegistry for PostgresStore {
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
        let body = encode_record(child)?;
        self.execute(
            REGISTER_CHILD,
            &[
                &auth.namespace(),
                &child.thread_id.as_str(),
                &child.parent_thread_id.as_str(),
                &to_nanos(child.created_at),
                &body,
            ],
            "registering a subagent",
        )
        .await?;
        Ok(())
    }

    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>> {
        let rows = self
            .query(
                CHILDREN,
                &[&auth.namespace(), &parent.as_str()],
                "listing subagents",
            )
            .await?;
        rows.iter()
            .map(|row| {
                let thread_id: &str = row.get(0);
                decode_record(row.get(1), &format!("subagent {thread_id}"))
            })
            .collect()
    }

    async fn child(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
    ) -> AgentResult<Option<ChildThread>> {
        self.select_by_key(&CHILD, auth, child.as_str()).await
    }

    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()> {
        let (tenant, thread) = (auth.namespace(), child.as_str());
        let mut client = self.client().await?;
        // Read, change and write back under the row's lock, so no concurrent update is lost.
        let tx = transaction(&mut client, "updating a subagent's status").await?;
        let row = query_opt(
            &tx,
            CHILD_FOR_UPDATE,
            &[&tenant, &thread],
            "updating a subagent's status",
        )
        .await?;
        let Some(row) = row else {
            return Err(ChildThread::not_registered(child));
        };
        let mut entry: ChildThread = decode_record(row.get(0), &format!("subagent {child}"))?;
        entry.status = status.to_owned();
        let body = encode_record(&entry)?;
        execute(
            &tx,
            SET_CHILD,
            &[&tenant, &thread, &body],
            "updating a subagent's status",
        )
        .await?;
        tx.commit()
            .await
            .map_err(doing("updating a subagent's status"))
    }
}
