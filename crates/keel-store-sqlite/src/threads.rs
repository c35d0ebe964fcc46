//! Thread storage over SQLite: history ([`ThreadHistory`]), the durable FIFO queue
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
use rusqlite::{params, Connection};
use serde_json::Value;

use crate::codec::{
    decode_record, decode_value, encode_record, encode_value, from_nanos, from_sql_int,
    select_count, select_record, select_rows, select_text, to_nanos, to_sql_int, usize_to_sql,
    SqlContext,
};
use crate::leases::{check_fence, delete_lease};
use crate::SqliteStore;

/// Append encoded messages to a thread's history, after its last entry; the seq of the last
/// entry after the append. The caller checks the lease in the same transaction.
pub(crate) fn append_history_rows(
    conn: &Connection,
    tenant: &str,
    thread_id: &ThreadId,
    bodies: &[String],
) -> AgentResult<u64> {
    let thread_id = thread_id.as_str();
    let last: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(MAX(seq), 0) FROM thread_history \
             WHERE tenant = ?1 AND thread_id = ?2",
        )
        .and_then(|mut stmt| stmt.query_row(params![tenant, thread_id], |row| row.get(0)))
        .context("reading a thread's history length")?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO thread_history (tenant, thread_id, seq, body) \
             VALUES (?1, ?2, ?3, ?4)",
        )
        .context("appending to a thread's history")?;
    let mut seq = last;
    for body in bodies {
        seq += 1;
        stmt.execute(params![tenant, thread_id, seq, body])
            .context("appending to a thread's history")?;
    }
    from_sql_int(seq, "history seq")
}

/// A per-thread counter kept in `threads`: it starts at 1 and only grows, because its row
/// outlives what it numbers (a released lease, an acknowledged queue item).
pub(crate) enum ThreadCounter {
    /// The fencing token of the thread's leases.
    LeaseToken,
    /// The seq of the thread's queued items.
    QueueSeq,
}

impl ThreadCounter {
    /// Advance the counter of `thread_id` and return its new value.
    pub(crate) fn next(
        &self,
        conn: &Connection,
        tenant: &str,
        thread_id: &ThreadId,
    ) -> AgentResult<i64> {
        let (sql, what) = match self {
            ThreadCounter::LeaseToken => (
                "INSERT INTO threads (tenant, thread_id, last_lease_token) VALUES (?1, ?2, 1) \
                 ON CONFLICT (tenant, thread_id) DO UPDATE SET \
                 last_lease_token = last_lease_token + 1 RETURNING last_lease_token",
                "issuing a lease token",
            ),
            ThreadCounter::QueueSeq => (
                "INSERT INTO threads (tenant, thread_id, last_queue_seq) VALUES (?1, ?2, 1) \
                 ON CONFLICT (tenant, thread_id) DO UPDATE SET \
                 last_queue_seq = last_queue_seq + 1 RETURNING last_queue_seq",
                "numbering a queued item",
            ),
        };
        conn.prepare_cached(sql)
            .and_then(|mut stmt| {
                stmt.query_row(params![tenant, thread_id.as_str()], |row| row.get(0))
            })
            .context(what)
    }
}

/// The tenant's subagent `child`, if registered: what reading a child and updating its
/// status both look up.
fn select_child(
    conn: &Connection,
    tenant: &str,
    child: &ThreadId,
) -> AgentResult<Option<ChildThread>> {
    select_record(
        conn,
        "SELECT body FROM subagents WHERE tenant = ?1 AND thread_id = ?2",
        params![tenant, child.as_str()],
        &format!("subagent {child}"),
        decode_record,
    )
}

