//! The A2A command line against any agent: `keel send`, `keel tasks list|get|cancel|
//! subscribe|approve` and `keel run --url`, through Keel's own A2A client.

use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;

use futures::StreamExt;
use keel::core::{AgentError, AgentResult, Message, Part, Task, TaskId, TaskState};
use keel::transport::{
    stream_event_json, task_json, A2aClient, SendMessageOptions, StreamEvent, TaskEventStream,
    TaskListQuery, API_KEY_HEADER,
};
use serde_json::{json, Value};

use keel::agent::approval_part;

use crate::render::{approval_text, colour_stderr, out, Styles};
use crate::run::{exit_status, pending_approval, print_answer, says_what_went_wrong, Approver};

/// Where the agent is and how to be let in.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    /// The agent's base URL (its card is under it).
    pub url: String,
    /// Sent as `X-API-Key` when given.
    pub api_key: Option<String>,
}

impl Remote {
    fn client(&self) -> Result<A2aClient, String> {
        if !self.url.contains("://") {
            return Err(format!(
                "--url `{}` names no scheme; write http://{} (or https://)",
                self.url, self.url
            ));
        }
        let client = A2aClient::new(self.url.clone());
        let Some(key) = &self.api_key else {
            return Ok(client);
        };
        let mut value = reqwest::header::HeaderValue::from_str(key)
            .map_err(|_| "--api-key holds characters an HTTP header cannot carry".to_owned())?;
        value.set_sensitive(true);
        let name = reqwest::header::HeaderName::from_bytes(API_KEY_HEADER.as_bytes())
            .map_err(|err| err.to_string())?;
        let headers = reqwest::header::HeaderMap::from_iter([(name, value)]);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|err| format!("cannot make an HTTP client: {err}"))?;
        Ok(client.with_http_client(http))
    }

    /// Await a client call, its error said so a user can act on it.
    async fn call<T>(&self, call: impl Future<Output = AgentResult<T>>) -> Result<T, String> {
        match call.await {
            Ok(answer) => Ok(answer),
            Err(err) => Err(self.explain(err).await),
        }
    }

    /// An error as the user reads it. When no agent answers at the URL, the server's own
    /// card (at its origin) names the agent it does serve, if it serves one there.
    async fn explain(&self, err: AgentError) -> String {
        let said = err.to_string();
        let AgentError::InvalidInput { field, .. } = &err else {
            return said;
        };
        let origin = reqwest::Url::parse(&self.url)
            .ok()
            .filter(|url| url.path() != "/")
            .map(|url| url.origin().ascii_serialization());
        let (Some(origin), true) = (origin, field == "url") else {
            return said;
        };
        match A2aClient::new(origin.clone()).get_card().await {
            Ok(card) => format!("{said}; {origin}/ serves the agent `{}`", card.name),
            Err(_) => said,
        }
    }
}

/// A task as one line for people: its id, thread, state and what its status says.
fn task_line(task: &Task) -> String {
    let said = task.status().text().unwrap_or_default().replace('\n', " ");
    format!(
        "{}  {}  {:<15} {}",
        task.id,
        task.thread_id,
        task.state().to_string(),
        said
    )
}

/// Print a task: A2A JSON with `--json`, else its answer on stdout and its state on stderr.
fn print_task(task: &Task, json: bool) {
    if json {
        out(task_json(task));
        return;
    }
    if let Some(text) = task.status().text().filter(|text| !text.is_empty()) {
        if says_what_went_wrong(task.state()) {
            eprintln!("{}", Styles::new(colour_stderr()).bad.apply_to(text));
        } else {
            out(text);
        }
    }
    eprintln!(
        "keel: task {} (thread {}) is {}",
        task.id,
        task.thread_id,
        task.state()
    );
    if let Some(request) = pending_approval(task) {
        eprintln!(
            "{}\nkeel: request {}; answer with `keel tasks approve {}` (or `--deny`)",
            approval_text(&request),
            request.request_id,
            task.id
        );
    }
}

/// `keel send`: one message, answered when the task rests (or at once, when asked).
pub(crate) async fn send(
    remote: Remote,
    text: String,
    thread: Option<String>,
    task: Option<String>,
    return_immediately: bool,
    json: bool,
) -> Result<ExitCode, String> {
    let mut message = Message::user(text);
    message.thread_id = thread.map(Into::into);
    message.task_id = task.map(Into::into);
    let options = SendMessageOptions {
        return_immediately,
        ..SendMessageOptions::default()
    };
    let task = remote
        .call(remote.client()?.send_message(message, options))
        .await?;
    print_task(&task, json);
    if return_immediately {
        return Ok(ExitCode::SUCCESS);
    }
    Ok(exit_status(task.state()))
}

