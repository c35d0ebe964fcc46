//! A minimal HTTP/1.1 client on `std::net`, for the few requests the harness makes itself:
//! probes before a load, the task GetTask reads, and the cold-start poll. One connection per
//! request (`Connection: close`), so the body ends where the stream does; chunked bodies
//! (streams) are decoded. Loads are wrk's job, not this.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response: its status code and its body, as text.
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// `GET path` on 127.0.0.1:`port`.
pub fn get(port: u16, path: &str, timeout: Duration) -> std::io::Result<Response> {
    exchange(port, &format!("GET {path} HTTP/1.1\r\n"), "", timeout)
}

/// `POST /` of a JSON-RPC body on 127.0.0.1:`port`, as an A2A v1.0 client sends it.
pub fn post_json(port: u16, body: &str, timeout: Duration) -> std::io::Result<Response> {
    let head = format!(
        "POST / HTTP/1.1\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n",
        body.len()
    );
    exchange(port, &head, body, timeout)
}

fn exchange(port: u16, head: &str, body: &str, timeout: Duration) -> std::io::Result<Response> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!("{head}Host: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n{body}");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse(&raw).ok_or_else(|| std::io::Error::other("not an HTTP/1.1 response"))
}

/// Status and body of a whole response.
fn parse(raw: &[u8]) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let payload = &raw[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(payload)
    } else {
        payload.to_vec()
    };
    Some(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The data of a chunked body (as much of it as is well-formed).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_line = String::from_utf8_lossy(&raw[..line_end]);
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_hex, 16) else {
            break;
        };
        let data = &raw[line_end + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        raw = data[size..].strip_prefix(b"\r\n").unwrap_or(&data[size..]);
    }
    out
}
