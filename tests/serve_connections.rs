//! `keel serve`'s connection deadlines and cap, from its flags and from `[server]` in a
//! `keel.toml`: a client that sends nothing is closed after the header deadline given, and
//! values out of range are refused before the server starts.

mod support;

use std::process::Command;
use std::time::Duration;

use keel::transport::ConnectionLimits;
use support::KeelServer;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long a one-second deadline may take to act on a loaded machine.
const SLACK: Duration = Duration::from_secs(20);

/// Connect to `server` and send nothing; completes once the server closes the connection,
/// which must come well before the default header deadline (the setting took effect).
async fn silent_client_is_closed(server: &KeelServer) {
    let address = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let mut silent = TcpStream::connect(address).await.unwrap();
    let opened = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(SLACK, silent.read(&mut buf))
        .await
        .expect("a silent connection was never closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        opened.elapsed() < ConnectionLimits::DEFAULT_HEADER_TIMEOUT,
        "closed only after {:?}: the default, not the setting",
        opened.elapsed()
    );
}

#[tokio::test]
async fn the_header_timeout_flag_closes_a_silent_connection() {
    let server = KeelServer::start(&["--header-timeout", "0.5", "--max-connections", "50"]);
    silent_client_is_closed(&server).await;
}

#[tokio::test]
async fn the_files_header_timeout_closes_a_silent_connection() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[server]\nstore = \"memory\"\nheader_timeout_seconds = 0.5\nidle_timeout_seconds = 5\n\n[[agents]]\nname = \"local\"\ndescription = \"Local.\"\n",
    )
    .unwrap();
    let server = KeelServer::start_in(dir.path(), &[]);
    silent_client_is_closed(&server).await;
}

#[test]
fn deadlines_and_caps_out_of_range_are_refused() {
    let refused = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--store",
            "memory",
            "--port",
            "0",
            "--body-timeout",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--body-timeout 0 is out of range"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(
        &file,
        "[server]\nstore = \"memory\"\nmax_connections = 0\n\n[[agents]]\nname = \"local\"\ndescription = \"Local.\"\n",
    )
    .unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["check", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("server.max_connections"), "{stderr}");
}
