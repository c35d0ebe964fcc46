//! `A2aServer::with_console`: the console's routes are served beside A2A without the
//! server's credentials, and `GET /` sends a browser (one asking for HTML) to the console
//! while every other caller keeps the `405` of the JSON-RPC path.

mod support;

use std::sync::Arc;

use axum::routing::get;
use keel_llm::MockLlm;
use keel_runtime::Services;
use keel_transport::Security;
use reqwest::{header, StatusCode};
use support::TestServer;

/// Stands in for `keel_console::router()`, which this layer does not know.
fn console() -> axum::Router {
    axum::Router::new().route("/console/", get(|| async { "the console page" }))
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `GET path` of `server`, redirects not followed, with `accept` when given.
async fn get_path(server: &TestServer, path: &str, accept: Option<&str>) -> reqwest::Response {
    let mut request = no_redirects().get(format!("{}{path}", server.base));
    if let Some(accept) = accept {
        request = request.header(header::ACCEPT, accept);
    }
    request.send().await.unwrap()
}

async fn root(server: &TestServer, accept: &str) -> reqwest::Response {
    get_path(server, "/", Some(accept)).await
}

#[tokio::test]
async fn a_browser_opening_the_server_is_sent_to_the_console() {
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let server = TestServer::start_with(runtime, |s| s.with_console(console())).await;
    let answer = root(&server, "text/html,application/xhtml+xml,*/*;q=0.8").await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()[header::LOCATION], "console/");
    let page = get_path(&server, "/console/", None).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.text().await.unwrap(), "the console page");
}

#[tokio::test]
async fn other_callers_of_get_root_keep_the_405_of_the_json_rpc_path() {
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let with = TestServer::start_with(runtime, |s| s.with_console(console())).await;
    let without = TestServer::start().await;
    for server in [&with, &without] {
        let answer = root(server, "*/*").await;
        assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(answer.headers()[header::ALLOW], "POST");
    }
    // Without a console a browser is not redirected: there is nowhere to go.
    let browser = root(&without, "text/html").await;
    assert_eq!(browser.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_console_is_served_without_credentials_while_the_api_needs_them() {
    let runtime = support::two_tenant_runtime(MockLlm::new());
    let server = TestServer::start_with(runtime, |s| {
        s.with_security(Security::api_key_and_bearer())
            .with_console(console())
    })
    .await;
    let page = get_path(&server, "/console/", None).await;
    assert_eq!(page.status(), StatusCode::OK);
    let tasks = get_path(&server, "/api/v1/tasks", None).await;
    assert_eq!(tasks.status(), StatusCode::UNAUTHORIZED);
}
