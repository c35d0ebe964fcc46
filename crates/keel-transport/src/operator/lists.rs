//! The operator API's reads: agents, threads, tasks, pending approvals and runs, each list
//! paged on the server, each read scoped to the caller's tenant.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use keel_agent::reads::{RunPageQuery, TaskQuery};
use keel_core::{RunId, TaskId, TaskState, ThreadId};
use keel_runtime::TaskOrder;
use serde_json::Value;

use super::schema::{
    AgentView, AgentsAnswer, ApprovalView, ApprovalsAnswer, ErrorBody, ListQuery, RunsAnswer,
    RunsQuery, TaskQueryParams, TasksAnswer, ThreadDetail, ThreadListingView, ThreadsAnswer,
    ToolView,
};
use super::{answer, check_id, failure, tri, Asked, Caller, OperatorState};
use crate::variables::refuse;

/// How many queued items a thread's detail shows.
const DETAIL_QUEUE: usize = 100;
/// How many recent tasks a thread's detail shows.
const DETAIL_TASKS: u32 = 20;

fn to_json(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The server's agents: their cards' fields, their tools and their runs' limits.
#[utoipa::path(get, path = "/api/v1/agents", tag = "operator",
    responses(
        (status = 200, body = AgentsAnswer),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn agents(State(state): State<OperatorState>, _: Caller) -> Response {
    let agents = state
        .agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let executor = agent.handlers.executor();
            let card = executor.agent().card();
            // The stop rules' step limit always holds; the budget's may be tighter.
            let mut budget = executor.agent().budget().clone();
            let steps = executor.agent().max_steps();
            budget.max_steps = Some(budget.max_steps.map_or(steps, |max| max.min(steps)));
            AgentView {
                name: agent.name.clone(),
                description: card.description.clone(),
                version: card.version.clone(),
                url: agent.url.clone(),
                skills: to_json(&card.skills),
                capabilities: to_json(&card.capabilities),
                default: i == 0,
                tools: executor
                    .agent()
                    .tool_specs()
                    .into_iter()
                    .map(|spec| ToolView {
                        name: spec.name,
                        description: spec.description,
                        input_schema: spec.parameters,
                    })
                    .collect(),
                budget: to_json(&budget),
            }
        })
        .collect();
    Json(AgentsAnswer { agents }).into_response()
}

/// The tenant's threads, by their first task's creation, oldest first.
#[utoipa::path(get, path = "/api/v1/threads", tag = "operator",
    params(ListQuery),
    responses(
        (status = 200, body = ThreadsAnswer),
        (status = 400, body = ErrorBody, description = "`invalid_query`, `invalid_input`"),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn threads(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Asked(asked): Asked<ListQuery>,
) -> Response {
    let page = state
        .reads
        .threads(&auth, asked.page_size, asked.page_token)
        .await;
    answer(page.map(|page| {
        ThreadsAnswer {
            threads: page
                .items
                .into_iter()
                .map(|t| ThreadListingView {
                    thread_id: t.thread_id.to_string(),
                    first_task_id: t.first_task_id.to_string(),
                    agent: t.agent,
                })
                .collect(),
            next_page_token: page.next_page_token,
        }
    }))
}

/// One thread: its state, its queue and its recent tasks.
#[utoipa::path(get, path = "/api/v1/threads/{thread_id}", tag = "operator",
    params(("thread_id" = String, Path, description = "The thread")),
    responses(
        (status = 200, body = ThreadDetail),
        (status = 400, body = ErrorBody, description = "`invalid_id`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`thread_not_found`"),
    ))]
pub(super) async fn thread(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(thread_id): Path<String>,
) -> Response {
    let thread_id: ThreadId = tri!(check_id("thread_id", thread_id));
    let detail = async {
        let summary = state.reads.thread(&auth, &thread_id).await?;
        let queue = state
            .reads
            .thread_queue(&auth, &thread_id, DETAIL_QUEUE)
            .await?;
        let recent = state
            .reads
            .tasks(
                &auth,
                &TaskQuery {
                    thread_id: Some(thread_id.clone()),
                    order: TaskOrder::RecentlyUpdated { since: None },
                    page_size: Some(DETAIL_TASKS),
                    ..TaskQuery::default()
                },
            )
            .await?;
        Ok(ThreadDetail {
            thread_id: summary.thread_id.to_string(),
            terminated_at: summary.terminated_at,
            parent_thread_id: summary.parent_thread_id.map(|t| t.to_string()),
            children: to_json(&summary.children),
            queued: summary.queued,
            queue: to_json(&queue),
            recent_tasks: to_json(&recent.items),
        })
    };
    answer(detail.await)
}

