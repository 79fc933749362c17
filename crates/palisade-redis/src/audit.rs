//! The deployment audit: does a set of Redis nodes meet Redlock's assumptions?
//!
//! Redlock's majority only means something if the nodes fail independently: five
//! "nodes" that are one master and its replicas, or five processes on one host,
//! are one failure domain. And a node restarted without fsync-on-every-write
//! persistence may have forgotten locks it granted, so it must stay out of the
//! majority for the longest TTL ("delay restarts"). The audit asks every node and
//! reports:
//!
//! | finding | severity | why |
//! |---|---|---|
//! | `unreachable` | violation | cannot be verified |
//! | `duplicate_server` | violation | two URLs, one server (same `run_id`) |
//! | `replica` | violation | a replica is not an independent master |
//! | `replicates_within_set` | violation | a master's replica is also in the set |
//! | `has_replicas` | violation | a failover to an async replica can lose locks (the `redlock-replica-failover` drill: two holders) |
//! | `shared_host` | violation | several nodes on one host: one failure domain |
//! | `no_fsync` | warning | a restart loses recent locks |
//! | `short_uptime` | warning | restarted more recently than the longest TTL |
//!
//! Hosts are compared by resolved IP address; every loopback address is the same
//! host. Two different addresses may still be one machine, which no query can show.

use std::net::IpAddr;
use std::time::Duration;

use palisade_core::InputError;
use serde::Serialize;

use crate::error::RedisLockError;
use crate::node::{Node, info_field};

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The set does not meet the independence assumption.
    Violation,
    /// The set may meet it, but something weakens the lock.
    Warning,
}

/// What one node said about itself.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeReport {
    /// The node URL, password removed.
    pub url: String,
    /// Whether it answered.
    pub reachable: bool,
    /// Why it did not, if it did not.
    pub error: Option<String>,
    /// The host it resolves to (an IP address, or `loopback`).
    pub host: Option<String>,
    /// Its port.
    pub port: Option<u16>,
    /// `master` or `slave`, from `INFO replication`.
    pub role: Option<String>,
    /// The server's run id: distinct for every server process.
    pub run_id: Option<String>,
    /// The server's version.
    pub redis_version: Option<String>,
    /// For a replica, the `HOST:PORT` of its master.
    pub master: Option<String>,
    /// For a master, the `HOST:PORT` of each connected replica.
    pub replicas: Vec<String>,
    /// `CONFIG GET appendonly`.
    pub appendonly: Option<String>,
    /// `CONFIG GET appendfsync`.
    pub appendfsync: Option<String>,
    /// Seconds since the server started.
    pub uptime_s: Option<u64>,
}

/// One problem found in the set.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// How serious it is.
    pub severity: Severity,
    /// A stable identifier (see the module docs).
    pub kind: &'static str,
    /// The URLs concerned.
    pub nodes: Vec<String>,
    /// A sentence for humans.
    pub message: String,
}

/// The whole audit.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    /// One entry per URL, in the order given.
    pub nodes: Vec<NodeReport>,
    /// Everything found, violations first.
    pub findings: Vec<Finding>,
    /// True when no finding is a violation.
    pub independent: bool,
    /// The longest TTL the uptime was compared with, in milliseconds.
    pub max_ttl_ms: Option<u64>,
}

/// Asks every node about itself, concurrently, each within `timeout`, and checks
/// the set. `max_ttl`: the longest lease the set is used for, to compare uptimes
/// with.
///
/// # Errors
/// [`RedisLockError::InvalidInput`] for no URLs or a malformed one. Unreachable
/// nodes are findings, not errors.
pub async fn audit<S: AsRef<str>>(
    urls: &[S],
    max_ttl: Option<Duration>,
    timeout: Duration,
) -> Result<AuditReport, RedisLockError> {
    if urls.is_empty() {
        return Err(InputError::Invalid("no redis nodes given".into()).into());
    }
    let nodes = urls
        .iter()
        .map(|u| Node::new(u.as_ref(), None).map(|n| (u.as_ref().to_owned(), n)))
        .collect::<Result<Vec<_>, _>>()?;
    let reports =
        futures_util::future::join_all(nodes.iter().map(|(url, node)| inspect(url, node, timeout)))
            .await;
    let mut findings = check(&reports, max_ttl);
    findings.sort_by_key(|f| f.severity != Severity::Violation);
    Ok(AuditReport {
        independent: findings.iter().all(|f| f.severity != Severity::Violation),
        nodes: reports,
        findings,
        max_ttl_ms: max_ttl.map(|d| d.as_millis() as u64),
    })
}

