//! Real servers for tests, benchmarks and fault drills: each started on a loopback
//! port it chose, in its own temporary directory, and stopped when dropped.
//!
//! No mocks: a test that needs Redis gets a real `redis-server` process. The
//! binaries come from `PATH` (Debian's packages), or from the environment variable
//! named by each server type.

pub mod clock;
mod cpu;
mod etcd;
mod fence_store;
mod palisade;
mod postgres;
mod prometheus;
mod redis;
pub mod servers;
mod silent;
mod zookeeper;

pub use cpu::cpu_time;
pub use etcd::{EtcdCluster, EtcdMember};
pub use fence_store::FenceStoreProcess;
pub use palisade::{PalisadeNode, colocated_worker_threads};
pub use postgres::PostgresServer;
pub use prometheus::PrometheusServer;
pub use redis::RedisServer;
pub use servers::{Launch, Launcher, PalisadeCluster, Servers};
pub use silent::SilentServer;
pub use zookeeper::ZooKeeperEnsemble;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago. Servers that fail to bind it are
/// retried on another (see the callers), which closes the race.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `n` distinct loopback ports that were free a moment ago: held all at once
/// while they are picked, so that one call never returns the same port twice
/// (two separate [`free_port`] calls may).
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Polls `ready` every 20 ms until it returns true or `limit` passes.
pub(crate) fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `GET path` from the HTTP server at `addr` (HTTP/1.1, one connection, no
/// client library): the status code and the body.
///
/// # Errors
/// When the server cannot be reached or its answer is not HTTP.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let bad = || {
        std::io::Error::other(format!(
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&answer)
        ))
    };
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(bad)?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let body = &answer[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The body of a chunked transfer: each chunk is `SIZE-IN-HEX\r\nDATA\r\n`.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let tail = &rest[eol + 2..];
        match size {
            Some(size) if size > 0 && tail.len() >= size => {
                body.extend_from_slice(&tail[..size]);
                rest = tail[size..].strip_prefix(b"\r\n").unwrap_or(&tail[size..]);
            }
            _ => break,
        }
    }
    body
}

/// A loopback socket address for `port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
