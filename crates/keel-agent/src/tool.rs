//! Tools: named, described, schema-checked operations a model (or a caller) can invoke.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::{AgentResult, RunContext, TaskId, ThreadId};
use keel_runtime::{AuthContext, Runtime};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What a tool sees of the run that calls it.
#[derive(Clone)]
pub struct ToolContext {
    /// The tenant.
    pub auth: AuthContext,
    /// The run.
    pub run: RunContext,
    /// The task being worked on.
    pub task_id: TaskId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// The thread's handle: its key-value store, queue, parent and status.
    pub thread: crate::ThreadState,
    /// Fires when the run is canceled; long-running tools should stop when it does.
    pub cancel: CancellationToken,
    /// The service hub.
    pub runtime: Arc<dyn Runtime>,
    /// The run's event stream, when the call happens inside a run.
    pub(crate) events: Option<Arc<crate::observe::RunObs>>,
    /// Whether `task_id` is a stored task whose log takes artifacts (a run's), rather than
    /// the id of a direct call that has no task.
    pub(crate) in_task: bool,
    /// The tool call being made with this context, when there is one: its span in the
    /// run's trace and its action's id (a delegation it makes hangs under both).
    pub(crate) call: Option<(keel_core::SpanId, keel_core::ActionId)>,
    /// The files attached to the result of the call being made, when there is one.
    pub(crate) attached: Option<Arc<std::sync::Mutex<Vec<keel_core::FileContent>>>>,
}

impl ToolContext {
    /// The context for one tool call: this one, knowing the call's span and action.
    pub(crate) fn for_call(&self, span: keel_core::SpanId, action: keel_core::ActionId) -> Self {
        Self {
            call: Some((span, action)),
            attached: Some(Arc::default()),
            ..self.clone()
        }
    }

    /// Attach a file to the result of this call (an image the tool produced): the tool
    /// result the model reads carries it, and a provider that takes images with a tool
    /// result (Anthropic, Gemini) sends the image; the others get a line naming it. Store the
    /// bytes first ([`ThreadState::put_attachment`](crate::ThreadState::put_attachment)) and
    /// attach the file part that answers: the history and the events then hold its
    /// `keel-attachment://` reference, never the bytes, which are loaded for each request.
    /// A call whose result is an error, or a direct call
    /// ([`AgentExecutor::call_tool_in_context`](crate::AgentExecutor::call_tool_in_context)),
    /// returns its output alone.
    pub fn attach_to_result(&self, file: keel_core::FileContent) {
        if let Some(attached) = &self.attached {
            attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(file);
        }
    }

    /// The files attached to this call's result so far, taken.
    pub(crate) fn take_attached(&self) -> Vec<keel_core::FileContent> {
        self.attached
            .as_ref()
            .map(|attached| {
                std::mem::take(&mut *attached.lock().unwrap_or_else(|p| p.into_inner()))
            })
            .unwrap_or_default()
    }

    /// The run context for work this tool call delegates to `agent` (a remote agent, a
    /// subagent): a child of the calling run ([`RunContext::child`]) whose run span hangs
    /// under this call's span in the same trace, with the call's action id as its
    /// `delegation_id`. Outside a tool call, the plain child.
    pub fn delegated_run(&self, agent: impl Into<String>) -> RunContext {
        let child = self.run.child(agent);
        match &self.call {
            Some((span, action)) => child.delegated_from(span.to_hex(), action.as_str()),
            None => child,
        }
    }

    /// The W3C `traceparent` for an outgoing request this call makes (an HTTP tool, a
    /// delegation): the run's trace, under this call's span (the run's span outside one).
    pub fn traceparent(&self) -> keel_core::TraceParent {
        let trace_id = keel_core::W3cTraceId::of(&self.run.trace_id);
        let span_id = match &self.call {
            Some((span, _)) => *span,
            None => keel_events::RunSpans::of(&self.run).run_span(),
        };
        keel_core::TraceParent {
            trace_id,
            span_id,
            sampled: true,
        }
    }

    /// Add an event to the calling run's normalized stream (numbered like every other event
    /// of the run); a call made outside a run has no stream and the event is dropped.
    pub async fn emit(&self, event: keel_events::RunEventBuilder) {
        if let Some(events) = &self.events {
            events.emit(event).await;
        }
    }

