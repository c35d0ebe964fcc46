// The thread engine's rules (Standard Agents §2–§11) on the in-memory store with the offline
// model: one flow per thread, durable queues, stop rules, hand-off, termination.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions, StopRules};
use keel_core::{AgentCard, AgentError, FileContent, Message, Part, TaskState, ThreadId};
use keel_llm::{LlmRole, MockLlm, MockResponse, ModelProfile, ToolCall};
use serde_json::{json, Value};
use tokio::sync::Notify;
use super::fixture::{
    attach, backend, call_then_answer, echo_tool, executor, gate_tool, object_tool,
    register_running_child, scripted, send, start, stored_history, try_send,
};

fn card() -> AgentCard {
    AgentCard::new("threads", "thread engine tests", "http://127.0.0.1:0")
}

/// The test agent with the [`gate_tool`], and the gate's two signals (started, release).
fn gated_agent() -> (Agent, Arc<Notify>, Arc<Notify>) {
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let agent = Agent::builder(card())
        .tool(gate_tool(started.clone(), release.clone()))
        .build()
        .unwrap();
    (agent, started, release)
}

/// An executor of the [`gated_agent`] whose task of `/gate` (on a thread of its own) has
/// reached the gate; the caller, the task and the signal that releases the gate.
async fn at_the_gate() -> (AgentExecutor, keel_runtime::AuthContext, keel_core::Task, Arc<Notify>) {
    let (agent, started, release) = gated_agent();
    let (exec, auth) = executor(agent);
    let task = start(&exec, &auth, Message::user("/gate")).await;
    started.notified().await;
    (exec, auth, task, release)
}

/// An executor whose model calls `tool` once, without arguments, then answers `text`; the
/// caller; and the model, to read what it was sent.
fn calling(tool: FnTool, text: &str) -> (AgentExecutor, keel_runtime::AuthContext, Arc<MockLlm>) {
    let name = keel_agent::Tool::name(&tool).to_owned();
    scripted(card(), call_then_answer(&name, json!({}), text), |agent| agent.tool(tool))
}

/// Sends "go" to `agent` and checks that the run stopped its task in `state` by the stop rule
/// `reason`; the task.
async fn stopped(agent: Agent, state: TaskState, reason: &str) -> keel_core::Task {
    let (exec, auth) = executor(agent);
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), state, "{reason}");
    assert_eq!(stop_reason(&task), reason);
    task
}

/// A tool that queues "a note queued mid-run" on its own thread.
fn note_tool() -> FnTool {
    object_tool("note", "Queue a note", |_a, ctx| async move {
        ctx.thread.queue_message("a note queued mid-run").await?;
        Ok(json!("queued"))
    })
}

