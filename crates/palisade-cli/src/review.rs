//! `palisade review`: the design-review record of a lock as a team deploys it —
//! the facts the second source document asks every team to write down before
//! relying on a lock (what the lease is measured on, whether grants carry a
//! fencing token and whether the resource checks it, the independence of the
//! nodes, the longest pause tolerated, the drills' results), gathered from the
//! running systems where they can be asked, and a verdict by the need.
//!
//! A fact that could not be had (an unreachable backend or resource, a missing
//! drill report) is written down as such; the record is written all the same.

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_chaos::Summary;

/// What the lock is for: the consequence of a double holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A double holder costs duplicated work.
    Efficiency,
    /// A double holder corrupts state.
    Correctness,
}

/// What to review.
#[derive(Debug, Clone)]
pub struct ReviewInput {
    /// The lock's name, as the team uses it.
    pub lock: String,
    /// The backend by URL: `palisade://…`, `etcd://…`, `zk://…`,
    /// `postgres://…`, or `redis://HOST:PORT[,redis://…]` (several: Redlock).
    pub backend: String,
    /// The resource the lock protects: a fence store's `http(s)://HOST:PORT`,
    /// or `none` for one that checks no token; `None`: not stated.
    pub resource: Option<String>,
    /// The CA (PEM) that signed an `https://` resource's certificate: the only
    /// one trusted when asking it.
    pub resource_ca: Option<PathBuf>,
    /// TLS for a `palisade://` backend, as `palisade lock` takes it; `None`:
    /// plaintext.
    pub cluster_tls: Option<palisade_client::TlsOptions>,
    /// A bearer token for a `palisade://` backend (only over TLS).
    pub cluster_token: Option<String>,
    /// The lease length the team uses.
    pub ttl: Duration,
    /// How long the work under the lock takes.
    pub work: Option<Duration>,
    /// A `palisade chaos --out` directory (or its `summary.jsonl`).
    pub drills: Option<PathBuf>,
    /// The need.
    pub need: Need,
}

/// The record and its verdict.
#[derive(Debug, Clone)]
pub struct Review {
    /// The Markdown record.
    pub markdown: String,
    /// Why the set-up does not meet the need; empty when it does.
    pub failures: Vec<String>,
    /// Facts that could not be had.
    pub unknown: Vec<String>,
}

struct BackendFacts {
    name: &'static str,
    /// The chaos drills' name for it.
    drill_name: &'static str,
    lease_on: &'static str,
    token: Option<&'static str>,
    clocks: &'static str,
    /// What `palisade review` can ask of the running deployment.
    deployment: Deployment,
}

/// Whose deployment `palisade review` knows how to question.
enum Deployment {
    /// Each Redis node's role, replicas, host, persistence and uptime.
    Redis,
    /// The Palisade cluster's members, leader and health.
    Palisade,
    /// Not asked: the backend's own tools know its members.
    NotAsked,
}

/// A correctness backend's facts from its descriptor; Redis and Redlock
/// (efficiency locks, outside the registry) by what `nodes` says.
fn facts(scheme: &str, nodes: usize) -> Option<BackendFacts> {
    if scheme == "redis" {
        return Some(BackendFacts {
            name: if nodes > 1 {
                "Redlock (independent Redis masters)"
            } else {
                "Redis (single instance)"
            },
            drill_name: if nodes > 1 { "redlock" } else { "redis" },
            lease_on: "each Redis server's wall clock (the key's PX expiry); the client's validity on its monotonic clock, minus a drift allowance",
            token: None,
            clocks: "yes: bounded clock drift, pauses and network delays are assumed",
            deployment: Deployment::Redis,
        });
    }
    let backend = crate::backends::by_scheme(scheme)?;
    let f = backend.facts;
    Some(BackendFacts {
        name: f.title,
        drill_name: backend.name,
        lease_on: f.lease_on,
        token: Some(f.token),
        clocks: f.clocks,
        deployment: if std::ptr::eq(backend, &palisade_client::DESCRIPTOR) {
            Deployment::Palisade
        } else {
            Deployment::NotAsked
        },
    })
}