    /// Add an artifact to the task, or a chunk of one: a `TaskArtifactUpdateEvent` in A2A's
    /// terms. The update is written to the task's event log before this returns, so streams
    /// see it while the run goes on, and the task's artifacts hold it from the moment the run
    /// rests ([`keel_core::Task::apply_artifact`]: with [`ArtifactChunk::append`] the parts
    /// extend the artifact of the same id). A run that adds artifacts this way has named its
    /// outputs: its final answer is then the task's status message only, not also an
    /// `answer` artifact. A call outside a task (a direct tool call) has nowhere to put one:
    /// [`keel_core::AgentError::Unsupported`].
    pub async fn add_artifact(
        &self,
        artifact: keel_core::Artifact,
        chunk: ArtifactChunk,
    ) -> AgentResult<()> {
        let events = match &self.events {
            Some(events) if self.in_task => events,
            _ => {
                return Err(keel_core::AgentError::Unsupported {
                    what: "an artifact from a tool call outside a task".into(),
                })
            }
        };
        let update = keel_core::TaskEvent::ArtifactUpdate {
            task_id: self.task_id.clone(),
            thread_id: self.thread_id.clone(),
            artifact: artifact.clone(),
            append: chunk.append,
            last_chunk: chunk.last_chunk,
        };
        self.runtime
            .task_manager()
            .add_task_event(&self.auth, &self.task_id, &update)
            .await?;
        self.thread.host.task_changed();
        events
            .emit(keel_events::RunEvent::task_artifact(
                &artifact,
                chunk.append,
                chunk.last_chunk,
            ))
            .await;
        events.produced_artifact(artifact, chunk.append);
        Ok(())
    }
}

impl ToolContext {
    /// Report the progress of this call (`tool` names it): appended to the task's log as a
    /// `working` status update whose message is `progress` as a data part, with
    /// `metadata.status_kind = tool_progress` and `metadata.tool`, as an asynchronous tool's
    /// progress report is ([`crate::AgentExecutor::deliver_tool_progress`]), so the task's
    /// stream and push subscribers see it while the call goes on. It changes nothing the
    /// model sees. A call outside a task (a direct tool call) has no stream: nothing is sent.
    pub async fn report_progress(&self, tool: &str, progress: Value) -> AgentResult<()> {
        if !self.in_task {
            return Ok(());
        }
        let mut message = keel_core::Message::new(
            keel_core::Role::Agent,
            vec![keel_core::Part::data(progress)],
        )
        .with_status_kind(keel_core::StatusKind::ToolProgress);
        message.task_id = Some(self.task_id.clone());
        message.thread_id = Some(self.thread_id.clone());
        message
            .metadata
            .insert("tool".into(), Value::String(tool.to_owned()));
        let update = keel_core::TaskEvent::StatusUpdate {
            task_id: self.task_id.clone(),
            thread_id: self.thread_id.clone(),
            status: keel_core::TaskStatus {
                state: keel_core::TaskState::Working,
                message: Some(message),
                timestamp: chrono::Utc::now(),
            },
            is_final: false,
        };
        self.runtime
            .task_manager()
            .add_task_event(&self.auth, &self.task_id, &update)
            .await?;
        self.thread.host.task_changed();
        Ok(())
    }
}

/// How an artifact update relates to earlier ones of the same artifact id (A2A
/// `TaskArtifactUpdateEvent.append` / `lastChunk`). The default is a whole artifact: not
/// appended, and its last chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactChunk {
    /// The parts extend the artifact already sent with this id.
    pub append: bool,
    /// No more chunks of this artifact follow.
    pub last_chunk: bool,
}

impl Default for ArtifactChunk {
    fn default() -> Self {
        Self::WHOLE
    }
}

impl ArtifactChunk {
    /// A whole artifact in one update.
    pub const WHOLE: Self = Self {
        append: false,
        last_chunk: true,
    };
    /// The first chunk of an artifact whose later chunks append to it.
    pub const FIRST: Self = Self {
        append: false,
        last_chunk: false,
    };
    /// A chunk appended to the artifact, more to follow.
    pub const MORE: Self = Self {
        append: true,
        last_chunk: false,
    };
    /// The last chunk appended to the artifact.
    pub const LAST: Self = Self {
        append: true,
        last_chunk: true,
    };
}

/// The [`Tool`] methods of a tool that keeps its name, description and parameter schema in
/// fields of those names (the tools of this crate): written once.
macro_rules! described_by_fields {
    () => {
        fn name(&self) -> &str {
            &self.name
        }
        fn description(&self) -> &str {
            &self.description
        }
        fn parameters(&self) -> serde_json::Value {
            self.parameters.clone()
        }
    };
}
pub(crate) use described_by_fields;

