//! `keel run` and `keel chat`: an agent of `keel.toml` (or the demo agent) run in this process
//! on the configured store, shown live, with approvals asked on the terminal.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use keel::agent::{AgentExecutor, ExecutorConfig, SendOptions};
use keel::core::{
    ApprovalDecision, ApprovalOutcome, ApprovalRequest, Message, Task, TaskId, TaskState,
};
use keel::services::AuthContext;
use keel::transport::callbacks::HttpCallbacks;
use keel::transport::{AgentsServer, AGENTS_PATH};
use keel::{DefaultRuntime, StoreConfig};

use crate::render::{approval_text, out, Renderer};

/// The tenant of a caller that shows no API key: the one `keel serve` gives such callers, so
/// that `keel run` and `keel serve` on one store see the same tasks and runs.
pub(crate) fn local_tenant() -> AuthContext {
    AuthContext::new("default-app", "default-user")
}

/// Where the agents come from and where their work is kept.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// `--config`, else `./keel.toml` when present, else the demo agent.
    pub config: Option<PathBuf>,
    /// `--store`, over the file's.
    pub store: Option<String>,
    /// `--redis-prefix`, over the file's.
    pub redis_prefix: Option<String>,
    /// The model of the demo agent (agents from a file name their own).
    pub llm: String,
}