fn stop_reason(task: &keel_core::Task) -> &str {
    task.metadata["stop_reason"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_message_to_a_busy_thread_is_queued_and_runs_after_the_current_one() {
    let (agent, started, release) = gated_agent();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    let first = start(&exec, &auth, Message::user("/gate").in_thread(thread.clone())).await;
    started.notified().await;
    let second = start(&exec, &auth, Message::user("after").in_thread(thread.clone())).await;
    let waiting = exec.get_task(&auth, &second.id, None).await.unwrap();
    assert_eq!(
        waiting.state(),
        TaskState::Submitted,
        "queued, not run concurrently"
    );
    assert!(!exec.is_running(&auth, &second.id));
    release.notify_one();
    // Blocking on the second message's answer: it runs once the first is done.
    let mut done = Message::user("third").in_thread(thread.clone());
    done.task_id = None;
    let third = send(&exec, &auth, done).await;
    assert_eq!(third.state(), TaskState::Completed);
    for id in [&first.id, &second.id] {
        assert_eq!(
            exec.get_task(&auth, id, None).await.unwrap().state(),
            TaskState::Completed
        );
    }
    // The thread's history is one clean sequence: first's turn, then second's, then third's.
    let history = stored_history(&exec, &auth, &thread).await;
    let users: Vec<String> = history
        .iter()
        .filter(|e| e.message.role == LlmRole::User)
        .map(|e| e.message.content.clone())
        .collect();
    assert_eq!(users, ["/gate", "after", "third"]);
}

#[tokio::test]
async fn different_threads_run_concurrently() {
    let (exec, auth, blocked, release) = at_the_gate().await;
    let other = send(&exec, &auth, Message::user("hello")).await;
    assert_eq!(
        other.state(),
        TaskState::Completed,
        "another thread is not blocked"
    );
    assert!(exec.is_running(&auth, &blocked.id));
    release.notify_one();
}

#[tokio::test]
async fn a_thread_waiting_for_a_work_slot_keeps_its_lease() {
    let (agent, started, release) = gated_agent();
    let (runtime, auth) = backend();
    let ttl = std::time::Duration::from_millis(900);
    let config = keel_agent::ExecutorConfig {
        lease_ttl: ttl,
        max_concurrent_threads: 1,
        max_threads_per_tenant: 1,
        ..Default::default()
    };
    let exec = AgentExecutor::with_config(agent, runtime.clone(), config);
    let background = || SendOptions::in_background();
    // The only work slot is busy...
    exec.send_message(&auth, Message::user("/gate"), background())
        .await
        .unwrap();
    started.notified().await;
    // ...so the next thread's driver takes that thread's lease and waits for the slot.
    let waiting = ThreadId::new();
    let queued = exec
        .send_message(
            &auth,
            Message::user("hello").in_thread(waiting.clone()),
            background(),
        )
        .await
        .unwrap();
    let threads = runtime.thread_store();
    keel_runtime::testing::eventually("the waiting thread's driver to hold its lease", || {
        let (threads, auth, waiting) = (threads.clone(), auth.clone(), waiting.clone());
        async move {
            match threads
                .acquire_lease(&auth, &waiting, "probe", ttl)
                .await
                .unwrap()
            {
                Some(lease) => {
                    threads.release_lease(&auth, &lease).await.unwrap();
                    false
                }
                None => true,
            }
        }
    })
    .await;
    // A lease taken now lapses after the one the driver took: once it has, the driver's
    // would have too, unless renewed.
    let clock = threads
        .acquire_lease(&auth, &ThreadId::new(), "clock", ttl)
        .await
        .unwrap()
        .expect("a fresh thread's lease is free");
    keel_runtime::testing::eventually("a lease TTL to go by", || {
        let (threads, auth, clock) = (threads.clone(), auth.clone(), clock.thread_id.clone());
        async move {
            threads
                .acquire_lease(&auth, &clock, "probe", ttl)
                .await
                .unwrap()
                .is_some()
        }
    })
    .await;
    assert!(
        threads
            .acquire_lease(&auth, &waiting, "another-process", ttl)
            .await
            .unwrap()
            .is_none(),
        "another process took the thread while its driver waited for a work slot"
    );
    assert_eq!(
        exec.get_task(&auth, &queued.id, None).await.unwrap().state(),
        TaskState::Submitted
    );
    release.notify_one();
    let done = keel_runtime::testing::eventually("the waiting thread's task to run", || {
        let exec = &exec;
        let (auth, id) = (auth.clone(), queued.id.clone());
        async move {
            let task = exec.get_task(&auth, &id, None).await.unwrap();
            task.state().is_terminal().then_some(task)
        }
    })
    .await;
    assert_eq!(done.state(), TaskState::Completed);
}

#[tokio::test]
async fn the_takeover_sweep_runs_work_queued_on_an_idle_thread_with_no_runner() {
    let (runtime, auth) = backend();
    let config = keel_agent::ExecutorConfig {
        lease_ttl: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    let agent = Agent::builder(card()).build().unwrap();
    let exec = AgentExecutor::with_config(agent, runtime.clone(), config);
    // The tenant has been served before: the sweep looks at the tenants the store knows.
    send(&exec, &auth, Message::user("hello")).await;
    let mut updates = exec.task_updates();
    exec.start_takeover();
    // What a process that died right after queueing a message on an idle thread leaves: the
    // item in the thread's queue, no task for it, and no driver anywhere to take it.
    let thread = ThreadId::new();
    let message = Message::user("left behind").in_thread(thread.clone());
    let item = runtime
        .thread_store()
        .push_queue(
            &auth,
            &thread,
            json!({"kind": "message", "message": serde_json::to_value(&message).unwrap()}),
        )
        .await
        .unwrap();
    // The queued message starts a turn of its own, a task named after the queue item.
    let task_id = keel_core::TaskId::from(format!("queued-{}", item.id));
    let done = tokio::time::timeout(keel_runtime::testing::WAIT_DEADLINE, async {
        loop {
            updates.borrow_and_update();
            if let Ok(task) = exec.get_task(&auth, &task_id, None).await {
                if task.state().is_terminal() {
                    return task;
                }
            }
            updates.changed().await.unwrap();
        }
    })
    .await
    .expect("the sweep took the thread and ran its queued message");
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(
        runtime.thread_store().queue_len(&auth, &thread).await.unwrap(),
        0,
        "the item was acknowledged"
    );
    exec.shutdown().await;
}

#[tokio::test]
async fn the_thread_history_carries_the_conversation_across_tasks() {
    let llm = Arc::new(MockLlm::new());
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    send(&exec, &auth, Message::user("my name is Ada").in_thread(thread.clone())).await;
    send(&exec, &auth, Message::user("what is my name?").in_thread(thread.clone())).await;
    let last = llm.requests().pop().unwrap();
    let contents: Vec<&str> = last.messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        contents,
        [
            "my name is Ada",
            "You said: my name is Ada",
            "what is my name?"
        ]
    );
}

#[tokio::test]
async fn work_queued_while_active_is_injected_before_the_next_model_call() {
    let (exec, auth, llm) = calling(note_tool(), "saw the note");
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Completed);
    let second_call = &llm.requests()[1];
    let last = second_call.messages.last().unwrap();
    assert_eq!(
        (last.role, last.content.as_str()),
        (LlmRole::User, "a note queued mid-run")
    );
    let queued = exec
        .runtime()
        .thread_store()
        .peek_queue(&auth, &task.thread_id, 100)
        .await
        .unwrap();
    assert!(
        queued.iter().all(|item| item.payload["kind"] != "message"),
        "injected work is acknowledged: {queued:?}"
    );
}

#[tokio::test]
async fn a_message_queued_while_idle_starts_a_turn() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let thread = ThreadId::new();
    let state = exec.thread(&auth, thread.clone());
    state.queue_message("wake up").await.unwrap();
    // The turn runs as a task in the thread; wait for it through the store's task list.
    let tasks = exec.runtime().task_manager();
    let task = keel_runtime::testing::eventually("the queued message to start a turn", || async {
        let page = tasks
            .list_tasks(
                &auth,
                &keel_runtime::ListTasksFilter {
                    thread_id: Some(thread.clone()),
                    state: Some(TaskState::Completed),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        page.items.into_iter().next()
    })
    .await;
    assert_eq!(
        task.status().message.as_ref().unwrap().text(),
        "You said: wake up"
    );
}

#[tokio::test]
async fn session_stop_and_session_fail_end_the_task_by_the_lifecycle_tools() {
    for (tool, args, state, reason) in [
        (
            "session_stop",
            json!({"result": "all done"}),
            TaskState::Completed,
            "session_stop",
        ),
        (
            "session_fail",
            json!({"error": "cannot"}),
            TaskState::Failed,
            "session_fail",
        ),
    ] {
        let llm = MockLlm::scripted(vec![MockResponse::ToolCalls(vec![ToolCall::new(
            tool, args,
        )])]);
        let agent = Agent::builder(card())
            .llm(llm)
            .lifecycle_tools(true)
            .build()
            .unwrap();
        stopped(agent, state, reason).await;
    }
}

#[tokio::test]
async fn the_stop_tool_ends_the_task_with_its_output() {
    let llm = MockLlm::scripted(vec![MockResponse::ToolCalls(vec![ToolCall::new(
        "echo",
        json!({"x": 1}),
    )])]);
    let agent = Agent::builder(card())
        .llm(llm)
        .tool(echo_tool())
        .stop_tool("echo")
        .build()
        .unwrap();
    let task = stopped(agent, TaskState::Completed, "stop_tool").await;
    assert_eq!(task.status().message.as_ref().unwrap().text(), r#"{"x":1}"#);
}

#[tokio::test]
async fn when_two_stop_rules_fire_at_once_the_lifecycle_tool_wins() {
    let llm = MockLlm::scripted(vec![MockResponse::ToolCalls(vec![
        ToolCall::new("echo", json!({})),
        ToolCall::new("session_fail", json!({"error": "gave up"})),
    ])]);
    let agent = Agent::builder(card())
        .llm(llm)
        .tool(echo_tool())
        .stop_tool("echo")
        .lifecycle_tools(true)
        .build()
        .unwrap();
    stopped(agent, TaskState::Failed, "session_fail").await;
}

#[tokio::test]
async fn without_stop_on_response_the_loop_runs_to_the_step_limit() {
    let (exec, auth, _) = scripted(
        card(),
        (0..3)
            .map(|i| MockResponse::Text(format!("thought {i}")))
            .collect(),
        |agent| {
            agent
                .stop_on_response(false)
                .max_steps(3)
        },
    );
    let task = send(&exec, &auth, Message::user("think")).await;
    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(stop_reason(&task), "max_steps");
}

#[tokio::test]
async fn a_thread_past_its_turn_limit_fails_the_next_task() {
    let agent = Agent::builder(card())
        .stop_rules(StopRules {
            max_session_turns: Some(2),
            ..StopRules::default()
        })
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    for i in 0..2 {
        let task = send(&exec, &auth, Message::user(format!("turn {i}")).in_thread(thread.clone())).await;
        assert_eq!(task.state(), TaskState::Completed);
    }
    let task = send(&exec, &auth, Message::user("one more").in_thread(thread)).await;
    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(stop_reason(&task), "max_session_turns");
}

#[tokio::test]
async fn repeating_the_same_invalid_call_past_the_cap_stops_the_run() {
    let strict = FnTool::new(
        "strict",
        "Needs n",
        json!({"type": "object", "required": ["n"]}),
        |_a, _c| async { Ok(Value::Null) },
    );
    let llm = MockLlm::scripted(
        (0..5)
            .map(|_| MockResponse::ToolCalls(vec![ToolCall::new("strict", json!({}))]))
            .collect(),
    );
    let agent = Agent::builder(card())
        .llm(llm)
        .tool(strict)
        .stop_rules(StopRules {
            max_invalid_repeats: 2,
            ..StopRules::default()
        })
        .build()
        .unwrap();
    let task = stopped(agent, TaskState::Failed, "invalid_tool_repeats").await;
    let first_error = keel_runtime::testing::tool_outputs(&task)
        .into_iter()
        .find_map(|(output, _)| output.as_str().map(str::to_owned));
    assert!(
        first_error
            .unwrap()
            .contains("\"n\" is a required property"),
        "the model is told which field is wrong"
    );
}

#[tokio::test]
async fn ask_human_waits_in_input_required_and_the_answer_resumes_the_same_task() {
    let (exec, auth, llm) = scripted(
        card(),
        vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "ask_human",
                json!({"question": "Which city?"}),
            )]),
            MockResponse::Text("Booked in Lisbon.".into()),
        ],
        |agent| agent.human_handoff(true),
    );
    let task = send(&exec, &auth, Message::user("book a hotel")).await;
    assert_eq!(task.state(), TaskState::InputRequired);
    assert_eq!(
        task.status().message.as_ref().unwrap().text(),
        "Which city?"
    );
    let mut answer = Message::user("Lisbon");
    answer.task_id = Some(task.id.clone());
    let done = send(&exec, &auth, answer).await;
    assert_eq!(done.id, task.id);
    assert_eq!(done.state(), TaskState::Completed);
    let last_request = llm.requests().pop().unwrap();
    assert_eq!(
        last_request.messages.last().unwrap().content,
        "Lisbon",
        "the model sees the human's answer"
    );
}

