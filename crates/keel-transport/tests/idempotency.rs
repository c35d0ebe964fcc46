//! Retries are safe: a SendMessage repeated with the same `messageId` by the same tenant, on
//! any binding, blocking or streaming, answers with the task the first one made and runs
//! nothing again; another tenant's same `messageId` is its own message; and a store failure
//! between the task's creation and the answer is an error that names the task, whose retry
//! answers with it.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool};
use keel_core::{AgentCard, AgentError, AgentResult, TaskEvent, TaskId};
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, Runtime, Services, TaskManager};
use keel_transport::Security;
use serde_json::{json, Value};
use support::{sse_events, TestServer, ALICE, BOB};

/// An agent whose one tool, `count`, counts its runs in `runs`.
fn counting_agent(runs: Arc<AtomicUsize>) -> Agent {
    let count = FnTool::new(
        "count",
        "Count one run",
        json!({"type": "object", "properties": {}}),
        move |_args, _ctx| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(json!("counted"))
            }
        },
    );
    Agent::builder(AgentCard::new("counter", "Counts", "http://unused"))
        .tool(count)
        .build()
        .expect("the counting agent builds")
}

/// A server of the counting agent for the two tenants of `support`, on `runtime`, and the
/// count of its tool's runs.
async fn counting_server(runtime: Arc<dyn Runtime>) -> (TestServer, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let executor = AgentExecutor::new(counting_agent(runs.clone()), runtime);
    let server = TestServer::start_with_executor(executor, |server| {
        server.with_security(Security::api_key_and_bearer())
    })
    .await;
    (server, runs)
}

/// [`counting_server`] on in-memory stores.
async fn counting_in_memory() -> (TestServer, Arc<AtomicUsize>) {
    counting_server(support::two_tenant_runtime(MockLlm::new())).await
}

