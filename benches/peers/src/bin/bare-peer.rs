//! The bare ceiling: an axum handler that parses the JSON-RPC envelope and answers a fixed
//! completed task for every method (SendStreamingMessage: as the one event of an SSE body).
//! What HTTP and JSON cost with no A2A server behind them.

use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

async fn answer(body: Bytes) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let method = request.get("method").and_then(Value::as_str);
    let valid = request.get("jsonrpc").and_then(Value::as_str) == Some("2.0") && method.is_some();
    let reply = if valid {
        json!({"jsonrpc": "2.0", "id": id, "result": {"task": {
            "id": "t-1",
            "contextId": "c-1",
            "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-01T00:00:00Z"}
        }}})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": "invalid request"}})
    };
    // Serialized here rather than with axum's `json` feature: one dependency fewer.
    if valid && method == Some("SendStreamingMessage") {
        return (
            [(header::CONTENT_TYPE, "text/event-stream")],
            format!("data: {reply}\n\n"),
        );
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        reply.to_string(),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listener = a2a_bench_peers::bind("bare-peer").await?;
    axum::serve(listener, Router::new().route("/", post(answer))).await
}