#[tokio::test]
async fn the_key_value_store_and_prompt_variables_are_per_thread() {
    let remember = object_tool("remember", "Store the city", |args, ctx| async move {
        ctx.thread.set_value("city", args["city"].clone()).await?;
        let reserved = ctx.thread.set_value("keel:x", json!(1)).await;
        assert!(
            matches!(&reserved, Err(AgentError::InvalidInput { field, .. }) if field == "key"),
            "keel: keys are reserved: {reserved:?}"
        );
        Ok(json!("ok"))
    });
    let (exec, auth, llm) = scripted(
        card(),
        vec![
            MockResponse::ToolCalls(vec![ToolCall::new("remember", json!({"city": "Oslo"}))]),
            MockResponse::Text("noted".into()),
            MockResponse::Text("again".into()),
        ],
        |agent| {
            agent
                .instructions("User city: {{city}}. Agent {{agent_name}}.")
                .tool(remember)
        },
    );
    let thread = ThreadId::new();
    send(&exec, &auth, Message::user("I live in Oslo").in_thread(thread.clone())).await;
    send(&exec, &auth, Message::user("hi").in_thread(thread.clone())).await;
    let system = llm.requests().pop().unwrap().messages[0].content.clone();
    assert_eq!(system, "User city: Oslo. Agent threads.");
    assert_eq!(
        exec.thread(&auth, thread).get_value("city").await.unwrap(),
        Some(json!("Oslo"))
    );
    assert_eq!(
        exec.thread(&auth, ThreadId::new())
            .get_value("city")
            .await
            .unwrap(),
        None,
        "isolated per thread"
    );
}

