//! The run context: the typed execution envelope that travels with a task run.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AgentError, AgentResult, Metadata, RunId, Task, ThreadId, TraceId};

/// The task metadata key under which a [`RunContext`] is stored.
pub const RUN_CONTEXT_KEY: &str = "run_context";

/// Execution limits of a run. `None` means unlimited.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunBudget {
    /// Model steps (one model call plus its tool calls).
    pub max_steps: Option<u32>,
    /// Model calls.
    pub max_llm_calls: Option<u32>,
    /// Tool calls.
    pub max_tool_calls: Option<u32>,
    /// Input tokens, estimated before each call.
    pub max_input_tokens: Option<u64>,
    /// Output tokens, from provider usage.
    pub max_output_tokens: Option<u64>,
    /// Wall-clock seconds.
    pub max_runtime_seconds: Option<f64>,
    /// Micro-dollars of priced model calls, estimated before each call from its context and
    /// output limit (decision 186).
    pub max_cost_micros: Option<u64>,
}

impl RunBudget {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == RunBudget::default()
    }

    /// The tighter of two budgets, limit by limit (a child can narrow, never widen).
    pub fn narrowed_by(&self, other: &RunBudget) -> RunBudget {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, None) => a,
                (None, b) => b,
            }
        }
        RunBudget {
            max_steps: min(self.max_steps, other.max_steps),
            max_llm_calls: min(self.max_llm_calls, other.max_llm_calls),
            max_tool_calls: min(self.max_tool_calls, other.max_tool_calls),
            max_input_tokens: min(self.max_input_tokens, other.max_input_tokens),
            max_output_tokens: min(self.max_output_tokens, other.max_output_tokens),
            max_runtime_seconds: min(self.max_runtime_seconds, other.max_runtime_seconds),
            max_cost_micros: min(self.max_cost_micros, other.max_cost_micros),
        }
    }
}

/// Which run this is and what constraints travel with it. Stored in task metadata under
/// [`RUN_CONTEXT_KEY`]; it is a value and safe to send anywhere (live cancellation is a
/// separate, process-local token held by the engine).
///
/// ```
/// use keel_core::{Message, RunContext, Task};
/// let mut task = Task::create(Message::user("hi"));
/// let ctx = RunContext::new().with_agent("gateway");
/// ctx.attach_to_task(&mut task)?;
/// let child = RunContext::from_task(&task)?.unwrap().child("worker");
/// assert_eq!(child.parent_run_id.as_ref(), Some(&ctx.run_id));
/// assert_eq!(child.agent_chain, vec!["gateway", "worker"]);
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// One logical execution run.
    pub run_id: RunId,
    /// The thread (conversation) shared across runs; `session_id` is read as an alias.
    #[serde(alias = "session_id")]
    pub thread_id: Option<ThreadId>,
    /// Observability trace. A new context's is a W3C trace id (32 hex digits); a request
    /// with a `traceparent` sets the caller's.
    pub trace_id: TraceId,
    /// The span the run's own span hangs under, as 16 hex digits: the caller's span from a
    /// `traceparent`, or the tool call of the parent run that delegated this one. `None`:
    /// the run's span is the trace's root.
    pub parent_span_id: Option<String>,
    /// The caller's W3C `tracestate`, passed along unchanged on the run's outgoing requests.
    pub trace_state: Option<String>,
    /// The delegation this run serves (the delegating tool call's action id), stamped on
    /// every event of the run.
    pub delegation_id: Option<String>,
    /// Run boundary: a folder, dataset, account.
    pub workspace_uri: Option<String>,
    /// The parent run, for nested execution.
    pub parent_run_id: Option<RunId>,
    /// Agents that have handled the run, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_chain: Vec<String>,
    /// Capability rules (`allow`, `deny`, `require_approval`, or booleans) by capability.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub permissions: Metadata,
    /// Limits. Left out of the JSON when there are none, as `canceled` is when false: the
    /// context rides on every stored task (decision 269).
    #[serde(default, skip_serializing_if = "RunBudget::is_unlimited")]
    pub budget: RunBudget,
    /// Whether the run was canceled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub canceled: bool,
    /// Why, when canceled.
    pub cancel_reason: Option<String>,
    /// Application metadata that travels with the run.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

impl Default for RunContext {
    fn default() -> Self {
        Self::new()
    }
}

