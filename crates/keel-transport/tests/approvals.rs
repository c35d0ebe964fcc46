//! Approvals over the wire (`docs/approvals.md`): a task waiting for an approval is
//! `input-required` with the request in `metadata.keel.pendingApproval`; a message to it whose one
//! part is `{"approval": {"requestId", "decision", "reason"?}}` approves or denies, over
//! JSON-RPC, HTTP+JSON, streaming and the WebSocket alike, and the run records who decided.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_core::{RunContext, TaskId};
use keel_llm::MockLlm;
use keel_runtime::AuthContext;
use keel_transport::{Security, KEEL_APPROVAL_EXTENSION_URI};
use serde_json::{json, Value};
use support::{sse_events, SendJson, TestServer, ALICE, BOB};

/// A prompt that makes the offline model call the tool that needs approval.
const WRITE: &str = "/write_record {\"id\": \"r1\"}";

/// An agent whose `write_record` tool needs approval, served with API keys for two tenants.
struct ApprovalServer {
    server: TestServer,
    /// How many times `write_record` ran.
    writes: Arc<AtomicUsize>,
}

/// The shared test server's helpers (`base`, `http`, `executor`) on the approval server.
impl std::ops::Deref for ApprovalServer {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

impl ApprovalServer {
    async fn start() -> Self {
        let writes = Arc::new(AtomicUsize::new(0));
        let agent = support::records_agent(writes.clone());
        let runtime = support::two_tenant_runtime(MockLlm::new());
        let executor = keel_agent::AgentExecutor::new(agent, runtime);
        let server = TestServer::start_with_executor(executor, |server| {
            server.with_security(Security::api_key_and_bearer())
        })
        .await;
        Self { server, writes }
    }

    async fn stop(self) {
        self.server.stop().await;
    }

    fn rpc_request(&self, key: &str, method: &str, params: Value) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/", self.base))
            .header("A2A-Version", "1.0")
            .header("X-API-Key", key)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    }

    /// A unary JSON-RPC call as the tenant of `key`.
    async fn rpc(&self, key: &str, method: &str, params: Value) -> Value {
        let response = self.rpc_request(key, method, params).send().await.unwrap();
        response.json().await.unwrap()
    }

    /// A server with one task of Alice's waiting for approval: the server, the task's id and
    /// the approval request's id.
    async fn with_waiting_task() -> (Self, String, String) {
        let server = Self::start().await;
        let (task_id, request_id) = server.waiting_task().await;
        (server, task_id, request_id)
    }

    /// A task of Alice's that waits for approval of its `write_record` call, and the request id.
    async fn waiting_task(&self) -> (String, String) {
        let answer = self
            .rpc(
                ALICE,
                "SendMessage",
                json!({"message": message(vec![json!({"text": WRITE})], None)}),
            )
            .await;
        let task = &answer["result"]["task"];
        assert_eq!(
            task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{answer}"
        );
        let request_id = task["metadata"]["keel"]["pendingApproval"]["requestId"]
            .as_str()
            .expect("the pending request travels in the task's metadata")
            .to_owned();
        (task["id"].as_str().unwrap().to_owned(), request_id)
    }

    /// As the tenant of `key`, decide `request_id` on `task_id` over JSON-RPC; the answer.
    async fn decide(&self, key: &str, request_id: &str, outcome: &str, task_id: &str) -> Value {
        let params = decision(request_id, outcome, task_id);
        self.rpc(key, "SendMessage", params).await
    }

