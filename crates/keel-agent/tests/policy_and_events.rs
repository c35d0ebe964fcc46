//! Every side effect is prepared, judged and recorded: the engine's wiring of policy,
//! approvals, budgets and the normalized event stream.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::{approval_part, Agent, AgentBuilder, AgentExecutor, FnTool, SendOptions};
use keel_core::{
    AgentCard, AgentError, AgentResult, ApprovalDecision, ApprovalOutcome, Message, RunBudget,
    RunContext, Task, TaskState, ThreadId,
};
use keel_events::{
    assert_no_denied_actions, assert_run_events, normalize, InMemoryEventSink, Match, RunEvent,
};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, deny_request, ApprovalFn, CapabilityPolicy, CapabilityRule};
use keel_runtime::{AuthContext, RunQuery};
use serde_json::{json, Value};
use support::{executor, stored_report};

fn card() -> AgentCard {
    AgentCard::new("records", "keeps records", "http://127.0.0.1:0")
}

fn write_tool(writes: Arc<AtomicUsize>) -> FnTool {
    FnTool::new(
        "write_record",
        "Write a record",
        json!({"type": "object", "properties": {"id": {"type": "string"}, "api_key": {"type": "string"}}, "required": ["id"]}),
        move |args, _ctx| {
            let writes = writes.clone();
            async move {
                writes.fetch_add(1, Ordering::SeqCst);
                Ok(json!(format!("wrote {}", args["id"].as_str().unwrap_or_default())))
            }
        },
    )
    .with_capabilities(["records.write"])
    .with_preview(|args| Some(keel_core::Artifact::text(format!("will write record {}", args["id"])).of_kind("preview")))
}

fn script(calls: usize) -> Arc<MockLlm> {
    let mut responses: Vec<MockResponse> = (0..calls)
        .map(|i| {
            MockResponse::ToolCalls(vec![ToolCall::new(
                "write_record",
                json!({"id": format!("r{i}"), "api_key": "sk-secret"}),
            )])
        })
        .collect();
    responses.push(MockResponse::Text("done".into()));
    Arc::new(MockLlm::scripted(responses))
}

/// The records agent with `write_record` on an in-memory runtime, its events collected: what
/// most tests here set up, each adding the rule it is about (a policy, a handler, a budget).
struct Records {
    exec: AgentExecutor,
    auth: AuthContext,
    sink: Arc<InMemoryEventSink>,
    /// How many writes actually ran.
    writes: Arc<AtomicUsize>,
}

impl Records {
    /// The agent over `llm`, as `configure` finishes building it.
    fn new(llm: Arc<MockLlm>, configure: impl FnOnce(AgentBuilder) -> AgentBuilder) -> Self {
        let writes = Arc::new(AtomicUsize::new(0));
        let builder = Agent::builder(card())
            .llm_shared(llm)
            .tool(write_tool(writes.clone()));
        let (exec, auth, sink) = executor(configure(builder).build().unwrap());
        Self {
            exec,
            auth,
            sink,
            writes,
        }
    }

    /// The agent whose model calls `write_record` `calls` times, then answers.
    fn writing(calls: usize, configure: impl FnOnce(AgentBuilder) -> AgentBuilder) -> Self {
        Self::new(script(calls), configure)
    }

    /// Send `text` and wait for the task's answer.
    async fn send(&self, text: &str) -> Task {
        self.send_in(text, None).await
    }

    /// Send `text` under `run_context` and wait for the task's answer.
    async fn send_in(&self, text: &str, run_context: Option<RunContext>) -> Task {
        let options = SendOptions {
            run_context,
            ..Default::default()
        };
        self.exec
            .send_message(&self.auth, Message::user(text), options)
            .await
            .unwrap()
    }

    /// Answer `task`'s pending approval with `decision`.
    async fn decide(&self, task: &Task, decision: ApprovalDecision) -> AgentResult<Task> {
        self.exec
            .decide_approval(&self.auth, &task.id, decision)
            .await
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }
}

