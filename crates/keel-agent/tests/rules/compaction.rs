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
use super::fixture::{backend, send_in};

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
    let task = send_in(exec, auth, thread, text).await;
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

/// `pairs` questions and answers (`q0`, `a0`, `q1`, ...), as a long-lived thread's history.
fn exchanges(pairs: usize) -> Vec<LlmMessage> {
    (0..pairs)
        .flat_map(|i| {
            [
                LlmMessage::user(format!("q{i}")),
                LlmMessage::assistant(format!("a{i}"), vec![]),
            ]
        })
        .collect()
}

/// `thread`'s lease for `holder`, taken once the run that held it let go: a run lets go of
/// its thread just after its answer, so the thread may still be held for a moment.
async fn lease_once_let_go(
    runtime: &dyn Runtime,
    auth: &AuthContext,
    thread: &ThreadId,
    holder: &str,
) -> keel_runtime::Lease {
    let store = runtime.thread_store();
    keel_runtime::testing::eventually("the run to let go of the thread", || async {
        store
            .acquire_lease(auth, thread, holder, std::time::Duration::from_secs(60))
            .await
            .unwrap()
    })
    .await
}

fn contents(messages: &[LlmMessage]) -> Vec<String> {
    messages.iter().map(|m| m.content.clone()).collect()
}

#[tokio::test]
async fn compact_thread_persists_a_shorter_history_that_a_new_executor_sends() {
    let (runtime, auth) = backend();
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
    // A blocking send answers once its task is final; the run lets go of the thread just
    // after, so a compaction may find it still held (`Overloaded`) for a moment.
    let result = keel_runtime::testing::eventually("the last run to let go of the thread", || async {
        match exec.compact_thread(&auth, &thread, &request).await {
            Ok(result) => Some(result),
            Err(AgentError::Overloaded { .. }) => None,
            Err(other) => panic!("compaction failed: {other}"),
        }
    })
    .await;
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
    let (runtime, auth) = backend();
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
    let (runtime, auth) = backend();
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
    // The old executor's worker lets go of the thread just after its last answer; until it
    // has, it would take the next message from the queue itself, and run it uncompacted.
    let store = runtime.thread_store();
    let lease = lease_once_let_go(runtime.as_ref(), &auth, &thread, "test").await;
    store.release_lease(&auth, &lease).await.unwrap();

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

/// A thread store that counts the history entries read through it: how a test sees what a
/// run's reads cost without timing them.
struct Counting {
    inner: Arc<dyn keel_runtime::ThreadStore>,
    read: Arc<std::sync::atomic::AtomicUsize>,
}

impl Counting {
    fn counted(&self, entries: &[keel_runtime::HistoryEntry]) {
        self.read
            .fetch_add(entries.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Each method goes to the wrapped store; the history reads are counted.
mod counting {
    use super::Counting;
    use async_trait::async_trait;
    use keel_core::{AgentResult, ThreadId};
    use keel_llm::LlmMessage;
    use keel_runtime::{
        AuthContext, ChildThread, HistoryEntry, Lease, LeaseAsk, LeaseRenewal, QueuedItem,
        SubagentRegistry, ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue,
    };
    use serde_json::Value;

    #[async_trait]
    impl ThreadHistory for Counting {
        async fn append_history(&self, auth: &AuthContext, lease: &Lease, messages: &[LlmMessage]) -> AgentResult<u64> {
            self.inner.append_history(auth, lease, messages).await
        }
        async fn read_history(&self, auth: &AuthContext, thread_id: &ThreadId, after_seq: u64, limit: usize) -> AgentResult<Vec<HistoryEntry>> {
            let entries = self.inner.read_history(auth, thread_id, after_seq, limit).await?;
            self.counted(&entries);
            Ok(entries)
        }
        async fn read_history_before(&self, auth: &AuthContext, thread_id: &ThreadId, before_seq: u64, limit: usize) -> AgentResult<Vec<HistoryEntry>> {
            let entries = self.inner.read_history_before(auth, thread_id, before_seq, limit).await?;
            self.counted(&entries);
            Ok(entries)
        }
    }

    #[async_trait]
    impl ThreadQueue for Counting {
        async fn push_queue(&self, auth: &AuthContext, thread_id: &ThreadId, payload: Value) -> AgentResult<QueuedItem> {
            self.inner.push_queue(auth, thread_id, payload).await
        }
        async fn peek_queue(&self, auth: &AuthContext, thread_id: &ThreadId, limit: usize) -> AgentResult<Vec<QueuedItem>> {
            self.inner.peek_queue(auth, thread_id, limit).await
        }
        async fn ack_queue(&self, auth: &AuthContext, lease: &Lease, ids: &[String]) -> AgentResult<()> {
            self.inner.ack_queue(auth, lease, ids).await
        }
        async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
            self.inner.queue_len(auth, thread_id).await
        }
        async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
            self.inner.tenant_queue_len(auth).await
        }
        async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
            self.inner.queued_threads(auth).await
        }
    }

    #[async_trait]
    impl ThreadKv for Counting {
        async fn kv_get(&self, auth: &AuthContext, thread_id: &ThreadId, key: &str) -> AgentResult<Option<Value>> {
            self.inner.kv_get(auth, thread_id, key).await
        }
        async fn kv_set(&self, auth: &AuthContext, thread_id: &ThreadId, key: &str, value: Value) -> AgentResult<()> {
            self.inner.kv_set(auth, thread_id, key, value).await
        }
        async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
            self.inner.kv_keys(auth, thread_id).await
        }
    }

    #[async_trait]
    impl SubagentRegistry for Counting {
        async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
            self.inner.register_child(auth, child).await
        }
        async fn children(&self, auth: &AuthContext, parent: &ThreadId) -> AgentResult<Vec<ChildThread>> {
            self.inner.children(auth, parent).await
        }
        async fn child(&self, auth: &AuthContext, child: &ThreadId) -> AgentResult<Option<ChildThread>> {
            self.inner.child(auth, child).await
        }
        async fn set_child_status(&self, auth: &AuthContext, child: &ThreadId, status: &str) -> AgentResult<()> {
            self.inner.set_child_status(auth, child, status).await
        }
    }

    #[async_trait]
    impl ThreadLeases for Counting {
        async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>> {
            self.inner.take_lease(auth, ask).await
        }
        async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease> {
            self.inner.extend_lease(auth, renewal).await
        }
        async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
            self.inner.release_lease(auth, lease).await
        }
    }
}

