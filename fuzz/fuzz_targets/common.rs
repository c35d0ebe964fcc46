// Shared by the fuzz targets: one A2A server router over the offline demo agent and the
// in-memory store, driven in process (no sockets), and the rule every answer must keep.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use keel::agent::AgentExecutor;
use keel::transport::A2aServer;
use keel::DefaultRuntime;
use tower::ServiceExt;

pub struct Harness {
    pub runtime: tokio::runtime::Runtime,
    pub router: axum::Router,
}

pub fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let router = runtime.block_on(async {
            let agent = keel::demo::agent().expect("the demo agent");
            let executor = AgentExecutor::new(agent, Arc::new(DefaultRuntime::offline()));
            A2aServer::new(executor).router("http://127.0.0.1:1")
        });
        Harness { runtime, router }
    })
}

/// Send one request; every answer must be a well-formed HTTP response that is not a server
/// error (a 5xx would mean bad input reached an internal failure).
pub fn send(request: Request<Body>) {
    let harness = harness();
    let response = harness
        .runtime
        .block_on(harness.router.clone().oneshot(request))
        .expect("the router answers");
    assert!(
        response.status() != StatusCode::INTERNAL_SERVER_ERROR,
        "bad input produced an internal server error"
    );
}