#[tokio::test]
async fn a_terminated_thread_refuses_work_and_updates_its_parent_registry() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let (parent, child) = (ThreadId::new(), ThreadId::new());
    register_running_child(
        exec.runtime().as_ref(),
        &auth,
        &child,
        &parent,
        "helper",
        "threads",
    )
    .await;
    let state = exec.thread(&auth, child.clone());
    state.notify_parent("halfway there").await.unwrap();
    state.terminate().await.unwrap();
    let more = Message::user("more").in_thread(child.clone());
    let err = try_send(&exec, &auth, more).await.unwrap_err();
    assert!(matches!(err, AgentError::ThreadTerminated { .. }));
    assert!(matches!(
        state.queue_message("x").await,
        Err(AgentError::ThreadTerminated { .. })
    ));
    let entry = exec
        .runtime()
        .thread_store()
        .child(&auth, &child)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.status, "terminated");
    assert_eq!(
        exec.thread(&auth, child).parent().await.unwrap(),
        Some(parent)
    );
}

/// A model that notes what each request said (role and text) and lets the request go, as a
/// provider does, so the engine's view of the thread is never held elsewhere.
struct Noting {
    script: std::sync::Mutex<Vec<keel_llm::LlmResponse>>,
    seen: std::sync::Mutex<Vec<Vec<(LlmRole, String)>>>,
}

#[async_trait::async_trait]
impl keel_llm::Llm for Noting {
    fn model_name(&self) -> &str {
        "noting"
    }
    async fn complete(
        &self,
        request: keel_llm::LlmRequest,
    ) -> keel_core::AgentResult<keel_llm::LlmResponse> {
        let said = request
            .messages
            .iter()
            .map(|m| (m.role, m.content.clone()))
            .collect();
        self.seen.lock().unwrap().push(said);
        Ok(self.script.lock().unwrap().remove(0))
    }
}

#[tokio::test]
async fn each_step_sends_the_whole_history_and_the_prompt_as_it_is_now() {
    let relocate = object_tool("relocate", "Store the city", |args, ctx| async move {
        ctx.thread.set_value("city", args["city"].clone()).await?;
        Ok(json!("moved"))
    });
    let call = |city: &str| keel_llm::LlmResponse {
        content: None,
        tool_calls: vec![ToolCall::new("relocate", json!({ "city": city }))],
        usage: Default::default(),
    };
    let llm = Arc::new(Noting {
        script: std::sync::Mutex::new(vec![
            call("Oslo"),
            call("Bergen"),
            keel_llm::LlmResponse::text("settled"),
            keel_llm::LlmResponse::text("still here"),
        ]),
        seen: Default::default(),
    });
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .instructions("City: {{city}}.")
        .tool(relocate)
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    for text in ["move me", "and now?"] {
        send(&exec, &auth, Message::user(text).in_thread(thread.clone())).await;
    }
    let seen = llm.seen.lock().unwrap().clone();
    let system: Vec<&str> = seen.iter().map(|r| r[0].1.as_str()).collect();
    // The prompt follows the variable a tool changed during the same run.
    assert_eq!(
        system,
        ["City: {{city}}.", "City: Oslo.", "City: Bergen.", "City: Bergen."]
    );
    let roles: Vec<Vec<LlmRole>> = seen
        .iter()
        .map(|r| r.iter().map(|(role, _)| *role).collect())
        .collect();
    use LlmRole::{Assistant as A, System as S, Tool as T, User as U};
    assert_eq!(
        roles,
        [
            vec![S, U],
            vec![S, U, A, T],
            vec![S, U, A, T, A, T],
            vec![S, U, A, T, A, T, A, U],
        ]
    );
    // Each request is the previous one plus what the thread gained since.
    for pair in seen.windows(2) {
        assert_eq!(pair[0][1..], pair[1][1..pair[0].len()]);
    }
    let last = &seen[3];
    assert_eq!(last[1].1, "move me");
    assert_eq!(last[6].1, "settled");
    assert_eq!(last[7].1, "and now?");
}

/// An executor of an agent behind `negotiator`; the caller; and the offline model its
/// accepted tasks reach.
fn negotiating(
    negotiator: impl keel_agent::Negotiator + 'static,
) -> (AgentExecutor, keel_runtime::AuthContext, Arc<MockLlm>) {
    let llm = Arc::new(MockLlm::new());
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .negotiator(negotiator)
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    (exec, auth, llm)
}

struct NoSpam;