/// Decision 250: a run on a long thread reads its history back to the newest compaction
/// checkpoint only, and the model is sent what it was sent when the whole log was read.
#[tokio::test]
async fn a_run_on_a_long_compacted_thread_reads_back_to_the_checkpoint_only() {
    let (runtime, auth) = backend();
    let thread = ThreadId::new();
    let store = runtime.thread_store();
    // 3,000 entries written straight to the store (a long-lived thread), then compacted.
    let lease = store
        .acquire_lease(&auth, &thread, "builder", std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    store.append_history(&auth, &lease, &exchanges(1_500)).await.unwrap();
    store.release_lease(&auth, &lease).await.unwrap();
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::Text("b1".into()),
        MockResponse::Text("b2".into()),
    ]));
    let exec = AgentExecutor::new(agent(llm.clone(), None), runtime.clone());
    let request = HistoryCompactionRequest {
        max_messages: 3,
        ..HistoryCompactionRequest::new(CompactionStrategy::Recent)
    };
    exec.compact_thread(&auth, &thread, &request).await.unwrap();

    // The same store, its history reads counted.
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Counting {
        inner: store.clone(),
        read: read.clone(),
    };
    let counted: Arc<dyn Runtime> =
        Arc::new(keel_runtime::Services::of(runtime.as_ref()).with_threads(counted));
    let exec = AgentExecutor::new(agent(llm.clone(), None), counted);
    say(&exec, &auth, &thread, "r1").await;
    say(&exec, &auth, &thread, "r2").await;
    let sent = llm.requests().last().unwrap().messages.clone();
    assert_eq!(
        contents(&sent),
        ["Answer briefly.", "q1499", "a1499", "r1", "b1", "r2"]
    );
    let read = read.load(std::sync::atomic::Ordering::Relaxed);
    // Two runs, each a page back from the end (at most 256 entries): not the 3,000.
    assert!(read <= 2 * 256, "two runs read {read} history entries");
    println!("two runs on a thread of 3,000 entries read {read} of them");
}

