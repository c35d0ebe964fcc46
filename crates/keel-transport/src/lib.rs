//! Keel's A2A transport: the A2A v1.0 server on axum ([`A2aServer`], JSON-RPC binding), the
//! A2A client ([`A2aClient`], reqwest), and the mapping between Keel's models and A2A's wire
//! form.
//!
//! Only this crate knows HTTP routes, JSON-RPC and A2A. Inside it, only the private `wire`
//! module names the official `a2a-lf` types; the server and the client speak Keel's models
//! (`keel-core`) and plain JSON. Keel's extras travel in A2A's own slots (typed parts as data
//! parts marked `keel.partType` in their metadata, task and artifact extras in `metadata`,
//! card extras in the [`KEEL_CARD_EXTENSION_URI`] extension), so a stranger's A2A client
//! talks to a Keel agent and a Keel client to a stranger's agent.
//!
//! What this first cut serves: the card at `/.well-known/agent-card.json`, and `SendMessage`,
//! `GetTask` and `CancelTask` over JSON-RPC at `/`. Not yet: streaming, push notifications,
//! `ListTasks`, the REST binding, the v0.3 compatibility layer (requests without an
//! `A2A-Version` header are handled as v1.0 for now) and JSON-RPC batches.
//!
//! See [`A2aServer`] for a complete example that serves an agent and talks to it.

mod client;
pub mod jsonrpc;
mod server;
mod wire;

pub use client::{A2aClient, SendMessageOptions};
pub use server::{A2aServer, AGENT_CARD_PATH, DEFAULT_BODY_LIMIT};
pub use wire::KEEL_CARD_EXTENSION_URI;