/// The tenant's tasks, filtered and paged.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "operator",
    params(ListQuery),
    responses(
        (status = 200, body = TasksAnswer),
        (status = 400, body = ErrorBody,
            description = "`invalid_query`, `invalid_state`, `invalid_input`"),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn tasks(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Asked(asked): Asked<ListQuery>,
) -> Response {
    let task_state = match asked.state.as_deref().map(str::parse::<TaskState>) {
        None => None,
        Some(Ok(parsed)) => Some(parsed),
        Some(Err(_)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_state",
                format!("unknown task state {:?}", asked.state.unwrap_or_default()),
            )
        }
    };
    let task_query = TaskQuery {
        thread_id: asked.thread_id.map(ThreadId::from),
        state: task_state,
        agent: asked.agent,
        page_size: asked.page_size,
        page_token: asked.page_token,
        ..TaskQuery::default()
    };
    let page = state.reads.tasks(&auth, &task_query).await;
    answer(page.map(|page| TasksAnswer {
        tasks: to_json(&page.items),
        next_page_token: page.next_page_token,
        total_size: page.total_size,
    }))
}

/// One task, with its history.
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}", tag = "operator",
    params(("task_id" = String, Path, description = "The task"), TaskQueryParams),
    responses(
        (status = 200, body = Object, description = "The task, with its history"),
        (status = 400, body = ErrorBody, description = "`invalid_id`, `invalid_query`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`task_not_found`"),
    ))]
pub(super) async fn task(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(task_id): Path<String>,
    Asked(asked): Asked<TaskQueryParams>,
) -> Response {
    let task_id: TaskId = tri!(check_id("task_id", task_id));
    answer(
        state
            .reads
            .task_with_history(&auth, &task_id, asked.history_length)
            .await,
    )
}

/// A task's conversation: its own entries of its thread's history (input, answers, tool
/// calls and results), oldest first, read back from the thread's end (decision 251).
#[utoipa::path(get, path = "/api/v1/tasks/{task_id}/messages", tag = "operator",
    params(("task_id" = String, Path, description = "The task")),
    responses(
        (status = 200, body = Object,
            description = "`task_id`, `thread_id` and `messages`: history entries `{seq, message}`"),
        (status = 400, body = ErrorBody, description = "`invalid_id`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`task_not_found`"),
    ))]
pub(super) async fn task_messages(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(task_id): Path<String>,
) -> Response {
    let task_id: TaskId = tri!(check_id("task_id", task_id));
    let read = state.reads.task_messages(&auth, &task_id).await;
    answer(read.map(|(thread_id, messages)| {
        serde_json::json!({"task_id": task_id, "thread_id": thread_id, "messages": messages})
    }))
}

/// The actions waiting for a decision.
#[utoipa::path(get, path = "/api/v1/approvals", tag = "operator",
    params(ListQuery),
    responses(
        (status = 200, body = ApprovalsAnswer),
        (status = 400, body = ErrorBody, description = "`invalid_query`, `invalid_input`"),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn approvals(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Asked(asked): Asked<ListQuery>,
) -> Response {
    let thread_id = asked.thread_id.map(ThreadId::from);
    let page = state
        .reads
        .pending_approvals(&auth, thread_id.as_ref(), asked.page_size, asked.page_token)
        .await;
    answer(page.map(|page| {
        ApprovalsAnswer {
            approvals: page
                .items
                .into_iter()
                .map(|p| ApprovalView {
                    task_id: p.task_id.to_string(),
                    thread_id: p.thread_id.to_string(),
                    request: to_json(&p.request),
                })
                .collect(),
            next_page_token: page.next_page_token,
            total_size: page.total_size,
        }
    }))
}

/// Run records, newest first, by thread, task or agent.
#[utoipa::path(get, path = "/api/v1/runs", tag = "operator",
    params(RunsQuery),
    responses(
        (status = 200, body = RunsAnswer),
        (status = 400, body = ErrorBody, description = "`invalid_query`, `invalid_input`"),
        (status = 401, body = ErrorBody),
    ))]
pub(super) async fn runs(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Asked(asked): Asked<RunsQuery>,
) -> Response {
    let run_query = RunPageQuery {
        thread_id: asked.thread_id.map(ThreadId::from),
        task_id: asked.task_id.map(TaskId::from),
        agent: asked.agent,
        page_size: asked.page_size,
        page_token: asked.page_token,
    };
    let page = state.reads.runs_page(&auth, &run_query).await;
    answer(page.map(|page| RunsAnswer {
        runs: to_json(&page.items),
        next_page_token: page.next_page_token,
    }))
}

/// One run's report, redacted as persisted.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}", tag = "operator",
    params(("run_id" = String, Path, description = "The run")),
    responses(
        (status = 200, body = Object, description = "The run record"),
        (status = 400, body = ErrorBody, description = "`invalid_id`"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`run_not_found`"),
    ))]
pub(super) async fn run(
    State(state): State<OperatorState>,
    Caller(auth): Caller,
    Path(run_id): Path<String>,
) -> Response {
    let run_id: RunId = tri!(check_id("run_id", run_id));
    match state.reads.run(&auth, &run_id).await {
        Ok(Some(record)) => Json(record).into_response(),
        Ok(None) => refuse(StatusCode::NOT_FOUND, "run_not_found", "no such run"),
        Err(err) => failure(&err),
    }
}