async fn inspect(url: &str, node: &Node, timeout: Duration) -> NodeReport {
    let mut report = NodeReport {
        url: node.display.clone(),
        ..NodeReport::default()
    };
    if let Ok(parsed) = url::Url::parse(url) {
        let port = parsed.port().unwrap_or(6379);
        report.port = Some(port);
        if let Some(host) = parsed.host_str() {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if let Ok(mut addrs) = tokio::net::lookup_host((host, port)).await {
                report.host = addrs.next().map(|a| host_key(a.ip()));
            }
        }
    }
    let result = tokio::time::timeout(timeout, async {
        let mut c = node.connection(timeout).await?;
        let server: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
        let replication: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c)
            .await?;
        let appendonly: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut c)
            .await;
        let appendfsync: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async(&mut c)
            .await;
        redis::RedisResult::Ok((server, replication, appendonly, appendfsync))
    })
    .await;
    match result {
        Err(_) => report.error = Some(format!("no answer within {timeout:?}")),
        Ok(Err(e)) => report.error = Some(e.to_string()),
        Ok(Ok((server, replication, appendonly, appendfsync))) => {
            report.reachable = true;
            report.run_id = info_field(&server, "run_id").map(str::to_owned);
            report.redis_version = info_field(&server, "redis_version").map(str::to_owned);
            report.uptime_s = info_field(&server, "uptime_in_seconds").and_then(|v| v.parse().ok());
            report.role = info_field(&replication, "role").map(str::to_owned);
            if let (Some(h), Some(p)) = (
                info_field(&replication, "master_host"),
                info_field(&replication, "master_port"),
            ) {
                report.master = Some(format!("{h}:{p}"));
            }
            report.replicas = replica_addrs(&replication);
            // CONFIG may be renamed or disabled; then the setting is unknown.
            report.appendonly = appendonly.ok().and_then(|v| v.get(1).cloned());
            report.appendfsync = appendfsync.ok().and_then(|v| v.get(1).cloned());
        }
    }
    report
}

/// Every loopback address is this machine; other addresses stand for themselves.
fn host_key(ip: IpAddr) -> String {
    if ip.is_loopback() {
        "loopback".to_owned()
    } else {
        ip.to_string()
    }
}

/// `slaveN:ip=…,port=…,…` lines of `INFO replication`, as `IP:PORT`.
fn replica_addrs(replication: &str) -> Vec<String> {
    replication
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains("ip="))
        .filter_map(|l| {
            let fields = l.split_once(':')?.1;
            let get = |k: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            };
            Some(format!("{}:{}", get("ip")?, get("port")?))
        })
        .collect()
}

/// The node in the set at `HOST:PORT`, comparing hosts as [`host_key`] does.
fn find_node<'a>(reports: &'a [NodeReport], addr: &str) -> Option<&'a NodeReport> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let key = host.parse::<IpAddr>().map(host_key).unwrap_or_else(|_| {
        if host == "localhost" {
            "loopback".into()
        } else {
            host.into()
        }
    });
    reports
        .iter()
        .find(|r| r.port == Some(port) && r.host.as_deref() == Some(key.as_str()))
}

fn check(reports: &[NodeReport], max_ttl: Option<Duration>) -> Vec<Finding> {
    let mut f = Findings::default();
    for r in reports.iter().filter(|r| !r.reachable) {
        unreachable(&mut f, r);
    }
    let live: Vec<&NodeReport> = reports.iter().filter(|r| r.reachable).collect();
    duplicates(&mut f, &live);
    for r in &live {
        replication(&mut f, r, reports);
    }
    shared_hosts(&mut f, &live);
    for r in &live {
        durability(&mut f, r, max_ttl);
    }
    f.0
}

/// The findings of one audit, in the order they were found.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn add(
        &mut self,
        severity: Severity,
        kind: &'static str,
        nodes: &[&NodeReport],
        message: String,
    ) {
        self.0.push(Finding {
            severity,
            kind,
            nodes: nodes.iter().map(|n| n.url.clone()).collect(),
            message,
        });
    }
}

/// A node that could not be asked counts against the set.
fn unreachable(f: &mut Findings, r: &NodeReport) {
    let why = r.error.as_deref().unwrap_or("unknown error");
    f.add(
        Severity::Violation,
        "unreachable",
        &[r],
        format!("{} could not be asked: {why}", r.url),
    );
}

