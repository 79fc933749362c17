//! Helpers shared by the Redis integration tests: real servers, direct inspection.

#![allow(dead_code)]

use std::time::Duration;

use palisade_redis::{AcquireOptions, Redlock, RedlockConfig};
use palisade_testkit::RedisServer;

/// `n` real redis-servers without persistence.
pub fn servers(n: usize) -> Vec<RedisServer> {
    (0..n)
        .map(|_| {
            RedisServer::start().expect("redis-server must be installed (scripts/test installs it)")
        })
        .collect()
}

pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// No retries, so each test sees exactly one round of the algorithm. The node
/// timeout is generous: a loaded machine must not turn a live node into a
/// timed-out one.
pub fn one_shot() -> RedlockConfig {
    RedlockConfig {
        retry_count: 0,
        node_timeout: Some(Duration::from_secs(2)),
        ..RedlockConfig::default()
    }
}

pub fn manager(urls: &[String]) -> Redlock {
    Redlock::new(urls, one_shot()).unwrap()
}

pub fn opts(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions::new(Duration::from_millis(ttl_ms))
}

/// A direct connection to one node, to look at keys behind the lock's back.
pub async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub async fn get(url: &str, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn(url).await)
        .await
        .unwrap()
}

pub async fn pttl(url: &str, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn(url).await)
        .await
        .unwrap()
}

pub async fn set(url: &str, key: &str, value: &str, px_ms: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(px_ms)
        .query_async(&mut conn(url).await)
        .await
        .unwrap();
}

/// How many of the urls hold `key`.
pub async fn holders(urls: &[String], key: &str) -> usize {
    let mut n = 0;
    for u in urls {
        if get(u, key).await.is_some() {
            n += 1;
        }
    }
    n
}
