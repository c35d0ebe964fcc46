//! Replay as a regression test (issue 42): the current agent definition re-driven over a
//! recorded run, with the recorded model answers in place of the model and the recorded tool
//! results in place of the tools, then compared event by event with the recording.
//!
//! No side effect runs and no model is called: [`ReplayLlm`] serves the recorded answers in
//! order, each tool is wrapped so that its current declaration (name, schema, capabilities,
//! preview) is what the model and policy see while its result comes from the recording, and
//! approvals are answered as recorded. A tool the recording never called fails with a
//! "not in the recording" error the model sees, and is listed in
//! [`ReplayOutcome::unrecorded_tools`]. With [`Replay::fork_at`] the answers from that step on
//! come from a live model and the tools run for real; the fork's run report names the run
//! and step it forked from under [`FORKED_FROM`].

mod divergence;
mod recording;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use keel_core::{AgentError, AgentResult, ApprovalDecision, Message, Task};
use keel_events::{InMemoryEventSink, RunEvent};
use keel_llm::{Llm, LlmRequest, LlmResponse, LlmStream, LlmStreamEvent, MockLlm, ModelProfile};
use keel_policy::ApprovalFn;
use keel_runtime::{Runtime, Services};
use serde_json::Value;

pub use divergence::{first_divergence, Divergence};
pub use recording::{RecordedStep, RecordedToolCall, Recording};

use crate::{AgentBuilder, AgentExecutor, SendOptions, Tool, ToolContext};

/// The run-context metadata key (and run-report metadata key) of a fork: `{"run_id": the
/// source run, "step": the first live model call}`. `keel runs` shows it.
pub const FORKED_FROM: &str = "keel.forked_from";

/// What a replay shares between its model, its tools and its approvals: the recording, the
/// next answer's index, and whether the run has gone live (a fork).
struct Cursor {
    recording: Recording,
    next_step: AtomicUsize,
    next_call: Mutex<Vec<bool>>,
    next_approval: AtomicUsize,
    live: AtomicBool,
    unrecorded: Mutex<Vec<String>>,
    requests: Mutex<Vec<LlmRequest>>,
}

/// An [`Llm`] that answers from a recording: the recorded answers in order, under the
/// recorded model's name; after the fork step, the live model's answers.
pub struct ReplayLlm {
    cursor: Arc<Cursor>,
    profile: ModelProfile,
    fork: Option<(usize, Arc<dyn Llm>)>,
}

#[async_trait]
impl Llm for ReplayLlm {
    fn model_name(&self) -> &str {
        &self.profile.model
    }

    fn profile(&self) -> ModelProfile {
        self.profile.clone()
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        self.answer(request).await.map(|(response, _)| response)
    }

    /// The recorded answer streamed as it was recorded: the same text chunks (so the same
    /// `llm.stream` events), then its tool calls, usage and the whole answer.
    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        stream::once(self.answer(request))
            .flat_map(|answer| {
                let events: Vec<AgentResult<LlmStreamEvent>> = match answer {
                    Ok((response, chunks)) => {
                        let mut events: Vec<LlmStreamEvent> = chunks
                            .into_iter()
                            .map(|text| LlmStreamEvent::TextDelta { text })
                            .collect();
                        events.extend(
                            response
                                .tool_calls
                                .iter()
                                .map(|call| LlmStreamEvent::ToolCall { call: call.clone() }),
                        );
                        events.push(LlmStreamEvent::Usage {
                            usage: response.usage,
                        });
                        events.push(LlmStreamEvent::Done { response });
                        events.into_iter().map(Ok).collect()
                    }
                    Err(error) => vec![Err(error)],
                };
                stream::iter(events)
            })
            .boxed()
    }
}

impl ReplayLlm {
    /// The next answer and the text chunks it streams in: the recorded ones, or after the
    /// fork step the live model's answer, its text in one chunk.
    async fn answer(&self, request: LlmRequest) -> AgentResult<(LlmResponse, Vec<String>)> {
        let index = self.cursor.next_step.fetch_add(1, Ordering::SeqCst);
        self.cursor
            .requests
            .lock()
            .map_err(AgentError::internal)?
            .push(request.clone());
        if let Some((from, live)) = &self.fork {
            if index >= *from {
                self.cursor.live.store(true, Ordering::SeqCst);
                let response = live.complete(request).await?;
                let chunks = response.content.iter().cloned().collect();
                return Ok((response, chunks));
            }
        }
        match self.cursor.recording.steps.get(index) {
            Some(step) => Ok((step.response.clone(), step.chunks.clone())),
            None => Err(AgentError::llm(
                self.profile.model.clone(),
                format!(
                    "the replay asked for model call {} but the recording has {}",
                    index + 1,
                    self.cursor.recording.steps.len()
                ),
            )),
        }
    }
}

/// A tool whose declaration is the current one and whose results come from the recording.
struct ReplayedTool {
    tool: Arc<dyn Tool>,
    cursor: Arc<Cursor>,
}

