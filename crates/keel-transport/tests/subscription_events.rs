//! The callback route's subscription events: a tool marks its post `"kind": "subscription"`
//! and the event is queued as input to the call's thread, waking the model, where a progress
//! report (`"kind": "event"`) is not.

mod support;

use std::sync::Arc;

use keel_agent::{
    Agent, AgentExecutor, AsyncDispatch, AsyncInvocation, ExecutorConfig, InvocationSender,
    SendOptions, Tool, ToolContext, CALLBACK_SECRET_HEADER,
};
use keel_core::{AgentCard, AgentResult, Message};
use keel_llm::{LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::{Runtime, Services};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// An asynchronous tool that hands each invocation to the test, which calls back itself.
struct Watch(mpsc::UnboundedSender<AsyncInvocation>);

#[async_trait::async_trait]
impl Tool for Watch {
    fn name(&self) -> &str {
        "watch"
    }
    fn description(&self) -> &str {
        "Watch a price; its moves arrive later as events."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> AgentResult<Value> {
        unreachable!("an asynchronous tool is dispatched, never called")
    }
    fn asynchronous(&self) -> Option<&dyn AsyncDispatch> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl AsyncDispatch for Watch {
    async fn dispatch(
        &self,
        invocation: &AsyncInvocation,
        _sender: &dyn InvocationSender,
    ) -> AgentResult<()> {
        let _ = self.0.send(invocation.clone());
        Ok(())
    }
}

#[tokio::test]
async fn a_post_marked_subscription_wakes_the_model_and_a_progress_post_does_not() {
    let (tx, mut invocations) = mpsc::unbounded_channel();
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("watch", json!({}))]),
        MockResponse::Text("noted".into()),
    ]));
    let agent = Agent::builder(AgentCard::new("rap", "async tools", "http://unused"))
        .llm_shared(llm.clone())
        .tool(Watch(tx))
        .build()
        .unwrap();
    let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let auth = runtime.auth_service().auth_context();
    let config = ExecutorConfig {
        callbacks: Some(keel_transport::callbacks::HttpCallbacks::shared(
            "http://127.0.0.1:9",
        )),
        ..ExecutorConfig::default()
    };
    let executor = AgentExecutor::with_config(agent, runtime, config);
    let server = support::TestServer::start_with_executor(executor.clone(), |s| s).await;
    let options = SendOptions::in_background();
    executor
        .send_message(&auth, Message::user("watch the price"), options)
        .await
        .unwrap();
    let inv = invocations.recv().await.unwrap();
    let post = |body: Value| {
        server
            .http
            .post(format!("{}/callbacks/{}", server.base, inv.call_id))
            .header(CALLBACK_SECRET_HEADER, &inv.callback_secret)
            .json(&body)
            .send()
    };

    let progress = post(json!({"kind": "event", "event": "half way"}))
        .await
        .unwrap();
    assert_eq!(progress.status(), 202);
    let event = post(json!({"kind": "subscription", "event": "the price moved to 42"}))
        .await
        .unwrap();
    assert_eq!(event.status(), 202);
    assert_eq!(event.json::<Value>().await.unwrap()["kind"], "subscription");

    keel_runtime::testing::eventually("the model woken by the event", || async {
        llm.requests().len() == 2
    })
    .await;
    let woken = &llm.requests()[1];
    let said: Vec<&str> = woken
        .messages
        .iter()
        .filter(|m| m.role == LlmRole::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        said,
        ["watch the price", "the price moved to 42"],
        "{woken:?}"
    );
    server.stop().await;
}