impl Source {
    /// The file to read, if any.
    fn file(&self) -> Option<PathBuf> {
        match &self.config {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(keel::config::DEFAULT_CONFIG_FILE)).filter(|p| p.exists()),
        }
    }

    /// The file, loaded, if there is one (else the demo agent is meant).
    pub(crate) fn loaded(&self) -> Result<Option<keel::config::LoadedConfig>, String> {
        self.file()
            .map(|path| keel::Config::from_path(&path).map_err(|err| err.to_string()))
            .transpose()
    }

    /// The store: the flag's, else the file's, else `sqlite:./keel.db`.
    pub(crate) fn store(
        &self,
        file: Option<&keel::config::LoadedConfig>,
    ) -> Result<StoreConfig, String> {
        let spec = match (&self.store, file) {
            (Some(spec), _) => spec.clone(),
            (None, Some(loaded)) => loaded.server.store.value().to_owned(),
            (None, None) => "sqlite:./keel.db".to_owned(),
        };
        let mut store = StoreConfig::parse(&spec).map_err(|err| err.to_string())?;
        if let StoreConfig::Redis { prefix, .. } = &mut store {
            *prefix = match (&self.redis_prefix, file) {
                (Some(p), _) => p.clone(),
                (None, Some(loaded)) => loaded.server.redis_prefix.clone(),
                (None, None) => "keel:".to_owned(),
            };
        }
        Ok(store)
    }

    /// The runtime on the configured store, without any agent (for `keel runs`). A SQLite
    /// file that does not exist is not created: reading finds nothing there, and the error
    /// names the file it looked at.
    pub(crate) async fn runtime(&self) -> Result<DefaultRuntime, String> {
        let store = self.existing_store()?;
        crate::open_runtime(&store, None, Vec::new()).await
    }

    /// The configured store, for a command that only reads or rewrites what is there (`keel
    /// runs`, `keel threads compact`): a SQLite file that does not exist is refused, not
    /// created, and the error names the file it looked at.
    pub(crate) fn existing_store(&self) -> Result<StoreConfig, String> {
        let store = self.store(self.loaded()?.as_ref())?;
        if let StoreConfig::Sqlite(path) = &store {
            if !path.exists() {
                return Err(format!(
                    "no store at {}: nothing has run here yet (pass --store or --config to read another)",
                    path.display()
                ));
            }
        }
        Ok(store)
    }

    /// The executor of agent `name` (default: the file's default agent, or the demo agent).
    ///
    /// Asynchronous tools answer later on a callback route, which `keel serve` serves and an
    /// in-process run has no server for: so the run listens on `127.0.0.1:0` for the same
    /// route (`/agents/{name}/callbacks/{call_id}`, one per agent of the file) while the
    /// process lives, and tools are given callback URLs there.
    pub(crate) async fn executor(&self, name: Option<&str>) -> Result<AgentExecutor, String> {
        let mut chosen = self.executors(name, false).await?;
        Ok(chosen.remove(0))
    }

    /// The executors of agent `name`, else (`all`) of every agent of the file, else of its
    /// default agent; never empty. Served callbacks as [`Self::executor`] says.
    pub(crate) async fn executors(
        &self,
        name: Option<&str>,
        all: bool,
    ) -> Result<Vec<AgentExecutor>, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| format!("cannot listen for tool callbacks: {err}"))?;
        let local = listener.local_addr().map_err(|err| err.to_string())?;
        let base = format!("http://{local}/");
        let callbacks_of = move |agent: &str| {
            HttpCallbacks::shared(AgentsServer::agent_url(&base, agent).trim_end_matches('/'))
        };
        let Some(path) = self.file() else {
            if let Some(name) = name.filter(|n| *n != "keel-demo") {
                return Err(format!(
                    "no agent `{name}`: there is no keel.toml here (give --config FILE)"
                ));
            }
            let llm = keel::llm::llm_from_spec(&self.llm).map_err(|err| err.to_string())?;
            let runtime = crate::open_runtime(&self.store(None)?, Some(llm), Vec::new()).await?;
            let agent = keel::demo::agent().map_err(|err| err.to_string())?;
            let agent_name = agent.card().name.clone();
            let executor = AgentExecutor::with_config(
                agent,
                Arc::new(runtime),
                ExecutorConfig {
                    callbacks: Some(callbacks_of(&agent_name)),
                    ..ExecutorConfig::default()
                },
            );
            serve_callbacks(listener, [(agent_name, executor.clone())]);
            return Ok(vec![executor]);
        };
        let loaded = keel::Config::from_path(&path).map_err(|err| err.to_string())?;
        let runtime = crate::open_runtime(&self.store(Some(&loaded))?, None, Vec::new()).await?;
        let lease_ttl = Duration::from_secs_f64(loaded.server.lease_ttl_seconds);
        let async_tool_timeout = Duration::from_secs_f64(loaded.server.async_tool_timeout_seconds);
        let agents = loaded
            .agents()
            .executor_config(move |agent| ExecutorConfig {
                lease_ttl,
                async_tool_timeout,
                callbacks: Some(callbacks_of(agent)),
                ..ExecutorConfig::default()
            })
            .connect(Arc::new(runtime))
            .await
            .map_err(|err| err.to_string())?;
        serve_callbacks(
            listener,
            agents.iter().map(|a| (a.name.clone(), a.executor.clone())),
        );
        if all && name.is_none() {
            return Ok(agents.iter().map(|a| a.executor.clone()).collect());
        }
        let agent = match name {
            Some(name) => agents.get(name).ok_or_else(|| {
                let known: Vec<String> = agents.iter().map(|a| format!("`{}`", a.name)).collect();
                format!(
                    "{} declares no agent `{name}` (it has {})",
                    path.display(),
                    known.join(", ")
                )
            })?,
            None => agents.default_agent(),
        };
        Ok(vec![agent.executor.clone()])
    }
}

/// Serve each agent's callback route on `listener` for as long as the process runs.
fn serve_callbacks(
    listener: tokio::net::TcpListener,
    agents: impl IntoIterator<Item = (String, AgentExecutor)>,
) {
    let mut router = axum::Router::new();
    for (name, executor) in agents {
        router = router.nest(
            &format!("{AGENTS_PATH}{name}"),
            keel::transport::callbacks::router(executor),
        );
    }
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router).await {
            tracing::warn!(%err, "the tool callback listener stopped");
        }
    });
}