/// Decision 250's figures: on threads of 1,000 and 10,000 entries compacted near their end, a
/// run reads the same bounded number of entries, where reading the whole history (what
/// every run did before) grows with the thread. Times are printed, not asserted.
#[tokio::test]
async fn a_runs_history_reads_do_not_grow_with_the_thread() {
    let (runtime, auth) = backend();
    let store = runtime.thread_store();
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted: Arc<dyn Runtime> = Arc::new(
        keel_runtime::Services::of(runtime.as_ref()).with_threads(Counting {
            inner: store.clone(),
            read: read.clone(),
        }),
    );
    let mut reads = Vec::new();
    for pairs in [500, 5_000] {
        let thread = ThreadId::new();
        let lease = store
            .acquire_lease(&auth, &thread, "builder", std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        for chunk in exchanges(pairs).chunks(1_000) {
            store.append_history(&auth, &lease, chunk).await.unwrap();
        }
        store.release_lease(&auth, &lease).await.unwrap();
        let llm = Arc::new(MockLlm::scripted(
            (0..3).map(|i| MockResponse::Text(format!("b{i}"))).collect(),
        ));
        let plain = AgentExecutor::new(agent(llm.clone(), None), runtime.clone());
        let request = HistoryCompactionRequest {
            max_messages: 20,
            ..HistoryCompactionRequest::new(CompactionStrategy::Recent)
        };
        plain.compact_thread(&auth, &thread, &request).await.unwrap();

        let exec = AgentExecutor::new(agent(llm.clone(), None), counted.clone());
        read.store(0, std::sync::atomic::Ordering::Relaxed);
        let started = std::time::Instant::now();
        for turn in 0..3 {
            say(&exec, &auth, &thread, &format!("r{turn}")).await;
        }
        let per_run = started.elapsed() / 3;
        let entries = read.load(std::sync::atomic::Ordering::Relaxed) / 3;
        let started = std::time::Instant::now();
        let whole = store.read_history(&auth, &thread, 0, usize::MAX).await.unwrap();
        println!(
            "{}: thread of {} entries: a run took {per_run:?} reading {entries} entries; \
             reading the whole history (each run's read before decision 250) took {:?}",
            module_path!(),
            whole.len(),
            started.elapsed()
        );
        reads.push(entries);
    }
    assert_eq!(reads[0], reads[1], "a run reads as much on the longer thread");
}

/// Decision 250: a task that waited while its thread grew and was compacted resumes with
/// its own entries, read back past the checkpoint to its first input: that input is not
/// taken in again, and its question is answered.
#[tokio::test]
async fn a_task_resumed_after_its_thread_grew_and_was_compacted_reads_back_to_its_input() {
    let (runtime, auth) = backend();
    let thread = ThreadId::new();
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![keel_llm::ToolCall::new(
            "ask_human",
            serde_json::json!({"question": "Which city?"}),
        )]),
        MockResponse::Text("Booked in Lisbon.".into()),
    ]));
    let handoff = Agent::builder(AgentCard::new("talker", "talks", "http://127.0.0.1:0"))
        .instructions("Answer briefly.")
        .llm_shared(llm.clone())
        .human_handoff(true)
        .build()
        .unwrap();
    let exec = AgentExecutor::new(handoff, runtime.clone());
    let asked = send_in(&exec, &auth, &thread, "book a hotel").await;
    assert_eq!(asked.state(), TaskState::InputRequired, "{asked:?}");

    // Meanwhile the thread grows by 600 entries and is compacted, once the run let go of it.
    let store = runtime.thread_store();
    let lease = lease_once_let_go(runtime.as_ref(), &auth, &thread, "builder").await;
    store.append_history(&auth, &lease, &exchanges(300)).await.unwrap();
    store.release_lease(&auth, &lease).await.unwrap();
    let request = HistoryCompactionRequest {
        max_messages: 3,
        ..HistoryCompactionRequest::new(CompactionStrategy::Recent)
    };
    exec.compact_thread(&auth, &thread, &request).await.unwrap();

    let mut answer = Message::user("Lisbon");
    answer.task_id = Some(asked.id.clone());
    let done = exec
        .send_message(&auth, answer.in_thread(thread.clone()), SendOptions::default())
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed, "{done:?}");
    let stored = log(&runtime, &auth, &thread).await;
    let taken = |text: &str| stored.iter().filter(|m| m.content == text).count();
    assert_eq!(taken("book a hotel"), 1, "the first input is taken in once");
    assert_eq!(taken("Lisbon"), 1);
    assert_eq!(taken("Booked in Lisbon."), 1);
}
