//! The operator API's bodies and answers as types, so that the OpenAPI document is derived
//! from what the handlers take and give. Keel's own models (a task, a run record, a queued
//! item) are carried as JSON objects: their shape is documented where they are defined.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// An error answer: `{"error": {"code", "message"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// A stable, snake_case name of the error (`task_not_found`, `invalid_body`, ...).
    pub code: String,
    /// A sentence for people.
    pub message: String,
}

/// One tool an agent offers its model.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ToolView {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON schema of its arguments.
    #[schema(value_type = Object)]
    pub input_schema: Value,
}

/// An agent: its card's fields and its tools.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentView {
    /// The name it is served under (`/agents/{name}/`).
    pub name: String,
    /// The card's description.
    pub description: String,
    /// The card's version.
    pub version: String,
    /// The URL it is served at (its JSON-RPC endpoint, as its served card gives it).
    pub url: String,
    /// The card's skills.
    #[schema(value_type = Vec<Object>)]
    pub skills: Value,
    /// The card's capabilities.
    #[schema(value_type = Object)]
    pub capabilities: Value,
    /// Whether a message that names no agent goes to this one.
    pub default: bool,
    /// Every tool it offers its model, built-in ones included.
    pub tools: Vec<ToolView>,
    /// The limits of each of its runs, as a run context's budget names them (`max_steps`,
    /// `max_llm_calls`, `max_tool_calls`, `max_input_tokens`, `max_output_tokens`,
    /// `max_runtime_seconds`, `max_cost_micros`): its budget, with `max_steps` the tighter of
    /// it and its stop rules' step limit; a limit it does not set is absent. A caller's run
    /// context can only narrow them.
    #[schema(value_type = Object)]
    pub budget: Value,
}

/// `GET /api/v1/agents`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentsAnswer {
    /// The agents of this server, the default first.
    pub agents: Vec<AgentView>,
}

/// One thread of `GET /api/v1/threads`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ThreadListingView {
    /// The thread.
    pub thread_id: String,
    /// Its first task.
    pub first_task_id: String,
    /// The agent of its first task.
    pub agent: Option<String>,
}

/// `GET /api/v1/threads`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ThreadsAnswer {
    /// Threads by their first task's creation, oldest first.
    pub threads: Vec<ThreadListingView>,
    /// The next page's token; `null` on the last page.
    pub next_page_token: Option<String>,
}

/// `GET /api/v1/threads/{thread_id}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ThreadDetail {
    /// The thread.
    pub thread_id: String,
    /// When it was terminated, if it was.
    #[schema(value_type = Option<Object>)]
    pub terminated_at: Option<Value>,
    /// The thread that started it as a subagent.
    pub parent_thread_id: Option<String>,
    /// Its subagents.
    #[schema(value_type = Vec<Object>)]
    pub children: Value,
    /// How many items wait in its queue.
    pub queued: usize,
    /// The first items of its queue, oldest first.
    #[schema(value_type = Vec<Object>)]
    pub queue: Value,
    /// Its most recently updated tasks, newest first, without history.
    #[schema(value_type = Vec<Object>)]
    pub recent_tasks: Value,
}

/// `GET /api/v1/tasks`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TasksAnswer {
    /// The page's tasks (snapshots without history).
    #[schema(value_type = Vec<Object>)]
    pub tasks: Value,
    /// The next page's token; `null` on the last page.
    pub next_page_token: Option<String>,
    /// How many tasks match in all.
    pub total_size: usize,
}

/// One action waiting for a decision.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ApprovalView {
    /// The task that waits.
    pub task_id: String,
    /// Its thread.
    pub thread_id: String,
    /// The request; answer it with its `request_id`.
    #[schema(value_type = Object)]
    pub request: Value,
}

/// `GET /api/v1/approvals`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ApprovalsAnswer {
    /// The page's pending approvals, oldest task first.
    pub approvals: Vec<ApprovalView>,
    /// The next page's token; `null` on the last page.
    pub next_page_token: Option<String>,
    /// How many `input-required` tasks the store matched (before the approval filter).
    pub total_size: usize,
}

/// `GET /api/v1/runs`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunsAnswer {
    /// Run records, newest first.
    #[schema(value_type = Vec<Object>)]
    pub runs: Value,
    /// The next page's token; `null` on the last page.
    pub next_page_token: Option<String>,
}

/// The query of the task, approval and thread lists.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only this thread's tasks.
    pub thread_id: Option<String>,
    /// Only tasks in this state (`submitted`, `working`, `input-required`, `completed`, ...).
    pub state: Option<String>,
    /// Only tasks sent to this agent.
    pub agent: Option<String>,
    /// At most this many (1-100, default 50).
    pub page_size: Option<u32>,
    /// The previous page's `next_page_token`.
    pub page_token: Option<String>,
}

/// The query of `GET /api/v1/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunsQuery {
    /// Only this thread's runs.
    pub thread_id: Option<String>,
    /// Only this task's runs.
    pub task_id: Option<String>,
    /// Only this agent's runs.
    pub agent: Option<String>,
    /// At most this many (1-100, default 50).
    pub page_size: Option<u32>,
    /// The previous page's `next_page_token`.
    pub page_token: Option<String>,
}

/// The query of `GET /api/v1/tasks/{task_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TaskQueryParams {
    /// Only the last this many messages of its history.
    pub history_length: Option<usize>,
}

/// The query of the event streams.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Resume after this event id (as `Last-Event-ID`, which wins when both are given).
    pub after: Option<String>,
}

/// The optional body of `POST /api/v1/tasks/{task_id}/cancel`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub(crate) struct CancelBody {
    /// Why, recorded with the cancellation.
    pub reason: Option<String>,
}

/// An approver's choice.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Decision {
    /// Run the action.
    Approve,
    /// Do not run it; the model sees a tool error.
    Deny,
}

/// The body of `POST /api/v1/tasks/{task_id}/approvals/{request_id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionBody {
    /// `approve` or `deny`.
    pub decision: Decision,
    /// Why, recorded with the decision.
    pub reason: Option<String>,
}

/// The body of `POST /api/v1/threads/{thread_id}/messages`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageBody {
    /// The message's text.
    pub text: String,
    /// The agent to send it to (a name of `GET /api/v1/agents`); the default one without.
    pub agent: Option<String>,
    /// Answer at once with the task, rather than when its turn rests.
    #[serde(default)]
    pub return_immediately: bool,
}

/// One event of a stream: the `data:` of an SSE event.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventView {
    /// The task whose log holds it.
    pub task_id: String,
    /// Its sequence number in that log, from 1 without gaps.
    pub seq: u64,
    /// The event (a status or artifact update, a message).
    #[schema(value_type = Object)]
    pub event: Value,
}
