//! Listing tasks (A2A `ListTasks`): the query and the page, in Keel's models, shared by the
//! server's handlers and [`crate::A2aClient::list_tasks`].

use chrono::{DateTime, Utc};
use keel_core::{Task, TaskState, ThreadId};

/// Which tasks to list, and how much of each to return (A2A `ListTasksRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskListQuery {
    /// Only tasks of this thread (A2A `contextId`).
    pub thread_id: Option<ThreadId>,
    /// Only tasks in this state (A2A `status`).
    pub state: Option<TaskState>,
    /// At most this many tasks (1 to 100; 50 when unset).
    pub page_size: Option<u32>,
    /// Where to continue: a [`TaskList::next_page_token`] from an earlier call.
    pub page_token: Option<String>,
    /// Keep only this many most recent messages of each task's history.
    pub history_length: Option<usize>,
    /// Only tasks whose status changed at or after this time.
    pub status_timestamp_after: Option<DateTime<Utc>>,
    /// Include each task's artifacts (A2A's default is to leave them out).
    pub include_artifacts: bool,
}

/// One page of tasks (A2A `ListTasksResponse`), most recently updated first.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskList {
    /// The tasks of this page.
    pub tasks: Vec<Task>,
    /// The token for the next page; `None` on the last page (A2A sends `""`).
    pub next_page_token: Option<String>,
    /// The page size the server used.
    pub page_size: u32,
    /// How many tasks match the query in all.
    pub total_size: usize,
}

impl TaskListQuery {
    /// The default page size.
    pub const DEFAULT_PAGE_SIZE: u32 = 50;
    /// The largest page size.
    pub const MAX_PAGE_SIZE: u32 = 100;
}
