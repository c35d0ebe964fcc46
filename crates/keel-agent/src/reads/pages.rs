//! Paged lists that no store indexes as such: the tenant's threads (read off the task list)
//! and run records (the run store answers newest first up to a limit; a page token marks
//! where a page ended so the next one neither repeats nor skips a record).

use std::collections::HashMap;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use keel_core::{AgentError, AgentResult, RunId, Task, TaskId, ThreadId};
use keel_runtime::{AuthContext, ListTasksFilter, RunQuery, RunRecord, TaskOrder};
use serde::{Deserialize, Serialize};

use super::{Page, Reads};
use crate::task_meta::EngineMeta;

/// One thread as [`Reads::threads`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadListing {
    /// The thread.
    pub thread_id: ThreadId,
    /// Its first task: the one whose creation placed the thread in the list.
    pub first_task_id: TaskId,
    /// The agent the first task was sent to, when it says.
    pub agent: Option<String>,
}

/// A page of [`Reads::threads`] or [`Reads::runs_page`]: no total, since neither list is
/// counted by a store.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    /// The items, in the list's order.
    pub items: Vec<T>,
    /// Pass this back to get the next page; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// Which run records [`Reads::runs_page`] lists, and which page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunPageQuery {
    /// Only runs of this thread.
    pub thread_id: Option<ThreadId>,
    /// Only runs of this task.
    pub task_id: Option<TaskId>,
    /// Only runs of this agent.
    pub agent: Option<String>,
    /// At most this many (default 50, at most 100; zero is [`AgentError::InvalidInput`]).
    pub page_size: Option<u32>,
    /// A previous page's `next_page_token`.
    pub page_token: Option<String>,
}

/// Where a page of runs ended: the last record's time, and the ids of the records at exactly
/// that time already handed out (several runs may share a timestamp; the store's order among
/// them is not fixed, so the ids, not a count, say which were seen).
#[derive(Debug, Serialize, Deserialize)]
struct RunCursor {
    at: DateTime<Utc>,
    seen: Vec<RunId>,
}

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 100;

fn page_size(size: Option<u32>) -> AgentResult<usize> {
    match size {
        None => Ok(DEFAULT_PAGE),
        Some(0) => Err(AgentError::invalid_input("page_size", "must be at least 1")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(MAX_PAGE).min(MAX_PAGE)),
    }
}

/// The task store's pages of a filter, read in turn for a page of `size` items the caller
/// keeps of them. No store page asks for more than still fits and each is consumed whole, so
/// the store's token is exactly where the next page starts.
pub(super) struct StorePages {
    filter: ListTasksFilter,
    size: usize,
    total_size: Option<usize>,
    ended: bool,
}

impl StorePages {
    pub(super) fn new(filter: ListTasksFilter, size: usize) -> Self {
        Self {
            filter,
            size,
            total_size: None,
            ended: false,
        }
    }

    /// The next store page's tasks, the caller having kept `kept` items; `None` once the
    /// page is full or the list has ended.
    pub(super) async fn next(
        &mut self,
        reads: &Reads,
        auth: &AuthContext,
        kept: usize,
    ) -> AgentResult<Option<Vec<Task>>> {
        if self.ended || kept >= self.size {
            return Ok(None);
        }
        self.filter.page_size = Some(u32::try_from(self.size - kept).unwrap_or(u32::MAX));
        let page = reads
            .runtime
            .task_manager()
            .list_tasks(auth, &self.filter)
            .await?;
        self.total_size.get_or_insert(page.total_size);
        self.filter.page_token = page.next_page_token;
        self.ended = self.filter.page_token.is_none();
        Ok(Some(page.items))
    }

    /// The page of `items`: the token where the next starts, the store's count of matches.
    pub(super) fn page<T>(self, items: Vec<T>) -> Page<T> {
        Page {
            items,
            next_page_token: self.filter.page_token,
            total_size: self.total_size.unwrap_or_default(),
        }
    }
}

fn bad_token(token: &str) -> AgentError {
    AgentError::invalid_input(
        "page_token",
        format!("`{token}` is not a page token this server issued"),
    )
}

impl RunCursor {
    fn token(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    fn parse(token: &str) -> AgentResult<Self> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or_else(|| bad_token(token))
    }
}