/// A policy that asks a human before every `records.write`.
fn approval_required() -> CapabilityPolicy {
    CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval)
}

/// The approval request a task waiting for one carries.
fn pending_approval(task: &Task) -> keel_core::ApprovalRequest {
    serde_json::from_value(task.metadata["pending_approval"].clone()).unwrap()
}

fn types(events: &[RunEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.event_type.as_str().to_owned())
        .collect()
}

#[tokio::test]
async fn an_allowed_tool_call_emits_the_normalized_sequence_and_a_persisted_report() {
    let records = Records::writing(1, |agent| agent);
    let task = records.send("write r0").await;
    assert_eq!(task.state(), TaskState::Completed);
    let Records {
        exec, auth, sink, ..
    } = records;
    let events = sink.events();
    assert_run_events(
        events.as_slice(),
        &[
            "task.status",
            "queue.drained",
            "context.prepared",
            "llm.call.started",
            "llm.call.completed",
            "message.persisted",
            "action.requested",
            "action.policy",
            "action.started",
            "action.completed",
            "tool_result.persisted",
            "stop.evaluated",
            "queue.drained",
            "context.prepared",
            "llm.call.started",
            "llm.stream",
            "llm.call.completed",
            "message.persisted",
            "stop.evaluated",
            "task.artifact",
            "run.stopped",
            "task.status",
        ],
        Match::Exact,
    );
    assert_no_denied_actions(events.as_slice());
    // One sequence per run, from 1, without gaps.
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    // The golden run: the normalized event sequence (ids, times and durations replaced) is
    // exactly the committed snapshot. Set KEEL_UPDATE_GOLDEN=1 to rewrite it after an
    // intended change, and review the diff.
    let golden = serde_json::to_string_pretty(&normalize(&events)).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/allowed_tool_call.json");
    if std::env::var_os("KEEL_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, format!("{golden}\n")).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .expect("the golden file exists (KEEL_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(
        golden.trim_end(),
        expected.trim_end(),
        "the normalized event stream changed"
    );

    // The report is persisted through the run store, redacted.
    let ctx = RunContext::from_task(&task).unwrap().unwrap();
    let stored = stored_report(&exec, &auth, &ctx.run_id).await;
    let text = stored.report.to_string();
    assert!(
        !text.contains("sk-secret"),
        "the api_key must be redacted in the persisted report"
    );
    assert!(text.contains("write_record"));
    // The run's record is its report: the engine writes no task snapshot beside it, the task
    // store being the task's one home (decision 258).
    let records = exec
        .runtime()
        .run_store()
        .find_task_records(&auth, &RunQuery::default())
        .await
        .unwrap();
    assert!(records.is_empty(), "{records:?}");
    // The report is indexed by the run's context and names the agent.
    assert_eq!(stored.run_id, ctx.run_id);
    assert_eq!(stored.task_id.as_ref(), Some(&task.id));
    assert_eq!(stored.thread_id.as_ref(), Some(&task.thread_id));
    assert_eq!(stored.trace_id.as_ref(), Some(&ctx.trace_id));
    assert_eq!(stored.agent_name.as_deref(), Some("records"));
}

#[tokio::test]
async fn a_denied_action_never_runs_and_the_model_sees_the_denial() {
    let records = Records::writing(1, |agent| {
        agent.policy(CapabilityPolicy::new().with_rule("records.*", CapabilityRule::Deny))
    });
    let task = records.send("write").await;
    assert_eq!(records.writes(), 0);
    assert_eq!(
        task.state(),
        TaskState::Completed,
        "a denial is a tool result, not a crash"
    );
    let outputs: Vec<String> = keel_runtime::testing::tool_outputs(&task)
        .iter()
        .map(|(output, _)| output.to_string())
        .collect();
    assert!(outputs[0].contains("denied"), "{outputs:?}");
    assert!(types(&records.sink.events()).contains(&"action.denied".to_owned()));
}

#[tokio::test]
async fn run_permissions_narrow_the_agent_policy_but_never_widen_it() {
    let permitting = |decision: &str| {
        let mut ctx = RunContext::new();
        ctx.permissions
            .insert("records.write".into(), json!(decision));
        Some(ctx)
    };
    // The agent allows writes; this run's permissions deny them.
    let records = Records::writing(1, |agent| agent);
    records.send_in("write", permitting("deny")).await;
    assert_eq!(records.writes(), 0, "a run can narrow");

    // The agent denies writes; this run's permissions try to allow them.
    let records = Records::writing(1, |agent| {
        agent.policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::Deny))
    });
    records.send_in("write", permitting("allow")).await;
    assert_eq!(records.writes(), 0, "a run can never widen");
}

