//! The right answer to each of a caller's smaller mistakes and limits: a JSON-RPC overload
//! answer carries `Retry-After` as HTTP+JSON's does; `max_queued_per_thread` N lets N tasks
//! wait besides the running one; a part with several contents is refused, not trimmed; gRPC
//! names an undecodable or too deeply nested request INVALID_ARGUMENT; and an error echoes a
//! huge id cut short.

mod support;

use keel_agent::{AgentExecutor, ExecutorConfig};
use keel_core::TaskState;
use keel_llm::MockLlm;
use keel_runtime::testing::eventually;
use keel_transport::jsonrpc::MAX_ECHOED_CHARS;
use keel_transport::Security;
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{user_message, TestServer, ALICE};

/// A tool call that lasts until the server stops (which cancels it).
const SLEEP_LONG: &str = "/sleep {\"seconds\": 3600}";

async fn queue_server(max_queued_per_thread: usize) -> TestServer {
    let config = ExecutorConfig {
        max_queued_per_thread,
        ..ExecutorConfig::default()
    };
    let runtime = support::two_tenant_runtime(MockLlm::new());
    let executor = AgentExecutor::with_config(support::agent(), runtime, config);
    TestServer::start_with_executor(executor, |server| {
        server.with_security(Security::api_key_and_bearer())
    })
    .await
}

/// SendMessage of `text` on the thread `thread`, answered at once; the whole response.
async fn send_on(server: &TestServer, text: &str, thread: &str) -> reqwest::Response {
    let mut message = user_message(text);
    message["contextId"] = json!(thread);
    server
        .post_v1("/")
        .header("X-API-Key", ALICE)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message, "configuration": {"returnImmediately": true}}}))
        .send()
        .await
        .unwrap()
}

/// Start a long task on `thread` and wait until it runs.
async fn run_long_task(server: &TestServer, thread: &str) {
    let sent: Value = send_on(server, SLEEP_LONG, thread)
        .await
        .json()
        .await
        .unwrap();
    let task_id = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let auth = keel_runtime::AuthContext::new("acme", "alice");
    let reads = server.executor.reads();
    eventually("the long task runs", || {
        let (reads, auth, task_id) = (reads.clone(), auth.clone(), task_id.clone());
        async move {
            reads
                .task(&auth, &task_id.as_str().into())
                .await
                .is_ok_and(|task| task.state() == TaskState::Working)
        }
    })
    .await;
}

#[tokio::test]
async fn max_queued_per_thread_lets_n_tasks_wait_besides_the_running_one() {
    let server = queue_server(2).await;
    run_long_task(&server, "t").await;
    for text in ["first waiting", "second waiting"] {
        let sent: Value = send_on(&server, text, "t").await.json().await.unwrap();
        assert_eq!(
            sent["result"]["task"]["status"]["state"], "TASK_STATE_SUBMITTED",
            "{sent}"
        );
    }
    let refused: Value = send_on(&server, "one too many", "t")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(refused["error"]["code"], -32051, "{refused}");
    assert_eq!(refused["error"]["data"][0]["metadata"]["max"], "2");
    server.stop().await;
}