fn message(message_id: &str) -> Value {
    json!({"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "/count {}"}]})
}

/// A JSON-RPC call as `key`; the response body.
async fn rpc(server: &TestServer, key: &str, method: &str, params: Value) -> Value {
    server
        .post_v1("/")
        .header("X-API-Key", key)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn send(server: &TestServer, key: &str, message_id: &str, immediately: bool) -> Value {
    let params = json!({
        "message": message(message_id),
        "configuration": {"returnImmediately": immediately},
    });
    rpc(server, key, "SendMessage", params).await
}

async fn total_tasks(server: &TestServer, key: &str) -> u64 {
    let listed = rpc(server, key, "ListTasks", json!({})).await;
    listed["result"]["totalSize"].as_u64().unwrap()
}

#[tokio::test]
async fn a_repeated_send_on_every_binding_answers_the_first_task_and_runs_nothing_again() {
    let (server, runs) = counting_in_memory().await;
    let first = send(&server, ALICE, "retry-1", false).await;
    let task = &first["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let task_id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // JSON-RPC, blocking and not.
    for immediately in [false, true] {
        let again = send(&server, ALICE, "retry-1", immediately).await;
        assert_eq!(again["result"]["task"]["id"], task_id.as_str(), "{again}");
        assert_eq!(
            again["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{again}"
        );
    }
    // HTTP+JSON.
    let rest: Value = server
        .post_v1("/message:send")
        .header("X-API-Key", ALICE)
        .json(&json!({"message": message("retry-1")}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rest["task"]["id"], task_id.as_str(), "{rest}");
    // A stream: the same task's events, from the message's turn.
    let streamed = server
        .post_v1("/")
        .header("X-API-Key", ALICE)
        .json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage",
            "params": {"message": message("retry-1")}}),
        )
        .send()
        .await
        .unwrap();
    let events = sse_events(streamed).await;
    assert!(!events.is_empty());
    for (_, event) in &events {
        let result = &event["result"];
        let id = result["task"]["id"]
            .as_str()
            .or_else(|| result["statusUpdate"]["taskId"].as_str())
            .or_else(|| result["artifactUpdate"]["taskId"].as_str());
        assert_eq!(id, Some(task_id.as_str()), "{event}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran again");
    assert_eq!(total_tasks(&server, ALICE).await, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_repeated_streaming_send_follows_the_first_task() {
    let (server, runs) = counting_in_memory().await;
    let stream = |id: u64| {
        server
            .post_v1("/")
            .header("X-API-Key", ALICE)
            .json(
                &json!({"jsonrpc": "2.0", "id": id, "method": "SendStreamingMessage",
                "params": {"message": message("stream-1")}}),
            )
            .send()
    };
    let first = sse_events(stream(1).await.unwrap()).await;
    let second = sse_events(stream(2).await.unwrap()).await;
    let task_of = |events: &[(String, Value)]| events[0].1["result"]["task"]["id"].clone();
    assert!(task_of(&first).is_string(), "{first:?}");
    assert_eq!(task_of(&first), task_of(&second));
    // The repeat finds the task done: its stream ends on the completed state.
    let last = &second.last().unwrap().1["result"];
    let state = last["statusUpdate"]["status"]["state"]
        .as_str()
        .or_else(|| last["task"]["status"]["state"].as_str());
    assert_eq!(state, Some("TASK_STATE_COMPLETED"), "{second:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(total_tasks(&server, ALICE).await, 1);
    server.stop().await;
}

#[tokio::test]
async fn another_tenants_same_message_id_is_another_message() {
    let (server, runs) = counting_in_memory().await;
    let alice = send(&server, ALICE, "shared-id", false).await;
    let bob = send(&server, BOB, "shared-id", false).await;
    let (alice, bob) = (&alice["result"]["task"], &bob["result"]["task"]);
    assert_eq!(bob["status"]["state"], "TASK_STATE_COMPLETED", "{bob}");
    assert_ne!(alice["id"], bob["id"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(total_tasks(&server, ALICE).await, 1);
    assert_eq!(total_tasks(&server, BOB).await, 1);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------
// A store that fails between the task's creation and the answer

/// The in-memory task store, except that while `armed`, the first read of a finished task's
/// log fails as an unreachable store would: the task was made and ran, and the answer cannot
/// be read.
struct FailOnce {
    inner: Arc<dyn TaskManager>,
    armed: AtomicBool,
}

keel_runtime::task_manager_from_field! {
    FailOnce => inner;
    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        let finished = self
            .inner
            .get_task(auth, task_id)
            .await?
            .is_some_and(|task| task.state().is_terminal());
        if finished && self.armed.swap(false, Ordering::SeqCst) {
            return Err(AgentError::store_unavailable(
                "memory",
                "get_task_events",
                std::io::Error::other("connection refused"),
            ));
        }
        self.inner.get_task_events(auth, task_id).await
    }
}

#[tokio::test]
async fn a_store_failure_after_the_task_was_made_names_it_and_the_retry_answers_it() {
    let services = Services::in_memory(Arc::new(MockLlm::new())).with_auth(support::two_tenants());
    let tasks = Arc::new(FailOnce {
        inner: services.tasks.clone(),
        armed: AtomicBool::new(true),
    });
    let runtime = Arc::new(Services {
        tasks: tasks.clone(),
        ..services
    });
    let (server, runs) = counting_server(runtime).await;

    let failed = send(&server, ALICE, "fragile-1", false).await;
    assert!(!tasks.armed.load(Ordering::SeqCst), "the fault never fired");
    let error = &failed["error"];
    assert_eq!(error["code"], -32050, "{failed}");
    let task_id = error["data"][0]["metadata"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("the error names no task: {failed}"))
        .to_owned();
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains(&task_id) && !m.contains("nothing was done")),
        "{failed}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The retry, as the error tells: the same task, done, and nothing ran again.
    let retried = send(&server, ALICE, "fragile-1", false).await;
    assert_eq!(
        retried["result"]["task"]["id"],
        task_id.as_str(),
        "{retried}"
    );
    assert_eq!(
        retried["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{retried}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the retry ran the tool again"
    );
    assert_eq!(total_tasks(&server, ALICE).await, 1);
    server.stop().await;
}

#[cfg(feature = "grpc")]
#[tokio::test]
async fn a_repeated_grpc_send_answers_the_first_task() {
    use keel_transport::grpc::tonic::Request;
    use keel_transport::grpc::{from_json, proto, to_json};

    let (server, runs) = counting_in_memory().await;
    let mut client = support::grpc_client(&server.base).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let request: proto::SendMessageRequest =
            from_json(&json!({"message": message("grpc-1")}).to_string()).unwrap();
        let mut request = Request::new(request);
        request
            .metadata_mut()
            .insert("x-api-key", ALICE.parse().unwrap());
        let answer = client.send_message(request).await.unwrap().into_inner();
        let answer = to_json(&answer).unwrap();
        assert_eq!(
            answer["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{answer}"
        );
        ids.push(answer["task"]["id"].clone());
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.stop().await;
}