#[tokio::test]
async fn an_approval_handler_decides_in_process() {
    let handler = ApprovalFn::new(
        |request: keel_core::ApprovalRequest, _ctx: RunContext| async move {
            // Approve the first record only.
            Ok(if request.action.payload["id"] == "r0" {
                approve_request(&request, "ops")
            } else {
                deny_request(&request, "one is enough")
            })
        },
    );
    let records = Records::writing(2, |agent| {
        agent.policy(approval_required()).approval_handler(handler)
    });
    let task = records.send("write two").await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(records.writes(), 1, "only the approved write ran");
    let t = types(&records.sink.events());
    assert_eq!(t.iter().filter(|t| *t == "approval.required").count(), 2);
    assert_eq!(t.iter().filter(|t| *t == "approval.decided").count(), 2);
    assert!(t.contains(&"action.denied".to_owned()));
}

#[tokio::test]
async fn without_a_handler_approval_fails_closed_and_waits_durably_for_a_decision() {
    let records = Records::writing(1, |agent| agent.policy(approval_required()));
    let task = records.send("write").await;
    assert_eq!(
        task.state(),
        TaskState::InputRequired,
        "waiting for approval"
    );
    assert_eq!(records.writes(), 0, "fail closed: nothing ran");
    let pending = pending_approval(&task);
    assert_eq!(
        pending.action.capabilities,
        ["records.write"],
        "the tool's capabilities are part of the action"
    );
    assert!(
        pending.action.previews.len() == 1,
        "the preview travels with the request"
    );
    assert_eq!(
        pending.action.payload["api_key"], "[REDACTED]",
        "the persisted request is redacted"
    );

    // A decision for another request is refused.
    let mut wrong = approve_request(&pending, "ops");
    wrong.request_id = "someone-else".into();
    let err = records.decide(&task, wrong).await.unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }));

    let done = records
        .decide(&task, approve_request(&pending, "ops"))
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed, "{:?}", done.status());
    assert_eq!(records.writes(), 1, "the approved action ran once");
    assert!(!done.metadata.contains_key("pending_approval"));
}

#[tokio::test]
async fn a_denied_approval_becomes_a_tool_error() {
    let records = Records::writing(1, |agent| agent.policy(approval_required()));
    let task = records.send("write").await;
    let denial = deny_request(&pending_approval(&task), "not today");
    let done = records.decide(&task, denial).await.unwrap();
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(records.writes(), 0);
}

