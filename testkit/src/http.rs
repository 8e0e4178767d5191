//! A plain HTTP/1.1 client for tests and benches that talk to a running `lake serve`.

use std::{
    io::{Read, Write},
    net::TcpStream,
};

/// A response: status, head (status line and headers, lower-cased) and body (chunked bodies
/// decoded).
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Status line and headers, lower-cased.
    pub head: String,
    /// The body.
    pub body: Vec<u8>,
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
    stream.read_to_end(&mut raw).expect("read");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("headers end") + 4;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head.split_whitespace().nth(1).expect("status").parse().expect("number");
    let mut body = raw[split..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let (mut out, mut rest) = (Vec::new(), &body[..]);
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).expect("hex").trim(), 16).expect("chunk size");
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
        body = out;
    }
    HttpResponse { status, head, body }
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
