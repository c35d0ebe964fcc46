//! What the peer servers share: the port to listen on, taken from the command line.

use std::net::SocketAddr;

/// `127.0.0.1:PORT` from the first argument (`0`, or none, picks a free port).
pub fn listen_addr() -> SocketAddr {
    let port = std::env::args()
        .nth(1)
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(0);
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Binds the listener and prints the line the harness waits for.
pub async fn bind(name: &str) -> std::io::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(listen_addr()).await?;
    println!("{name}: listening on http://{}/", listener.local_addr()?);
    Ok(listener)
}
