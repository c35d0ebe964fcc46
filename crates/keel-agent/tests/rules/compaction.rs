// History compaction on a thread: by the operator (`compact_thread`) and by the engine when
// a model call would not fit the model's context window. Both persist a checkpoint that
// every later run, in a new executor too, reads.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, AutoCompaction, SendOptions};
use keel_core::{AgentCard, AgentError, Message, TaskState, ThreadId};
use keel_events::payload::ContextCompactedPayload;
use keel_events::InMemoryEventSink;
use keel_llm::{
    compacted_view, is_compaction_checkpoint, CompactionStrategy, HistoryCompactionRequest,
    LlmMessage, LlmRole, MockLlm, MockResponse,
};
use keel_runtime::{AuthContext, Runtime};

fn agent(llm: Arc<MockLlm>, compaction: Option<AutoCompaction>) -> Agent {
    let mut builder = Agent::builder(AgentCard::new("talker", "talks", "http://127.0.0.1:0"))
        .instructions("Answer briefly.")
        .llm_shared(llm);
    if let Some(compaction) = compaction {
        builder = builder.compaction(compaction);
    }
    builder.build().unwrap()
}

async fn say(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId, text: &str) {
    let task = exec
        .send_message(
            auth,
            Message::user(text).in_thread(thread.clone()),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
}

async fn log(runtime: &Arc<dyn Runtime>, auth: &AuthContext, thread: &ThreadId) -> Vec<LlmMessage> {
    runtime
        .thread_store()
        .read_history(auth, thread, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| entry.message)
        .collect()
}

fn contents(messages: &[LlmMessage]) -> Vec<String> {
    messages.iter().map(|m| m.content.clone()).collect()
}

#[tokio::test]
async fn compact_thread_persists_a_shorter_history_that_a_new_executor_sends() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let thread = ThreadId::new();
    let llm = Arc::new(MockLlm::scripted(
        ["a1", "a2", "a3", "a4"]
            .map(|a| MockResponse::Text(a.into()))
            .to_vec(),
    ));
    let exec = AgentExecutor::new(agent(llm.clone(), None), runtime.clone());
    for question in ["q1", "q2", "q3"] {
        say(&exec, &auth, &thread, question).await;
    }

    // The prompt plus the two newest messages.
    let request = HistoryCompactionRequest {
        max_messages: 3,
        ..HistoryCompactionRequest::new(CompactionStrategy::Recent)
    };
    let result = exec.compact_thread(&auth, &thread, &request).await.unwrap();
    assert_eq!(
        (result.before_messages, result.after_messages, result.removed_messages),
        (7, 3, 4)
    );
    assert!(result.after_tokens < result.before_tokens);
    let stored = log(&runtime, &auth, &thread).await;
    assert!(is_compaction_checkpoint(stored.last().unwrap()));
    assert_eq!(contents(&compacted_view(&stored)), ["q3", "a3"]);

    // A restarted process (a new executor over the same store) sends the compacted history.
    drop(exec);
    let exec = AgentExecutor::new(agent(llm.clone(), None), runtime.clone());
    say(&exec, &auth, &thread, "q4").await;
    let sent = llm.requests().last().unwrap().messages.clone();
    assert_eq!(contents(&sent), ["Answer briefly.", "q3", "a3", "q4"]);

    // Compacting again works on what the model sees, not on the whole log.
    let again = exec.compact_thread(&auth, &thread, &request).await.unwrap();
    assert_eq!(again.before_messages, 5);
    // Within its limits: nothing removed, nothing appended.
    let loose = HistoryCompactionRequest {
        max_messages: 100,
        ..request.clone()
    };
    let before = log(&runtime, &auth, &thread).await.len();
    let nothing = exec.compact_thread(&auth, &thread, &loose).await.unwrap();
    assert_eq!(nothing.removed_messages, 0);
    assert_eq!(log(&runtime, &auth, &thread).await.len(), before);
}

#[tokio::test]
async fn compact_thread_refuses_a_thread_a_run_holds() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let thread = ThreadId::new();
    let exec = AgentExecutor::new(agent(Arc::new(MockLlm::new()), None), runtime.clone());
    let lease = runtime
        .thread_store()
        .acquire_lease(&auth, &thread, "another-process", std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let refused = exec
        .compact_thread(&auth, &thread, &HistoryCompactionRequest::default())
        .await;
    assert!(matches!(refused, Err(AgentError::Overloaded { .. })), "{refused:?}");
    runtime.thread_store().release_lease(&auth, &lease).await.unwrap();
    let done = exec
        .compact_thread(&auth, &thread, &HistoryCompactionRequest::default())
        .await
        .unwrap();
    assert_eq!(done.removed_messages, 0);
}

#[tokio::test]
async fn a_run_over_its_context_window_compacts_the_history_and_says_so() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let thread = ThreadId::new();
    let long = "word ".repeat(200);
    let llm = Arc::new(MockLlm::scripted(
        ["a1", "a2", "a3", "a4", "a5"]
            .map(|a| MockResponse::Text(a.into()))
            .to_vec(),
    ));
    // Without compaction the thread grows past what the next agent's window holds.
    let plain = AgentExecutor::new(agent(llm.clone(), None), runtime.clone());
    for i in 0..3 {
        say(&plain, &auth, &thread, &format!("{i} {long}")).await;
    }
    let grown = llm.requests().last().unwrap().messages.len();
    drop(plain);

    let auto = AutoCompaction::new(CompactionStrategy::Tokens).with_context_window(400);
    let exec = AgentExecutor::new(agent(llm.clone(), Some(auto)), runtime.clone());
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    say(&exec, &auth, &thread, "short question").await;

    let compacted: Vec<ContextCompactedPayload> = sink
        .events()
        .iter()
        .filter(|e| e.event_type.as_str() == "context.compacted")
        .map(|e| e.payload_as().unwrap())
        .collect();
    assert_eq!(compacted.len(), 1, "{compacted:?}");
    let event = &compacted[0];
    assert!(event.before_tokens > 400, "{event:?}");
    assert!(event.after_tokens <= 400, "{event:?}");
    assert_eq!(event.context_window, Some(400));
    assert_eq!(event.strategy, "tokens");
    // The model got the compacted context, newest turn included, and the next run (a new
    // executor) reads the same checkpoint without compacting again.
    let sent = llm.requests().last().unwrap().messages.clone();
    assert!(sent.len() < grown + 2, "{} messages", sent.len());
    assert_eq!(sent.last().unwrap().content, "short question");
    assert_eq!(sent[0].role, LlmRole::System);
    let stored = log(&runtime, &auth, &thread).await;
    assert_eq!(stored.iter().filter(|m| is_compaction_checkpoint(m)).count(), 1);

    drop(exec);
    let exec = AgentExecutor::new(
        agent(
            llm.clone(),
            Some(AutoCompaction::new(CompactionStrategy::Tokens).with_context_window(400)),
        ),
        runtime.clone(),
    );
    sink.clear();
    exec.add_event_sink(sink.clone());
    say(&exec, &auth, &thread, "again").await;
    assert!(sink
        .events()
        .iter()
        .all(|e| e.event_type.as_str() != "context.compacted"));
    let sent = llm.requests().last().unwrap().messages.clone();
    assert!(!sent.iter().any(|m| m.content.starts_with("0 word")));
}