/// Two URLs that reach the same server (same `run_id`) are one node, not two.
fn duplicates(f: &mut Findings, live: &[&NodeReport]) {
    for (i, a) in live.iter().enumerate() {
        if let Some(b) = live[..i]
            .iter()
            .find(|b| b.run_id.is_some() && b.run_id == a.run_id)
        {
            f.add(
                Severity::Violation,
                "duplicate_server",
                &[*b, *a],
                format!(
                    "{} and {} are the same server (run_id {})",
                    b.url,
                    a.url,
                    a.run_id.as_deref().unwrap_or("")
                ),
            );
        }
    }
}

/// Redlock assumes independent masters without replication.
fn replication(f: &mut Findings, r: &NodeReport, reports: &[NodeReport]) {
    if r.role.as_deref() == Some("slave") {
        let master = r.master.clone().unwrap_or_default();
        let in_set =
            find_node(reports, &master).map(|m| format!(", which is {} in this set", m.url));
        f.add(
            Severity::Violation,
            "replica",
            &[r],
            format!(
                "{} is a replica of {master}{}: not an independent master",
                r.url,
                in_set.unwrap_or_default()
            ),
        );
    }
    if !r.replicas.is_empty() {
        let inside: Vec<&NodeReport> = r
            .replicas
            .iter()
            .filter_map(|a| find_node(reports, a))
            .collect();
        if inside.is_empty() {
            // Not only a risk: the replica can be promoted (by Sentinel or
            // by hand) without the key, and then two clients hold the lock
            // (`palisade chaos redlock-replica-failover`). Redlock assumes
            // masters without replication.
            f.add(
                Severity::Violation,
                "has_replicas",
                &[r],
                format!(
                    "{} has replicas ({}): a failover to an asynchronous replica can lose locks",
                    r.url,
                    r.replicas.join(", ")
                ),
            );
        } else {
            let mut nodes = vec![r];
            nodes.extend(inside.iter().copied());
            f.add(
                Severity::Violation,
                "replicates_within_set",
                &nodes,
                format!(
                    "{} replicates to {}: master and replica share one fate",
                    r.url,
                    inside
                        .iter()
                        .map(|n| n.url.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
}

/// Nodes on one host share one failure domain.
fn shared_hosts(f: &mut Findings, live: &[&NodeReport]) {
    let mut hosts: Vec<&str> = live.iter().filter_map(|r| r.host.as_deref()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    for host in hosts {
        let on_host: Vec<&NodeReport> = live
            .iter()
            .copied()
            .filter(|r| r.host.as_deref() == Some(host))
            .collect();
        if on_host.len() > 1 {
            f.add(
                Severity::Violation,
                "shared_host",
                &on_host,
                format!(
                    "{} nodes run on one host ({host}): one failure domain",
                    on_host.len()
                ),
            );
        }
    }
}

/// A node that may forget a granted lock on restart (no fsync per write, or
/// restarted within the longest TTL).
fn durability(f: &mut Findings, r: &NodeReport, max_ttl: Option<Duration>) {
    let fsync_every_write =
        r.appendonly.as_deref() == Some("yes") && r.appendfsync.as_deref() == Some("always");
    if !fsync_every_write {
        f.add(
            Severity::Warning,
            "no_fsync",
            &[r],
            format!(
                "{} does not fsync every write (appendonly={}, appendfsync={}): a restart can forget granted locks; delay its restarts by the longest TTL",
                r.url,
                r.appendonly.as_deref().unwrap_or("unknown"),
                r.appendfsync.as_deref().unwrap_or("unknown")
            ),
        );
    }
    // `uptime_in_seconds` may overstate the real uptime by up to a second
    // (whole seconds of two truncated wall-clock readings).
    if let (Some(max), Some(up)) = (max_ttl, r.uptime_s)
        && Duration::from_secs(up.saturating_sub(1)) < max
    {
        f.add(
            Severity::Warning,
            "short_uptime",
            &[r],
            format!(
                "{} has been up {up} s, less than the longest TTL ({:.1} s): it may have forgotten locks after a restart",
                r.url,
                max.as_secs_f64()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replica_lines() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=6380,state=online,offset=1,lag=0\r\nslave1:ip=10.0.0.2,port=6379,state=online,offset=1,lag=1\r\n";
        assert_eq!(replica_addrs(info), ["127.0.0.1:6380", "10.0.0.2:6379"]);
    }
}
