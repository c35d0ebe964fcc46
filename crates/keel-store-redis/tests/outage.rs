//! A Redis outage seen through the store: while the server cannot be reached, calls fail
//! quickly with `StoreUnavailable` (not a generic storage error after long retries), and the
//! store works again once the server is back. The outage is a TCP proxy in front of the test
//! server (`REDIS_URL`) that this test closes and reopens.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use keel_core::{AgentError, Message, Task};
use keel_runtime::testing::eventually_within;
use keel_runtime::{AuthContext, TaskManager};
use keel_store_redis::RedisStore;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// How long the outage may take to begin or end: the client's own backed-off reconnection
/// takes about ten seconds, and a loaded machine more.
const RECONNECTION: Duration = Duration::from_secs(60);

/// Forwards connections on `address` to `upstream` until dropped; dropping it closes the
/// listener and every forwarded connection.
struct Proxy {
    _connections: JoinSet<()>,
}

impl Proxy {
    async fn open(address: SocketAddr, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(address).await.expect("bind the proxy");
        let mut connections = JoinSet::new();
        connections.spawn(async move {
            let mut forwarded = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                forwarded.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self {
            _connections: connections,
        }
    }
}

fn upstream() -> (url::Url, SocketAddr) {
    let url = url::Url::parse(&support::redis_url()).expect("REDIS_URL parses");
    let address = url
        .socket_addrs(|| Some(6379))
        .expect("REDIS_URL names a host")
        .into_iter()
        .next()
        .expect("REDIS_URL resolves");
    (url, address)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_redis_fails_fast_as_store_unavailable_and_recovers() {
    let (mut url, upstream) = upstream();
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = free.local_addr().unwrap();
    drop(free);
    let proxy = Proxy::open(address, upstream).await;
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(address.port())).unwrap();
    let prefix = support::fresh_prefix();
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let auth = AuthContext::new("outage", "u");
    let task = Task::create(Message::user("hello"));
    store.save_task(&auth, &task).await.unwrap();

    drop(proxy);
    // The proxy's tasks end asynchronously: wait until its port refuses connections and the
    // store has noticed (a call already on its way may still have gone through).
    eventually_within("the outage to begin", RECONNECTION, || async {
        TcpStream::connect(address).await.is_err() && store.get_task(&auth, &task.id).await.is_err()
    })
    .await;
    // Calls fail with StoreUnavailable, each within a bound far below the client's own
    // backed-off reconnection (about ten seconds).
    for _ in 0..3 {
        let err = tokio::time::timeout(Duration::from_secs(5), store.get_task(&auth, &task.id))
            .await
            .expect("a call fails fast while Redis is unreachable")
            .unwrap_err();
        assert!(
            matches!(
                err,
                AgentError::StoreUnavailable {
                    backend: "redis",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("store unavailable"), "{err}");
    }

    // Back: the store reconnects on its own.
    let _proxy = Proxy::open(address, upstream).await;
    let found = eventually_within("the store to reconnect", RECONNECTION, || async {
        match store.get_task(&auth, &task.id).await {
            Ok(found) => Some(found),
            Err(AgentError::StoreUnavailable { .. }) => None,
            Err(other) => panic!("{other:?}"),
        }
    })
    .await;
    assert_eq!(found.map(|t| t.id), Some(task.id.clone()));
    support::clean_up(&prefix).await;
}