#[tokio::test]
async fn the_json_rpc_overload_answer_carries_retry_after() {
    let server = queue_server(1).await;
    run_long_task(&server, "t").await;
    let waiting = send_on(&server, "waiting", "t").await;
    assert!(waiting.headers().get("retry-after").is_none());
    let refused = send_on(&server, "one too many", "t").await;
    assert_eq!(refused.status(), StatusCode::OK);
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .expect("no Retry-After on the -32051 answer")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32051, "{body}");
    assert_eq!(
        body["error"]["data"][0]["metadata"]["retryAfterSeconds"],
        retry_after.to_string()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_part_with_several_contents_is_refused_not_trimmed() {
    let server = TestServer::start().await;
    let message = json!({"messageId": "m-several", "role": "ROLE_USER", "parts": [
        {"text": "fine"},
        {"text": "hi", "url": "https://example.com/a.png", "data": {"k": 1}},
    ]});
    let rpc = server.send_message(message.clone()).await;
    assert_eq!(rpc["error"]["code"], -32602, "{rpc}");
    let info = &rpc["error"]["data"][0]["metadata"];
    assert_eq!(info["field"], "message.parts[1]", "{rpc}");
    assert!(
        info["description"]
            .as_str()
            .is_some_and(|d| d.contains("`text`") && d.contains("`url`") && d.contains("`data`")),
        "{rpc}"
    );
    let rest = server
        .post_v1("/message:send")
        .json(&json!({"message": message}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), StatusCode::BAD_REQUEST);
    let rest: Value = rest.json().await.unwrap();
    assert_eq!(rest["error"]["status"], "INVALID_ARGUMENT", "{rest}");
    let listed = server.rpc("ListTasks", json!({})).await;
    assert_eq!(listed["result"]["totalSize"], 0, "{listed}");
    server.stop().await;
}

#[tokio::test]
async fn an_error_echoes_a_huge_id_cut_short() {
    let server = TestServer::start().await;
    let id = "i".repeat(512 * 1024);
    let answer = server
        .rpc_with(Some("1.0"), "GetTask", json!({"id": id}))
        .await
        .text()
        .await
        .unwrap();
    assert!(answer.len() < 4096, "an error of {} bytes", answer.len());
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    let echoed = answer["error"]["data"][0]["metadata"]["taskId"]
        .as_str()
        .unwrap();
    assert_eq!(echoed.chars().count(), MAX_ECHOED_CHARS + 1);
    assert!(echoed.ends_with('…') && id.starts_with(echoed.trim_end_matches('…')));
    server.stop().await;
}

#[cfg(feature = "grpc")]
mod grpc {
    use keel_transport::grpc::tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use keel_transport::grpc::tonic::codegen::http::uri::PathAndQuery;
    use keel_transport::grpc::tonic::transport::Endpoint;
    use keel_transport::grpc::tonic::{client::Grpc, Code, Request, Status};
    use keel_transport::grpc::{from_json, proto};
    use prost::bytes::{Buf, BufMut};
    use serde_json::json;

    use super::{TestServer, MAX_ECHOED_CHARS};

    /// Request bytes sent as they are, whatever they decode to.
    #[derive(Debug, Clone, Copy, Default)]
    struct Raw;

    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }

    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Raw {
        type Item = Vec<u8>;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            let bytes = src.chunk().to_vec();
            src.advance(bytes.len());
            Ok(Some(bytes))
        }
    }

    /// SendMessage with `bytes` as its request message; the status it fails with.
    async fn send_raw(server: &TestServer, bytes: Vec<u8>) -> Status {
        let channel = Endpoint::from_shared(server.base.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = Grpc::new(channel);
        grpc.ready().await.unwrap();
        grpc.unary(
            Request::new(bytes),
            PathAndQuery::from_static("/lf.a2a.v1.A2AService/SendMessage"),
            Raw,
        )
        .await
        .unwrap_err()
    }

    /// A length-delimited protobuf field.
    fn field(number: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2];
        let mut len = body.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(body);
        out
    }

    #[tokio::test]
    async fn an_undecodable_or_too_deep_request_is_invalid_argument() {
        let server = TestServer::start().await;
        // Field 2 (the message) says 16 bytes follow; one does.
        let truncated = send_raw(&server, vec![0x12, 0x10, 0x01]).await;
        assert_eq!(truncated.code(), Code::InvalidArgument, "{truncated:?}");
        // `metadata` (field 4, a Struct) holding a list in a list ... 200 deep: past prost's
        // recursion limit of 100.
        let mut value = Vec::new();
        for _ in 0..200 {
            value = field(6, &field(1, &value));
        }
        let entry = [field(1, b"k"), field(2, &value)].concat();
        let deep = send_raw(&server, field(4, &field(1, &entry))).await;
        assert_eq!(deep.code(), Code::InvalidArgument, "{deep:?}");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_grpc_error_echoes_a_huge_id_cut_short() {
        let server = TestServer::start().await;
        let mut client = crate::support::grpc_client(&server.base).await;
        let id = "i".repeat(512 * 1024);
        let request: proto::GetTaskRequest = from_json(&json!({"id": id}).to_string()).unwrap();
        let status = client.get_task(request).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().len() < 1024, "{}", status.message().len());
        assert!(status.message().contains(&"i".repeat(MAX_ECHOED_CHARS)));
        server.stop().await;
    }
}
