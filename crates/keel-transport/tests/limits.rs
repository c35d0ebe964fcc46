//! One caller cannot starve the others: a huge batch is refused whole, a message with too
//! many parts is invalid, a tenant with too many requests in progress is answered 429 /
//! -32051 with `Retry-After`, one thread's or one tenant's full queues refuse new tasks the
//! same way, and one tenant's flood of long tasks leaves work slots for another tenant's send.

mod support;

use std::time::Duration;

use keel_agent::{AgentExecutor, ExecutorConfig};
use keel_llm::MockLlm;
use keel_runtime::testing::eventually_within;
use keel_transport::{Limits, Security};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{user_message, SendJson, TestServer, ALICE, BOB};

/// A tool call that lasts until the server stops (which cancels it).
const SLEEP_LONG: &str = "/sleep {\"seconds\": 3600}";
/// How long a request that must be served may take on a loaded machine.
const GENEROUS: Duration = Duration::from_secs(60);

/// Checks that `answer` is JSON-RPC's refusal of a request over a limit (`-32051`): the limit
/// on `what` (its `limit` names it) of `max`, saying when to retry.
fn assert_over_limit(answer: &Value, what: &str, max: &str) {
    assert_eq!(answer["error"]["code"], -32051, "{answer}");
    let info = &answer["error"]["data"][0];
    assert_eq!(info["reason"], "RESOURCE_EXHAUSTED", "{answer}");
    assert_eq!(info["metadata"]["max"], max, "{answer}");
    assert!(
        info["metadata"]["limit"]
            .as_str()
            .is_some_and(|limit| limit.contains(what)),
        "{answer}"
    );
    assert!(
        info["metadata"]["retryAfterSeconds"].is_string(),
        "{answer}"
    );
}

/// The seconds a `429` answer's `Retry-After` says to wait.
fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn two_tenants(limits: Limits) -> TestServer {
    two_tenants_with(limits, ExecutorConfig::default()).await
}

async fn two_tenants_with(limits: Limits, config: ExecutorConfig) -> TestServer {
    let runtime = support::two_tenant_runtime(MockLlm::new());
    // The tests' runs are sleeps that outlast any drain: a short one keeps `stop` quick.
    let config = ExecutorConfig {
        drain_timeout: Duration::from_millis(100),
        ..config
    };
    let executor = AgentExecutor::with_config(support::agent(), runtime, config);
    TestServer::start_with_executor(executor, |server| {
        server
            .with_security(Security::api_key_and_bearer())
            .with_limits(limits)
    })
    .await
}