#[async_trait::async_trait]
impl keel_agent::Negotiator for NoSpam {
    async fn negotiate(
        &self,
        _card: &AgentCard,
        message: &Message,
    ) -> keel_core::AgentResult<keel_agent::Negotiation> {
        let text = message.text();
        Ok(if text.contains("spam") {
            keel_agent::Negotiation::Reject {
                reason: "no spam, please".into(),
            }
        } else if text.len() < 3 {
            keel_agent::Negotiation::AskInput {
                question: "Could you say more?".into(),
            }
        } else {
            keel_agent::Negotiation::Accept {
                skill: Some("echo".into()),
            }
        })
    }
}

#[tokio::test]
async fn the_negotiator_accepts_asks_or_rejects_before_a_task_starts() {
    let (exec, auth, llm) = negotiating(NoSpam);
    let rejected = send(&exec, &auth, Message::user("buy spam now")).await;
    assert_eq!(rejected.state(), TaskState::Rejected);
    assert_eq!(
        rejected.status().message.as_ref().unwrap().text(),
        "no spam, please"
    );
    assert!(
        llm.requests().is_empty(),
        "a rejected task never reaches the model"
    );

    let asked = send(&exec, &auth, Message::user("hi")).await;
    assert_eq!(asked.state(), TaskState::InputRequired);
    let mut answer = Message::user("hello there, agent");
    answer.task_id = Some(asked.id.clone());
    let done = send(&exec, &auth, answer).await;
    assert_eq!(done.state(), TaskState::Completed);

    let accepted = send(&exec, &auth, Message::user("a fine request")).await;
    assert_eq!(accepted.metadata["skill"], "echo");
}

#[tokio::test]
async fn the_model_negotiator_reads_a_json_verdict() {
    let router = Arc::new(MockLlm::scripted(vec![MockResponse::Text(
        r#"{"decision": "reject", "reason": "off-topic"}"#.into(),
    )]));
    let agent = Agent::builder(card())
        .negotiator(keel_agent::LlmNegotiator::new(router.clone()))
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let task = send(&exec, &auth, Message::user("tell me a joke")).await;
    assert_eq!(task.state(), TaskState::Rejected);
    assert!(
        router.requests()[0].messages[0]
            .content
            .contains("Agent: threads"),
        "the model sees the card"
    );
}

/// Roles and texts of a request, system prompt left out.
fn roles(request: &keel_llm::LlmRequest) -> Vec<(LlmRole, String)> {
    request
        .messages
        .iter()
        .filter(|m| m.role != LlmRole::System)
        .map(|m| (m.role, m.content.clone()))
        .collect()
}

#[tokio::test]
async fn two_agents_on_one_thread_each_see_the_other_as_the_user_without_its_tools() {
    // dual_ai (§4): alpha and beta take turns on one thread. Each side's own turns are
    // `assistant`; the other side's text is `user`; the other side's tool calls and tool
    // results are not sent at all.
    let (runtime, auth) = backend();
    let alpha_llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("echo", json!({"x": 1}))]),
        MockResponse::Text("alpha: hello beta".into()),
        MockResponse::Text("alpha: thanks".into()),
    ]));
    let beta_llm = Arc::new(MockLlm::scripted(vec![MockResponse::Text(
        "beta: hi alpha".into(),
    )]));
    let side = |name: &str, llm: Arc<MockLlm>| {
        let agent = Agent::builder(AgentCard::new(name, "a side", "http://127.0.0.1:0"))
            .llm_shared(llm)
            .tool(echo_tool())
            .build()
            .unwrap();
        AgentExecutor::new(agent, runtime.clone())
    };
    let (alpha, beta) = (side("alpha", alpha_llm.clone()), side("beta", beta_llm.clone()));
    let thread = ThreadId::new();
    let say = |exec: &AgentExecutor, text: &str| {
        let (exec, auth, message) = (
            exec.clone(),
            auth.clone(),
            Message::user(text).in_thread(thread.clone()),
        );
        async move {
            send(&exec, &auth, message).await
        }
    };

    let first = say(&alpha, "start").await;
    assert_eq!(first.state(), TaskState::Completed);
    let second = say(&beta, "reply to alpha").await;
    assert_eq!(second.state(), TaskState::Completed);
    let text = |s: &str| s.to_owned();
    assert_eq!(
        roles(&beta_llm.requests()[0]),
        [
            (LlmRole::User, text("start")),
            (LlmRole::User, text("alpha: hello beta")),
            (LlmRole::User, text("reply to alpha")),
        ]
    );
    assert!(beta_llm.requests()[0]
        .messages
        .iter()
        .all(|m| m.tool_calls.is_empty() && m.tool_call_id.is_none()));

    let third = say(&alpha, "wrap up").await;
    assert_eq!(third.state(), TaskState::Completed);
    let request = &alpha_llm.requests()[2];
    assert_eq!(
        roles(request),
        [
            (LlmRole::User, text("start")),
            (LlmRole::Assistant, text("")),
            (LlmRole::Tool, text(r#"{"x":1}"#)),
            (LlmRole::Assistant, text("alpha: hello beta")),
            (LlmRole::User, text("reply to alpha")),
            (LlmRole::User, text("beta: hi alpha")),
            (LlmRole::User, text("wrap up")),
        ]
    );
    let own_calls: usize = request.messages.iter().map(|m| m.tool_calls.len()).sum();
    assert_eq!(own_calls, 1, "alpha's own call is shown");

    // The stored history is one conversation, both sides as they spoke.
    let stored: Vec<_> = runtime
        .thread_store()
        .read_history(&auth, &thread, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.message.role, e.message.content))
        .collect();
    assert!(stored.contains(&(LlmRole::Assistant, text("beta: hi alpha"))));
}

