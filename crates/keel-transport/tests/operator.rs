//! The operator API over real HTTP beside A2A: tasks, pending approvals and a run's report,
//! served to the caller's tenant only, with clear errors for bad input.

mod support;

use std::sync::Arc;

use keel_agent::AgentExecutor;
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, Runtime};
use keel_transport::{A2aServer, Security};
use reqwest::StatusCode;
use serde_json::Value;
use support::{ALICE, BOB};

async fn get(http: &reqwest::Client, url: &str, key: Option<&str>) -> (StatusCode, Value) {
    let mut request = http.get(url);
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn tasks_approvals_and_runs_are_served_to_their_tenant_only() {
    let alice = AuthContext::new("acme", "alice");
    let runtime: Arc<dyn Runtime> = support::two_tenant_runtime(MockLlm::new());
    let executor = AgentExecutor::new(support::agent(), runtime);
    let server = A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api/v1", listener.local_addr().unwrap());
    let router = server.router("http://127.0.0.1:0");
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::new();

    let task = support::completed_task(&executor, &alice, "hello").await;

    // Tasks: Alice sees hers; Bob sees none; no credentials is 401; bad input is 400.
    let (status, page) = get(&http, &format!("{base}/tasks"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"][0]["id"], task.id.to_string());
    assert_eq!(page["total_size"], 1);
    let by_thread = format!("{base}/tasks?thread_id={}&state=completed", task.thread_id);
    let (status, page) = get(&http, &by_thread, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let (status, page) = get(&http, &by_thread, Some(BOB)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 0);
    assert_eq!(
        get(&http, &format!("{base}/tasks"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, bad) = get(&http, &format!("{base}/tasks?state=bogus"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_state");
    let (status, bad) = get(&http, &format!("{base}/tasks?page_size=0"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_input");
    let (status, bad) = get(&http, &format!("{base}/tasks?page_size=x"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_query");

    // Approvals: none pending.
    let (status, page) = get(&http, &format!("{base}/approvals"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["approvals"].as_array().unwrap().len(), 0);

    // A run's report: Alice's; another tenant's id is 404, as is an unknown one.
    let record = executor
        .reads()
        .latest_run(&alice, &task.id)
        .await
        .unwrap()
        .expect("the finished turn recorded a run");
    let run_url = format!("{base}/runs/{}", record.run_id);
    let (status, run) = get(&http, &run_url, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["run_id"], record.run_id.to_string());
    let (status, refused) = get(&http, &run_url, Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "run_not_found");
    let (status, _) = get(&http, &format!("{base}/runs/no-such-run"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Cancel: another tenant's task is 404; a finished task is 409 for its owner.
    let cancel_url = format!("{base}/tasks/{}/cancel", task.id);
    let answer = |key: &'static str| {
        http.post(&cancel_url)
            .header("X-API-Key", key)
            .json(&serde_json::json!({"reason": "operator"}))
            .send()
    };
    let refused = answer(BOB).await.unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "task_not_found");
    let finished = answer(ALICE).await.unwrap();
    assert_eq!(finished.status(), StatusCode::CONFLICT);
    let body: Value = finished.json().await.unwrap();
    assert_eq!(body["error"]["code"], "task_not_cancelable");
}
