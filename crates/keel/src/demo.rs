//! The demo agent that `keel serve` runs: it works offline with the built-in model and shows
//! the tool loop and live cancellation.
//!
//! With the offline model, a message `/<tool> {json}` calls a tool; anything else is echoed:
//! - `/clock` answers the current UTC time;
//! - `/word_count {"text": "..."}` counts words;
//! - `/sleep {"seconds": 30}` waits (at most 300 s) and stops at once when the task is
//!   canceled, which makes it handy for trying `CancelTask`;
//! - when the environment variable `KEEL_DEMO_JOURNAL` names a file, `append_line
//!   {"line": "..."}` appends a line to it: a visible side effect for trying crash
//!   recovery (the tool is not idempotent, so a call interrupted by a crash is not run
//!   again);
//! - when the environment variable `KEEL_DEMO_ASYNC_TOOL_URL` names an HTTP endpoint,
//!   `background_job {"job": "..."}` is an asynchronous tool (seed 004): each call is POSTed
//!   there, acknowledged at once, and its result arrives later through the callback route
//!   (or `keel run-once --callback`).

use std::time::Duration;

use keel_agent::{Agent, AgentBuilder, FnTool};
use keel_core::{AgentCard, AgentError, AgentResult, AgentSkill};
use serde_json::{json, Value};

/// The longest `/sleep` the demo agent accepts, in seconds.
pub const MAX_SLEEP_SECONDS: u64 = 300;

/// The demo agent's card (its URL is filled in by the server).
pub fn card() -> AgentCard {
    let mut card = AgentCard::new(
        "keel-demo",
        "Keel's demo agent: echoes messages and runs a few offline tools.",
        "http://127.0.0.1:8080/",
    )
    .with_skill(
        AgentSkill::new("echo", "Answers with what you said.")
            .with_tags(["demo"])
            .with_example("hello"),
    )
    .with_skill(
        AgentSkill::new(
            "tools",
            "Runs a tool: /clock, /word_count {\"text\": ...}, /sleep {\"seconds\": N}.",
        )
        .with_tags(["demo", "tools"])
        .with_example("/sleep {\"seconds\": 5}"),
    )
    .with_tags(["demo"]);
    card.capabilities.has_llm = true;
    card
}

/// The demo agent.
///
/// ```
/// let agent = keel::demo::agent()?;
/// assert_eq!(agent.card().name, "keel-demo");
/// # Ok::<(), keel::core::AgentError>(())
/// ```
pub fn agent() -> AgentResult<Agent> {
    builder().build()
}

