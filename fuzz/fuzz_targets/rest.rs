//! REST paths, query strings and bodies: the first line of the input is the path (with an
//! optional query), the first byte chooses the method, the rest is the body.
#![no_main]

mod common;

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((method, rest)) = data.split_first() else {
        return;
    };
    let (path, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    if !path.starts_with('/') {
        return;
    }
    let method = match method % 4 {
        0 => "GET",
        1 => "POST",
        2 => "DELETE",
        _ => "PUT",
    };
    let Ok(request) = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/a2a+json")
        .header("A2A-Version", "1.0")
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    common::send(request);
});
