//! Push notifications against a real webhook receiver on 127.0.0.1:0: the four config
//! operations on both bindings, delivery with the config's token and authentication, retries,
//! the delivery log, the SSRF guard, and deliveries that resume after a restart.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use keel_llm::MockLlm;
use keel_runtime::testing::eventually;
use keel_runtime::{Runtime, Services};
use serde_json::{json, Value};
use support::{user_message, SendJson, TestServer, SLEEP_30};

/// A webhook that records what it receives; it can fail the next `fail_next` requests, or
/// every request while `fail_all` is set.
#[derive(Default)]
struct Hook {
    received: Mutex<Vec<(HeaderMap, Value)>>,
    attempts: AtomicUsize,
    fail_next: AtomicUsize,
    fail_all: AtomicBool,
}

async fn webhook() -> (Arc<Hook>, String) {
    let hook = Arc::new(Hook::default());
    let state = hook.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, Json(body): Json<Value>| {
            let hook = state.clone();
            async move {
                hook.attempts.fetch_add(1, Ordering::SeqCst);
                if hook.fail_all.load(Ordering::SeqCst)
                    || hook
                        .fail_next
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                {
                    return StatusCode::SERVICE_UNAVAILABLE;
                }
                hook.received.lock().unwrap().push((headers, body));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (hook, url)
}

impl Hook {
    fn bodies(&self) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// Wait until a received status update has `state`; its headers and body.
    async fn wait_for_state(&self, state: &str) -> (HeaderMap, Value) {
        eventually(&format!("a pushed {state} status"), || {
            let found = self
                .received
                .lock()
                .unwrap()
                .iter()
                .find(|(_, body)| body["statusUpdate"]["status"]["state"] == state)
                .cloned();
            async move { found }
        })
        .await
    }
}

fn runtime() -> Arc<Services> {
    Arc::new(Services::in_memory(Arc::new(MockLlm::new())))
}

async fn server_allowing_loopback(runtime: Arc<Services>) -> TestServer {
    TestServer::start_with(runtime, |s| {
        s.allow_private_push_targets(true)
            .with_push_retry(3, Duration::from_millis(10))
    })
    .await
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or(0)
}

/// Config `c1` of `task_id`: push to `url` with token `tok` and a bearer credential.
fn bearer_config(task_id: &str, url: &str) -> Value {
    json!({"taskId": task_id, "id": "c1", "url": url, "token": "tok",
           "authentication": {"scheme": "Bearer", "credentials": "secret"}})
}

/// `CreateTaskPushNotificationConfig` with `params`; the whole answer.
async fn create_config(server: &TestServer, params: Value) -> Value {
    server.rpc("CreateTaskPushNotificationConfig", params).await
}

/// `method` (a Get or a Delete) on the config `c1` of `task_id`; the whole answer.
async fn on_c1(server: &TestServer, method: &str, task_id: &str) -> Value {
    server
        .rpc(method, json!({"taskId": task_id, "id": "c1"}))
        .await
}

async fn sleeping_task(server: &TestServer) -> String {
    let sent = server
        .rpc(
            "SendMessage",
            json!({"message": user_message(SLEEP_30), "configuration": {"returnImmediately": true}}),
        )
        .await;
    sent["result"]["task"]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_four_config_operations_work_on_both_bindings() {
    let (_hook, url) = webhook().await;
    let server = server_allowing_loopback(runtime()).await;
    let task_id = sleeping_task(&server).await;
    // The REST route of the task's configs (`""`) or of one config (`"/{id}"`).
    let configs = |config: &str| {
        format!(
            "{}/tasks/{task_id}/pushNotificationConfigs{config}",
            server.base
        )
    };

    let created = create_config(&server, bearer_config(&task_id, &url)).await;
    assert_eq!(
        created["result"],
        bearer_config(&task_id, &url),
        "{created}"
    );
    let c2: Value = server
        .http
        .post(configs(""))
        .header("A2A-Version", "1.0")
        .header("content-type", "application/a2a+json")
        .body(json!({"url": url}).to_string())
        .json_with_status(reqwest::StatusCode::OK)
        .await;
    let c2_id = c2["id"].as_str().expect("a generated id").to_owned();
    assert_eq!(c2["taskId"], task_id.as_str());

    let got = on_c1(&server, "GetTaskPushNotificationConfig", &task_id).await;
    assert_eq!(got["result"]["token"], "tok", "{got}");
    let got: Value = server
        .http
        .get(configs(&format!("/{c2_id}")))
        .header("A2A-Version", "1.0")
        .json_body()
        .await;
    assert_eq!(got["url"], url.as_str());

    let list: Value = server
        .http
        .get(configs(""))
        .header("A2A-Version", "1.0")
        .json_body()
        .await;
    assert_eq!(list["configs"].as_array().unwrap().len(), 2, "{list}");

    let delete_c1_over_rest = || async {
        let deleted = server
            .http
            .delete(configs("/c1"))
            .header("A2A-Version", "1.0")
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 200);
    };
    delete_c1_over_rest().await;
    let list = server
        .rpc(
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        )
        .await;
    assert_eq!(
        list["result"]["configs"].as_array().unwrap().len(),
        1,
        "{list}"
    );
    let gone = on_c1(&server, "GetTaskPushNotificationConfig", &task_id).await;
    assert_eq!(code(&gone), -32001, "{gone}");
    // Deleting again is idempotent (A2A §3.1.10), over both bindings; an unknown task is not.
    let deleted = on_c1(&server, "DeleteTaskPushNotificationConfig", &task_id).await;
    assert!(deleted.get("error").is_none(), "{deleted}");
    delete_c1_over_rest().await;
    let unknown_task = on_c1(&server, "DeleteTaskPushNotificationConfig", "nope").await;
    assert_eq!(code(&unknown_task), -32001, "{unknown_task}");
    let unknown_task = server
        .rpc("ListTaskPushNotificationConfigs", json!({"taskId": "nope"}))
        .await;
    assert_eq!(code(&unknown_task), -32001);
    server.stop().await;
}

#[tokio::test]
async fn private_targets_are_refused_unless_the_operator_allows_them() {
    let (_hook, url) = webhook().await;
    let server = TestServer::start_with(runtime(), |s| s).await;
    let task_id = sleeping_task(&server).await;
    for target in [
        url.as_str(),
        "http://localhost:1/hook",
        "http://10.0.0.1/",
        "http://[::1]/",
    ] {
        let answer = create_config(&server, json!({"taskId": task_id, "url": target})).await;
        assert_eq!(code(&answer), -32602, "{target}: {answer}");
    }
    let rest = server
        .http
        .post(format!(
            "{}/tasks/{task_id}/pushNotificationConfigs",
            server.base
        ))
        .json(&json!({"url": url}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 400);
    // A host that does not resolve yet is stored; each delivery resolves and checks it.
    let later = create_config(
        &server,
        json!({"taskId": task_id, "url": "https://hooks.example.invalid/a2a"}),
    )
    .await;
    assert!(later.get("result").is_some(), "{later}");
    server.stop().await;
}

#[tokio::test]
async fn updates_are_pushed_with_token_and_authentication_and_failures_are_retried() {
    let (hook, url) = webhook().await;
    let runtime = runtime();
    let server = server_allowing_loopback(runtime.clone()).await;
    let task_id = sleeping_task(&server).await;
    hook.fail_next.store(1, Ordering::SeqCst);
    let created = create_config(&server, bearer_config(&task_id, &url)).await;
    assert!(created.get("result").is_some(), "{created}");
    let canceled = server.rpc("CancelTask", json!({"id": task_id})).await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");

    let (headers, body) = hook.wait_for_state("TASK_STATE_CANCELED").await;
    assert_eq!(headers["x-a2a-notification-token"], "tok");
    assert_eq!(headers["authorization"], "Bearer secret");
    assert_eq!(body["statusUpdate"]["taskId"], task_id.as_str());
    // The first attempt failed (503) and was retried.
    assert!(hook.attempts.load(Ordering::SeqCst) > hook.bodies().len());

    let auth = runtime.auth_service().auth_context();
    // The post carries the task's trace, under its run's span (W3C `traceparent`).
    let task = runtime
        .task_manager()
        .get_task(&auth, &keel_core::TaskId::from(task_id.as_str()))
        .await
        .unwrap()
        .unwrap();
    let context = keel_core::RunContext::from_task(&task).unwrap().unwrap();
    let run_span = keel_events::RunSpans::of(&context).run_span();
    assert_eq!(
        headers["traceparent"],
        format!("00-{}-{run_span}-01", context.trace_id).as_str()
    );
    // The log is written once the delivery's answer has been read, which can be after the
    // hook has seen the post: wait for it rather than read it once.
    let memory = runtime.memory_service();
    let key = format!("keel:push-log:{task_id}");
    let log = eventually("the push delivery log", || async {
        memory.load_serialized(&auth, &key).await.unwrap()
    })
    .await;
    let log = log.as_array().unwrap();
    assert!(
        log.iter()
            .all(|e| e["delivered"] == true && e["configId"] == "c1"),
        "{log:?}"
    );
    assert_eq!(log[0]["attempts"], 2, "{log:?}");
    server.stop().await;
}

#[tokio::test]
async fn send_message_with_a_push_config_pushes_the_whole_turn() {
    let (hook, url) = webhook().await;
    let server = server_allowing_loopback(runtime()).await;
    let answer = server
        .rpc(
            "SendMessage",
            json!({"message": user_message("hello"),
                   "configuration": {"taskPushNotificationConfig": {"url": url, "token": "t"}}}),
        )
        .await;
    // Blocking: answered once the turn is over.
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    hook.wait_for_state("TASK_STATE_COMPLETED").await;
    let bodies = hook.bodies();
    assert!(
        bodies.iter().any(|b| b.get("artifactUpdate").is_some()),
        "{bodies:?}"
    );
    let states: Vec<&Value> = bodies
        .iter()
        .filter_map(|b| b.get("statusUpdate").map(|s| &s["status"]["state"]))
        .collect();
    assert_eq!(
        states.last().unwrap().as_str(),
        Some("TASK_STATE_COMPLETED"),
        "{states:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn pending_deliveries_resume_after_a_restart() {
    let (hook, url) = webhook().await;
    let runtime = runtime();
    // The first server cannot deliver: the webhook is down (503) while it runs.
    hook.fail_all.store(true, Ordering::SeqCst);
    let first = TestServer::start_with(runtime.clone(), |s| {
        s.allow_private_push_targets(true)
            .with_push_retry(1000, Duration::from_millis(10))
    })
    .await;
    let task_id = sleeping_task(&first).await;
    let created = create_config(&first, json!({"taskId": task_id, "url": url})).await;
    assert!(created.get("result").is_some(), "{created}");
    // The task is canceled; the canceled status cannot be delivered before the stop.
    let canceled = first.rpc("CancelTask", json!({"id": task_id})).await;
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    first.stop().await;
    assert!(hook.bodies().is_empty());

    hook.fail_all.store(false, Ordering::SeqCst);
    let second = server_allowing_loopback(runtime).await;
    let (_, body) = hook.wait_for_state("TASK_STATE_CANCELED").await;
    assert_eq!(body["statusUpdate"]["taskId"], task_id.as_str());
    second.stop().await;
}
