//! A plain HTTP/1.1 client for tests and benches that talk to a running `lake serve`.

use std::{
    io::{Read, Write},
    net::TcpStream,
};

/// A response: status, head (status line and headers, lower-cased), body (chunked bodies
/// decoded) and how a chunked body ended.
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Status line and headers, lower-cased.
    pub head: String,
    /// The body, up to where it ended or broke off.
    pub body: Vec<u8>,
    /// For a chunked body, the trailer section after its last chunk (lower-cased, empty when
    /// it has none); `None` when the body broke off before its last chunk.
    pub trailers: Option<String>,
}

/// One request on a fresh connection (`Connection: close`) to `addr` (`host:port`).
///
/// # Panics
/// When the server cannot be reached or the answer is not HTTP.
pub fn http_request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send");
    stream.write_all(body).expect("send body");
    let mut raw = Vec::new();
    // (A body that breaks off may end in a reset: what came before it is the answer.)
    let _ = stream.read_to_end(&mut raw);
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("headers end") + 4;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head.split_whitespace().nth(1).expect("status").parse().expect("number");
    if head.contains("transfer-encoding: chunked") {
        let (body, trailers) = dechunk(&raw[split..]);
        return HttpResponse { status, head, body, trailers };
    }
    HttpResponse { status, head, body: raw[split..].to_vec(), trailers: Some(String::new()) }
}

/// A chunked HTTP/1.1 body decoded up to where it ends or breaks off, and the trailer section
/// after its last chunk (lower-cased; `None` when it broke off before it).
///
/// # Panics
/// When a chunk's size line is not hexadecimal.
pub fn dechunk(mut rest: &[u8]) -> (Vec<u8>, Option<String>) {
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).expect("hex").trim(), 16).expect("chunk size");
        let chunk = &rest[eol + 2..];
        if size == 0 {
            return (body, Some(String::from_utf8_lossy(chunk).to_lowercase()));
        }
        body.extend_from_slice(&chunk[..size.min(chunk.len())]);
        if chunk.len() < size + 2 {
            break;
        }
        rest = &chunk[size + 2..];
    }
    (body, None)
}

/// The samples of a Prometheus text exposition (`GET /metrics`) without labels, by name.
pub fn prometheus_values(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}