#[async_trait]
impl ThreadHistory for SqliteStore {
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64> {
        let bodies = messages
            .iter()
            .map(encode_record)
            .collect::<AgentResult<Vec<_>>>()?;
        let (tenant, lease) = (self.tenant(auth).await?, lease.clone());
        self.write(move |conn| {
            // The fence and the append share the transaction: a lease that lapses or is taken
            // over can never interleave with the write.
            check_fence(conn, &tenant, &lease)?;
            append_history_rows(conn, &tenant, &lease.thread_id, &bodies)
        })
        .await
    }

    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let (tenant, thread_id) = (self.tenant(auth).await?, thread_id.clone());
        self.read(move |conn| {
            let sql = "SELECT seq, body FROM thread_history \
                 WHERE tenant = ?1 AND thread_id = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4";
            history_entries(
                history_rows(conn, sql, &tenant, &thread_id, after_seq, limit)?,
                &thread_id,
            )
        })
        .await
    }

    async fn read_history_before(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        before_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let (tenant, thread_id) = (self.tenant(auth).await?, thread_id.clone());
        self.read(move |conn| {
            // Newest first, to take the last `limit`; the page itself runs oldest first.
            let sql = "SELECT seq, body FROM thread_history \
                 WHERE tenant = ?1 AND thread_id = ?2 AND seq < ?3 ORDER BY seq DESC LIMIT ?4";
            let mut rows = history_rows(conn, sql, &tenant, &thread_id, before_seq, limit)?;
            rows.reverse();
            history_entries(rows, &thread_id)
        })
        .await
    }
}

/// The (seq, body) rows `sql` selects for a thread, bound as (tenant, thread, seq bound,
/// limit): the one query shape both history reads page with.
fn history_rows(
    conn: &Connection,
    sql: &str,
    tenant: &str,
    thread_id: &ThreadId,
    seq_bound: u64,
    limit: usize,
) -> AgentResult<Vec<(i64, String)>> {
    let args = params![
        tenant,
        thread_id.as_str(),
        to_sql_int(seq_bound),
        usize_to_sql(limit)
    ];
    select_rows(
        conn,
        sql,
        args,
        |row| Ok((row.get(0)?, row.get(1)?)),
        "reading a thread's history",
    )
}

/// History rows (seq, body) as entries.
fn history_entries(
    rows: Vec<(i64, String)>,
    thread_id: &ThreadId,
) -> AgentResult<Vec<HistoryEntry>> {
    rows.into_iter()
        .map(|(seq, body)| {
            Ok(HistoryEntry {
                seq: from_sql_int(seq, "history seq")?,
                message: decode_record(
                    &body,
                    &format!("history entry {seq} of thread {thread_id}"),
                )?,
            })
        })
        .collect()
}

/// A queue item ready to be written: encoded, with its id, before the write job is sent (so
/// an encoding error writes nothing).
pub(crate) struct QueueRow {
    tenant: String,
    thread_id: ThreadId,
    id: String,
    text: String,
}

impl QueueRow {
    pub(crate) fn new(tenant: String, thread_id: &ThreadId, payload: &Value) -> AgentResult<Self> {
        Ok(Self {
            tenant,
            thread_id: thread_id.clone(),
            id: uuid::Uuid::now_v7().to_string(),
            text: encode_value(payload)?,
        })
    }

    /// Add the item at the back of its thread's queue, inside the caller's write job.
    pub(crate) fn push(self, conn: &Connection, payload: Value) -> AgentResult<QueuedItem> {
        let Self {
            tenant,
            thread_id,
            id,
            text,
        } = self;
        // The counter in `threads` survives acks, so seqs only grow even when the queue
        // empties.
        let seq = ThreadCounter::QueueSeq.next(conn, &tenant, &thread_id)?;
        let enqueued_at = Utc::now();
        conn.prepare_cached(
            "INSERT INTO thread_queue (tenant, thread_id, seq, id, payload, enqueued_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                tenant,
                thread_id.as_str(),
                seq,
                id,
                text,
                to_nanos(enqueued_at)
            ])
        })
        .context("queueing an item")?;
        Ok(QueuedItem {
            id,
            seq: from_sql_int(seq, "queue seq")?,
            payload,
            enqueued_at,
        })
    }
}