/// The demo agent's definition, not yet built (what `keel replay` re-drives).
pub fn builder() -> AgentBuilder {
    let clock = FnTool::new(
        "clock",
        "The current UTC time.",
        json!({"type": "object"}),
        |_args, _ctx| async { Ok(json!(chrono::Utc::now().to_rfc3339())) },
    );
    let word_count = FnTool::new(
        "word_count",
        "Count the words of a text.",
        json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        }),
        |args, _ctx| async move {
            let text = args["text"].as_str().unwrap_or_default();
            Ok(json!(text.split_whitespace().count()))
        },
    );
    let sleep = wait_tool(
        "sleep",
        "Wait for a number of seconds, stopping early if the task is canceled.",
        json!({"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}),
        |seconds| json!(format!("slept {seconds} s")),
    );
    let mut builder = Agent::builder(card())
        .instructions(
            "You are Keel's demo agent. Answer briefly; use a tool when the user asks for one.",
        )
        .tool(clock)
        .tool(word_count)
        .tool(sleep)
        // Its skills describe one agent's behaviour rather than routes to choose between, so
        // every task is taken on without the default negotiator's extra model call.
        .negotiator(keel_agent::AcceptAll);
    if let Some(journal) = std::env::var_os("KEEL_DEMO_JOURNAL") {
        builder = builder.tool(journal_tool(std::path::PathBuf::from(journal)));
    }
    if let Ok(endpoint) = std::env::var(ASYNC_TOOL_URL_ENV) {
        if !endpoint.trim().is_empty() {
            builder = builder.tool(background_job_tool(endpoint.trim()));
        }
    }
    builder
}

/// A tool that waits `{"seconds": N}` (`seconds` is the schema of N), or until its task is
/// canceled, and then answers `answer(N)`: the demo's `/sleep`, and the conformance agent's
/// wait.
pub(crate) fn wait_tool(
    name: &str,
    description: &str,
    seconds: Value,
    answer: fn(f64) -> Value,
) -> FnTool {
    FnTool::new(
        name,
        description,
        json!({
            "type": "object",
            "properties": {"seconds": seconds},
            "required": ["seconds"],
            "additionalProperties": false
        }),
        move |args, ctx| async move {
            let seconds = args["seconds"].as_f64().unwrap_or(0.0);
            tokio::select! {
                () = ctx.cancel.cancelled() => Err(AgentError::Canceled { reason: "task canceled".into() }),
                () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(answer(seconds)),
            }
        },
    )
}

/// The environment variable naming the endpoint of the demo's asynchronous tool.
pub const ASYNC_TOOL_URL_ENV: &str = "KEEL_DEMO_ASYNC_TOOL_URL";

/// `background_job`: an asynchronous tool served at `endpoint`.
fn background_job_tool(endpoint: &str) -> keel_agent::AsyncHttpTool {
    keel_agent::AsyncHttpTool::new(
        "background_job",
        "Start a long-running job; its result arrives later.",
        json!({
            "type": "object",
            "properties": {"job": {"type": "string"}},
            "required": ["job"],
            "additionalProperties": false
        }),
        endpoint,
    )
}

/// `append_line`: append one line to the journal file.
fn journal_tool(path: std::path::PathBuf) -> FnTool {
    FnTool::new(
        "append_line",
        "Append a line to the journal.",
        json!({
            "type": "object",
            "properties": {"line": {"type": "string"}},
            "required": ["line"],
            "additionalProperties": false
        }),
        move |args, _ctx| {
            let path = path.clone();
            async move {
                let line = args["line"].as_str().unwrap_or_default().replace('\n', " ");
                let write = tokio::task::spawn_blocking(move || {
                    use std::io::Write;
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?;
                    // One write of the whole line: appends of concurrent runs never
                    // interleave (writeln! may write the text and the newline apart).
                    file.write_all(format!("{line}\n").as_bytes())?;
                    file.sync_all()
                });
                write
                    .await
                    .map_err(AgentError::internal)?
                    .map_err(|e| AgentError::ToolFailed {
                        tool: "append_line".into(),
                        message: e.to_string(),
                    })?;
                Ok(json!("appended"))
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_agent::{AgentExecutor, SendOptions};
    use keel_core::{Message, TaskState};
    use keel_runtime::Runtime;

    use crate::DefaultRuntime;

    /// The demo agent on an offline runtime, and its caller.
    struct Demo {
        exec: AgentExecutor,
        auth: keel_runtime::AuthContext,
    }

    impl Demo {
        fn new() -> Self {
            let runtime = Arc::new(DefaultRuntime::offline());
            let auth = runtime.auth_service().auth_context();
            let exec = AgentExecutor::new(super::agent().unwrap(), runtime);
            Self { exec, auth }
        }

        /// The task of `text` sent with `options`.
        async fn send(&self, text: &str, options: SendOptions) -> keel_core::Task {
            self.exec
                .send_message(&self.auth, Message::user(text), options)
                .await
                .unwrap()
        }
    }

    #[tokio::test]
    async fn demo_agent_echoes_and_counts_words_offline() {
        let demo = Demo::new();
        let task = demo.send("hello", SendOptions::default()).await;
        assert_eq!(
            task.status().message.as_ref().unwrap().text(),
            "You said: hello"
        );
        let task = demo
            .send(
                r#"/word_count {"text": "one two three"}"#,
                SendOptions::default(),
            )
            .await;
        assert_eq!(task.state(), TaskState::Completed);
        assert_eq!(
            task.status().message.as_ref().unwrap().text(),
            "Tool results:\nword_count: 3"
        );
    }

    #[tokio::test]
    async fn demo_sleep_stops_when_the_task_is_canceled() {
        let demo = Demo::new();
        let task = demo
            .send(r#"/sleep {"seconds": 300}"#, SendOptions::in_background())
            .await;
        let canceled = demo
            .exec
            .cancel_task(&demo.auth, &task.id, None)
            .await
            .unwrap();
        assert_eq!(canceled.state(), TaskState::Canceled);
    }

    #[tokio::test]
    async fn demo_sleep_refuses_more_than_the_cap() {
        let demo = Demo::new();
        let task = demo
            .send(r#"/sleep {"seconds": 100000}"#, SendOptions::default())
            .await;
        let answer = task.status().message.as_ref().unwrap().text();
        assert!(answer.contains("arguments of `sleep`"), "{answer}");
    }
}