/// A file named `name` of `media_type`, its content not yet said.
fn named_file(name: &str, media_type: &str) -> FileContent {
    FileContent {
        name: Some(name.into()),
        media_type: Some(media_type.into()),
        ..Default::default()
    }
}

/// An image sent inline.
fn image() -> FileContent {
    FileContent {
        bytes: Some("aGk=".into()),
        ..named_file("cat.png", "image/png")
    }
}

/// A document sent by reference.
fn document() -> FileContent {
    FileContent {
        uri: Some("https://example.com/notes.pdf".into()),
        ..named_file("notes.pdf", "application/pdf")
    }
}

#[tokio::test]
async fn images_reach_only_a_model_with_vision_and_the_history_keeps_them() {
    for vision in [false, true] {
        let llm = Arc::new(
            MockLlm::scripted(vec![MockResponse::Text("seen".into())])
                .with_profile(ModelProfile::new("mock", "mock").with_vision(vision)),
        );
        let agent = Agent::builder(card()).llm_shared(llm.clone()).build().unwrap();
        let (exec, auth) = executor(agent);
        let message = Message::user("what is this?")
            .with_part(Part::file(image()))
            .with_part(Part::file(document()));
        let task = send(&exec, &auth, message).await;
        assert_eq!(task.state(), TaskState::Completed);

        let sent = llm.requests()[0].messages.last().unwrap().clone();
        if vision {
            assert_eq!(sent.attachments, [image(), document()]);
            assert_eq!(sent.content, "what is this?");
        } else {
            assert_eq!(sent.attachments, [document()], "the image is filtered out");
            assert_eq!(
                sent.content,
                "what is this?\n[image `cat.png` omitted: this model does not read images]"
            );
        }
        // The stored message keeps both files either way.
        let history = stored_history(&exec, &auth, &task.thread_id).await;
        assert_eq!(history[0].message.attachments, [image(), document()]);
        assert_eq!(history[0].message.content, "what is this?");
    }
}

#[tokio::test]
async fn stored_attachments_reach_the_model_as_bytes_and_stay_references_in_the_history() {
    // A file of the thread's own store is a `keel-attachment://` reference no provider can
    // fetch: the request copy carries its bytes, the stored message only the reference.
    let llm = Arc::new(
        MockLlm::scripted(vec![MockResponse::Text("seen".into())])
            .with_profile(ModelProfile::new("mock", "mock").with_vision(true)),
    );
    let agent = Agent::builder(card()).llm_shared(llm.clone()).build().unwrap();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    let state = exec.thread(&auth, thread.clone());
    let photo = attach(&state, "cat.png", Some("image/png"), b"png!").await;
    let notes = attach(&state, "notes.txt", Some("text/plain"), b"hi").await;
    let big = attach(&state, "big.log", None, &vec![b'x'; 64 * 1024]).await;
    let message = Message::user("look")
        .in_thread(thread.clone())
        .with_part(Part::file(photo.clone()))
        .with_part(Part::file(notes.clone()))
        .with_part(Part::file(big.clone()));
    let task = send(&exec, &auth, message).await;
    assert_eq!(task.state(), TaskState::Completed);

    let sent = llm.requests()[0].messages.last().unwrap().clone();
    let with_bytes = |file: &FileContent, bytes: &str| FileContent {
        bytes: Some(bytes.into()),
        ..file.clone()
    };
    assert_eq!(
        sent.attachments,
        [
            with_bytes(&photo, "cG5nIQ=="),
            with_bytes(&notes, "aGk="),
            big.clone()
        ],
        "a file too large to be shown stays a reference"
    );
    let history = stored_history(&exec, &auth, &thread).await;
    assert_eq!(history[0].message.attachments, [photo, notes, big]);
}

