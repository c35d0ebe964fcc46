//! A small keep-alive client for the memory figures: `connections` threads, each on one
//! HTTP/1.1 connection, send SendMessage until `total` have been sent (wrk cannot stop at a
//! request count: a capped wrk still waits out its whole duration).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a batch of sends did.
pub struct Sent {
    pub per_sec: f64,
    pub errors: u64,
}

/// Sends `total` SendMessage to 127.0.0.1:`port`, messageIds `{prefix}{n}`.
pub fn send_messages(
    port: u16,
    connections: usize,
    total: u64,
    prefix: &str,
) -> Result<Sent, String> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (next, prefix) = (next.clone(), prefix.to_owned());
            std::thread::spawn(move || sender(port, &next, total, &prefix))
        })
        .collect();
    let mut errors = 0;
    for worker in workers {
        errors += worker
            .join()
            .map_err(|_| "a sending thread panicked".to_owned())??;
    }
    Ok(Sent {
        per_sec: total as f64 / started.elapsed().as_secs_f64(),
        errors,
    })
}

/// One connection's share of the sends; the number that did not answer a result.
fn sender(port: u16, next: &AtomicU64, total: u64, prefix: &str) -> Result<u64, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut errors = 0;
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= total {
            return Ok(errors);
        }
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{n},"method":"SendMessage","params":{{"message":{{"messageId":"{prefix}{n}","role":"ROLE_USER","parts":[{{"text":"hello, echo"}}]}}}}}}"#
        );
        let request = format!(
            "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        writer
            .write_all(request.as_bytes())
            .map_err(|e| format!("send: {e}"))?;
        let (status, answer) = read_response(&mut reader)?;
        if status != 200 || !answer.contains("\"result\"") {
            errors += 1;
        }
    }
}

/// Status and body of one response with a `Content-Length` (what JSON-RPC answers carry).
fn read_response(reader: &mut BufReader<TcpStream>) -> Result<(u16, String), String> {
    let mut line = String::new();
    let mut status = 0;
    let mut length = None;
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .map_err(|e| format!("receive: {e}"))?;
        if read == 0 {
            return Err("the server closed the connection".into());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if status == 0 {
            status = header
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        } else if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let length = length.ok_or("a response without Content-Length")?;
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("receive: {e}"))?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