/// A tool. Its arguments are checked against [`Tool::parameters`] before [`Tool::call`] runs.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// JSON schema of its arguments.
    fn parameters(&self) -> Value;
    /// Run it. An error becomes a tool result the model sees.
    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value>;
    /// Whether running it twice with the same arguments is harmless. After a crash, a call
    /// that started but has no persisted result is re-run only for idempotent tools; for the
    /// others the model sees an "interrupted" tool error instead.
    fn idempotent(&self) -> bool {
        false
    }
    /// Capabilities the tool needs (`records.write`), always part of the action prepared for
    /// each call, so policy sees them whatever else the action says.
    fn capabilities(&self) -> Vec<String> {
        Vec::new()
    }
    /// A preview of what a call would do, shown to policy and approvers before it runs.
    fn preview(&self, _args: &Value) -> Option<keel_core::Artifact> {
        None
    }
    /// A custom action for this call (a domain-specific kind, name or payload for policy to
    /// judge). The tool's declared [`Tool::capabilities`] are always merged into it, so a
    /// custom action can add capabilities but never drop the declared ones.
    fn prepare_action(&self, _args: &Value) -> Option<keel_core::RunAction> {
        None
    }
    /// For an asynchronous tool (seed 004), how its calls are dispatched: inside a model's
    /// step the engine dispatches instead of calling, and waits durably for the callback.
    fn asynchronous(&self) -> Option<&dyn crate::AsyncDispatch> {
        None
    }
}

type ToolFuture = Pin<Box<dyn Future<Output = AgentResult<Value>> + Send>>;
type ToolFn = dyn Fn(Value, ToolContext) -> ToolFuture + Send + Sync;

/// A [`Tool`] made from a closure.
///
/// ```
/// use keel_agent::FnTool;
/// let add = FnTool::new(
///     "add",
///     "Add two numbers",
///     serde_json::json!({
///         "type": "object",
///         "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
///         "required": ["a", "b"]
///     }),
///     |args, _ctx| async move {
///         Ok(serde_json::json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)))
///     },
/// );
/// # let _ = add;
/// ```
pub struct FnTool {
    name: String,
    description: String,
    parameters: Value,
    idempotent: bool,
    capabilities: Vec<String>,
    preview: Option<Box<PreviewFn>>,
    run: Box<ToolFn>,
}

type PreviewFn = dyn Fn(&Value) -> Option<keel_core::Artifact> + Send + Sync;

impl FnTool {
    /// A tool named `name` that runs `run`.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        run: F,
    ) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AgentResult<Value>> + Send + 'static,
    {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            idempotent: false,
            capabilities: Vec::new(),
            preview: None,
            run: Box::new(move |args, ctx| Box::pin(run(args, ctx))),
        }
    }

    /// Declare the capabilities the tool needs.
    #[must_use]
    pub fn with_capabilities<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        capabilities: I,
    ) -> Self {
        self.capabilities
            .extend(capabilities.into_iter().map(Into::into));
        self
    }

    /// Build a preview artifact for each call.
    #[must_use]
    pub fn with_preview(
        mut self,
        preview: impl Fn(&Value) -> Option<keel_core::Artifact> + Send + Sync + 'static,
    ) -> Self {
        self.preview = Some(Box::new(preview));
        self
    }

    /// Declare the tool idempotent (see [`Tool::idempotent`]).
    #[must_use]
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }
}

#[async_trait]
impl Tool for FnTool {
    described_by_fields!();
    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        (self.run)(args, ctx.clone()).await
    }
    fn idempotent(&self) -> bool {
        self.idempotent
    }
    fn capabilities(&self) -> Vec<String> {
        self.capabilities.clone()
    }
    fn preview(&self, args: &Value) -> Option<keel_core::Artifact> {
        self.preview.as_ref().and_then(|preview| preview(args))
    }
}

/// A tool that runs its own prompt against a model and returns the model's answer
/// (Standard Agents' prompt tools). `{{name}}` placeholders in the prompt are replaced by the
/// string (or JSON) value of the argument `name`.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::PromptTool;
/// let summarize = PromptTool::new(
///     "summarize",
///     "Summarize a text in one sentence.",
///     serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
///     "Summarize in one sentence: {{text}}",
/// );
/// # let _ = summarize;
/// ```
pub struct PromptTool {
    name: String,
    description: String,
    parameters: Value,
    prompt: String,
    llm: Option<Arc<dyn keel_llm::Llm>>,
}

impl PromptTool {
    /// A prompt tool using the runtime's default model.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        prompt: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            prompt: prompt.into(),
            llm: None,
        }
    }

    /// Use this model instead of the runtime's default.
    #[must_use]
    pub fn with_llm(mut self, llm: Arc<dyn keel_llm::Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    fn render(&self, args: &Value) -> String {
        let mut prompt = self.prompt.clone();
        if let Value::Object(map) = args {
            for (key, value) in map {
                let text = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                prompt = prompt.replace(&format!("{{{{{key}}}}}"), &text);
            }
        }
        prompt
    }
}

#[async_trait]
impl Tool for PromptTool {
    described_by_fields!();
    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let llm = self
            .llm
            .clone()
            .unwrap_or_else(|| ctx.runtime.default_llm());
        let request =
            keel_llm::LlmRequest::new(vec![keel_llm::LlmMessage::user(self.render(&args))]);
        let response = llm.complete(request).await?;
        Ok(Value::String(response.content.unwrap_or_default()))
    }
    fn idempotent(&self) -> bool {
        true
    }
}