#[tokio::test]
async fn an_approval_message_decides_and_never_joins_the_models_conversation() {
    let llm = script(1);
    let records = Records::new(llm.clone(), |agent| agent.policy(approval_required()));
    let task = records.send("write").await;
    let pending = pending_approval(&task);
    let (exec, auth, sink) = (&records.exec, &records.auth, &records.sink);
    let answer = |outcome| {
        let mut message = Message::new(
            keel_core::Role::User,
            vec![approval_part(
                &pending.request_id,
                outcome,
                Some("go ahead"),
            )],
        );
        message.task_id = Some(task.id.clone());
        message
    };
    // Answer the task with an approval message that decides `outcome`.
    let decide = |outcome| exec.send_message(auth, answer(outcome), SendOptions::default());
    let done = decide(ApprovalOutcome::Approved).await.unwrap();
    assert_eq!(done.state(), TaskState::Completed, "{:?}", done.status());
    assert_eq!(records.writes(), 1);

    // The decision names who made it, and the model saw the tool's result right after its
    // call, with no user message between them.
    let decided = sink
        .events()
        .into_iter()
        .find(|e| e.event_type == keel_events::EventType::APPROVAL_DECIDED)
        .expect("an approval.decided event");
    assert_eq!(
        decided.payload["decision"]["decided_by"],
        auth.user_name.as_str()
    );
    assert_eq!(decided.payload["decision"]["reason"], "go ahead");
    let last = llm.requests().pop().expect("the model was called again");
    let users = last
        .messages
        .iter()
        .filter(|m| m.role == keel_llm::LlmRole::User)
        .count();
    assert_eq!(
        users, 1,
        "only the first message joins the conversation: {:?}",
        last.messages
    );
    assert_eq!(
        last.messages.last().map(|m| m.role),
        Some(keel_llm::LlmRole::Tool),
        "{:?}",
        last.messages
    );

    // The task waits no more: another decision is refused, naming its state.
    let err = decide(ApprovalOutcome::Denied).await.unwrap_err();
    assert!(
        matches!(&err, AgentError::InvalidInput { reason, .. } if reason.contains("completed")),
        "{err:?}"
    );
}

#[tokio::test]
async fn budget_limits_stop_the_run_before_the_protected_operation() {
    // Each limit at 1, named as the budget's field (and the stop reason) names it.
    for limit in [
        "max_llm_calls",
        "max_tool_calls",
        "max_steps",
        "max_input_tokens",
    ] {
        let budget: RunBudget = serde_json::from_value(json!({ limit: 1 })).unwrap();
        let records = Records::writing(2, |agent| agent);
        let ctx = RunContext::new().with_budget(budget);
        let task = records.send_in("write", Some(ctx)).await;
        assert_eq!(task.state(), TaskState::Failed, "{limit}");
        assert_eq!(task.metadata["stop_reason"], limit);
        let exceeded: Vec<RunEvent> = records
            .sink
            .events()
            .into_iter()
            .filter(|e| e.is("budget.exceeded"))
            .collect();
        assert_eq!(exceeded.len(), 1, "{limit}");
        assert_eq!(exceeded[0].payload["limit"], limit);
    }
}

#[tokio::test]
async fn max_output_tokens_is_enforced_from_an_estimate_when_the_model_reports_no_usage() {
    // The model reports zero usage for a long answer and a tool call: the run must count
    // their estimated size (well over 10 tokens) and stop before the second model call.
    let model = MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new(
            "write_record",
            json!({"id": "a fairly long record identifier that costs tokens"}),
        )]),
        MockResponse::Text("done".into()),
    ])
    .with_usage(keel_llm::Usage::default());
    let records = Records::new(Arc::new(model), |agent| agent);
    let budget = RunBudget {
        max_output_tokens: Some(10),
        ..Default::default()
    };
    let task = records
        .send_in("write", Some(RunContext::new().with_budget(budget)))
        .await;

    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(task.metadata["stop_reason"], "max_output_tokens");
    assert_eq!(records.writes(), 0, "no tool runs past the limit");
    let events = records.sink.events();
    let completed = events.iter().find(|e| e.is("llm.call.completed")).unwrap();
    assert!(
        completed.payload["output_tokens"].as_u64().unwrap() > 10,
        "{}",
        completed.payload
    );
}

/// The error of calling tool `name` directly (no model) on a new thread.
async fn direct_call_error(
    exec: &AgentExecutor,
    auth: &AuthContext,
    name: &str,
    arguments: Value,
) -> AgentError {
    exec.call_tool_in_context(auth, ThreadId::new(), name, arguments, RunContext::new())
        .await
        .unwrap_err()
}

