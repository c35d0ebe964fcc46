//! Scheduled effects and recovery across restarts and processes: a timer scheduled by one
//! executor fires in the next one built on the same SQLite file; two executors sharing one
//! Redis or PostgreSQL fire each due timer exactly once; `recover_all` resumes a tenant other
//! than the default one; a message a stopped process left in an idle thread's queue runs in
//! the next process (SQLite, Redis and PostgreSQL) through its wake.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_agent::reads::{Reads, TaskQuery};
use keel_agent::{Agent, AgentExecutor, EffectConfig, ExecutorConfig, SendOptions};
use keel_core::{AgentCard, Message, Task, TaskState, ThreadId};
use keel_llm::MockLlm;
use keel_runtime::testing::eventually;
use keel_runtime::{AuthContext, Runtime};
use keel_store_postgres::testing::TestSchema;
use serde_json::{json, Value};

fn card() -> AgentCard {
    AgentCard::new("effects", "durable effect tests", "http://127.0.0.1:0")
}

/// Fire counts by payload tag.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

/// An agent whose `remind` effect counts its tag and queues a message when asked to.
fn agent(counts: Counts) -> Agent {
    Agent::builder(card())
        .effect("remind", move |thread, payload: Value| {
            let counts = counts.clone();
            async move {
                let tag = payload["tag"].as_str().unwrap_or_default().to_owned();
                *counts.lock().unwrap().entry(tag.clone()).or_default() += 1;
                if payload["reply"] == json!(true) {
                    thread.queue_message(format!("reminder {tag}")).await?;
                }
                Ok(())
            }
        })
        .build()
        .unwrap()
}

/// Where a test's SQLite file goes: a fresh temp dir (which must outlive the test's
/// runtimes) and the file's path in it.
fn sqlite_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    (dir, path)
}

/// Executors whose thread leases lapse soon: a dead process's lease runs out within the test.
fn short_lease() -> ExecutorConfig {
    ExecutorConfig {
        lease_ttl: Duration::from_millis(300),
        ..ExecutorConfig::default()
    }
}

/// Effect schedulers whose claims lapse soon, so a claimed wake is looked at again quickly.
fn short_claim() -> EffectConfig {
    EffectConfig {
        claim_ttl: Duration::from_millis(300),
        ..EffectConfig::default()
    }
}

fn sqlite_runtime(path: &Path) -> Arc<dyn Runtime> {
    let store = keel_store_sqlite::SqliteStore::open(path).expect("open SQLite");
    Arc::new(store.services(Arc::new(MockLlm::new())))
}