impl RunContext {
    /// A fresh context with new run and trace ids.
    pub fn new() -> Self {
        Self {
            run_id: RunId::new(),
            thread_id: None,
            trace_id: TraceId::w3c(),
            parent_span_id: None,
            trace_state: None,
            delegation_id: None,
            workspace_uri: None,
            parent_run_id: None,
            agent_chain: Vec::new(),
            permissions: Metadata::new(),
            budget: RunBudget::default(),
            canceled: false,
            cancel_reason: None,
            metadata: Metadata::new(),
        }
    }

    /// Whether the context holds nothing but its run, thread and trace ids: what the engine
    /// makes for a task nobody gave a context. Anything else in it came from a caller.
    pub fn holds_only_ids(&self) -> bool {
        // Destructured in full, so a field added to contexts cannot be left out here.
        let RunContext {
            run_id: _,
            thread_id: _,
            trace_id: _,
            parent_span_id,
            trace_state,
            delegation_id,
            workspace_uri,
            parent_run_id,
            agent_chain,
            permissions,
            budget,
            canceled,
            cancel_reason,
            metadata,
        } = self;
        parent_span_id.is_none()
            && trace_state.is_none()
            && delegation_id.is_none()
            && workspace_uri.is_none()
            && parent_run_id.is_none()
            && agent_chain.is_empty()
            && permissions.is_empty()
            && budget.is_unlimited()
            && !canceled
            && cancel_reason.is_none()
            && metadata.is_empty()
    }

    /// Set the thread.
    #[must_use]
    pub fn with_thread(mut self, thread_id: ThreadId) -> Self {
        self.thread_id = Some(thread_id);
        self
    }

    /// Append an agent to the chain.
    #[must_use]
    pub fn with_agent(mut self, agent: impl Into<String>) -> Self {
        self.agent_chain.push(agent.into());
        self
    }

    /// Set the budget.
    #[must_use]
    pub fn with_budget(mut self, budget: RunBudget) -> Self {
        self.budget = budget;
        self
    }

    /// A context for delegated work: a new run id whose parent is this run, the same thread,
    /// trace, workspace, permissions, budget and metadata, and `agent` appended to the chain.
    pub fn child(&self, agent: impl Into<String>) -> Self {
        let mut child = self.clone();
        child.run_id = RunId::new();
        child.parent_run_id = Some(self.run_id.clone());
        child.agent_chain.push(agent.into());
        child.canceled = false;
        child.cancel_reason = None;
        // Which span the child hangs under is the delegating call's to say
        // ([`Self::delegated_from`]); it is not the parent run's parent.
        child.parent_span_id = None;
        child.delegation_id = None;
        child
    }

    /// Place this (child) run under the tool call `span_id` of the run that delegated it,
    /// as the delegation `delegation_id`: the child's run span is that call's child in the
    /// trace, and its events carry the delegation.
    #[must_use]
    pub fn delegated_from(
        mut self,
        span_id: impl Into<String>,
        delegation_id: impl Into<String>,
    ) -> Self {
        self.parent_span_id = Some(span_id.into());
        self.delegation_id = Some(delegation_id.into());
        self
    }

    /// Continue the caller's trace: the run joins `parent`'s trace under its span, and
    /// carries `state` (the caller's `tracestate`) on.
    #[must_use]
    pub fn continuing_trace(mut self, parent: &crate::TraceParent, state: Option<String>) -> Self {
        self.trace_id = TraceId::from(parent.trace_id.to_hex());
        self.parent_span_id = Some(parent.span_id.to_hex());
        self.trace_state = state;
        self
    }

    /// A canceled snapshot of this context.
    pub fn cancel(&mut self, reason: impl Into<String>) -> &mut Self {
        self.canceled = true;
        self.cancel_reason = Some(reason.into());
        self
    }

    /// Store this context in `task.metadata.run_context` and place it in the task's thread.
    pub fn attach_to_task(&self, task: &mut Task) -> AgentResult<()> {
        let mut ctx = self.clone();
        if ctx.thread_id.is_none() {
            ctx.thread_id = Some(task.thread_id.clone());
        }
        let value = serde_json::to_value(&ctx).map_err(AgentError::internal)?;
        task.metadata.insert(RUN_CONTEXT_KEY.into(), value);
        Ok(())
    }

    /// Read the context stored in a task, if any. Malformed stored context is
    /// [`AgentError::InvalidInput`] naming `metadata.run_context`.
    pub fn from_task(task: &Task) -> AgentResult<Option<RunContext>> {
        match task.metadata.get(RUN_CONTEXT_KEY) {
            None | Some(Value::Null) => Ok(None),
            // Read from the stored value in place: a run reads its context several times.
            Some(value) => RunContext::deserialize(value)
                .map(Some)
                .map_err(|e| AgentError::invalid_input("metadata.run_context", e.to_string())),
        }
    }