impl Reads {
    /// One page of the tenant's threads, in the order their first tasks were created (oldest
    /// first). The task store's pages are read in turn and a thread is listed at its first
    /// task, so the token (the task store's own) neither repeats nor skips a thread.
    pub async fn threads(
        &self,
        auth: &AuthContext,
        page_size_asked: Option<u32>,
        page_token: Option<String>,
    ) -> AgentResult<ListPage<ThreadListing>> {
        let size = page_size(page_size_asked)?;
        let filter = ListTasksFilter {
            page_token: page_token.filter(|t| !t.is_empty()),
            order: TaskOrder::Created,
            ..ListTasksFilter::default()
        };
        // Each thread's first task, read once per call.
        let mut firsts: HashMap<ThreadId, Option<TaskId>> = HashMap::new();
        let mut pages = StorePages::new(filter, size);
        let mut items = Vec::new();
        while let Some(tasks) = pages.next(self, auth, items.len()).await? {
            for task in tasks {
                if !firsts.contains_key(&task.thread_id) {
                    let first = self.first_task(auth, &task.thread_id).await?;
                    firsts.insert(task.thread_id.clone(), first);
                }
                if firsts.get(&task.thread_id).and_then(Option::as_ref) == Some(&task.id) {
                    items.push(listing(task));
                }
            }
        }
        let page = pages.page(items);
        Ok(ListPage {
            items: page.items,
            next_page_token: page.next_page_token,
        })
    }

    /// The id of the thread's oldest task.
    async fn first_task(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Option<TaskId>> {
        let filter = ListTasksFilter {
            thread_id: Some(thread_id.clone()),
            page_size: Some(1),
            order: TaskOrder::Created,
            ..ListTasksFilter::default()
        };
        let page = self
            .runtime
            .task_manager()
            .list_tasks(auth, &filter)
            .await?;
        Ok(page.items.into_iter().next().map(|t| t.id))
    }

    /// One page of run records matching `query`, newest first (their reports redacted as
    /// persisted).
    pub async fn runs_page(
        &self,
        auth: &AuthContext,
        query: &RunPageQuery,
    ) -> AgentResult<ListPage<RunRecord>> {
        let size = page_size(query.page_size)?;
        let cursor = match query.page_token.as_deref().filter(|t| !t.is_empty()) {
            Some(token) => Some(RunCursor::parse(token)?),
            None => None,
        };
        let seen = cursor.as_ref().map_or(0, |c| c.seen.len());
        let store_query = RunQuery {
            task_id: query.task_id.clone(),
            thread_id: query.thread_id.clone(),
            agent_name: query.agent.clone(),
            // `until` is exclusive: one nanosecond on includes the records at the cursor's
            // time, of which those already seen are dropped below.
            until: cursor
                .as_ref()
                .map(|c| c.at + chrono::Duration::nanoseconds(1)),
            // One more than a page says whether another follows.
            limit: Some(size + seen + 1),
            ..RunQuery::default()
        };
        let mut records: Vec<RunRecord> = self
            .runs(auth, &store_query)
            .await?
            .into_iter()
            .filter(|r| match &cursor {
                Some(c) => !(r.recorded_at == c.at && c.seen.contains(&r.run_id)),
                None => true,
            })
            .collect();
        let more = records.len() > size;
        records.truncate(size);
        let next_page_token = match records.last() {
            Some(last) if more => {
                let at = last.recorded_at;
                let mut seen: Vec<RunId> = records
                    .iter()
                    .filter(|r| r.recorded_at == at)
                    .map(|r| r.run_id.clone())
                    .collect();
                // Records at that time seen on earlier pages stay seen.
                if let Some(c) = cursor.filter(|c| c.at == at) {
                    seen.extend(c.seen);
                }
                Some(RunCursor { at, seen }.token())
            }
            _ => None,
        };
        Ok(ListPage {
            items: records,
            next_page_token,
        })
    }
}

fn listing(task: Task) -> ThreadListing {
    ThreadListing {
        agent: EngineMeta::of(&task.metadata).agent,
        first_task_id: task.id,
        thread_id: task.thread_id,
    }
}