/// `keel tasks list`.
pub(crate) async fn list(
    remote: Remote,
    thread: Option<String>,
    state: Option<String>,
    limit: u32,
    json: bool,
) -> Result<ExitCode, String> {
    let state = state
        .map(|s| {
            serde_json::from_value::<TaskState>(json!(s))
                .map_err(|_| format!("--state `{s}` is not a task state (completed, working, ...)"))
        })
        .transpose()?;
    let query = TaskListQuery {
        thread_id: thread.map(Into::into),
        state,
        page_size: Some(limit),
        ..TaskListQuery::default()
    };
    let page = remote.call(remote.client()?.list_tasks(&query)).await?;
    if json {
        let tasks: Vec<Value> = page.tasks.iter().map(task_json).collect();
        out(json!({
            "tasks": tasks,
            "nextPageToken": page.next_page_token.unwrap_or_default(),
            "pageSize": page.page_size,
            "totalSize": page.total_size,
        }));
    } else {
        for task in &page.tasks {
            out(task_line(task));
        }
        eprintln!("keel: {} of {} tasks", page.tasks.len(), page.total_size);
    }
    Ok(ExitCode::SUCCESS)
}

/// `keel tasks get`.
pub(crate) async fn get(remote: Remote, id: String, json: bool) -> Result<ExitCode, String> {
    let task = remote
        .call(remote.client()?.get_task(&TaskId::from(id), None))
        .await?;
    print_task(&task, json);
    Ok(exit_status(task.state()))
}

/// `keel tasks cancel`.
pub(crate) async fn cancel(
    remote: Remote,
    id: String,
    reason: Option<String>,
    json: bool,
) -> Result<ExitCode, String> {
    let task = remote
        .call(remote.client()?.cancel_task(&TaskId::from(id), reason))
        .await?;
    print_task(&task, json);
    Ok(ExitCode::SUCCESS)
}

/// `keel tasks approve`: the decision about the action a task waits to have approved, sent
/// as a message to the task with a data part `{"approval": {...}}`.
pub(crate) async fn approve(
    remote: Remote,
    id: String,
    request_id: Option<String>,
    deny: bool,
    reason: Option<String>,
    json: bool,
) -> Result<ExitCode, String> {
    let client = remote.client()?;
    let task_id = TaskId::from(id);
    let request_id = match request_id {
        Some(request_id) => request_id,
        // A task waits for one approval at a time: that one is meant.
        None => {
            let task = remote.call(client.get_task(&task_id, Some(0))).await?;
            pending_approval(&task)
                .ok_or_else(|| {
                    format!(
                        "task {} waits for no approval (it is {})",
                        task.id,
                        task.state()
                    )
                })?
                .request_id
        }
    };
    let mut approval = json!({
        "requestId": request_id,
        "decision": if deny { "deny" } else { "approve" },
    });
    if let Some(reason) = reason {
        approval["reason"] = json!(reason);
    }
    let mut message = Message::user("");
    message.parts = vec![Part::data(json!({ "approval": approval }))];
    message.task_id = Some(task_id);
    let task = remote
        .call(client.send_message(message, SendMessageOptions::default()))
        .await?;
    print_task(&task, json);
    Ok(exit_status(task.state()))
}

/// `keel threads compact`: the thread's history compacted on the agent's server.
pub(crate) async fn compact(
    remote: Remote,
    request: keel::llm::HistoryCompactionRequest,
    json: bool,
) -> Result<ExitCode, String> {
    let thread = request.thread_id.clone().unwrap_or_default();
    let client = remote.client()?;
    // The card first, as every other command reads it: a URL where no agent answers is told
    // as such (with the agents the server has), not as the endpoint's bare 404.
    remote.call(client.get_card()).await?;
    let result = remote.call(client.compact_thread(&request)).await?;
    print_compaction(&thread, &result, json);
    Ok(ExitCode::SUCCESS)
}

/// A compaction's result: JSON with `json`, else one line of what it kept.
pub(crate) fn print_compaction(
    thread: &keel::core::ThreadId,
    result: &keel::llm::HistoryCompactionResult,
    json: bool,
) {
    if json {
        out(serde_json::to_value(result).unwrap_or_default());
    } else {
        let summary = if result.summary_created {
            ", a summary written"
        } else {
            ""
        };
        out(format!(
            "thread {thread}: {} -> {} messages, {} -> {} tokens{summary}",
            result.before_messages,
            result.after_messages,
            result.before_tokens,
            result.after_tokens
        ));
    }
}

/// `keel tasks subscribe`: follow a task until its final status.
pub(crate) async fn subscribe(remote: Remote, id: String, json: bool) -> Result<ExitCode, String> {
    let stream = remote
        .call(remote.client()?.subscribe(&TaskId::from(id)))
        .await?;
    follow(stream, json).await
}

