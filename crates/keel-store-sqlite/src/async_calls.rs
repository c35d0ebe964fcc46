//! [`AsyncCallStore`] over SQLite: the `async_calls` table, keyed by call id alone (a callback
//! carries nothing else), with the owning tenant in its columns. A transition is one
//! `UPDATE … WHERE state = from` in the writer's transaction, and SQLite serialises writers
//! across processes, so of two concurrent deliveries exactly one changes the row.

use async_trait::async_trait;
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AsyncCall, AsyncCallMove, AsyncCallState, AsyncCallStore, AuthContext};
use rusqlite::params;

use crate::codec::{decode_value, encode_value, select_row, SqlContext};
use crate::SqliteStore;

#[async_trait]
impl AsyncCallStore for SqliteStore {
    async fn put_async_call(&self, call: &AsyncCall) -> AgentResult<()> {
        let record = encode_value(&call.record)?;
        let tenant = self.tenant(&call.auth).await?;
        let call = call.clone();
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO async_calls \
                 (call_id, tenant, app_name, user_name, thread_id, state, record) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (call_id) DO UPDATE SET tenant = excluded.tenant, \
                 app_name = excluded.app_name, user_name = excluded.user_name, \
                 thread_id = excluded.thread_id, state = excluded.state, \
                 record = excluded.record",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    call.call_id,
                    tenant,
                    call.auth.app_name,
                    call.auth.user_name,
                    call.thread_id.as_str(),
                    call.state.as_str(),
                    record
                ])
            })
            .context("saving an asynchronous call")?;
            Ok(())
        })
        .await
    }

    async fn find_async_call(&self, call_id: &str) -> AgentResult<Option<AsyncCall>> {
        let call_id = call_id.to_owned();
        self.read(move |conn| {
            let row: Option<(String, String, String, String, String)> = select_row(
                conn,
                "SELECT app_name, user_name, thread_id, state, record \
                 FROM async_calls WHERE call_id = ?1",
                params![call_id],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
                "reading an asynchronous call",
            )?;
            let Some((app_name, user_name, thread_id, state, record)) = row else {
                return Ok(None);
            };
            Ok(Some(AsyncCall {
                state: AsyncCallState::from_stored(
                    &state,
                    &format!("asynchronous call `{call_id}`"),
                )?,
                record: decode_value(&record, &format!("asynchronous call `{call_id}`"))?,
                auth: AuthContext::new(app_name, user_name),
                thread_id: ThreadId::from(thread_id),
                call_id,
            }))
        })
        .await
    }

    async fn move_call(&self, step: AsyncCallMove<'_>) -> AgentResult<bool> {
        let record = encode_value(&step.record)?;
        let (tenant, call_id) = (self.tenant(step.auth).await?, step.call_id.to_owned());
        let (from, to) = (step.from, step.to);
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE async_calls SET state = ?1, record = ?2 \
                     WHERE call_id = ?3 AND tenant = ?4 AND state = ?5",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![to.as_str(), record, call_id, tenant, from.as_str()])
                })
                .context("moving an asynchronous call")?;
            Ok(changed == 1)
        })
        .await
    }
}