/// Builds the record, asking the backend, the resource and the drill report.
pub async fn review(input: &ReviewInput) -> Review {
    let mut failures = Vec::new();
    let mut unknown = Vec::new();
    let mut md = String::new();
    let (scheme, rest) = input
        .backend
        .split_once("://")
        .unwrap_or((input.backend.as_str(), ""));
    let redis_nodes = redis_nodes(input, scheme);
    let need = match input.need {
        Need::Efficiency => "efficiency (a double holder costs duplicated work)",
        Need::Correctness => "correctness (a double holder corrupts state)",
    };
    md.push_str(&format!(
        "# Design review: lock `{}`\n\nNeed: **{need}**. Backend: `{}`.\n\n",
        input.lock,
        redact(&input.backend)
    ));
    let Some(f) = facts(scheme, redis_nodes.len()) else {
        failures.push(format!("unknown backend scheme {scheme:?}"));
        md.push_str(&verdict(&failures, &unknown));
        return Review {
            markdown: md,
            failures,
            unknown,
        };
    };

    md.push_str(&lock_table(&f, input));

    // Deployment: asked of the running systems.
    md.push_str("## Deployment\n\n");
    match f.deployment {
        Deployment::Redis => {
            redis_facts(&redis_nodes, input, &mut md, &mut failures, &mut unknown).await;
        }
        Deployment::Palisade => palisade_facts(rest, input, &mut md, &mut unknown).await,
        Deployment::NotAsked => md.push_str(&format!(
            "Not asked: `palisade review` does not query the deployment of {}; check its \
             members and their health with its own tools.\n\n",
            f.name
        )),
    }

    // The resource.
    md.push_str("## The resource\n\n");
    let fenced = resource_facts(input, &mut md, &mut unknown).await;

    // The drills.
    md.push_str("## Fault drills\n\n");
    drill_facts(
        input.drills.as_deref(),
        f.drill_name,
        &mut md,
        &mut failures,
        &mut unknown,
    );

    if input.need == Need::Correctness {
        failures.extend(correctness_failures(&f, fenced));
    }
    md.push_str(INVARIANTS);
    md.push_str(&verdict(&failures, &unknown));
    Review {
        markdown: md,
        failures,
        unknown,
    }
}

/// The URLs of a `redis://` backend's nodes (several: Redlock); empty for any
/// other scheme.
fn redis_nodes(input: &ReviewInput, scheme: &str) -> Vec<String> {
    if scheme != "redis" {
        return Vec::new();
    }
    input
        .backend
        .split(',')
        .map(|u| {
            if u.contains("://") {
                u.to_owned()
            } else {
                format!("redis://{u}")
            }
        })
        .collect()
}

/// The section on the lock itself: what its lease is measured on, its token,
/// its clocks, and what the TTL gives.
fn lock_table(f: &BackendFacts, input: &ReviewInput) -> String {
    let mut md = String::from("## The lock\n\n| fact | value |\n|---|---|\n");
    md.push_str(&format!("| backend | {} |\n", f.name));
    md.push_str(&format!("| lease measured on | {} |\n", f.lease_on));
    md.push_str(&format!(
        "| fencing token | {} |\n",
        f.token
            .unwrap_or("**none**: the resource cannot tell a stale holder's write")
    ));
    md.push_str(&format!("| safety depends on clocks | {} |\n", f.clocks));
    let margin = palisade_core::guarantee::Guarantee::margin_for(input.ttl);
    md.push_str(&format!("| TTL | {} |\n", secs(input.ttl)));
    if f.token.is_some() {
        // Keep-alives every quarter TTL: the worst pause starts just before one.
        let pause = (input.ttl * 3 / 4).saturating_sub(margin);
        md.push_str(&format!(
            "| guarantee per keep-alive | {} (TTL − margin {}), renewed every {} |\n",
            secs(input.ttl - margin),
            secs(margin),
            secs(input.ttl / 4)
        ));
        md.push_str(&format!(
            "| longest pause the lease survives | {} (a longer one loses the lease; the token still stops the stale write at a fenced resource) |\n",
            secs(pause)
        ));
        if let Some(work) = input.work {
            md.push_str(&format!(
                "| stated work | {}: fits (the lease is renewed while it runs) |\n",
                secs(work)
            ));
        }
    }
    md.push('\n');
    md
}

/// Why a lock with facts `f` in front of a resource that is `fenced` (or not
/// known to be) does not serve correctness.
fn correctness_failures(f: &BackendFacts, fenced: Option<bool>) -> Vec<String> {
    let mut failures = Vec::new();
    if f.token.is_none() {
        failures.push(format!(
            "{} issues no fencing token: a holder that pauses past its lease, or a \
             delayed write, corrupts the resource — use a correctness lock (palisade, \
             etcd, zk, postgres) and a resource that checks its token",
            f.name
        ));
    }
    match fenced {
        Some(true) => {}
        Some(false) => failures.push(
            "the resource does not check fencing tokens: a stale holder's write is accepted".into(),
        ),
        None => failures.push(
            "the resource's fencing could not be confirmed (name a fence store with --resource)"
                .into(),
        ),
    }
    failures
}