#[async_trait]
impl ThreadQueue for SqliteStore {
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let row = QueueRow::new(self.tenant(auth).await?, thread_id, &payload)?;
        self.write(move |conn| row.push(conn, payload)).await
    }

    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        let (tenant, thread_id) = (self.tenant(auth).await?, thread_id.clone());
        self.read(move |conn| {
            let rows: Vec<(String, i64, String, i64)> = select_rows(
                conn,
                "SELECT id, seq, payload, enqueued_at FROM thread_queue \
                 WHERE tenant = ?1 AND thread_id = ?2 ORDER BY seq LIMIT ?3",
                params![tenant, thread_id.as_str(), usize_to_sql(limit)],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                "reading a thread's queue",
            )?;
            rows.into_iter()
                .map(|(id, seq, payload, enqueued_at)| {
                    Ok(QueuedItem {
                        payload: decode_value(&payload, &format!("queued item {id}"))?,
                        id,
                        seq: from_sql_int(seq, "queue seq")?,
                        enqueued_at: from_nanos(enqueued_at),
                    })
                })
                .collect()
        })
        .await
    }

    async fn ack_queue(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        self.acknowledge(auth, lease, ids, false).await
    }

    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
        let (tenant, thread_id) = (self.tenant(auth).await?, thread_id.clone());
        self.read(move |conn| {
            select_count(
                conn,
                "SELECT COUNT(*) FROM thread_queue WHERE tenant = ?1 AND thread_id = ?2",
                params![tenant, thread_id.as_str()],
                "counting a thread's queue",
            )
        })
        .await
    }

    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        // The primary key starts with the tenant: this walks the tenant's queued items only,
        // which the engine's per-tenant limit keeps few.
        let tenant = self.tenant(auth).await?;
        self.read(move |conn| {
            select_count(
                conn,
                "SELECT COUNT(*) FROM thread_queue WHERE tenant = ?1",
                params![tenant],
                "counting a tenant's queued work",
            )
        })
        .await
    }

    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        let tenant = self.tenant(auth).await?;
        self.read(move |conn| {
            let rows: Vec<String> = select_rows(
                conn,
                "SELECT DISTINCT thread_id FROM thread_queue WHERE tenant = ?1",
                params![tenant],
                |row| row.get(0),
                "listing the threads with queued work",
            )?;
            Ok(rows.into_iter().map(ThreadId::from).collect())
        })
        .await
    }
}

#[async_trait]
impl ThreadKv for SqliteStore {
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>> {
        let (tenant, thread_id, key) =
            (self.tenant(auth).await?, thread_id.clone(), key.to_owned());
        self.read(move |conn| {
            let text = select_text(
                conn,
                "SELECT value FROM thread_kv WHERE tenant = ?1 AND thread_id = ?2 AND key = ?3",
                params![tenant, thread_id.as_str(), key],
                "reading a thread key",
            )?;
            text.map(|text| decode_value(&text, &format!("key `{key}` of thread {thread_id}")))
                .transpose()
        })
        .await
    }

    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        let text = encode_value(&value)?;
        // Size caps are checked by `keel_runtime::Validated`; the key count needs the
        // transaction below.
        let limits = self.kv_limits();
        let (tenant, thread_id, key) =
            (self.tenant(auth).await?, thread_id.clone(), key.to_owned());
        self.write(move |conn| {
            if value.is_null() {
                conn.prepare_cached(
                    "DELETE FROM thread_kv WHERE tenant = ?1 AND thread_id = ?2 AND key = ?3",
                )
                .and_then(|mut stmt| stmt.execute(params![tenant, thread_id.as_str(), key]))
                .context("deleting a thread key")?;
                return Ok(());
            }
            // The count and the insert share the transaction, so concurrent writers cannot
            // together pass the cap.
            let exists = conn
                .prepare_cached(
                    "SELECT 1 FROM thread_kv WHERE tenant = ?1 AND thread_id = ?2 AND key = ?3",
                )
                .and_then(|mut stmt| stmt.exists(params![tenant, thread_id.as_str(), key]))
                .context("reading a thread key")?;
            if !exists {
                let count = select_count(
                    conn,
                    "SELECT COUNT(*) FROM thread_kv WHERE tenant = ?1 AND thread_id = ?2",
                    params![tenant, thread_id.as_str()],
                    "counting a thread's keys",
                )?;
                if count >= limits.max_keys {
                    return Err(limits.too_many_keys());
                }
            }
            conn.prepare_cached(
                "INSERT INTO thread_kv (tenant, thread_id, key, value) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (tenant, thread_id, key) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut stmt| stmt.execute(params![tenant, thread_id.as_str(), key, text]))
            .context("writing a thread key")?;
            Ok(())
        })
        .await
    }

    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
        let (tenant, thread_id) = (self.tenant(auth).await?, thread_id.clone());
        self.read(move |conn| {
            // SQLite's default BINARY collation compares UTF-8 bytes, which is Rust's order
            // for strings: the keys come back sorted as the trait promises.
            select_rows(
                conn,
                "SELECT key FROM thread_kv WHERE tenant = ?1 AND thread_id = ?2 ORDER BY key",
                params![tenant, thread_id.as_str()],
                |row| row.get(0),
                "listing a thread's keys",
            )
        })
        .await
    }
}