fn call(id: usize, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A JSON-RPC POST of `body` as the tenant of `key`.
fn request(server: &TestServer, key: &str, body: &Value) -> reqwest::RequestBuilder {
    server.post_v1("/").header("X-API-Key", key).json(body)
}

/// The JSON answer to [`request`].
async fn answer_to(server: &TestServer, key: &str, body: &Value) -> Value {
    request(server, key, body).json_body().await
}

async fn send(server: &TestServer, key: &str, text: &str, return_immediately: bool) -> Value {
    let params = json!({
        "message": user_message(text),
        "configuration": {"returnImmediately": return_immediately},
    });
    answer_to(server, key, &call(1, "SendMessage", params)).await
}

#[tokio::test]
async fn a_huge_batch_is_refused_whole_while_another_clients_send_is_served() {
    let server = two_tenants(Limits::default()).await;
    let batch: Vec<Value> = (0..1000)
        .map(|i| call(i, "SendMessage", json!({"message": user_message("hello")})))
        .collect();
    let (batch_answer, single) = tokio::join!(
        async { answer_to(&server, ALICE, &Value::Array(batch)).await },
        tokio::time::timeout(GENEROUS, send(&server, BOB, "hello", false)),
    );
    assert_eq!(batch_answer["error"]["code"], -32600, "{batch_answer}");
    assert_eq!(
        batch_answer["error"]["data"][0]["metadata"]["maxBatchRequests"],
        Limits::default().max_batch_requests.to_string()
    );
    let single = single.expect("the single send is served");
    assert_eq!(
        single["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{single}"
    );
    // Nothing of the refused batch ran.
    let listed = answer_to(&server, ALICE, &call(1, "ListTasks", json!({}))).await;
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    // A batch within the limit runs.
    let small: Vec<Value> = (0..3)
        .map(|i| call(i, "GetTask", json!({"id": "nope"})))
        .collect();
    let answers: Value = answer_to(&server, ALICE, &Value::Array(small)).await;
    assert_eq!(answers.as_array().map(Vec::len), Some(3), "{answers}");
    server.stop().await;
}

#[tokio::test]
async fn a_message_with_too_many_parts_is_invalid() {
    let server = two_tenants(Limits {
        max_message_parts: 4,
        ..Limits::default()
    })
    .await;
    // A message of `parts` text parts, sent as Alice.
    let alice = &server;
    let send_parts = |parts: usize| {
        let mut message = user_message("hello");
        message["parts"] = Value::Array(vec![json!({"text": "part"}); parts]);
        let body = call(1, "SendMessage", json!({"message": message}));
        async move { answer_to(alice, ALICE, &body).await }
    };
    let answer = send_parts(5).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(
        answer["error"]["data"][0]["metadata"]["field"],
        "message.parts"
    );
    let answer = send_parts(4).await;
    assert!(answer["result"]["task"].is_object(), "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_with_too_many_requests_in_progress_is_told_to_retry_later() {
    let server = two_tenants(Limits {
        max_requests_per_tenant: 2,
        ..Limits::default()
    })
    .await;
    // Two blocking sends that stay in progress until the server stops.
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let (http, base) = (server.http.clone(), server.base.clone());
            tokio::spawn(async move {
                http.post(format!("{base}/"))
                    .header("A2A-Version", "1.0")
                    .header("X-API-Key", ALICE)
                    .json(&call(
                        1,
                        "SendMessage",
                        json!({"message": user_message(SLEEP_LONG)}),
                    ))
                    .send()
                    .await
            })
        })
        .collect();
    // Once both are in progress, Alice's next request is refused: over HTTP+JSON with 429
    // and `Retry-After`...
    let refused = eventually_within("Alice's requests to be refused", GENEROUS, || async {
        let response = server
            .get_v1("/tasks")
            .header("X-API-Key", ALICE)
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            return Some(response);
        }
        assert_eq!(response.status(), StatusCode::OK);
        None
    })
    .await;
    assert!(retry_after(&refused) >= 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
    // ...and over JSON-RPC with -32051 naming the limit.
    let answer: Value = answer_to(&server, ALICE, &call(1, "ListTasks", json!({}))).await;
    assert_over_limit(&answer, "tenant", "2");
    // Bob is served meanwhile.
    let bob = tokio::time::timeout(GENEROUS, send(&server, BOB, "hello", false))
        .await
        .expect("Bob is served");
    assert_eq!(
        bob["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    server.stop().await;
    for request in blocked {
        // Answered (the canceled task) once the server stopped.
        let _ = request.await.unwrap();
    }
}

#[tokio::test]
async fn one_tenants_flood_of_long_tasks_leaves_slots_for_another_tenant() {
    // Few slots, so that the flood is quick to send; the share is three quarters, as by default.
    let (slots, share) = (16, 12);
    let config = ExecutorConfig {
        max_concurrent_threads: slots,
        max_threads_per_tenant: share,
        ..ExecutorConfig::default()
    };
    let server = two_tenants_with(Limits::default(), config).await;
    // As many long tasks as the process has work slots, each on its own thread.
    let mut flood = Vec::new();
    for _ in 0..slots {
        let sent = send(&server, ALICE, SLEEP_LONG, true).await;
        let id = sent["result"]["task"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{sent}"));
        flood.push(id.to_owned());
    }
    // Wait until Alice's share of the slots is busy with them.
    eventually_within("Alice's tasks to fill her share", GENEROUS, || async {
        let listed: Value = answer_to(
            &server,
            ALICE,
            &call(
                1,
                "ListTasks",
                json!({"status": "TASK_STATE_WORKING", "pageSize": 100}),
            ),
        )
        .await;
        let working = listed["result"]["totalSize"].as_u64().unwrap_or(0) as usize;
        assert!(
            working <= share,
            "Alice runs {working} threads, more than her share"
        );
        working == share
    })
    .await;
    // Bob's blocking send runs and completes although Alice has more work waiting.
    let bob = tokio::time::timeout(GENEROUS, send(&server, BOB, "hello", false))
        .await
        .expect("Bob's send is served while Alice's tasks run");
    assert_eq!(
        bob["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{bob}"
    );
    server.stop().await;
}

/// A message on the thread `context_id`, answered at once (the task stays queued).
async fn send_on(server: &TestServer, key: &str, text: &str, context_id: &str) -> Value {
    let mut message = user_message(text);
    message["contextId"] = json!(context_id);
    let params = json!({"message": message, "configuration": {"returnImmediately": true}});
    answer_to(server, key, &call(1, "SendMessage", params)).await
}

#[tokio::test]
async fn a_full_thread_queue_or_tenant_queue_refuses_new_tasks_with_retry_later() {
    let config = ExecutorConfig {
        max_queued_per_thread: 1,
        max_queued_per_tenant: 3,
        ..ExecutorConfig::default()
    };
    let server = two_tenants_with(Limits::default(), config).await;
    // A long task runs on thread `t` (its queue item stays until it ends); a second waits.
    for text in [SLEEP_LONG, "hello"] {
        let sent = send_on(&server, ALICE, text, "t").await;
        assert!(sent["result"]["task"].is_object(), "{sent}");
    }
    // The third is refused over JSON-RPC with -32051, naming the thread's limit...
    let refused = send_on(&server, ALICE, "one more", "t").await;
    assert_over_limit(&refused, "thread", "1");
    // ...and over HTTP+JSON with 429 and `Retry-After`.
    let mut message = user_message("one more");
    message["contextId"] = json!("t");
    let response = server
        .post_v1("/message:send")
        .header("X-API-Key", ALICE)
        .json(&json!({"message": message, "configuration": {"returnImmediately": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&response) >= 1);
    // Another thread of Alice's takes the tenant's third queued item; a fourth thread is
    // refused by the tenant's limit.
    let sent = send_on(&server, ALICE, SLEEP_LONG, "u").await;
    assert!(sent["result"]["task"].is_object(), "{sent}");
    let refused = send_on(&server, ALICE, "hello", "v").await;
    assert_over_limit(&refused, "tenant", "3");
    // Nothing of the refused messages was stored.
    let listed: Value = answer_to(&server, ALICE, &call(1, "ListTasks", json!({}))).await;
    assert_eq!(listed["result"]["totalSize"], 3, "{listed}");
    // Bob's queues are his own.
    let bob = send_on(&server, BOB, "hello", "t").await;
    assert!(bob["result"]["task"].is_object(), "{bob}");
    server.stop().await;
}
