//! JSON-RPC over a WebSocket at [`WS_PATH`]: each text frame the client sends is one JSON-RPC
//! request (v1.0, or v0.3 by the same rules as `POST /`), each frame the server sends one
//! JSON-RPC response; a streaming method (`SendStreamingMessage`, `SubscribeToTask`) is
//! answered with several response frames carrying the request's id, one per stream event, the
//! last being the final status (or an error). Requests on one socket run concurrently, so a
//! stream never holds up the requests behind it, and a `CancelTask` sent on another socket
//! (or over HTTP) reaches the engine at once: the canceled task's stream then ends with its
//! `canceled` status.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use futures::{SinkExt, StreamExt};
use keel_runtime::AuthContext;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::dispatch::{self, Outcome};
use crate::handlers::Handlers;
use crate::jsonrpc::{self, RpcError, INVALID_REQUEST, PARSE_ERROR};

/// The path of the WebSocket endpoint.
pub const WS_PATH: &str = "/ws";

/// How many requests of one socket may run at once; further frames wait to be read (the
/// socket's backpressure).
pub const WS_MAX_IN_FLIGHT: usize = 64;

/// Frames queued for the socket before the requests that produce them wait.
const OUTBOX: usize = 64;

/// The route of the socket endpoint: `GET` [`WS_PATH`], with messages up to `message_limit`
/// bytes.
pub(crate) fn router(handlers: Handlers, message_limit: usize) -> Router {
    Router::new()
        .route(WS_PATH, get(upgrade))
        .with_state(Arc::new(SocketState {
            handlers,
            message_limit,
        }))
}

/// What the socket endpoint serves with.
struct SocketState {
    handlers: Handlers,
    /// The largest WebSocket message accepted (the server's body limit).
    message_limit: usize,
}

/// `GET /ws`: authenticate the upgrade request (401 as `POST /` would answer), then speak
/// JSON-RPC on the socket as that tenant. The `A2A-Version` header or query parameter of the
/// upgrade request selects the protocol for every frame, as it does for `POST /`.
async fn upgrade(
    State(endpoint): State<Arc<SocketState>>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let auth = match endpoint.handlers.caller(&headers, None, true) {
        Ok(auth) => auth,
        Err(denied) => return *denied,
    };
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let limit = endpoint.message_limit;
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| {
            serve_socket(
                socket,
                Connection {
                    handlers: endpoint.handlers.clone(),
                    headers,
                    query,
                    auth,
                },
            )
        })
}

/// What every request of one socket shares.
struct Connection {
    handlers: Handlers,
    headers: HeaderMap,
    query: Vec<(String, String)>,
    auth: AuthContext,
}

async fn serve_socket(socket: WebSocket, connection: Connection) {
    let connection = Arc::new(connection);
    let (mut sink, mut source) = socket.split();
    let (outbox, mut outgoing) = mpsc::channel::<Message>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if sink.send(frame).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let in_flight = Arc::new(Semaphore::new(WS_MAX_IN_FLIGHT));
    let mut requests = JoinSet::new();
    let mut closing = connection.handlers.closing();
    let server_closing = loop {
        let frame = tokio::select! {
            frame = source.next() => frame,
            _ = closing.wait_for(|closed| *closed) => break true,
        };
        let text = match frame {
            None | Some(Err(_) | Ok(Message::Close(_))) => break false,
            Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
            Some(Ok(Message::Binary(bytes))) => match String::from_utf8(bytes.to_vec()) {
                Ok(text) => text,
                Err(_) => {
                    let error = RpcError::new(PARSE_ERROR, "parse error: a frame is not UTF-8");
                    if send(&outbox, &jsonrpc::failure(Value::Null, &error))
                        .await
                        .is_err()
                    {
                        break false;
                    }
                    continue;
                }
            },
            // Pings are answered by axum; pongs need nothing.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break false;
        };
        let (connection, outbox) = (connection.clone(), outbox.clone());
        requests.spawn(async move {
            let _permit = permit;
            answer(&connection, &text, &outbox).await;
        });
        while requests.try_join_next().is_some() {}
    };
    if server_closing {
        // The server's runs have stopped: open streams read their logs one last time and end,
        // so every request in flight finishes with its final answer.
        while requests.join_next().await.is_some() {}
    } else {
        // The client went away: its requests stop (their tasks go on in the engine).
        requests.abort_all();
    }
    drop(outbox);
    let _ = writer.await;
}

/// Queue one response frame; `Err` once the socket is gone.
async fn send(outbox: &mpsc::Sender<Message>, response: &impl ToString) -> Result<(), ()> {
    outbox
        .send(Message::Text(response.to_string().into()))
        .await
        .map_err(|_| ())
}

/// Run the request in one frame and queue its response frames.
async fn answer(connection: &Connection, text: &str, outbox: &mpsc::Sender<Message>) {
    let request: Value = match serde_json::from_str(text) {
        Ok(request) => request,
        Err(err) => {
            let error = RpcError::new(PARSE_ERROR, format!("parse error: {err}"));
            let _ = send(outbox, &jsonrpc::failure(Value::Null, &error)).await;
            return;
        }
    };
    if request.is_array() {
        let error = RpcError::new(
            INVALID_REQUEST,
            "batches are not accepted over WebSocket: send one request per frame",
        );
        let _ = send(outbox, &jsonrpc::failure(Value::Null, &error)).await;
        return;
    }
    let outcome = dispatch::call(
        &connection.handlers,
        &connection.headers,
        &connection.query,
        &connection.auth,
        request,
        false,
    )
    .await;
    match outcome {
        Outcome::Silent => {}
        Outcome::Answer(response)
        | Outcome::Failed {
            answer: response, ..
        } => {
            let _ = send(outbox, &response).await;
        }
        Outcome::Stream {
            id,
            protocol,
            mut events,
        } => {
            while let Some(item) = events.next().await {
                let response = dispatch::stream_envelope(&id, protocol, item);
                if send(outbox, &response).await.is_err() {
                    return;
                }
            }
        }
    }
}
