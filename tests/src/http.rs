//! HTTP on the loopback: a minimal GET client for stall's web server and
//! exporter, and a real Prometheus to scrape it and answer queries.

use crate::{
    procs::{wait_until, Killer},
    scratch::Scratch,
};
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

/// A TCP port free on the loopback now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The body of a GET on the loopback, if it answered 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Decode a chunked body (axum streams it so).
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(tail.get(..n)?);
            rest = tail.get(n + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_string())
}

/// `q` percent-encoded for a URL's query.
pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A scalar from Prometheus's instant query API, if the query has a result.
pub fn query(port: u16, q: &str) -> Option<f64> {
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let r = v["data"]["result"].as_array()?.first()?.clone();
    r["value"][1].as_str()?.parse().ok()
}

/// A real Prometheus (Debian's, which `cargo xtask test` installs) on a free
/// loopback port, with `config` (YAML) and its data in `dir`; returns it once
/// it is ready, and its port.
pub fn start_prometheus(dir: &Scratch, config: &str) -> (Child, u16) {
    let prometheus = Path::new("/usr/bin/prometheus");
    assert!(prometheus.exists(), "Debian's prometheus is needed (cargo xtask test installs it)");
    let path = dir.path("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    let port = free_port();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", path.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ended if it never gets ready.
    let mut started = Killer(vec![child]);
    wait_until("prometheus", Duration::from_secs(30), || http_get(port, "/-/ready").is_some());
    (started.0.pop().expect("the child"), port)
}