/// What every record says of the guarantees and the drills' fault model.
const INVARIANTS: &str = concat!(
    "## Invariants and fault model\n\n",
    "- At most one holder *believes* it holds the lock only while pauses, network delays and clock drift stay within the lease; beyond that, only a fencing token checked by the resource keeps writes ordered.\n\
     - Fault model of the drills: process pauses (SIGSTOP), `kill -9`, partitions and delays through a fault proxy, clock jumps, a replica promoted in a master's place.\n\
     - Fencing tokens only grow per lock; the resource must refuse any token lower than the highest it has accepted.\n\n"
);

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// A URL without its password (`user:secret@` → `user:***@`).
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

fn verdict(failures: &[String], unknown: &[String]) -> String {
    let mut md = String::from("## Verdict\n\n");
    if failures.is_empty() {
        md.push_str("**Meets the need.**\n");
    } else {
        md.push_str("**Does not meet the need:**\n\n");
        for f in failures {
            md.push_str(&format!("- {f}\n"));
        }
    }
    if !unknown.is_empty() {
        md.push_str("\nFacts that could not be had:\n\n");
        for u in unknown {
            md.push_str(&format!("- {u}\n"));
        }
    }
    md
}

async fn redis_facts(
    nodes: &[String],
    input: &ReviewInput,
    md: &mut String,
    failures: &mut Vec<String>,
    unknown: &mut Vec<String>,
) {
    match palisade_redis::audit::audit(nodes, Some(input.ttl), Duration::from_secs(2)).await {
        Err(e) => unknown.push(format!("the Redis deployment audit: {e}")),
        Ok(report) => {
            md.push_str("`palisade redis audit`:\n\n| node | reachable | role | replicas | appendfsync |\n|---|---|---|---|---|\n");
            for n in &report.nodes {
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {} |\n",
                    n.url,
                    n.reachable,
                    n.role.as_deref().unwrap_or("–"),
                    n.replicas.len(),
                    n.appendfsync.as_deref().unwrap_or("–")
                ));
                if !n.reachable {
                    unknown.push(format!(
                        "{}: {}",
                        n.url,
                        n.error.as_deref().unwrap_or("unreachable")
                    ));
                }
            }
            md.push('\n');
            for finding in &report.findings {
                md.push_str(&format!("- {:?}: {}\n", finding.severity, finding.message));
                if finding.severity == palisade_redis::audit::Severity::Violation {
                    failures.push(format!("Redis audit: {}", finding.message));
                }
            }
            md.push('\n');
        }
    }
    // The validity budget: one real acquire shows what acquiring costs here.
    let manager =
        match palisade_redis::Redlock::new(nodes, palisade_redis::RedlockConfig::default()) {
            Ok(m) => m,
            Err(e) => {
                unknown.push(format!("the validity budget: {e}"));
                return;
            }
        };
    let options = palisade_redis::AcquireOptions::new(input.ttl);
    let started = std::time::Instant::now();
    // A key of its own per run: a probe left behind by another review (its
    // release lost, the key alive until its TTL) must not refuse this one.
    let probe = format!("palisade-review-probe-{:016x}", rand::random::<u64>());
    match manager.acquire(&probe, &options).await {
        Err(e) => unknown.push(format!("the validity budget (a probe acquire): {e}")),
        Ok(guard) => {
            let acquire = started.elapsed();
            let validity = guard.remaining();
            // This process exits soon: every node must have the delete.
            let _ = guard.release_everywhere().await;
            md.push_str(&format!(
                "Validity budget: TTL {} − acquire {} (measured) − drift {} ≈ {} usable per grant.\n",
                secs(input.ttl),
                secs(acquire),
                secs(palisade_redis::budget::default_drift(input.ttl)),
                secs(validity)
            ));
            if let Some(work) = input.work {
                if work > validity {
                    failures.push(format!(
                        "the stated work ({}) does not fit the validity of a grant ({})",
                        secs(work),
                        secs(validity)
                    ));
                } else {
                    md.push_str(&format!("The stated work ({}) fits.\n", secs(work)));
                }
            }
            md.push('\n');
        }
    }
}