#[tokio::test]
async fn the_deterministic_call_path_goes_through_the_same_policy() {
    let writes = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder(card())
        .tool(write_tool(writes.clone()))
        .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    let err = direct_call_error(&exec, &auth, "write_record", json!({"id": "x"})).await;
    let AgentError::ApprovalRequired { request } = err else {
        panic!("expected ApprovalRequired")
    };
    assert_eq!(request.action.name, "write_record");
    assert_eq!(writes.load(Ordering::SeqCst), 0);
    let err = direct_call_error(&exec, &auth, "write_record", json!({"id": 3})).await;
    assert!(
        matches!(err, AgentError::InvalidInput { .. }),
        "arguments are validated first"
    );
    assert!(types(&sink.events()).contains(&"approval.required".to_owned()));
    let _: Value = json!(null);
}

/// A tool that prepares its own action: a custom kind and capability, and (on purpose) not
/// its declared one.
struct Transfer;

#[async_trait::async_trait]
impl keel_agent::Tool for Transfer {
    fn name(&self) -> &str {
        "transfer"
    }
    fn description(&self) -> &str {
        "Move money"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]})
    }
    fn capabilities(&self) -> Vec<String> {
        vec!["payments.write".into()]
    }
    fn prepare_action(&self, args: &Value) -> Option<keel_core::RunAction> {
        let mut action = keel_core::RunAction::tool_call("transfer", args.clone());
        action.kind = "payment".into();
        action.capabilities = vec!["payments.large".into()];
        Some(action)
    }
    async fn call(
        &self,
        _args: Value,
        _ctx: &keel_agent::ToolContext,
    ) -> keel_core::AgentResult<Value> {
        Ok(json!("sent"))
    }
}

#[tokio::test]
async fn the_tools_declared_capabilities_are_merged_into_a_custom_action() {
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("transfer", json!({"amount": 10}))]),
        MockResponse::Text("ok".into()),
    ]));
    // Policy denies the declared capability; the custom action tried to leave it out.
    let agent = Agent::builder(card())
        .llm_shared(llm)
        .tool(Transfer)
        .policy(CapabilityPolicy::new().with_rule("payments.write", CapabilityRule::Deny))
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    exec.send_message(&auth, Message::user("pay"), SendOptions::default())
        .await
        .unwrap();
    let requested = sink
        .events()
        .into_iter()
        .find(|e| e.is("action.requested"))
        .unwrap();
    let action: keel_core::RunAction =
        serde_json::from_value(requested.payload["action"].clone()).unwrap();
    assert_eq!(action.kind, "payment");
    assert_eq!(action.capabilities, ["payments.large", "payments.write"]);
    assert!(
        types(&sink.events()).contains(&"action.denied".to_owned()),
        "the declared capability still counts"
    );
}