impl ReplayedTool {
    /// The recorded result for a call of this tool: the first unused one with the same
    /// arguments, else the first unused one of this tool.
    fn recorded(&self, args: &Value) -> Option<Result<Value, String>> {
        let mut used = self.cursor.next_call.lock().ok()?;
        let calls = &self.cursor.recording.tool_calls;
        let free = |i: &usize| !used[*i] && calls[*i].tool == self.tool.name();
        let index = (0..calls.len())
            .filter(free)
            .find(|i| &calls[*i].arguments == args)
            .or_else(|| (0..calls.len()).find(free))?;
        used[index] = true;
        Some(calls[index].outcome.clone())
    }
}

#[async_trait]
impl Tool for ReplayedTool {
    fn name(&self) -> &str {
        self.tool.name()
    }
    fn description(&self) -> &str {
        self.tool.description()
    }
    fn parameters(&self) -> Value {
        self.tool.parameters()
    }
    fn idempotent(&self) -> bool {
        self.tool.idempotent()
    }
    fn capabilities(&self) -> Vec<String> {
        self.tool.capabilities()
    }
    fn preview(&self, args: &Value) -> Option<keel_core::Artifact> {
        self.tool.preview(args)
    }
    fn prepare_action(&self, args: &Value) -> Option<keel_core::RunAction> {
        self.tool.prepare_action(args)
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        if self.cursor.live.load(Ordering::SeqCst) {
            return self.tool.call(args, ctx).await;
        }
        match self.recorded(&args) {
            Some(Ok(output)) => Ok(output),
            Some(Err(error)) => Err(AgentError::internal(error)),
            None => {
                if let Ok(mut unrecorded) = self.cursor.unrecorded.lock() {
                    unrecorded.push(self.tool.name().to_owned());
                }
                Err(AgentError::invalid_input(
                    "replay.tool",
                    format!(
                        "`{}` was not called in the recording; a replay does not run it",
                        self.tool.name()
                    ),
                ))
            }
        }
    }
}

/// What a replay did and how it compares with the recording.
#[derive(Debug)]
pub struct ReplayOutcome {
    /// The replay's events (the replayed task's run).
    pub events: Vec<RunEvent>,
    /// The task as the replay left it.
    pub task: Task,
    /// The first difference from the recording, `None` when the replay agrees.
    pub divergence: Option<Divergence>,
    /// Tools the replay called that the recording never did (not run).
    pub unrecorded_tools: Vec<String>,
    /// What the model was sent at each call, in order.
    pub model_inputs: Vec<LlmRequest>,
    /// The run the replay was made from.
    pub source_run_id: String,
}

impl ReplayOutcome {
    /// Whether the replay did what the recording did.
    pub fn passed(&self) -> bool {
        self.divergence.is_none() && self.unrecorded_tools.is_empty()
    }
}

/// A replay of one recording.
///
/// ```
/// use keel_agent::replay::{Recording, Replay};
/// # fn demo(recording: Recording) {
/// let replay = Replay::new(recording);
/// # let _ = replay;
/// # }
/// ```
pub struct Replay {
    recording: Recording,
    fork: Option<(u32, Arc<dyn Llm>)>,
}

impl Replay {
    /// A replay of `recording`, served entirely from it.
    pub fn new(recording: Recording) -> Self {
        Self {
            recording,
            fork: None,
        }
    }

    /// Serve the recorded answers before model call `step` (1-based), then continue live
    /// with `model` and the real tools: "what would the new definition do from here?".
    #[must_use]
    pub fn fork_at(mut self, step: u32, model: Arc<dyn Llm>) -> Self {
        self.fork = Some((step, model));
        self
    }

    /// The user message the recorded run answered, when the recording carries it
    /// ([`Recording::input`]).
    pub fn recorded_input(&self) -> Option<Message> {
        self.recording.input.clone()
    }

    /// Run `agent` on the input the recording answered ([`Replay::recorded_input`]); a
    /// recording that does not carry it is [`AgentError::InvalidInput`].
    pub async fn run_recorded(&self, agent: AgentBuilder) -> AgentResult<ReplayOutcome> {
        let input = self.recorded_input().ok_or_else(|| {
            AgentError::invalid_input(
                "recording.input",
                "the export does not carry the user's message under `input`",
            )
        })?;
        self.run(agent, input).await
    }

    /// Run `agent` (the current definition) on `input` over an in-memory runtime of its own,
    /// and compare its run with the recording.
    pub async fn run(&self, agent: AgentBuilder, input: Message) -> AgentResult<ReplayOutcome> {
        let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
        self.run_on(runtime, agent, input).await
    }