/// `keel run --url`: the prompt sent streaming, the task followed live. When the task stops
/// to wait for an approval, the action is shown and the approver's decision is sent to the
/// task as the approval data part, streaming again until the task rests for good.
pub(crate) async fn run(
    remote: Remote,
    prompt: String,
    thread: Option<String>,
    approver: Approver,
    json: bool,
) -> Result<ExitCode, String> {
    let client = remote.client()?;
    let s = Styles::new(colour_stderr());
    let mut message = Message::user(prompt);
    message.thread_id = thread.map(Into::into);
    loop {
        let stream = remote.call(client.send_streaming_message(message)).await?;
        let seen = follow_stream(stream, json).await?;
        let (Some(TaskState::InputRequired), Some(task_id)) = (seen.state, &seen.task_id) else {
            return finish(seen, json);
        };
        // Status updates carry no task metadata: the pending request is on the task.
        let task = remote.call(client.get_task(task_id, Some(0))).await?;
        let Some(request) = pending_approval(&task) else {
            return finish(seen, json);
        };
        eprintln!("{}", s.warn.apply_to(approval_text(&request)));
        let (outcome, by) = approver.decide(&request).await?;
        let reason = format!("answered on {by}");
        let mut decision = Message::user("");
        decision.parts = vec![approval_part(&request.request_id, outcome, Some(&reason))];
        decision.task_id = Some(task.id.clone());
        decision.thread_id = Some(task.thread_id.clone());
        message = decision;
    }
}

/// What a followed stream showed: the last state, the task and its last words.
struct Seen {
    state: Option<TaskState>,
    task_id: Option<TaskId>,
    answer: String,
    /// The artifacts' text shown on stderr as they came.
    shown: String,
}

/// Print a task's stream as it comes (A2A `StreamResponse` JSON lines with `json`), then
/// the answer; the exit status follows the last state seen.
async fn follow(stream: TaskEventStream, json: bool) -> Result<ExitCode, String> {
    let seen = follow_stream(stream, json).await?;
    finish(seen, json)
}

/// The answer on stdout and the state on stderr (with `json`, the events said it all); the
/// exit status of the last state.
fn finish(seen: Seen, json: bool) -> Result<ExitCode, String> {
    let shown = seen.shown.contains(seen.answer.as_str());
    let failed = seen.state.is_some_and(says_what_went_wrong);
    if !json && failed && !seen.answer.is_empty() {
        let s = Styles::new(colour_stderr());
        eprintln!("{}", s.bad.apply_to(&seen.answer));
    } else if !json
        && !seen.answer.is_empty()
        && print_answer(
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
            shown,
        )
    {
        out(seen.answer);
    }
    let state = seen
        .state
        .ok_or("the agent's stream ended before it named a task")?;
    if !json {
        eprintln!("keel: {state}");
    }
    Ok(exit_status(state))
}

/// Print a stream's events as they come, until it ends.
async fn follow_stream(mut stream: TaskEventStream, json: bool) -> Result<Seen, String> {
    let s = Styles::new(colour_stderr());
    let mut state = None;
    let mut task_id = None;
    let mut answer = String::new();
    let mut shown = String::new();
    while let Some(event) = stream.next().await {
        let event = event.map_err(|err| err.to_string())?;
        if json {
            out(stream_event_json(&event));
        }
        match &event {
            StreamEvent::Task(task) => {
                state = Some(task.state());
                task_id = Some(task.id.clone());
                if !json {
                    eprintln!(
                        "{}",
                        s.dim
                            .apply_to(format!("· task {} {}", task.id, task.state()))
                    );
                }
                answer = task.status().text().unwrap_or_default();
            }
            StreamEvent::StatusUpdate {
                task_id: id,
                status,
                ..
            } => {
                state = Some(status.state);
                task_id = Some(id.clone());
                answer = status.text().unwrap_or_default();
                if !json {
                    eprintln!("{}", s.dim.apply_to(format!("· {}", status.state)));
                }
            }
            StreamEvent::ArtifactUpdate { artifact, .. } => {
                if !json {
                    let text: String = artifact
                        .parts
                        .iter()
                        .filter_map(Part::as_text)
                        .collect::<Vec<_>>()
                        .join("");
                    eprintln!("{}", s.tool.apply_to(format!("· artifact: {text}")));
                    shown.push_str(&text);
                }
            }
            StreamEvent::Message(message) => {
                state = Some(TaskState::Completed);
                answer = message.text();
            }
        }
    }
    Ok(Seen {
        state,
        task_id,
        answer,
        shown,
    })
}
