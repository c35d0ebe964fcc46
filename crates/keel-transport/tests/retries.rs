//! The client retries idempotent calls (the card fetch, GetTask, ListTasks, CancelTask) when
//! the connection is lost, and never SendMessage (unless nothing was sent: the card fetch that
//! finds the endpoint): a proxy in front of a real server drops the first connections it
//! accepts without answering.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentError, AgentResult, Message, TaskState};
use keel_transport::{A2aClient, Binding, SendMessageOptions, TaskListQuery};
use support::TestServer;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `target` that reads the request on each of the first connections it
/// accepts and closes it without an answer (a lost connection); later ones are forwarded.
struct DroppingProxy {
    base: String,
    accepted: Arc<AtomicUsize>,
    to_drop: Arc<AtomicUsize>,
}

impl DroppingProxy {
    async fn start(target: &str) -> Self {
        let target = target
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let to_drop = Arc::new(AtomicUsize::new(0));
        let (count, drop) = (accepted.clone(), to_drop.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let dropping = drop
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                let target = target.clone();
                tokio::spawn(async move {
                    if dropping {
                        let mut buf = [0u8; 4096];
                        let _ = inbound.read(&mut buf).await;
                        return; // dropped: the connection closes with no answer
                    }
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            base,
            accepted,
            to_drop,
        }
    }

    /// Drop the next `n` connections.
    fn drop_next(&self, n: usize) {
        self.to_drop.store(n, Ordering::SeqCst);
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A client that opens a fresh connection per request (so each request meets the proxy's
/// accept) and retries quickly.
fn client(base: &str) -> A2aClient {
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    A2aClient::new(base)
        .with_http_client(fresh)
        .with_retries(3, Duration::from_millis(10))
}

/// A client of `proxy` told its JSON-RPC endpoint, so it fetches no card first.
fn jsonrpc_client(proxy: &DroppingProxy) -> A2aClient {
    client(&proxy.base).with_endpoint(format!("{}/", proxy.base))
}

/// A test server behind a [`DroppingProxy`] that drops the next `drops` connections.
async fn proxied(drops: usize) -> (TestServer, DroppingProxy) {
    let server = TestServer::start().await;
    let proxy = DroppingProxy::start(&server.base).await;
    proxy.drop_next(drops);
    (server, proxy)
}

/// How many tasks `server` holds, read directly (not through the proxy).
async fn stored_tasks(server: &TestServer) -> usize {
    let direct = A2aClient::new(&server.base);
    let list = direct.list_tasks(&TaskListQuery::default()).await.unwrap();
    list.total_size
}

#[tokio::test]
async fn the_card_and_get_task_survive_a_dropped_connection() {
    let server = TestServer::start().await;
    let proxy = DroppingProxy::start(&server.base).await;
    let direct = A2aClient::new(&server.base);
    let task = direct
        .send_message(Message::user("hi"), SendMessageOptions::default())
        .await
        .unwrap();

    proxy.drop_next(1);
    let via_proxy = client(&proxy.base);
    let card = via_proxy
        .get_card()
        .await
        .expect("the card fetch is retried");
    assert_eq!(card.name, "echo");
    assert_eq!(proxy.accepted(), 2, "one dropped, one served");

    for binding in [Binding::JsonRpc, Binding::HttpJson] {
        let endpoint = match binding {
            Binding::JsonRpc => format!("{}/", proxy.base),
            Binding::HttpJson => proxy.base.clone(),
        };
        let via_proxy = client(&proxy.base)
            .with_binding(binding)
            .with_endpoint(endpoint);
        let before = proxy.accepted();
        proxy.drop_next(1);
        let got = via_proxy
            .get_task(&task.id, None)
            .await
            .expect("GetTask is retried");
        assert_eq!(got.state(), TaskState::Completed);
        proxy.drop_next(1);
        let list = via_proxy
            .list_tasks(&TaskListQuery::default())
            .await
            .expect("ListTasks is retried");
        assert_eq!(list.total_size, 1);
        assert_eq!(
            proxy.accepted() - before,
            4,
            "GetTask and ListTasks: two attempts each"
        );
        proxy.drop_next(1);
        let err = via_proxy
            .cancel_task(&task.id, None)
            .await
            .expect_err("a completed task cannot be canceled");
        assert!(
            matches!(err, AgentError::TaskNotCancelable { .. }),
            "the retried CancelTask reached the agent: {err:?}"
        );
        assert_eq!(proxy.accepted() - before, 6, "CancelTask: two attempts");
    }
    server.stop().await;
}

/// Assert that `answer` is the client's `Unreachable` error: the proxy dropped every
/// connection of the call (`why` says how, for the failure message).
fn assert_unreachable<T: std::fmt::Debug>(answer: AgentResult<T>, why: &str) {
    let err = answer.expect_err(why);
    assert!(matches!(err, AgentError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn retries_give_up_after_their_attempts() {
    let (server, proxy) = proxied(10).await;
    let via_proxy = jsonrpc_client(&proxy);
    let answer = via_proxy.get_task(&"t-1".into(), None).await;
    assert_unreachable(answer, "every connection is dropped");
    assert_eq!(proxy.accepted(), 3, "three attempts, no more");
    server.stop().await;
}

#[tokio::test]
async fn send_message_is_never_retried() {
    let (server, proxy) = proxied(1).await;
    let via_proxy = jsonrpc_client(&proxy);
    let answer = via_proxy
        .send_message(Message::user("once"), SendMessageOptions::default())
        .await;
    assert_unreachable(answer, "the only connection is dropped");
    assert_eq!(proxy.accepted(), 1, "SendMessage got one attempt");
    assert_eq!(stored_tasks(&server).await, 0, "the message never arrived");
    server.stop().await;
}

#[tokio::test]
async fn send_message_retries_the_endpoint_lookup_that_sent_nothing() {
    let (server, proxy) = proxied(1).await;
    // No endpoint given: the first call fetches the card through the proxy to find it.
    let via_proxy = client(&proxy.base);
    let task = via_proxy
        .send_message(Message::user("once"), SendMessageOptions::default())
        .await
        .expect("the lost card fetch sent no message, so it is tried again");
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(proxy.accepted(), 2, "the card: one dropped, one served");
    assert_eq!(stored_tasks(&server).await, 1, "the message arrived once");
    server.stop().await;
}