    /// Assert that Alice's task `task_id` still waits for its approval and nothing ran.
    async fn assert_still_waiting(&self, task_id: &str) {
        let task = self.rpc(ALICE, "GetTask", json!({"id": task_id})).await;
        assert_eq!(
            task["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{task}"
        );
        assert_eq!(self.writes.load(Ordering::SeqCst), 0);
    }

    /// The `approval.decided` events of the task's run, from its persisted report.
    async fn decided_events(&self, task_id: &str) -> Vec<Value> {
        let auth = AuthContext::new("acme", "alice");
        let task = self
            .executor
            .get_task(&auth, &TaskId::from(task_id), None)
            .await
            .unwrap();
        let ctx = RunContext::from_task(&task).unwrap().unwrap();
        let stored = self
            .executor
            .runtime()
            .run_store()
            .get_run_report(&auth, &ctx.run_id)
            .await
            .unwrap()
            .expect("the run's report");
        stored.report["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "approval.decided")
            .cloned()
            .collect()
    }
}

fn message(parts: Vec<Value>, task_id: Option<&str>) -> Value {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut message = json!({
        "messageId": format!("m-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        "role": "ROLE_USER",
        "parts": parts,
    });
    if let Some(task_id) = task_id {
        message["taskId"] = json!(task_id);
    }
    message
}

fn approval(request_id: &str, decision: &str, reason: Option<&str>) -> Value {
    let mut answer = json!({"requestId": request_id, "decision": decision});
    if let Some(reason) = reason {
        answer["reason"] = json!(reason);
    }
    json!({"data": {"approval": answer}})
}

/// SendMessage's params for a message that decides `request_id` on `task_id` (no reason).
fn decision(request_id: &str, decision: &str, task_id: &str) -> Value {
    json!({"message": message(vec![approval(request_id, decision, None)], Some(task_id))})
}

fn error_code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or(0)
}

#[tokio::test]
async fn jsonrpc_approval_runs_the_action_and_the_run_records_who_decided() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    assert_eq!(
        server.writes.load(Ordering::SeqCst),
        0,
        "nothing ran before the decision"
    );

    let answer = server
        .rpc(
            ALICE,
            "SendMessage",
            json!({"message": message(vec![approval(&request_id, "approve", Some("looks right"))], Some(&task_id))}),
        )
        .await;
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    assert_eq!(
        server.writes.load(Ordering::SeqCst),
        1,
        "the approved action ran once"
    );
    // The decision message is in the task's history, as A2A callers expect.
    let history = task["history"].as_array().unwrap();
    assert!(
        history
            .iter()
            .any(|m| m["parts"][0]["data"]["approval"]["requestId"] == request_id.as_str()),
        "{history:?}"
    );

    let decided = server.decided_events(&task_id).await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    let decision = &decided[0]["payload"]["decision"];
    assert_eq!(decision["outcome"], "approved");
    assert_eq!(decision["decided_by"], "alice");
    assert_eq!(decision["reason"], "looks right");
    assert_eq!(decision["request_id"], request_id.as_str());
    server.stop().await;
}

#[tokio::test]
async fn rest_denial_refuses_the_action_and_the_task_goes_on() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    let answer: Value = server.post_v1("/message:send")
        .header("X-API-Key", ALICE)
        .json(&json!({"message": message(vec![approval(&request_id, "deny", Some("not today"))], Some(&task_id))}))
        .json_with_status(reqwest::StatusCode::OK)
        .await;
    assert_eq!(
        answer["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    assert_eq!(
        server.writes.load(Ordering::SeqCst),
        0,
        "a denied action never runs"
    );
    let decided = server.decided_events(&task_id).await;
    assert_eq!(decided[0]["payload"]["decision"]["outcome"], "denied");
    assert_eq!(decided[0]["payload"]["decision"]["decided_by"], "alice");
    server.stop().await;
}

#[tokio::test]
async fn a_streamed_approval_follows_the_resumed_turn_to_its_end() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    let response = server
        .rpc_request(
            ALICE,
            "SendStreamingMessage",
            decision(&request_id, "approve", &task_id),
        )
        .send()
        .await
        .unwrap();
    let events = sse_events(response).await;
    let states: Vec<&str> = events
        .iter()
        .filter_map(|(_, e)| {
            e["result"]["statusUpdate"]["status"]["state"]
                .as_str()
                .or_else(|| e["result"]["task"]["status"]["state"].as_str())
        })
        .collect();
    assert_eq!(
        states.first(),
        Some(&"TASK_STATE_WORKING"),
        "the stream starts at the resumed turn: {states:?}"
    );
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{states:?}");
    assert_eq!(server.writes.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_approval_answers_with_the_finished_task() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    let mut socket = support::connect_ws(&server.base, Some(ALICE)).await;
    let params = decision(&request_id, "approve", &task_id);
    support::send_ws(&mut socket, "ws-1", "SendMessage", params).await;
    // Generous: the socket answers once the resumed run rests.
    let answer = support::next_ws(&mut socket, std::time::Duration::from_secs(60)).await;
    assert_eq!(answer["id"], "ws-1");
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    assert_eq!(server.writes.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_request_id_or_a_plain_message_is_invalid_params_and_the_task_still_waits() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;

    let wrong = server
        .rpc(ALICE, "SendMessage", json!({"message": message(vec![approval("not-the-one", "approve", None)], Some(&task_id))}))
        .await;
    assert_eq!(error_code(&wrong), -32602, "{wrong}");
    let text = wrong["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("not-the-one") && text.contains(&request_id),
        "{text}"
    );

    let malformed = server.decide(ALICE, &request_id, "maybe", &task_id).await;
    assert_eq!(error_code(&malformed), -32602, "{malformed}");

    let plain = server
        .rpc(
            ALICE,
            "SendMessage",
            json!({"message": message(vec![json!({"text": "yes"})], Some(&task_id))}),
        )
        .await;
    assert_eq!(error_code(&plain), -32602, "{plain}");

    server.assert_still_waiting(&task_id).await;
    server.stop().await;
}

#[tokio::test]
async fn a_decision_on_a_task_that_waits_for_no_approval_names_its_state() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    let done = server.decide(ALICE, &request_id, "approve", &task_id).await;
    assert_eq!(
        done["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{done}"
    );

    let again = server.decide(ALICE, &request_id, "approve", &task_id).await;
    assert_eq!(error_code(&again), -32602, "{again}");
    let text = again["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("completed") && text.contains("does not wait for an approval"),
        "{text}"
    );
    assert_eq!(
        server.writes.load(Ordering::SeqCst),
        1,
        "a second approval runs nothing"
    );

    // A task waiting for plain input waits for no approval either.
    let asking = server
        .rpc(ALICE, "SendMessage", json!({"message": message(vec![json!({"text": "/ask_human {\"question\": \"which?\"}"})], None)}))
        .await;
    let asking = &asking["result"]["task"];
    assert_eq!(
        asking["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{asking}"
    );
    let asking_id = asking["id"].as_str().unwrap();
    let refused = server
        .decide(ALICE, &request_id, "approve", asking_id)
        .await;
    assert_eq!(error_code(&refused), -32602, "{refused}");
    let text = refused["error"]["message"].as_str().unwrap();
    assert!(text.contains("input-required"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn another_tenants_task_is_task_not_found() {
    let (server, task_id, request_id) = ApprovalServer::with_waiting_task().await;
    let answer = server.decide(BOB, &request_id, "approve", &task_id).await;
    assert_eq!(error_code(&answer), -32001, "{answer}");
    server.assert_still_waiting(&task_id).await;
    server.stop().await;
}

#[tokio::test]
async fn the_card_declares_the_approval_extension() {
    let server = ApprovalServer::start().await;
    let card: Value = server.get_json_as(None, support::CARD_PATH).await;
    let uris: Vec<&str> = card["capabilities"]["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["uri"].as_str())
        .collect();
    assert!(uris.contains(&KEEL_APPROVAL_EXTENSION_URI), "{uris:?}");
    server.stop().await;
}