    /// The task's context, creating and attaching one when missing. Legacy metadata keys
    /// (`session_id`, `trace_id`, `workspace_uri`) are upgraded into the typed context.
    pub fn ensure_task_context(task: &mut Task) -> AgentResult<RunContext> {
        if let Some(ctx) = Self::from_task(task)? {
            return Ok(ctx);
        }
        let mut ctx = RunContext::new();
        let legacy = |key: &str| {
            task.metadata
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        ctx.thread_id = Some(
            legacy("thread_id")
                .or_else(|| legacy("session_id"))
                .map(ThreadId::from)
                .unwrap_or_else(|| task.thread_id.clone()),
        );
        if let Some(trace) = legacy("trace_id") {
            ctx.trace_id = TraceId::from(trace);
        }
        ctx.workspace_uri = legacy("workspace_uri");
        ctx.attach_to_task(task)?;
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    #[test]
    fn a_context_holds_only_ids_until_anything_else_is_set() {
        let ids = RunContext::new().with_thread(ThreadId::from("t-1"));
        assert!(ids.holds_only_ids());
        let changes: [fn(&mut RunContext); 4] = [
            |c| c.budget.max_steps = Some(3),
            |c| c.agent_chain.push("a".into()),
            |c| c.canceled = true,
            |c| {
                c.metadata.insert("k".into(), serde_json::json!(1));
            },
        ];
        for change in changes {
            let mut ctx = ids.clone();
            change(&mut ctx);
            assert!(!ctx.holds_only_ids(), "{ctx:?}");
        }
    }

    #[test]
    fn child_preserves_thread_trace_and_budget() {
        let parent = RunContext::new()
            .with_thread(ThreadId::from("th"))
            .with_agent("a")
            .with_budget(RunBudget {
                max_steps: Some(3),
                ..Default::default()
            });
        let child = parent.child("b");
        assert_ne!(child.run_id, parent.run_id);
        assert_eq!(child.parent_run_id, Some(parent.run_id.clone()));
        assert_eq!(child.trace_id, parent.trace_id);
        assert_eq!(child.thread_id, parent.thread_id);
        assert_eq!(child.budget.max_steps, Some(3));
    }

    #[test]
    fn ensure_task_context_upgrades_legacy_session_id() {
        let mut task = Task::create(Message::user("x"));
        task.metadata
            .insert("session_id".into(), "legacy-session".into());
        task.metadata.insert("trace_id".into(), "tr-1".into());
        let ctx = RunContext::ensure_task_context(&mut task).unwrap();
        assert_eq!(ctx.thread_id, Some(ThreadId::from("legacy-session")));
        assert_eq!(ctx.trace_id, TraceId::from("tr-1"));
        // Stored, so a second call returns the same run.
        let again = RunContext::ensure_task_context(&mut task).unwrap();
        assert_eq!(again.run_id, ctx.run_id);
    }

    #[test]
    fn legacy_session_id_key_inside_context_is_read() {
        let json = serde_json::json!({"run_id": "r", "trace_id": "t", "session_id": "s"});
        let ctx: RunContext = serde_json::from_value(json).unwrap();
        assert_eq!(ctx.thread_id, Some(ThreadId::from("s")));
    }

    #[test]
    fn malformed_stored_context_names_the_field() {
        let mut task = Task::create(Message::user("x"));
        task.metadata
            .insert(RUN_CONTEXT_KEY.into(), serde_json::json!(42));
        let err = RunContext::from_task(&task).unwrap_err();
        assert!(
            matches!(err, AgentError::InvalidInput { ref field, .. } if field == "metadata.run_context")
        );
    }

    #[test]
    fn cancel_marks_snapshot() {
        let mut ctx = RunContext::new();
        ctx.cancel("stop");
        assert!(ctx.canceled);
        let back: RunContext = serde_json::from_value(serde_json::to_value(&ctx).unwrap()).unwrap();
        assert_eq!(back, ctx);
    }

    #[test]
    fn budget_narrowing_takes_the_tighter_limit() {
        let agent = RunBudget {
            max_steps: Some(10),
            max_tool_calls: Some(5),
            ..Default::default()
        };
        let task = RunBudget {
            max_steps: Some(20),
            max_llm_calls: Some(2),
            ..Default::default()
        };
        let b = agent.narrowed_by(&task);
        assert_eq!(
            (b.max_steps, b.max_tool_calls, b.max_llm_calls),
            (Some(10), Some(5), Some(2))
        );
    }
}
