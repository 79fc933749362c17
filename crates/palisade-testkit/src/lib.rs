//! Real servers for tests, benchmarks and fault drills: each started on a loopback
//! port it chose, in its own temporary directory, and stopped when dropped.
//!
//! No mocks: a test that needs Redis gets a real `redis-server` process. The
//! binaries come from `PATH` (Debian's packages), or from the environment variable
//! named by each server type.

pub mod clock;
mod etcd;
mod palisade;
mod postgres;
mod redis;
mod silent;
mod zookeeper;

pub use etcd::{EtcdCluster, EtcdMember};
pub use palisade::PalisadeNode;
pub use postgres::PostgresServer;
pub use redis::RedisServer;
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

/// A loopback socket address for `port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
