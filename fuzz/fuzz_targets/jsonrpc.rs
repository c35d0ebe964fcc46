//! JSON-RPC envelopes and params, as raw bodies POSTed to the endpoint (v1.0 and v0.3).
#![no_main]

mod common;

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the protocol version header, the rest is the body.
    let (version, body) = match data.split_first() {
        Some((v, rest)) => (*v, rest),
        None => (0, data),
    };
    let mut request = Request::post("/").header("content-type", "application/json");
    match version % 3 {
        0 => request = request.header("A2A-Version", "1.0"),
        1 => request = request.header("A2A-Version", "0.3"),
        _ => {}
    }
    common::send(request.body(Body::from(body.to_vec())).expect("a request"));
});
