//! [`AsyncCallStore`] over PostgreSQL: pending asynchronous tool calls by id alone (a
//! callback names only its call); the row says whose call it is, and a transition compares
//! the tenant and the state in the statement that writes.

use async_trait::async_trait;
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AsyncCall, AsyncCallMove, AsyncCallState, AsyncCallStore, AuthContext};

use crate::codec::{decode_value, encode_value};
use crate::PostgresStore;

const PUT: &str = "\
INSERT INTO async_calls (call_id, tenant, app_name, user_name, thread_id, state, record)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (call_id) DO UPDATE SET tenant = excluded.tenant, app_name = excluded.app_name,
    user_name = excluded.user_name, thread_id = excluded.thread_id, state = excluded.state,
    record = excluded.record";
const FIND: &str = "SELECT app_name, user_name, thread_id, state, record \
     FROM async_calls WHERE call_id = $1";
const TRANSITION: &str = "UPDATE async_calls SET state = $1, record = $2 \
     WHERE call_id = $3 AND tenant = $4 AND state = $5";

#[async_trait]
impl AsyncCallStore for PostgresStore {
    async fn put_async_call(&self, call: &AsyncCall) -> AgentResult<()> {
        let record = encode_value(&call.record)?;
        self.execute(
            PUT,
            &[
                &call.call_id,
                &call.auth.namespace(),
                &call.auth.app_name,
                &call.auth.user_name,
                &call.thread_id.as_str(),
                &call.state.as_str(),
                &record,
            ],
            "saving an asynchronous call",
        )
        .await?;
        Ok(())
    }

    async fn find_async_call(&self, call_id: &str) -> AgentResult<Option<AsyncCall>> {
        let Some(row) = self
            .query_opt(FIND, &[&call_id], "reading an asynchronous call")
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(AsyncCall {
            state: AsyncCallState::from_stored(
                row.get(3),
                &format!("asynchronous call `{call_id}`"),
            )?,
            record: decode_value(row.get(4), &format!("asynchronous call `{call_id}`"))?,
            auth: AuthContext::new(row.get::<_, String>(0), row.get::<_, String>(1)),
            thread_id: ThreadId::from(row.get::<_, String>(2)),
            call_id: call_id.to_owned(),
        }))
    }

    async fn move_call(&self, step: AsyncCallMove<'_>) -> AgentResult<bool> {
        let record = encode_value(&step.record)?;
        let changed = self
            .execute(
                TRANSITION,
                &[
                    &step.to.as_str(),
                    &record,
                    &step.call_id,
                    &step.auth.namespace(),
                    &step.from.as_str(),
                ],
                "moving an asynchronous call",
            )
            .await?;
        Ok(changed == 1)
    }
}