    /// As [`Replay::run`], on `runtime`: a fork run this way is an ordinary run of that
    /// runtime, on a new task and thread, listed by `keel runs`.
    pub async fn run_on(
        &self,
        runtime: Arc<dyn Runtime>,
        agent: AgentBuilder,
        mut input: Message,
    ) -> AgentResult<ReplayOutcome> {
        // A task and a thread of the replay's own: on a shared store, a fork must not write
        // into the recorded conversation (nor see what came after it).
        input.task_id = None;
        input.thread_id = None;
        let steps = self.recording.steps.len();
        let cursor = Arc::new(Cursor {
            next_call: Mutex::new(vec![false; self.recording.tool_calls.len()]),
            recording: self.recording.clone(),
            next_step: AtomicUsize::new(0),
            next_approval: AtomicUsize::new(0),
            live: AtomicBool::new(false),
            unrecorded: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::with_capacity(steps)),
        });
        let first = self.recording.steps.first();
        let provider = first.and_then(|s| s.provider.clone()).unwrap_or_default();
        let model = first.and_then(|s| s.model.clone()).unwrap_or_default();
        // The current model's profile (context window, output cap, price: what the engine
        // budgets and compacts by), under the recorded model's name.
        let profile = match agent.model() {
            Some(current) => ModelProfile {
                provider,
                model,
                ..current.profile()
            },
            None => ModelProfile::new(provider, model),
        };
        let llm = ReplayLlm {
            cursor: cursor.clone(),
            profile,
            fork: self
                .fork
                .as_ref()
                .map(|(step, model)| ((*step as usize).saturating_sub(1), model.clone())),
        };
        let tools_cursor = cursor.clone();
        let approvals = cursor.clone();
        let agent = agent.llm(llm).map_tools(move |tool| {
            Arc::new(ReplayedTool {
                tool,
                cursor: tools_cursor.clone(),
            }) as Arc<dyn Tool>
        });
        // A run that paused for a person's decision pauses again here, and is given the
        // recorded decision as the person gave it (below); one decided at once by a handler
        // is decided by the recording's handler, at once.
        let paused = self.recording.paused_for_approval();
        let agent = if paused {
            agent
        } else {
            agent.approval_handler(ApprovalFn::new(
                move |request: keel_core::ApprovalRequest, _| {
                    let approvals = approvals.clone();
                    async move { recorded_decision(&approvals, &request) }
                },
            ))
        }
        .build()?;
        let exec = AgentExecutor::new(agent, runtime.clone());
        let sink = Arc::new(InMemoryEventSink::new());
        exec.add_event_sink(sink.clone());
        let auth = runtime.auth_service().auth_context();
        let options = SendOptions {
            run_context: self.fork.as_ref().map(|(step, _)| {
                let mut context = keel_core::RunContext::new();
                context.metadata.insert(
                    FORKED_FROM.to_owned(),
                    serde_json::json!({ "run_id": self.recording.report.run_id, "step": step }),
                );
                context
            }),
            ..SendOptions::default()
        };
        let mut task = exec.send_message(&auth, input, options).await?;
        while paused && task.state() == keel_core::TaskState::InputRequired {
            let Some(request) = crate::task_meta::EngineMeta::of(&task.metadata).pending_approval
            else {
                break;
            };
            let decision = recorded_decision(&cursor, &request)?;
            task = exec.decide_approval(&auth, &task.id, decision).await?;
        }
        let events: Vec<RunEvent> = sink
            .events()
            .into_iter()
            .filter(|e| e.task_id.as_ref() == Some(&task.id))
            .collect();
        let divergence = first_divergence(self.recording.events(), &events);
        let unrecorded_tools = cursor
            .unrecorded
            .lock()
            .map_err(AgentError::internal)?
            .clone();
        let model_inputs = cursor
            .requests
            .lock()
            .map_err(AgentError::internal)?
            .clone();
        Ok(ReplayOutcome {
            events,
            task,
            divergence,
            unrecorded_tools,
            model_inputs,
            source_run_id: self
                .recording
                .report
                .run_id
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
        })
    }
}

/// The next recorded approval decision, answering this request; a request the recording
/// never decided is denied (the replay cannot ask anyone).
fn recorded_decision(
    cursor: &Cursor,
    request: &keel_core::ApprovalRequest,
) -> AgentResult<ApprovalDecision> {
    let index = cursor.next_approval.fetch_add(1, Ordering::SeqCst);
    let mut decision = match cursor.recording.approvals.get(index) {
        Some(decision) => decision.clone(),
        None => keel_policy::deny_request(request, "not in the recording"),
    };
    decision.request_id = request.request_id.clone();
    Ok(decision)
}

/// The exported runs (`*.json`) in `dir`, in name order: what [`replay_dir`] (and `keel
/// test`) replay.
pub fn exported_runs(dir: &std::path::Path) -> AgentResult<Vec<std::path::PathBuf>> {
    let io = |e: std::io::Error| {
        AgentError::invalid_input("replay.dir", format!("{}: {e}", dir.display()))
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    Ok(files)
}

/// Replay every exported run (`*.json`) in `dir`, in name order, through the agent `agent`
/// builds: what `cargo test` runs to keep a project's important runs as regression tests.
/// Each file gives its outcome, or why it could not be replayed.
pub async fn replay_dir(
    dir: &std::path::Path,
    agent: impl Fn() -> AgentBuilder,
) -> AgentResult<Vec<(std::path::PathBuf, AgentResult<ReplayOutcome>)>> {
    let files = exported_runs(dir)?;
    let mut outcomes = Vec::with_capacity(files.len());
    for path in files {
        let outcome = async {
            Replay::new(Recording::read(&path)?)
                .run_recorded(agent())
                .await
        }
        .await;
        outcomes.push((path, outcome));
    }
    Ok(outcomes)
}