async fn palisade_facts(
    rest: &str,
    input: &ReviewInput,
    md: &mut String,
    unknown: &mut Vec<String>,
) {
    let endpoints: Vec<String> = rest
        .trim_end_matches('/')
        .split(',')
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    let mut config = palisade_client::ClientConfig::new(endpoints);
    config.retry_for = Duration::from_secs(3);
    config.tls.clone_from(&input.cluster_tls);
    config.bearer_token.clone_from(&input.cluster_token);
    let status = match palisade_client::Admin::new(&config) {
        Ok(admin) => admin.status().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match status {
        Ok(s) => md.push_str(&format!(
            "Cluster: {} voting member(s), leader {}, term {}, commit index {}. A majority must stay up and connected for grants; tokens never repeat across crashes of any or all nodes.\n\n",
            s.members.len(),
            s.leader.map_or("none".into(), |l| format!("node {l}")),
            s.term,
            s.commit_index
        )),
        Err(e) => unknown.push(format!("the cluster's status: {e}")),
    }
}

/// Whether the resource checks tokens: `Some(true)` for a fence store with
/// fencing on, `Some(false)` for `none` or fencing off, `None` when unknown.
async fn resource_facts(
    input: &ReviewInput,
    md: &mut String,
    unknown: &mut Vec<String>,
) -> Option<bool> {
    use palisade_fence::client::{StoreAddr, fencing_on};
    let url = match input.resource.as_deref() {
        None => {
            md.push_str("Not stated (`--resource`).\n\n");
            unknown.push("whether the resource checks fencing tokens (no --resource)".into());
            return None;
        }
        Some("none") => {
            md.push_str("Stated: the resource checks **no** fencing token.\n\n");
            return Some(false);
        }
        Some(url) => url,
    };
    let https = url.strip_prefix("https://");
    let addr = https
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url)
        .trim_end_matches('/');
    let store = match (https, input.resource_ca.as_deref()) {
        (None, _) => Ok(StoreAddr::plain(addr)),
        (Some(_), Some(ca)) => StoreAddr::tls(addr, ca).map_err(|e| e.to_string()),
        (Some(_), None) => {
            Err("it speaks HTTPS: give the CA that signed its certificate (--resource-ca)".into())
        }
    };
    let how = if https.is_some() {
        "over HTTPS, its certificate checked against --resource-ca"
    } else {
        "over plain HTTP"
    };
    match store {
        Ok(store) => match fencing_on(&store).await {
            Ok(fencing) => {
                md.push_str(&format!(
                    "Fence store at `{url}`: fencing **{}** (asked at `/v1/health` {how}).\n\n",
                    if fencing { "on" } else { "off" }
                ));
                Some(fencing)
            }
            Err(e) => {
                md.push_str(&format!("Fence store at `{url}`: could not be asked.\n\n"));
                unknown.push(format!("the resource at {url}: {e}"));
                None
            }
        },
        Err(e) => {
            md.push_str(&format!("Fence store at `{url}`: could not be asked.\n\n"));
            unknown.push(format!("the resource at {url}: {e}"));
            None
        }
    }
}

fn drill_facts(
    drills: Option<&Path>,
    backend: &str,
    md: &mut String,
    failures: &mut Vec<String>,
    unknown: &mut Vec<String>,
) {
    let Some(path) = drills else {
        md.push_str("No drill report given (`--drills DIR`, from `palisade chaos --out DIR`).\n\n");
        unknown.push("the drills' results (no --drills)".into());
        return;
    };
    let file = if path.is_dir() {
        path.join("summary.jsonl")
    } else {
        path.to_owned()
    };
    let rows: Vec<Summary> = match std::fs::read_to_string(&file) {
        Err(e) => {
            md.push_str(&format!(
                "Drill report `{}`: could not be read.\n\n",
                file.display()
            ));
            unknown.push(format!("the drills' results: {}: {e}", file.display()));
            return;
        }
        Ok(text) => text
            .lines()
            .filter_map(Summary::from_json_line)
            .filter(|s| s.backend == backend)
            .collect(),
    };
    if rows.is_empty() {
        md.push_str(&format!(
            "Drill report `{}` has no rows for `{backend}`.\n\n",
            file.display()
        ));
        unknown.push(format!(
            "the drills' results for {backend} (none in the report)"
        ));
        return;
    }
    md.push_str(&format!("From `{}`:\n\n", file.display()));
    md.push_str(&Summary::markdown_table(&rows));
    md.push_str("\n\n");
    for r in rows.iter().filter(|r| r.fencing) {
        if r.stale_writes_accepted > 0 || r.lost_updates > 0 || r.non_monotonic_tokens > 0 {
            failures.push(format!(
                "drill {}{}: {} stale writes accepted, {} lost updates, {} non-monotonic tokens with fencing on",
                r.scenario,
                if r.variant.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.variant)
                },
                r.stale_writes_accepted,
                r.lost_updates,
                r.non_monotonic_tokens
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_written_into_the_record() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/locks"),
            "postgres://app:***@db:5432/locks"
        );
        assert_eq!(redact("palisade://a:1,b:2"), "palisade://a:1,b:2");
    }
}