/// Decision 255: the run's final status names the task, its state and its status message,
/// and carries no copy of the task; the task and its run context are read from the store.
#[tokio::test]
async fn the_runs_final_status_event_names_the_task_and_the_store_holds_its_run_context() {
    let agent = Agent::builder(card())
        .llm_shared(Arc::new(MockLlm::scripted(vec![MockResponse::Text(
            "done".into(),
        )])))
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    let mut ctx = RunContext::new();
    ctx.workspace_uri = Some("file:///workspace".into());
    let task = exec
        .send_message(
            &auth,
            Message::user("go"),
            SendOptions {
                run_context: Some(ctx.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let events = sink.events();
    let last = events.last().unwrap();
    assert!(last.is("task.status") && last.is_final);
    assert_eq!(last.task_id.as_ref(), Some(&task.id));
    assert_eq!(last.payload["state"], "completed");
    assert_eq!(last.payload["message"], "done");
    assert!(last.payload.get("task").is_none(), "{:?}", last.payload);
    assert_eq!(last.run_context().unwrap(), None);
    let stored = exec.reads().task(&auth, &task.id).await.unwrap();
    let recovered = RunContext::from_task(&stored).unwrap().unwrap();
    assert_eq!(recovered.run_id, ctx.run_id);
    assert_eq!(
        recovered.workspace_uri.as_deref(),
        Some("file:///workspace")
    );
    // The answer's artifact event comes from the task event the log keeps: it names the task.
    let artifact = events.iter().find(|e| e.is("task.artifact")).unwrap();
    assert_eq!(artifact.task_id.as_ref(), Some(&task.id));
}

/// A budget policy of the application's: one model call past `max_llm_calls`, once, for a
/// last answer; everything else as the default enforcer decides.
struct OneGraceCall {
    inner: keel_policy::BudgetEnforcer,
    grace_used: bool,
}

impl keel_policy::BudgetPolicy for OneGraceCall {
    fn usage(&self) -> keel_core::BudgetUsage {
        self.inner.usage()
    }
    fn check_step(&mut self) -> keel_core::AgentResult<Vec<keel_policy::BudgetWarning>> {
        self.inner.check_step()
    }
    fn check_llm_call(
        &mut self,
        manifest: &keel_core::ContextManifest,
    ) -> keel_core::AgentResult<Vec<keel_policy::BudgetWarning>> {
        match self.inner.check_llm_call(manifest) {
            Err(AgentError::BudgetExceeded { limit, .. })
                if limit == "max_llm_calls" && !self.grace_used =>
            {
                self.grace_used = true;
                Ok(Vec::new())
            }
            other => other,
        }
    }
    fn record_llm_usage(&mut self, input: u64, output: u64) {
        self.inner.record_llm_usage(input, output);
    }
    fn check_output_tokens(&mut self) -> keel_core::AgentResult<Vec<keel_policy::BudgetWarning>> {
        self.inner.check_output_tokens()
    }
    fn check_tool_call(&mut self) -> keel_core::AgentResult<Vec<keel_policy::BudgetWarning>> {
        self.inner.check_tool_call()
    }
}

#[tokio::test]
async fn an_agents_budget_policy_decides_at_the_limit_instead_of_the_enforcer() {
    let budget = RunBudget {
        max_llm_calls: Some(1),
        ..Default::default()
    };
    let grace = |budget: RunBudget| -> Box<dyn keel_policy::BudgetPolicy> {
        Box::new(OneGraceCall {
            inner: keel_policy::BudgetEnforcer::new(budget),
            grace_used: false,
        })
    };
    // One tool call, then the answer: two model calls under a limit of one.
    for (custom, state, calls) in [
        (false, TaskState::Failed, 1),
        (true, TaskState::Completed, 2),
    ] {
        let records = Records::writing(1, |agent| {
            let agent = agent.budget(budget.clone());
            if custom {
                agent.budget_policy(grace)
            } else {
                agent
            }
        });
        let task = records.send("write r0").await;
        assert_eq!(task.state(), state, "custom policy: {custom}");
        let events = records.sink.events();
        let started = events.iter().filter(|e| e.is("llm.call.started")).count();
        assert_eq!(started, calls, "custom policy: {custom}");
        let exceeded = events.iter().filter(|e| e.is("budget.exceeded")).count();
        assert_eq!(exceeded, usize::from(!custom), "custom policy: {custom}");
        // The policy's usage is what budget events report: the warning at the limit says 1 of 1.
        let warning = events.iter().find(|e| e.is("budget.warning")).unwrap();
        assert_eq!(warning.payload["usage"]["llm_calls"], 1);
    }
}

/// A tool whose own error already names it, as the HTTP and MCP tools' errors do.
fn failing_fetch() -> FnTool {
    FnTool::new(
        "fetch",
        "Fetch a page",
        json!({"type": "object", "properties": {}}),
        |_args, _ctx| async {
            Err(AgentError::ToolFailed {
                tool: "fetch".into(),
                message: "HTTP 500".into(),
            })
        },
    )
}

#[tokio::test]
async fn a_failed_tool_is_named_once_in_its_error_and_its_event() {
    let agent = Agent::builder(card())
        .tool(failing_fetch())
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    let err = direct_call_error(&exec, &auth, "fetch", json!({})).await;
    assert!(matches!(err, AgentError::ToolFailed { .. }), "{err:?}");
    assert_eq!(err.to_string(), "tool `fetch` failed: HTTP 500");
    let events = sink.events();
    let failed = events.iter().find(|e| e.is("action.failed")).unwrap();
    assert_eq!(failed.payload["error"], "HTTP 500", "{}", failed.payload);
}