/// Who answers approvals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Approver {
    /// `--approve`: every action.
    ApproveAll,
    /// `--deny`: every action.
    DenyAll,
    /// Ask: on the terminal, or one line from piped stdin (`y`/`yes` approves; anything else,
    /// or the end of the input, denies: it fails closed).
    Ask,
}

impl Approver {
    /// From `--approve` / `--deny`.
    pub(crate) fn from_flags(approve: bool, deny: bool) -> Self {
        match (approve, deny) {
            (true, _) => Self::ApproveAll,
            (_, true) => Self::DenyAll,
            _ => Self::Ask,
        }
    }

    /// The answer to `request`, and who gave it.
    pub(crate) async fn decide(
        self,
        request: &ApprovalRequest,
    ) -> Result<(ApprovalOutcome, &'static str), String> {
        match self {
            Self::ApproveAll => Ok((ApprovalOutcome::Approved, "--approve")),
            Self::DenyAll => Ok((ApprovalOutcome::Denied, "--deny")),
            Self::Ask if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() => {
                let prompt = format!("Approve {}?", request.action.name);
                let approved = tokio::task::spawn_blocking(move || {
                    dialoguer::Confirm::new()
                        .with_prompt(prompt)
                        .default(false)
                        .interact()
                })
                .await
                .map_err(|err| err.to_string())?
                // A prompt that cannot be shown (the terminal went away) denies.
                .unwrap_or(false);
                Ok((outcome(approved), "the terminal"))
            }
            Self::Ask => {
                let line = tokio::task::spawn_blocking(|| {
                    let mut line = String::new();
                    std::io::stdin().lock().read_line(&mut line).map(|_| line)
                })
                .await
                .map_err(|err| err.to_string())?
                .unwrap_or_default();
                let approved = matches!(
                    line.trim().to_ascii_lowercase().as_str(),
                    "y" | "yes" | "approve"
                );
                Ok((outcome(approved), "stdin"))
            }
        }
    }
}

fn outcome(approved: bool) -> ApprovalOutcome {
    if approved {
        ApprovalOutcome::Approved
    } else {
        ApprovalOutcome::Denied
    }
}

/// The exit status of a task that ended (or rests) in `state`: 0 completed, 1 failed or
/// rejected, 3 waiting for input, 130 canceled (as a shell reports Ctrl-C).
pub(crate) fn exit_status(state: TaskState) -> ExitCode {
    match state {
        TaskState::Completed => ExitCode::SUCCESS,
        TaskState::Canceled => ExitCode::from(130),
        TaskState::InputRequired | TaskState::AuthRequired => ExitCode::from(3),
        _ => ExitCode::FAILURE,
    }
}

/// Whether the task stopped to wait for someone, or ended.
fn rests(task: &Task) -> bool {
    task.state().is_terminal()
        || matches!(
            task.state(),
            TaskState::InputRequired | TaskState::AuthRequired
        )
}

/// The task metadata key that holds the approval request a task waits for. The one place
/// `keel run` (in process and `--url`) reads it, so that a change of the key is one edit.
const PENDING_APPROVAL_KEY: &str = "pending_approval";

/// The action the task waits to have approved, if that is what it waits for.
pub(crate) fn pending_approval(task: &Task) -> Option<ApprovalRequest> {
    if task.state() != TaskState::InputRequired {
        return None;
    }
    let value = task.metadata.get(PENDING_APPROVAL_KEY)?;
    serde_json::from_value(value.clone()).ok()
}

/// Wait, on the executor's change signal, until the task rests.
async fn until_rest(
    executor: &AgentExecutor,
    auth: &AuthContext,
    task_id: &TaskId,
) -> Result<Task, String> {
    // Subscribed before the first look, so no change between the look and the wait is missed.
    let mut updates = executor.task_updates();
    loop {
        let task = executor
            .get_task(auth, task_id, Some(0))
            .await
            .map_err(|err| err.to_string())?;
        if rests(&task) {
            return Ok(task);
        }
        updates
            .changed()
            .await
            .map_err(|_| "the executor stopped".to_owned())?;
    }
}

