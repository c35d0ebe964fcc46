//! Keel's A2A transport: the A2A server on axum ([`A2aServer`]: A2A v1.0 over JSON-RPC and
//! HTTP+JSON, with Server-Sent Events for streams, and A2A v0.3 JSON-RPC through a
//! compatibility layer), the A2A client ([`A2aClient`], reqwest), and the mapping between
//! Keel's models and A2A's wire form.
//!
//! Only this crate knows HTTP routes, JSON-RPC and A2A. Inside it, only the private `wire`
//! module names the official `a2a-lf` types; the server and the client speak Keel's models
//! (`keel-core`) and plain JSON. Keel's extras travel in A2A's own slots (typed parts as data
//! parts marked `keel.partType` in their metadata, task and artifact extras in `metadata`,
//! card extras in the [`KEEL_CARD_EXTENSION_URI`] extension), so a stranger's A2A client
//! talks to a Keel agent and a Keel client to a stranger's agent.
//!
//! The code map: `handlers` holds the operations that every binding calls (so bindings cannot
//! drift apart); `server` the routes and the card; `dispatch` one JSON-RPC request (over HTTP
//! or a WebSocket frame); `version` the `A2A-Version` selection; `rest` the HTTP+JSON binding;
//! `sse` Server-Sent Events answers; `compat_v03` the v0.3 method names and JSON shapes;
//! `stream` the follower that turns a task's durable event log into a stream; `wire` the v1.0
//! JSON; `ws` JSON-RPC over a WebSocket at [`WS_PATH`], streams included; `push` and
//! `push_config` push notifications; `client` the client, written once over its bindings
//! (HTTP, WebSocket, in-process); `transport` the [`AgentTransport`] trait every client implements and the types its
//! operations share.
//!
//! What it serves: the card at `/.well-known/agent-card.json` (with `Cache-Control` and an
//! `ETag`); SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask,
//! the four push notification config operations (with webhook delivery, `push`) and
//! GetExtendedAgentCard on both bindings; JSON-RPC 2.0 batches and notifications; and, with
//! [`A2aServer::with_security`], API key and bearer authentication through the runtime's
//! auth service (`security`), every operation running as the tenant the credentials prove.
//!
//! [`AgentTransport`] is the one typed interface to an agent. [`A2aClient`] implements it once,
//! over a binding: HTTP ([`A2aClient::new`]), the WebSocket ([`A2aClient::ws`], the type
//! [`A2aWsClient`]) or an agent in this process ([`A2aClient::in_process`], the type
//! [`InProcessClient`]), through the same handler layer and with no HTTP.
//!
//! See [`A2aServer`] for a complete example that serves an agent and talks to it.

mod agents;
pub mod callbacks;
mod client;
mod compat_v03;
mod conn;
mod dispatch;
mod endpoint;
#[cfg(feature = "grpc")]
pub mod grpc;
mod handlers;
mod idempotency;
pub mod jsonrpc;
mod limits;
mod observability;
mod operator;
mod push;
mod push_config;
mod rest;
mod security;
mod server;
mod sse;
mod stream;
mod task_list;
mod threads;
mod transport;
mod variables;
mod version;
mod wire;
mod ws;

pub use agents::{AgentsServer, AGENTS_PATH};
pub use client::{
    A2aClient, A2aWsClient, Binding, BlockingClient, HttpBinding, InProcessBinding,
    InProcessClient, WsBinding,
};
pub use conn::ConnectionLimits;
pub use endpoint::{
    EndpointContent, EndpointRequest, EndpointSpec, HttpMethod, RequestSource, COMPACT_THREAD_PATH,
    ENDPOINTS_PATH,
};
pub use limits::Limits;
pub use observability::{
    MetricsRoute, HTTP_REQUESTS, HTTP_REQUEST_SECONDS, METRICS_PATH, PUSH_DELIVERIES,
    SSE_SUBSCRIBERS,
};
pub use push::{PushTarget, DELIVERY_LOG_LIMIT, NOTIFICATION_TOKEN_HEADER};
pub use security::{Security, API_KEY_HEADER};
pub use server::{
    A2aServer, AGENT_CARD_PATH, DEFAULT_BODY_LIMIT, DEFAULT_CARD_MAX_AGE, LEGACY_AGENT_CARD_PATH,
};
pub use stream::{StreamEvent, POLL_INTERVAL};
pub use task_list::{TaskList, TaskListQuery};
pub use threads::{THREAD_MESSAGES_PATH, THREAD_PATH, THREAD_QUEUE_PATH};
pub use transport::{AgentTransport, SendMessageOptions, TaskEventStream};
pub use variables::VARIABLES_PATH;
pub use wire::{
    stream_event_json, task_json, KEEL_APPROVAL_EXTENSION_URI, KEEL_CARD_EXTENSION_URI,
    KEEL_METADATA_KEY,
};
pub use ws::{WS_MAX_IN_FLIGHT, WS_PATH};