async fn task_in_state(
    runtime: &Arc<dyn Runtime>,
    auth: &AuthContext,
    thread: &ThreadId,
    state: TaskState,
) -> Option<Task> {
    let query = TaskQuery {
        thread_id: Some(thread.clone()),
        state: Some(state),
        ..TaskQuery::default()
    };
    let page = Reads::new(runtime.clone())
        .tasks(auth, &query)
        .await
        .unwrap();
    page.items.into_iter().next()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_effect_scheduled_before_a_restart_fires_in_the_next_executor() {
    let (_dir, path) = sqlite_file();
    let auth = AuthContext::new("acme", "restart");
    let thread = ThreadId::new();
    let first_counts = Counts::default();
    {
        let runtime = sqlite_runtime(&path);
        let exec = AgentExecutor::new(agent(first_counts.clone()), runtime);
        exec.start_effects().unwrap();
        exec.thread(&auth, thread.clone())
            .schedule_effect(
                "remind",
                json!({"tag": "later", "reply": true}),
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        // The process goes away before the timer is due.
    }
    let counts = Counts::default();
    let runtime = sqlite_runtime(&path);
    let exec = AgentExecutor::new(agent(counts.clone()), runtime.clone());
    exec.start_effects().unwrap();
    completed_with(&runtime, &auth, &thread, "You said: reminder later").await;
    assert_eq!(counts.lock().unwrap().get("later"), Some(&1));
    assert!(
        first_counts.lock().unwrap().is_empty(),
        "the dropped executor never fired it"
    );
    exec.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recover_all_resumes_a_task_of_a_non_default_tenant() {
    let (_dir, path) = sqlite_file();
    let tenant = AuthContext::new("other-app", "bob");
    let thread = ThreadId::new();
    let config = short_lease();
    {
        // A dead process still holds the thread's lease, so the message waits queued.
        let runtime = sqlite_runtime(&path);
        hold_as_a_dead_process(&runtime, &tenant, &thread, Duration::from_millis(300)).await;
        let exec =
            AgentExecutor::with_config(agent(Counts::default()), runtime.clone(), config.clone());
        let task = exec
            .send_message(
                &tenant,
                Message::user("hello").in_thread(thread.clone()),
                SendOptions::in_background(),
            )
            .await
            .unwrap();
        assert_eq!(task.state(), TaskState::Submitted);
        exec.shutdown().await;
    }
    let runtime = sqlite_runtime(&path);
    let exec = AgentExecutor::with_config(agent(Counts::default()), runtime.clone(), config);
    let default = runtime.auth_service().auth_context();
    assert_ne!(default, tenant);
    assert_eq!(
        exec.recover(&default).await.unwrap(),
        0,
        "the default tenant has nothing"
    );
    assert_eq!(
        exec.recover_all().await.unwrap(),
        1,
        "the other tenant's task is found"
    );
    completed_with(&runtime, &tenant, &thread, "You said: hello").await;
    exec.shutdown().await;
}

/// Take `thread`'s lease for `ttl` as a process that then dies: work for the thread queues
/// until the lease lapses.
async fn hold_as_a_dead_process(
    runtime: &Arc<dyn Runtime>,
    auth: &AuthContext,
    thread: &ThreadId,
    ttl: Duration,
) {
    runtime
        .thread_store()
        .acquire_lease(auth, thread, "dead-process", ttl)
        .await
        .unwrap()
        .expect("the lease is free");
}

/// Wait until a task of `thread` completes, and assert that it answered `answer`.
async fn completed_with(
    runtime: &Arc<dyn Runtime>,
    auth: &AuthContext,
    thread: &ThreadId,
    answer: &str,
) {
    let task = eventually(
        &format!("a task of the thread to answer {answer:?}"),
        || task_in_state(runtime, auth, thread, TaskState::Completed),
    )
    .await;
    assert_eq!(task.status().message.as_ref().unwrap().text(), answer);
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

async fn redis_runtime(prefix: &str) -> Arc<dyn Runtime> {
    let store = keel_store_redis::RedisStore::connect(&redis_url())
        .await
        .expect("the Redis tests need a server at REDIS_URL")
        .with_prefix(prefix);
    Arc::new(store.services(Arc::new(MockLlm::new())))
}

/// Delete every key under the test's prefix.
async fn clean_up(prefix: &str) {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut con)
        .await
        .unwrap();
    for chunk in keys.chunks(500) {
        redis::cmd("DEL")
            .arg(chunk)
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_executors_on_one_redis_fire_each_due_effect_exactly_once() {
    let prefix = format!("keel-test-{}:", uuid::Uuid::new_v4().simple());
    let (a_runtime, b_runtime) = (redis_runtime(&prefix).await, redis_runtime(&prefix).await);
    two_executors_fire_each_due_effect_exactly_once(a_runtime, b_runtime).await;
    clean_up(&prefix).await;
}

/// A runtime on the test PostgreSQL server's `schema`.
async fn postgres_runtime(schema: &TestSchema) -> Arc<dyn Runtime> {
    let store = schema
        .store()
        .await
        .expect("the PostgreSQL tests need a server");
    Arc::new(store.services(Arc::new(MockLlm::new())))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_executors_on_one_postgres_fire_each_due_effect_exactly_once() {
    let schema = TestSchema::new().await.unwrap();
    let (a_runtime, b_runtime) = (
        postgres_runtime(&schema).await,
        postgres_runtime(&schema).await,
    );
    two_executors_fire_each_due_effect_exactly_once(a_runtime, b_runtime).await;
    schema.drop_schema().await.unwrap();
}

/// Two executors (two processes) on one store, each scheduling half of a dozen effects due
/// at once: every effect fires exactly once.
async fn two_executors_fire_each_due_effect_exactly_once(
    a_runtime: Arc<dyn Runtime>,
    b_runtime: Arc<dyn Runtime>,
) {
    let counts = Counts::default();
    let a = AgentExecutor::new(agent(counts.clone()), a_runtime.clone());
    let b = AgentExecutor::new(agent(counts.clone()), b_runtime);
    a.start_effects().unwrap();
    b.start_effects().unwrap();
    let auth = AuthContext::new("acme", "redis");
    // The same due time for all, half scheduled through each, so both schedulers wake for
    // them and race to claim.
    let due = chrono::Utc::now() + chrono::Duration::milliseconds(200);
    let mut threads = Vec::new();
    for i in 0..12 {
        let thread = ThreadId::new();
        let exec = if i % 2 == 0 { &a } else { &b };
        exec.schedule_effect(
            &auth,
            &thread,
            "remind",
            json!({"tag": format!("t{i}")}),
            due,
        )
        .await
        .unwrap();
        threads.push(thread);
    }
    let store = a_runtime.thread_store();
    let timers = a_runtime.thread_timers().unwrap();
    eventually("every effect fired and nothing pending", || {
        let (counts, store, timers, threads, auth) = (
            counts.clone(),
            store.clone(),
            timers.clone(),
            threads.clone(),
            auth.clone(),
        );
        async move {
            if counts.lock().unwrap().len() < threads.len() {
                return None;
            }
            for thread in &threads {
                if !timers
                    .thread_timers(&auth, thread)
                    .await
                    .unwrap()
                    .is_empty()
                    || store.queue_len(&auth, thread).await.unwrap() > 0
                {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    let counts = counts.lock().unwrap().clone();
    assert_eq!(counts.len(), 12);
    assert!(
        counts.values().all(|&n| n == 1),
        "each effect fired exactly once: {counts:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_effect_queued_by_a_process_that_stopped_before_firing_it_fires_after_restart() {
    let (_dir, path) = sqlite_file();
    let auth = AuthContext::new("acme", "queued");
    let thread = ThreadId::new();
    let short = short_claim();
    {
        // A dead process holds the thread, so the due effect is queued but cannot run here.
        let runtime = sqlite_runtime(&path);
        hold_as_a_dead_process(&runtime, &auth, &thread, Duration::from_millis(500)).await;
        let exec = AgentExecutor::new(agent(Counts::default()), runtime.clone());
        exec.start_effects_with(short).unwrap();
        exec.thread(&auth, thread.clone())
            .schedule_effect(
                "remind",
                json!({"tag": "queued", "reply": true}),
                Duration::ZERO,
            )
            .await
            .unwrap();
        let store = runtime.thread_store();
        eventually("the effect in the thread's queue", || {
            let (store, auth, thread) = (store.clone(), auth.clone(), thread.clone());
            async move {
                let items = store.peek_queue(&auth, &thread, 16).await.unwrap();
                items
                    .iter()
                    .any(|i| i.payload["kind"] == "effect")
                    .then_some(())
            }
        })
        .await;
        exec.shutdown().await;
    }
    // Nothing but the stored timer says this thread has work: the next process must find it.
    let counts = Counts::default();
    let runtime = sqlite_runtime(&path);
    let exec = AgentExecutor::new(agent(counts.clone()), runtime.clone());
    exec.start_effects_with(short).unwrap();
    completed_with(&runtime, &auth, &thread, "You said: reminder queued").await;
    assert_eq!(counts.lock().unwrap().get("queued"), Some(&1), "fired once");
    assert!(
        exec.thread(&auth, thread.clone())
            .scheduled_effects()
            .await
            .unwrap()
            .is_empty(),
        "the timer is removed once fired"
    );
    exec.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_left_in_an_idle_threads_queue_runs_after_a_restart() {
    let (_dir, path) = sqlite_file();
    left_behind_message_runs_in_the_next_process(sqlite_runtime(&path), sqlite_runtime(&path))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_left_by_one_redis_process_runs_in_another() {
    let prefix = format!("keel-test-{}:", uuid::Uuid::new_v4().simple());
    left_behind_message_runs_in_the_next_process(
        redis_runtime(&prefix).await,
        redis_runtime(&prefix).await,
    )
    .await;
    clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_left_by_one_postgres_process_runs_in_another() {
    let schema = TestSchema::new().await.unwrap();
    left_behind_message_runs_in_the_next_process(
        postgres_runtime(&schema).await,
        postgres_runtime(&schema).await,
    )
    .await;
    schema.drop_schema().await.unwrap();
}

/// A message queued on an idle thread by a process that stops before running it is run by
/// the next process on the same store, without any other input.
async fn left_behind_message_runs_in_the_next_process(
    first: Arc<dyn Runtime>,
    second: Arc<dyn Runtime>,
) {
    let auth = AuthContext::new("acme", "left-behind");
    let thread = ThreadId::new();
    let config = short_lease();
    {
        // A dead process still holds the thread, so the queued message cannot run here;
        // then this process goes away too. No task records the message: only the queue.
        let runtime = first;
        // Long enough that this process is gone before it lapses even on a loaded machine
        // (300 ms let this process's own worker take the message first); the next process
        // waits it out.
        hold_as_a_dead_process(&runtime, &auth, &thread, Duration::from_secs(3)).await;
        let exec =
            AgentExecutor::with_config(agent(Counts::default()), runtime.clone(), config.clone());
        exec.start_effects().unwrap();
        exec.thread(&auth, thread.clone())
            .queue_message("left behind")
            .await
            .unwrap();
        exec.shutdown().await;
        assert_eq!(
            runtime
                .thread_store()
                .queue_len(&auth, &thread)
                .await
                .unwrap(),
            1
        );
        assert!(
            task_in_state(&runtime, &auth, &thread, TaskState::Submitted)
                .await
                .is_none(),
            "no task says the thread has work"
        );
    }
    // The next process recovers as `keel serve` does; the message runs without other input.
    let runtime = second;
    let exec = AgentExecutor::with_config(agent(Counts::default()), runtime.clone(), config);
    assert_eq!(
        exec.recover_all().await.unwrap(),
        0,
        "no task was left working"
    );
    // A short claim TTL so the wake, kept while the queue held work, is looked at again soon.
    exec.start_effects_with(short_claim()).unwrap();
    completed_with(&runtime, &auth, &thread, "You said: left behind").await;
    let store = runtime.thread_store();
    let timers = runtime.thread_timers().unwrap();
    eventually("the wake removed once the queue is empty", || {
        let (store, timers, auth, thread) =
            (store.clone(), timers.clone(), auth.clone(), thread.clone());
        async move {
            (store.queue_len(&auth, &thread).await.unwrap() == 0
                && timers
                    .thread_timers(&auth, &thread)
                    .await
                    .unwrap()
                    .is_empty())
            .then_some(())
        }
    })
    .await;
    exec.shutdown().await;
}
