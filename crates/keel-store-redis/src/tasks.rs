//! [`TaskManager`] over Redis: a snapshot string per task, an event list per task, and
//! sorted-set indexes (per tenant, thread, state, thread and state) scored by a per-tenant
//! creation seq, so listings are in creation order and a re-save does not move a task.

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult, Task, TaskEvent, TaskId};
use keel_runtime::{AuthContext, ListTasksFilter, Page, TaskManager};

use crate::encoding::{decode, encode};
use crate::keys::{fixed, kind};
use crate::scripts;
use crate::RedisStore;

/// A page token is the seq of the last task of the previous page: stable under concurrent
/// inserts (new tasks only ever get larger seqs, and nothing is deleted).
fn parse_page_token(token: Option<&str>) -> AgentResult<u64> {
    match token {
        None | Some("") => Ok(0),
        Some(token) => token.parse().map_err(|_| {
            AgentError::invalid_input(
                "page_token",
                format!("`{token}` is not a token this server issued"),
            )
        }),
    }
}

impl RedisStore {
    /// Save the snapshot with its indexes and append `events` to the task's log in one
    /// script: one round trip, all or nothing (the tenant list aside, noted once per process).
    async fn save_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        // Encoded before anything is sent, so an encoding error writes nothing.
        let snapshot = encode(&task.clone_without_history())?;
        let events = events.iter().map(encode).collect::<AgentResult<Vec<_>>>()?;
        // Noted before the save, so the tenant list never misses a tenant with tasks.
        self.note_tenant(auth).await?;
        let keys = self.keys(auth);
        let (id, thread, state) = (
            task.id.as_str(),
            task.thread_id.as_str(),
            task.state().as_str(),
        );
        let events_key = keys.of(kind::TASK_EVENTS, id);
        let mut call = scripts::SAVE_TASK.prepare_invoke();
        call.key(keys.of(kind::TASK, id))
            .key(keys.of(kind::TASK_META, id))
            .key(keys.fixed(fixed::TASK_SEQ))
            .key(keys.fixed(fixed::TASKS))
            .key(keys.of(kind::TASKS_BY_THREAD, thread))
            .key(keys.of(kind::TASKS_BY_STATE, state))
            .key(keys.of(kind::TASKS_BY_THREAD_STATE, &format!("{state}:{thread}")))
            .key(&events_key)
            .arg(snapshot)
            .arg(id)
            .arg(thread)
            .arg(state)
            .arg(keys.base());
        for event in events {
            call.arg(event);
        }
        let outcome: i64 = call
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("save task", &e))?;
        if outcome < 0 {
            return Err(AgentError::storage(format!(
                "Redis key `{events_key}` is not a list, so task {id} was not saved; were keys \
                 under Keel's prefix changed by hand?"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl TaskManager for RedisStore {
    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>> {
        let key = self.keys(auth).of(kind::TASK, task_id.as_str());
        let text: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("GET task", &e))?;
        text.map(|text| decode(&key, &text)).transpose()
    }

    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<Task>> {
        let page_size = filter.effective_page_size()?;
        let after = parse_page_token(filter.page_token.as_deref())?;
        let keys = self.keys(auth);
        // Every filter combination has its own index, so a page costs O(log n + page).
        let index = match (&filter.thread_id, filter.state) {
            (None, None) => keys.fixed(fixed::TASKS),
            (Some(thread), None) => keys.of(kind::TASKS_BY_THREAD, thread.as_str()),
            (None, Some(state)) => keys.of(kind::TASKS_BY_STATE, state.as_str()),
            (Some(thread), Some(state)) => keys.of(
                kind::TASKS_BY_THREAD_STATE,
                &format!("{}:{}", state.as_str(), thread.as_str()),
            ),
        };
        let snapshot_prefix = keys.of(kind::TASK, "");
        // One more than a page tells whether another page follows.
        let (total, rows): (u64, Vec<(String, String, Option<String>)>) = scripts::LIST_TASKS
            .key(&index)
            .arg(after)
            .arg(page_size + 1)
            .arg(&snapshot_prefix)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list tasks", &e))?;
        let more = rows.len() > page_size;
        let mut items = Vec::with_capacity(page_size.min(rows.len()));
        let mut last_seq = None;
        for (id, seq, snapshot) in rows.into_iter().take(page_size) {
            let key = format!("{snapshot_prefix}{id}");
            let snapshot = snapshot.ok_or_else(|| {
                AgentError::storage(format!(
                    "Redis index `{index}` lists task {id} but `{key}` is missing; \
                     were keys under Keel's prefix deleted by hand?"
                ))
            })?;
            items.push(decode::<Task>(&key, &snapshot)?);
            last_seq = Some(seq);
        }
        Ok(Page {
            next_page_token: if more { last_seq } else { None },
            items,
            total_size: usize::try_from(total).unwrap_or(usize::MAX),
        })
    }

    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        self.list_tenants().await
    }

    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.save_with_events(auth, task, &[]).await
    }

    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        self.save_with_events(auth, task, events).await
    }

    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        let keys = self.keys(auth);
        // Checking the snapshot and appending in one script: an event can never land in the
        // log of a task that does not exist.
        let length: i64 = scripts::ADD_TASK_EVENT
            .key(keys.of(kind::TASK, task_id.as_str()))
            .key(keys.of(kind::TASK_EVENTS, task_id.as_str()))
            .arg(encode(event)?)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("append task event", &e))?;
        if length < 0 {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        Ok(())
    }

    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        let keys = self.keys(auth);
        let events_key = keys.of(kind::TASK_EVENTS, task_id.as_str());
        let (exists, events): (bool, Vec<String>) = redis::pipe()
            .atomic()
            .exists(keys.of(kind::TASK, task_id.as_str()))
            .lrange(&events_key, 0, -1)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read task events", &e))?;
        if !exists {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        events
            .iter()
            .map(|event| decode(&events_key, event))
            .collect()
    }
}