/// One message through the agent: sent, followed live, its approvals answered, until it
/// ends or waits for input. Ctrl-C cancels it.
pub(crate) async fn turn(
    executor: &AgentExecutor,
    renderer: &Renderer,
    approver: Approver,
    message: Message,
) -> Result<Task, String> {
    let auth = local_tenant();
    let task = executor
        .send_message(&auth, message, SendOptions::in_background())
        .await
        .map_err(|err| err.to_string())?;
    let id = task.id.clone();
    let follow = async {
        loop {
            let task = until_rest(executor, &auth, &id).await?;
            let Some(request) = pending_approval(&task) else {
                return Ok::<Task, String>(task);
            };
            renderer.pause();
            eprintln!(
                "{}",
                renderer.styles().warn.apply_to(approval_text(&request))
            );
            let (outcome, by) = approver.decide(&request).await?;
            let decision = ApprovalDecision {
                request_id: request.request_id.clone(),
                outcome,
                reason: Some(format!("answered on {by}")),
                decided_by: Some(by.to_owned()),
                decided_at: chrono::Utc::now(),
            };
            executor
                .decide_approval(&auth, &id, decision)
                .await
                .map_err(|err| err.to_string())?;
        }
    };
    tokio::select! {
        task = follow => task,
        _ = tokio::signal::ctrl_c() => {
            renderer.pause();
            eprintln!("keel: canceling task {id}");
            executor
                .cancel_task(&auth, &id, Some("canceled from the terminal (Ctrl-C)".into()))
                .await
                .map_err(|err| err.to_string())
        }
    }
}

/// What `keel run` prints once the task rests: the answer on stdout, the state and what the
/// run used on stderr (with `--json`, the events already said it all).
pub(crate) fn finish(renderer: &Renderer, task: &Task, json: bool) {
    renderer.pause();
    if json {
        return;
    }
    let s = renderer.styles();
    let answer = task.status().text().unwrap_or_default();
    let streamed = renderer.take_streamed();
    let state = task.state();
    if says_what_went_wrong(state) {
        if !answer.is_empty() {
            eprintln!("{}", renderer.styles().bad.apply_to(&answer));
        }
    } else if !answer.is_empty()
        && print_answer(
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
            streamed,
        )
    {
        out(answer);
    }
    let used = renderer.take_usage();
    let style = match state {
        TaskState::Completed => &s.good,
        TaskState::Canceled | TaskState::InputRequired | TaskState::AuthRequired => &s.warn,
        _ => &s.bad,
    };
    eprintln!(
        "{} {} · used {} model calls, {} tool calls, {} tokens in, {} out · task {} thread {}",
        style.apply_to("■"),
        state,
        used.model_calls,
        used.tool_calls,
        used.input_tokens,
        used.output_tokens,
        task.id,
        task.thread_id,
    );
}

/// Whether a task in `state` has in its status what went wrong rather than an answer (a
/// model's failure names the endpoint it tried): that goes to stderr, and stdout stays empty
/// for a script. `keel run`, `keel run --url`, `keel send` and `keel tasks`.
pub(crate) fn says_what_went_wrong(state: TaskState) -> bool {
    matches!(state, TaskState::Failed | TaskState::Rejected)
}

/// Whether the answer goes to stdout at the end. A script reading stdout always gets it; a
/// person watching one terminal already saw it on stderr when it was `shown` there (streamed,
/// or as a remote task's artifact), so it is not shown twice. `keel run` and `keel run --url`.
pub(crate) fn print_answer(
    stdout_is_terminal: bool,
    stderr_is_terminal: bool,
    shown: bool,
) -> bool {
    !(stdout_is_terminal && stderr_is_terminal && shown)
}

