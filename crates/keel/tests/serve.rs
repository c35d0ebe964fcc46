//! `DefaultRuntime::builder().agents([...]).serve_on(listener, shutdown)`: several agents on
//! one runtime and one server, each reached at its own URL.

use std::sync::Arc;

use keel::llm::{MockLlm, MockResponse};
use keel::prelude::*;
use keel::transport::{A2aClient, SendMessageOptions};

fn agent(name: &str, answer: &str) -> Agent {
    Agent::builder(AgentCard::new(name, "answers one thing", "http://unused"))
        .llm_shared(Arc::new(MockLlm::scripted(vec![MockResponse::Text(
            answer.into(),
        )])))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_are_served_in_one_call_each_at_its_own_url() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(
        DefaultRuntime::builder()
            .agents([agent("alpha", "from alpha"), agent("beta", "from beta")])
            .serve_on(listener, async move {
                let _ = stopped.await;
            }),
    );

    for (name, answer) in [("alpha", "from alpha"), ("beta", "from beta")] {
        let client = A2aClient::new(format!("{base}/agents/{name}"));
        assert_eq!(client.get_card().await.unwrap().name, name);
        let task = client
            .send_message(Message::user("hello"), SendMessageOptions::default())
            .await
            .unwrap();
        assert_eq!(task.state(), TaskState::Completed, "{name}");
        let text = task.status().message.as_ref().map(Message::text);
        assert_eq!(text.as_deref(), Some(answer), "{name}");
    }
    // The first agent is also the server's default, at `/`.
    let card = A2aClient::new(base.clone()).get_card().await.unwrap();
    assert_eq!(card.name, "alpha");

    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn serving_without_agents_or_with_a_repeated_name_is_refused() {
    for agents in [
        vec![],
        vec![agent("twin", "a"), agent("twin", "b")],
        vec![agent("a/b", "x")],
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = DefaultRuntime::builder()
            .agents(agents)
            .serve_on(listener, async {})
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    }
}