#[tokio::test]
async fn each_step_drains_assembles_calls_persists_runs_tools_in_order_then_evaluates_stops() {
    // §3: one run of two steps. Step 1's model asks for two tools (the first queues a
    // message); step 2 answers. The markers of each step must come in exactly the seed's order.
    let (exec, auth, llm) = scripted(
        card(),
        vec![
            MockResponse::ToolCalls(vec![
                ToolCall::new("note", json!({})),
                ToolCall::new("echo", json!({"n": 2})),
            ]),
            MockResponse::Text("done".into()),
        ],
        |agent| {
            agent
                .tool(note_tool())
                .tool(echo_tool())
        },
    );
    let sink = Arc::new(keel_events::InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Completed);

    let markers: Vec<String> = sink
        .events()
        .iter()
        .filter_map(|e| {
            let kind = e.event_type.as_str();
            let step = e.step.map(|s| format!("{s}:")).unwrap_or_default();
            match kind {
                "queue.drained" | "queue.injected" | "context.prepared" | "llm.call.started"
                | "llm.call.completed" | "message.persisted" | "stop.evaluated" => {
                    Some(format!("{step}{kind}"))
                }
                "action.started" => Some(format!("{kind} {}", e.summary)),
                "action.completed" => Some(kind.to_owned()),
                "tool_result.persisted" => Some(format!("{step}{kind} {}", e.payload["tool"])),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        markers,
        [
            "1:queue.drained",
            "1:context.prepared",
            "1:llm.call.started",
            "1:llm.call.completed",
            "1:message.persisted",
            "action.started tool_call `note` started",
            "action.completed",
            "1:tool_result.persisted \"note\"",
            "action.started tool_call `echo` started",
            "action.completed",
            "1:tool_result.persisted \"echo\"",
            "1:stop.evaluated",
            "queue.injected",
            "2:queue.drained",
            "2:context.prepared",
            "2:llm.call.started",
            "2:llm.call.completed",
            "2:message.persisted",
            "2:stop.evaluated",
        ]
    );
    let stops: Vec<Value> = sink
        .events()
        .iter()
        .filter(|e| e.event_type.as_str() == "stop.evaluated")
        .map(|e| e.payload["stop"].clone())
        .collect();
    assert_eq!(stops, [Value::Null, json!("response")]);

    // What each marker stands for is in the store in the same order, and the model's second
    // call saw the results in call order, then the message drained at the top of step 2.
    let history: Vec<_> = stored_history(&exec, &auth, &task.thread_id).await
        .into_iter()
        .map(|e| (e.message.role, e.message.tool_name, e.message.content))
        .collect();
    let entry = |role, tool: Option<&str>, content: &str| {
        (role, tool.map(str::to_owned), content.to_owned())
    };
    assert_eq!(
        history,
        [
            entry(LlmRole::User, None, "go"),
            entry(LlmRole::Assistant, None, ""),
            entry(LlmRole::Tool, Some("note"), "queued"),
            entry(LlmRole::Tool, Some("echo"), r#"{"n":2}"#),
            entry(LlmRole::User, None, "a note queued mid-run"),
            entry(LlmRole::Assistant, None, "done"),
        ]
    );
    assert_eq!(roles(&llm.requests()[1]).len(), 5);
}

#[tokio::test]
async fn terminating_a_thread_mid_run_emits_thread_terminated_and_marks_the_status_message() {
    let quit = object_tool("quit", "Terminate this thread", |_a, ctx| async move {
        ctx.thread.terminate().await?;
        // Held until the run is canceled, as an in-flight operation would be.
        std::future::pending::<()>().await;
        Ok(json!("unreachable"))
    });
    let (exec, auth, _) = calling(quit, "never asked");
    let sink = Arc::new(keel_events::InMemoryEventSink::new());
    exec.add_event_sink(sink.clone() as Arc<dyn keel_events::EventSink>);
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Canceled);
    let status = task.status().message.clone().unwrap();
    assert_eq!(status.status_kind(), Some(keel_core::StatusKind::Termination));
    let events = sink.events();
    let terminated: Vec<_> = events
        .iter()
        .filter(|e| e.event_type == keel_events::EventType::THREAD_TERMINATED)
        .collect();
    assert_eq!(terminated.len(), 1, "one termination event");
    let payload: keel_events::payload::ThreadTerminatedPayload =
        terminated[0].payload_as().unwrap();
    assert_eq!(payload.thread_id, task.thread_id);
    assert!(payload.terminated_at.is_some(), "the recorded time");
    let stopped = events
        .iter()
        .position(|e| e.event_type == keel_events::EventType::RUN_STOPPED)
        .unwrap();
    let at = events
        .iter()
        .position(|e| e.event_type == keel_events::EventType::THREAD_TERMINATED)
        .unwrap();
    assert!(at < stopped, "before the run's stop");
}

#[tokio::test]
async fn a_canceled_run_marks_its_status_message_as_an_execution_abort() {
    let (exec, auth, task, _release) = at_the_gate().await;
    let canceled = exec.cancel_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    let status = canceled.status().message.clone().unwrap();
    assert_eq!(
        status.status_kind(),
        Some(keel_core::StatusKind::ExecutionAbort)
    );
}

/// Notes every lifecycle point it is called at, and vetoes the tool `forbidden`.
#[derive(Clone, Default)]
struct Recording(Arc<std::sync::Mutex<Vec<String>>>);

impl Recording {
    fn note(&self, what: String) {
        self.0.lock().unwrap().push(what);
    }
}

#[async_trait::async_trait]
impl keel_agent::LifecycleHooks for Recording {
    async fn before_step(&self, ctx: &keel_agent::ToolContext, step: u32) {
        self.note(format!("before_step {step} {}", ctx.thread_id));
    }
    async fn before_model_call(
        &self,
        _ctx: &keel_agent::ToolContext,
        step: u32,
        request: &keel_llm::LlmRequest,
    ) {
        let last = request.messages.last().map(|m| m.content.clone());
        self.note(format!("before_model_call {step} {}", last.unwrap_or_default()));
    }
    async fn after_model_call(
        &self,
        _ctx: &keel_agent::ToolContext,
        step: u32,
        response: &keel_llm::LlmResponse,
    ) {
        self.note(format!(
            "after_model_call {step} calls={} text={}",
            response.tool_calls.len(),
            response.content.clone().unwrap_or_default()
        ));
    }
    async fn before_tool_call(
        &self,
        _ctx: &keel_agent::ToolContext,
        call: &ToolCall,
    ) -> keel_agent::ToolVerdict {
        self.note(format!("before_tool_call {} {}", call.name, call.arguments));
        if call.name == "forbidden" {
            keel_agent::ToolVerdict::Veto("not on this thread".into())
        } else {
            keel_agent::ToolVerdict::Run
        }
    }
    async fn after_tool_call(
        &self,
        _ctx: &keel_agent::ToolContext,
        call: &ToolCall,
        output: &Value,
        is_error: bool,
    ) {
        self.note(format!("after_tool_call {} {output} error={is_error}", call.name));
    }
    async fn after_step(&self, _ctx: &keel_agent::ToolContext, step: u32) {
        self.note(format!("after_step {step}"));
    }
}

#[tokio::test]
async fn lifecycle_hooks_fire_in_order_with_the_steps_data_and_a_veto_stops_the_tool() {
    let ran_forbidden = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forbidden = {
        let ran = ran_forbidden.clone();
        object_tool("forbidden", "Must not run", move |_a, _c| {
            let ran = ran.clone();
            async move {
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(json!("ran"))
            }
        })
    };
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![
            ToolCall::new("echo", json!({"a": 1})),
            ToolCall::new("forbidden", json!({})),
        ]),
        MockResponse::Text("done".into()),
    ]));
    let recording = Recording::default();
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .tool(echo_tool())
        .tool(forbidden)
        .hooks(recording.clone())
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let thread = ThreadId::new();
    let task = send(&exec, &auth, Message::user("go").in_thread(thread.clone())).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert!(!ran_forbidden.load(std::sync::atomic::Ordering::SeqCst), "vetoed");
    let seen = recording.0.lock().unwrap().clone();
    let vetoed = json!("vetoed: not on this thread");
    assert_eq!(
        seen,
        [
            format!("before_step 1 {thread}"),
            "before_model_call 1 go".to_owned(),
            "after_model_call 1 calls=2 text=".to_owned(),
            r#"before_tool_call echo {"a":1}"#.to_owned(),
            r#"after_tool_call echo {"a":1} error=false"#.to_owned(),
            "before_tool_call forbidden {}".to_owned(),
            format!("after_tool_call forbidden {vetoed} error=true"),
            "after_step 1".to_owned(),
            format!("before_step 2 {thread}"),
            "before_model_call 2 vetoed: not on this thread".to_owned(),
            "after_model_call 2 calls=0 text=done".to_owned(),
            "after_step 2".to_owned(),
        ]
    );
    // The model saw the veto as the call's result.
    let second = &llm.requests()[1];
    assert_eq!(second.messages.last().unwrap().role, LlmRole::Tool);
}