/// `keel run`.
pub(crate) async fn run(
    source: Source,
    agent: Option<String>,
    thread: Option<String>,
    prompt: String,
    approver: Approver,
    json: bool,
) -> Result<ExitCode, String> {
    if prompt.trim().is_empty() {
        return Err("the prompt is empty".into());
    }
    let executor = source.executor(agent.as_deref()).await?;
    let renderer = Renderer::new(json);
    executor.add_event_sink(renderer.clone());
    let mut message = Message::user(prompt);
    message.thread_id = thread.map(Into::into);
    let task = turn(&executor, &renderer, approver, message).await?;
    finish(&renderer, &task, json);
    executor.shutdown().await;
    Ok(exit_status(task.state()))
}

/// `keel chat`: one conversation on one thread, a line at a time, each turn shown as
/// `keel run` shows it. A task that waits for input is answered by the next line. Ends at the
/// end of the input or on `/exit`.
pub(crate) async fn chat(
    source: Source,
    agent: Option<String>,
    thread: Option<String>,
    approver: Approver,
) -> Result<ExitCode, String> {
    let executor = source.executor(agent.as_deref()).await?;
    let renderer = Renderer::new(false);
    executor.add_event_sink(renderer.clone());
    let interactive = std::io::stdin().is_terminal();
    let mut thread = thread.map(keel::core::ThreadId::from);
    let mut waiting: Option<TaskId> = None;
    if interactive {
        eprintln!(
            "keel: chatting with `{}`; /exit or Ctrl-D ends",
            executor.agent().card().name
        );
    }
    loop {
        if interactive {
            eprint!("{}", renderer.styles().tool.apply_to("you> "));
            let _ = std::io::Write::flush(&mut std::io::stderr());
        }
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .map(|n| (n > 0).then_some(line))
        })
        .await
        .map_err(|err| err.to_string())?
        .map_err(|err| format!("cannot read stdin: {err}"))?;
        let Some(line) = line else { break };
        let line = line.trim();
        if line == "/exit" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let mut message = Message::user(line);
        message.thread_id = thread.clone();
        message.task_id = waiting.take();
        let task = turn(&executor, &renderer, approver, message).await?;
        finish(&renderer, &task, false);
        thread = Some(task.thread_id.clone());
        if task.state() == TaskState::InputRequired {
            waiting = Some(task.id.clone());
        }
    }
    executor.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// `keel threads compact` without `--url`: the thread compacted in this process, on the
/// configured store, by the agent whose model would summarise it (`summary`).
pub(crate) async fn compact(
    source: Source,
    agent: Option<String>,
    request: keel::llm::HistoryCompactionRequest,
    json: bool,
) -> Result<ExitCode, String> {
    source.existing_store()?;
    let thread = request.thread_id.clone().unwrap_or_default();
    let executor = source.executor(agent.as_deref()).await?;
    let auth = local_tenant();
    // A thread the store has nothing of is unknown (a misspelt id), as the operator API says,
    // not a compaction that removed nothing.
    let reads = keel::agent::reads::Reads::new(executor.runtime().clone());
    let result = match reads.thread(&auth, &thread).await {
        Ok(_) => executor.compact_thread(&auth, &thread, &request).await,
        Err(err) => Err(err),
    }
    .map_err(|err| format!("cannot compact thread {thread}: {err}"));
    executor.shutdown().await;
    crate::remote::print_compaction(&thread, &result?, json);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::print_answer;

    #[test]
    fn the_answer_is_shown_once_on_a_terminal_and_always_to_a_pipe() {
        assert!(
            !print_answer(true, true, true),
            "streamed on the same terminal"
        );
        assert!(print_answer(true, true, false), "nothing was streamed");
        assert!(print_answer(false, true, true), "stdout is piped");
        assert!(print_answer(true, false, true), "the stream went elsewhere");
    }
}
