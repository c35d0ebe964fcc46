//! Connection hygiene against stalled raw TCP clients: a client that sends nothing, or
//! trickles its headers, is closed after the header deadline; a body that stops arriving is
//! answered 408; an idle keep-alive connection is closed after the idle deadline (and not at
//! the header one); past the connection cap new connections wait while open ones are served.

mod support;

use std::time::{Duration, Instant};

use keel_transport::ConnectionLimits;
use support::{TestServer, CARD_PATH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Short deadlines, so that the tests wait seconds, not minutes.
const LIMITS: ConnectionLimits = ConnectionLimits {
    header_timeout: Duration::from_secs(1),
    body_timeout: Duration::from_secs(1),
    idle_timeout: Duration::from_secs(3),
    max_connections: 100,
};

/// Longer than any deadline here takes to act, on a loaded machine.
const SLACK: Duration = Duration::from_secs(20);

async fn server(limits: ConnectionLimits) -> TestServer {
    TestServer::start_with(
        std::sync::Arc::new(keel_runtime::Services::in_memory(std::sync::Arc::new(
            keel_llm::MockLlm::new(),
        ))),
        move |server| server.with_connection_limits(limits),
    )
    .await
}

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// A server with [`LIMITS`], and one raw connection to it.
async fn connected() -> (TestServer, TcpStream) {
    let server = server(LIMITS).await;
    let stream = connect(&server).await;
    (server, stream)
}

/// Read until the server closes the connection; what it sent. Panics after [`SLACK`].
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(SLACK, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server never closed the connection");
    String::from_utf8_lossy(&received).into_owned()
}

/// One GET of the card on `stream`, read to the end of its body (the card is small: one
/// read of headers and body, by Content-Length).
async fn get_card(stream: &mut TcpStream) -> String {
    stream
        .write_all(format!("GET {CARD_PATH} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 8192];
    tokio::time::timeout(SLACK, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer");
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap();
                if body.len() >= length {
                    return text.into_owned();
                }
            }
        }
    })
    .await
    .expect("no answer")
}

#[tokio::test]
async fn a_client_that_sends_nothing_is_closed_after_the_header_deadline() {
    let (server, mut silent) = connected().await;
    let opened = Instant::now();
    let received = read_until_closed(&mut silent).await;
    assert!(received.is_empty(), "{received}");
    assert!(opened.elapsed() >= LIMITS.header_timeout);
    server.stop().await;
}

#[tokio::test]
async fn a_trickled_header_is_closed_after_the_header_deadline() {
    let (server, mut trickling) = connected().await;
    let (mut reader, mut writer) = trickling.split();
    let opened = Instant::now();
    let trickle = async {
        writer.write_all(b"GET / HTTP/1.1\r\n").await?;
        for n in 0.. {
            tokio::time::sleep(Duration::from_millis(200)).await;
            writer.write_all(format!("X-{n}: y\r\n").as_bytes()).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(SLACK, async {
        tokio::select! {
            _ = trickle => {}
            () = closed => {}
        }
    })
    .await
    .expect("a trickling client was never closed");
    assert!(opened.elapsed() >= LIMITS.header_timeout);
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let (server, mut stalled) = connected().await;
    stalled
        .write_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: 52428800\r\n\r\n{\"jsonrpc\"",
        )
        .await
        .unwrap();
    let received = read_until_closed(&mut stalled).await;
    assert!(
        received.starts_with("HTTP/1.1 408"),
        "not a 408: {received:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_deadline_not_the_header_one() {
    let (server, mut client) = connected().await;
    let answer = get_card(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let idle_since = Instant::now();
    // Past the header deadline, the idle connection still serves a request...
    tokio::time::sleep(LIMITS.header_timeout + Duration::from_millis(500)).await;
    let answer = get_card(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let idle_since_second = Instant::now();
    // ...and, left idle, is closed once the idle deadline passes.
    let received = read_until_closed(&mut client).await;
    assert!(received.is_empty(), "{received}");
    assert!(idle_since_second.elapsed() >= LIMITS.idle_timeout);
    assert!(idle_since.elapsed() >= LIMITS.idle_timeout);
    server.stop().await;
}

#[tokio::test]
async fn past_the_connection_cap_new_connections_wait_while_open_ones_are_served() {
    let server = server(ConnectionLimits {
        header_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        max_connections: 2,
        ..LIMITS
    })
    .await;
    let mut first = connect(&server).await;
    let second = connect(&server).await;
    // An open connection is served...
    let answer = get_card(&mut first).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // ...a third waits while both are open...
    let third = tokio::spawn({
        let (http, url) = (server.http.clone(), format!("{}{CARD_PATH}", server.base));
        async move { http.get(url).send().await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!third.is_finished(), "a connection past the cap was served");
    let answer = get_card(&mut first).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // ...and is served once one closes.
    drop(second);
    let status = tokio::time::timeout(SLACK, third)
        .await
        .expect("the waiting connection was never served")
        .unwrap()
        .unwrap();
    assert_eq!(status, reqwest::StatusCode::OK);
    server.stop().await;
}