struct ReplyDirectly;

#[async_trait::async_trait]
impl keel_agent::Negotiator for ReplyDirectly {
    async fn negotiate(
        &self,
        _card: &AgentCard,
        _message: &Message,
    ) -> keel_core::AgentResult<keel_agent::Negotiation> {
        Ok(keel_agent::Negotiation::Reply {
            message: Message::agent("no task needed"),
        })
    }
}

#[tokio::test]
async fn a_negotiator_reply_answers_with_a_message_and_stores_no_task() {
    let (exec, auth, llm) = negotiating(ReplyDirectly);
    let thread = ThreadId::new();
    let mut question = Message::user("what time is it?");
    question.thread_id = Some(thread.clone());
    let outcome = exec
        .send(&auth, question.clone(), SendOptions::default())
        .await
        .unwrap();
    let keel_agent::SendOutcome::Message(reply) = outcome else {
        panic!("expected a message, got {outcome:?}");
    };
    assert_eq!(reply.role, keel_core::Role::Agent);
    assert_eq!(reply.text(), "no task needed");
    assert_eq!(reply.thread_id.as_ref(), Some(&thread));
    assert_eq!(reply.task_id, None);
    assert!(llm.requests().is_empty(), "a reply never reaches the model");
    let listed = exec
        .runtime()
        .task_manager()
        .list_tasks(
            &auth,
            &keel_runtime::ListTasksFilter {
                thread_id: Some(thread),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(listed.items.is_empty(), "{:?}", listed.items);
    // A caller that asks for a task is told there is none.
    let err = exec
        .send_message(&auth, question, SendOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Unsupported { what } if what.contains("created no task")),
        "{err:?}"
    );
}

fn chunk_tool() -> FnTool {
    object_tool("chunks", "Adds one artifact in two chunks", |_args, ctx| async move {
        let first = keel_core::Artifact::text("one ").named("report");
        let mut second = keel_core::Artifact::text("two");
        second.id = first.id.clone();
        ctx.add_artifact(first, keel_agent::ArtifactChunk::FIRST)
            .await?;
        ctx.add_artifact(second, keel_agent::ArtifactChunk::LAST)
            .await?;
        Ok(json!("added"))
    })
}

#[tokio::test]
async fn artifacts_a_tool_adds_are_logged_in_chunks_and_the_task_keeps_them_appended() {
    let (exec, auth, _) = calling(chunk_tool(), "done");
    let task = send(&exec, &auth, Message::user("report")).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(task.status().message.as_ref().unwrap().text(), "done");
    // The tool named the task's output: the answer is not added as a second artifact.
    assert_eq!(task.artifacts.len(), 1, "{:?}", task.artifacts);
    assert_eq!(
        task.artifacts[0].parts,
        vec![Part::text("one "), Part::text("two")]
    );
    let events = exec
        .runtime()
        .task_manager()
        .get_task_events(&auth, &task.id)
        .await
        .unwrap();
    let chunks: Vec<(bool, bool)> = events
        .iter()
        .filter_map(|e| match e {
            keel_core::TaskEvent::ArtifactUpdate {
                append, last_chunk, ..
            } => Some((*append, *last_chunk)),
            _ => None,
        })
        .collect();
    assert_eq!(chunks, vec![(false, false), (true, true)]);
}

#[tokio::test]
async fn a_direct_tool_call_has_no_task_to_add_an_artifact_to() {
    let agent = Agent::builder(card()).tool(chunk_tool()).build().unwrap();
    let (exec, auth) = executor(agent);
    let err = exec
        .call_tool_in_context(
            &auth,
            ThreadId::new(),
            "chunks",
            json!({}),
            keel_core::RunContext::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::ToolFailed { message, .. } if message.contains("outside a task")),
        "{err:?}"
    );
}