#[async_trait]
impl SubagentRegistry for SqliteStore {
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
        let body = encode_record(child)?;
        let (tenant, thread_id, parent, created_at) = (
            self.tenant(auth).await?,
            child.thread_id.clone(),
            child.parent_thread_id.clone(),
            to_nanos(child.created_at),
        );
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO subagents (tenant, thread_id, parent_thread_id, created_at, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (tenant, thread_id) DO UPDATE SET \
                 parent_thread_id = excluded.parent_thread_id, \
                 created_at = excluded.created_at, body = excluded.body",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    tenant,
                    thread_id.as_str(),
                    parent.as_str(),
                    created_at,
                    body
                ])
            })
            .context("registering a subagent")?;
            Ok(())
        })
        .await
    }

    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>> {
        let (tenant, parent) = (self.tenant(auth).await?, parent.clone());
        self.read(move |conn| {
            let rows: Vec<(String, String)> = select_rows(
                conn,
                "SELECT thread_id, body FROM subagents \
                 WHERE tenant = ?1 AND parent_thread_id = ?2 ORDER BY created_at, thread_id",
                params![tenant, parent.as_str()],
                |row| Ok((row.get(0)?, row.get(1)?)),
                "listing subagents",
            )?;
            rows.into_iter()
                .map(|(thread_id, body)| decode_record(&body, &format!("subagent {thread_id}")))
                .collect()
        })
        .await
    }

    async fn child(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
    ) -> AgentResult<Option<ChildThread>> {
        let (tenant, child) = (self.tenant(auth).await?, child.clone());
        self.read(move |conn| select_child(conn, &tenant, &child))
            .await
    }

    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()> {
        let (tenant, child, status) = (self.tenant(auth).await?, child.clone(), status.to_owned());
        self.write(move |conn| {
            // Read, change and write back in one transaction, so no concurrent update is lost.
            let Some(mut entry) = select_child(conn, &tenant, &child)? else {
                return Err(ChildThread::not_registered(&child));
            };
            entry.status = status;
            let body = encode_record(&entry)?;
            conn.prepare_cached(
                "UPDATE subagents SET body = ?3 WHERE tenant = ?1 AND thread_id = ?2",
            )
            .and_then(|mut stmt| stmt.execute(params![tenant, child.as_str(), body]))
            .context("updating a subagent's status")?;
            Ok(())
        })
        .await
    }
}

impl SqliteStore {
    /// Acknowledge `ids` on the lease's thread, fenced by the lease, and with `release` release
    /// the lease too, unfenced, in one write job: a refused fence acknowledges nothing and is
    /// the answer, but the job stands, so the release is made all the same.
    pub(crate) async fn acknowledge(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
        release: bool,
    ) -> AgentResult<()> {
        let (tenant, lease, ids) = (self.tenant(auth).await?, lease.clone(), ids.to_vec());
        self.write(move |conn| {
            let fenced = check_fence(conn, &tenant, &lease);
            if fenced.is_ok() {
                delete_queued(conn, &tenant, &lease.thread_id, &ids)?;
            }
            if release {
                delete_lease(conn, &tenant, &lease)?;
            }
            Ok(fenced)
        })
        .await?
    }
}

/// Remove the items `ids` from the thread's queue (acknowledged); the caller checks the fence
/// in the same transaction.
fn delete_queued(
    conn: &Connection,
    tenant: &str,
    thread_id: &ThreadId,
    ids: &[String],
) -> AgentResult<()> {
    let mut stmt = conn
        .prepare_cached("DELETE FROM thread_queue WHERE tenant = ?1 AND thread_id = ?2 AND id = ?3")
        .context("acknowledging queued items")?;
    for id in ids {
        stmt.execute(params![tenant, thread_id.as_str(), id])
            .context("acknowledging queued items")?;
    }
    Ok(())
}
