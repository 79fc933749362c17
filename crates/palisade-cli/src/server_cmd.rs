//! `palisade serve|lock|status|locks|check-token|cluster`: the correctness half.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use palisade_client::{Admin, ClientConfig, ClientError, FencingToken, TlsOptions};
use palisade_core::machine::Claim;
use palisade_core::{LockError, LockOptions, Unreachable};

use crate::backends::{self, BackendUrl, SessionSpec};

use crate::child::{Ended, run_holding, shell_status};
use crate::{duration_arg, exit};

/// The default client port and listen address of `palisade serve`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7420";

/// Where clients find the cluster, and how they prove who they are.
#[derive(Args, Clone)]
pub struct Endpoints {
    /// Cluster nodes, comma-separated HOST:PORT (any of them; the leader is found).
    #[arg(long, value_delimiter = ',', env = "PALISADE_ENDPOINTS", default_value = DEFAULT_ADDR)]
    endpoints: Vec<String>,
    /// The cluster's CA (PEM): speak TLS to the nodes and trust only this CA.
    #[arg(long, env = "PALISADE_CA")]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), to authenticate by certificate.
    #[arg(long, env = "PALISADE_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, env = "PALISADE_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// A file holding a bearer token, to authenticate without a certificate
    /// (sent only over TLS).
    #[arg(long, env = "PALISADE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// How long to keep trying to reach a leader (nodes down, an election in
    /// progress) before giving up.
    #[arg(long, default_value = "5s", value_parser = duration_arg, env = "PALISADE_RETRY_FOR")]
    retry_for: Duration,
}

impl Endpoints {
    /// "waiting for a leader at A, B", for [`with_progress`].
    fn waiting(&self) -> String {
        format!("waiting for a leader at {}", self.endpoints.join(", "))
    }

    /// The client configuration these options describe.
    ///
    /// # Errors
    /// When a file cannot be read, or a certificate or token is given without
    /// the CA (they are never sent in the clear).
    pub fn config(&self) -> Result<ClientConfig, ClientError> {
        let mut config = ClientConfig::new(self.endpoints.clone());
        (config.tls, config.bearer_token) = self.credentials()?;
        config.retry_for = self.retry_for;
        Ok(config)
    }

    /// The TLS options and bearer token these flags describe.
    ///
    /// # Errors
    /// See [`palisade_client::credentials_from_files`].
    pub fn credentials(&self) -> Result<(Option<TlsOptions>, Option<String>), ClientError> {
        palisade_client::credentials_from_files(
            self.ca.as_deref(),
            self.cert.as_deref().zip(self.key.as_deref()),
            self.token_file.as_deref(),
        )
    }
}

/// `palisade serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Read flags from this TOML file, keys named as the long flags
    /// (`data-dir = "/var/lib/palisade"`); flags and PALISADE_* variables win.
    #[arg(long, env = "PALISADE_CONFIG")]
    config: Option<PathBuf>,
    /// This node's id.
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Address to listen on for clients.
    #[arg(long, default_value = DEFAULT_ADDR)]
    listen: SocketAddr,
    /// Address to listen on for peers (Raft traffic only). Default: the client
    /// port + 1.
    #[arg(long)]
    listen_peer: Option<SocketAddr>,
    /// Address clients reach this node at (default: the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// Address peers reach this node at (default: the peer listen address).
    #[arg(long)]
    advertise_peer: Option<String>,
    /// This node's certificate (PEM; `palisade certs init` makes one): TLS on
    /// both listeners, peers authenticated by certificate.
    #[arg(long, env = "PALISADE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "PALISADE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The cluster's CA (PEM): the only issuer of peer and client certificates.
    #[arg(long, env = "PALISADE_TLS_CA", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// The policy file: roles by lock-name prefix, users, bearer tokens. Re-read
    /// on SIGHUP. Without it every authenticated caller may do everything.
    #[arg(long, env = "PALISADE_AUTH", requires = "tls_cert")]
    auth: Option<PathBuf>,
    /// Allow plaintext on a non-loopback address (anyone who reaches the port
    /// could then forge Raft messages and release others' locks).
    #[arg(long)]
    insecure: bool,
    /// Open connections per listener.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// TLS handshakes in progress per listener (more are closed at once).
    #[arg(long, default_value_t = 256)]
    max_handshakes: usize,
    /// TLS handshakes in progress from one source address.
    #[arg(long, default_value_t = 16)]
    max_handshakes_per_ip: usize,
    /// Close a connection with no call for this long.
    #[arg(long, default_value = "5m", value_parser = duration_arg)]
    idle_timeout: Duration,
    /// Calls in flight per identity (waiting acquires included; a role's
    /// `max_calls` in the policy file overrides it).
    #[arg(long, default_value_t = 4096)]
    max_calls_per_identity: usize,
    /// Sessions open at once per identity on a TLS node (a role's
    /// `max_sessions` in the policy file overrides it).
    #[arg(long, default_value_t = 10_000)]
    max_sessions_per_identity: usize,
    /// Where the log, vote and snapshots live.
    #[arg(long, default_value = "palisade-data")]
    data_dir: PathBuf,
    /// Bootstrap a cluster: every node as ID=HOST:PORT, comma-separated. Omit for a
    /// single-node cluster.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// Join an existing cluster later (via `palisade cluster add-learner`) instead
    /// of bootstrapping.
    #[arg(long)]
    join: bool,
    /// Snapshot and compact the log every this many entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Serve Prometheus metrics (`/metrics`) and the status page on this
    /// address. On a TLS node: HTTPS with the node's certificate, and only
    /// for identities with a read or admin role (client certificate or bearer
    /// token); on a plaintext node: plain HTTP to everyone, loopback only
    /// unless --insecure.
    #[arg(long, env = "PALISADE_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// On a TLS node, serve --metrics-listen as plain HTTP to everyone anyway
    /// (a Prometheus on the same host); refused unless that address is
    /// loopback.
    #[arg(long, requires = "metrics_listen")]
    metrics_open: bool,
    /// Threads that run this node's work (default: one per core). Nodes that
    /// share a machine should share its cores: `palisade dev-cluster` gives
    /// each of its nodes cores ÷ nodes (at least one), since threads beyond
    /// the cores only add context switches to every commit.
    #[arg(long, env = "PALISADE_WORKER_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
}

impl ServeArgs {
    /// The runtime's worker threads, when given.
    pub fn worker_threads(&self) -> Option<usize> {
        self.worker_threads.map(usize::from)
    }
}

#[cfg(test)]
impl ServeArgs {
    /// This node's id, as given.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The client listen address, as given.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }
}

/// `palisade lock`.
#[derive(Args)]
pub struct LockArgs {
    /// The lock name.
    name: String,
    /// The lock service, by URL: `palisade://HOST:PORT[,…]` (default: the
    /// Palisade cluster at --endpoints).
    #[arg(long, env = "PALISADE_BACKEND")]
    backend: Option<String>,
    #[command(flatten)]
    endpoints: Endpoints,
    /// Session TTL: how long the lock survives this process dying silently.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long to wait for the lock (0: fail at once if held).
    #[arg(long, default_value = "0s", value_parser = duration_arg)]
    wait: Duration,
    /// Keep the lock unavailable this long after our session expires.
    #[arg(long, default_value = "0s", value_parser = duration_arg)]
    lock_delay: Duration,
    /// Take one permit of a semaphore of N instead of a plain lock: at most N
    /// hold the name at once (every holder must give the same N). CMD also
    /// gets PALISADE_PERMIT_SLOT, 0 to N-1: fence per (name, slot).
    #[arg(long, value_name = "N", conflicts_with_all = ["read", "write"])]
    permits: Option<u32>,
    /// Take a read lock: shared with other readers, never with a writer.
    #[arg(long, conflicts_with = "write")]
    read: bool,
    /// Take a write lock: alone, after every reader and writer before it.
    #[arg(long)]
    write: bool,
    /// Time CMD gets between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    grace: Duration,
    /// At exit, write the lock-safety figures (guarantee left at release, time
    /// CMD ran past its guarantee, lost leases, late grants) to this file in
    /// Prometheus' text format — for node_exporter's textfile collector.
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `palisade elect`.
#[derive(Args)]
pub struct ElectArgs {
    /// The election's name.
    name: String,
    /// What observers see while this candidate leads (an address, an id; at
    /// most 1024 bytes).
    #[arg(long, required_unless_present = "observe")]
    value: Option<String>,
    /// Print each change of leader (session, token, value) as one JSON line
    /// instead of campaigning, until Ctrl-C. Pushed by the cluster's leader as
    /// it applies the log (the `Observe` stream): leaders that came and went
    /// within one batch of applied entries arrive as the latest.
    #[arg(long, conflicts_with_all = ["value", "command"])]
    observe: bool,
    /// The election service, by URL: `palisade://HOST:PORT[,…]` (default:
    /// the Palisade cluster at --endpoints), or `etcd://…` / `zk://…`, whose
    /// own election recipes are used (docs/recipes.md; --observe is the
    /// Palisade server's).
    #[arg(long, env = "PALISADE_BACKEND")]
    backend: Option<String>,
    #[command(flatten)]
    endpoints: Endpoints,
    /// Session TTL: how long leadership survives this process dying silently.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long to campaign before giving up (at most 1h, the server's
    /// longest wait).
    #[arg(long, default_value = "1h", value_parser = duration_arg)]
    wait: Duration,
    /// Time CMD gets between SIGTERM and SIGKILL when leadership is lost.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    grace: Duration,
    /// As for `palisade lock`.
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// The command to run while leader, and its arguments.
    #[arg(last = true, required_unless_present = "observe")]
    command: Vec<String>,
}

/// `palisade status` / `palisade locks`.
#[derive(Args)]
pub struct QueryArgs {
    #[command(flatten)]
    endpoints: Endpoints,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `palisade check-token`.
#[derive(Args)]
pub struct CheckTokenArgs {
    /// The lock name.
    name: String,
    /// The token to check.
    token: FencingToken,
    #[command(flatten)]
    endpoints: Endpoints,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `palisade cluster …`.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Add a node as a learner (it catches up, but does not vote).
    AddLearner {
        /// The new node's id.
        id: u64,
        /// Its address, HOST:PORT.
        addr: String,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Set the voting members (promotes learners, removes unlisted members).
    SetVoters {
        /// Node ids, comma-separated.
        #[arg(value_delimiter = ',')]
        voters: Vec<u64>,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Take a snapshot now and compact the log (before a backup, say). The
    /// leader (or the only endpoint given) snapshots its own state.
    Snapshot {
        #[command(flatten)]
        endpoints: Endpoints,
    },
}

/// Runs a node until SIGINT/SIGTERM.
pub async fn serve(a: ServeArgs) -> Result<i32> {
    let initial_cluster = match &a.initial_cluster {
        Some(s) => match palisade_server::service::parse_initial_cluster(s) {
            Ok(members) => members,
            Err(e) => {
                eprintln!("palisade: --initial-cluster {e}");
                return Ok(exit::USAGE);
            }
        },
        None => Default::default(),
    };
    let listen_peer = match a.listen_peer {
        Some(addr) => addr,
        None => {
            let mut addr = a.listen;
            addr.set_port(
                a.listen
                    .port()
                    .checked_add(1)
                    .context("the client port is 65535: give --listen-peer")?,
            );
            addr
        }
    };
    let tls = a
        .tls_cert
        .clone()
        .map(|cert| palisade_server::security::TlsFiles {
            cert,
            key: a.tls_key.clone().expect("clap requires it"),
            ca: a.tls_ca.clone().expect("clap requires it"),
        });
    if let Some(refusal) = exposure_refused(&a, listen_peer, tls.is_some()) {
        eprintln!("palisade: {refusal}");
        return Ok(exit::USAGE);
    }
    let advertise = a.advertise.clone().unwrap_or_else(|| a.listen.to_string());
    let advertise_peer = a
        .advertise_peer
        .clone()
        .unwrap_or_else(|| listen_peer.to_string());
    let config = palisade_server::ServerConfig {
        id: a.id,
        listen: a.listen,
        listen_peer,
        advertise,
        advertise_peer,
        security: palisade_server::security::SecurityConfig {
            tls,
            policy: a.auth.clone(),
            limits: connection_limits(&a),
        },
        data_dir: a.data_dir.clone(),
        initial_cluster,
        snapshot_every: a.snapshot_every,
        join: a.join,
        metrics_listen: a.metrics_listen,
        metrics_open: a.metrics_open,
    };
    // Said only once the ports are bound and the data directory is ours: a
    // node that cannot start says why and nothing else.
    let serving = serving_line(&a, listen_peer);
    let served = palisade_server::run_until(config, crate::child::interrupted(), move || {
        eprintln!("{serving}");
    })
    .await;
    match served {
        Ok(()) => Ok(0),
        // A configuration that cannot work is bad input, like a bad flag.
        Err(e @ palisade_server::ServerError::Config(_)) => {
            eprintln!("palisade: {e}");
            Ok(exit::USAGE)
        }
        Err(e) => Err(e.into()),
    }
}

/// Why `a` would expose what it must not: an unauthenticated metrics
/// listener off loopback, or plaintext off loopback without `--insecure`.
fn exposure_refused(a: &ServeArgs, listen_peer: SocketAddr, tls: bool) -> Option<String> {
    if a.metrics_open
        && let Some(addr) = a.metrics_listen.filter(|m| !m.ip().is_loopback())
    {
        return Some(format!(
            "refusing --metrics-open on {addr}: the status page names locks and \
             holders, so an unauthenticated listener must be loopback. Drop --metrics-open \
             (scrape over HTTPS with a read identity) or listen on 127.0.0.1."
        ));
    }
    if tls || a.insecure {
        return None;
    }
    [a.listen, listen_peer]
        .into_iter()
        .chain(a.metrics_listen)
        .find(|addr| !addr.ip().is_loopback())
        .map(|addr| {
            format!(
                "refusing to serve plaintext on {addr}: anyone who reaches it could \
                 forge Raft messages and release others' locks.\n\
                 Give --tls-cert/--tls-key/--tls-ca (`palisade certs init DIR` makes them), \
                 or --insecure if this network is trusted."
            )
        })
}

/// The connection limits `a` asks for, each at least 1 (of its unit).
fn connection_limits(a: &ServeArgs) -> palisade_server::security::conn::Limits {
    palisade_server::security::conn::Limits {
        max_connections: a.max_connections.max(1),
        idle_timeout: a.idle_timeout.max(Duration::from_secs(1)),
        max_calls_per_identity: a.max_calls_per_identity.max(1),
        max_sessions_per_identity: a.max_sessions_per_identity.max(1),
        // A client that cannot finish a handshake in the idle time is idle.
        handshake_timeout: a
            .idle_timeout
            .clamp(Duration::from_secs(1), Duration::from_secs(10)),
        max_handshakes: a.max_handshakes.max(1),
        max_handshakes_per_ip: a.max_handshakes_per_ip.max(1),
    }
}

/// What a node says once its ports are bound and its data directory is its
/// own.
fn serving_line(a: &ServeArgs, listen_peer: SocketAddr) -> String {
    format!(
        "palisade: node {} serving clients on {} and peers on {}{} (data in {}){}",
        a.id,
        a.listen,
        listen_peer,
        if a.tls_cert.is_some() {
            " with TLS"
        } else {
            ", plaintext"
        },
        a.data_dir.display(),
        a.metrics_listen
            .map(|m| {
                let scheme = if a.tls_cert.is_some() && !a.metrics_open {
                    "https"
                } else {
                    "http"
                };
                format!("; metrics at {scheme}://{m}/metrics")
            })
            .unwrap_or_default()
    )
}

/// Runs CMD holding the lock, on whichever backend `--backend` names (default:
/// the Palisade cluster at `--endpoints`), reached only through the
/// correctness-lock trait.
pub async fn lock(a: LockArgs) -> Result<i32> {
    let claim = match (a.permits, a.read, a.write) {
        (Some(permits), _, _) => Claim::Permit { permits },
        (None, true, _) => Claim::Read,
        (None, false, true) => Claim::Write,
        (None, false, false) => Claim::Lock,
    };
    hold(a, claim).await
}

/// `palisade elect NAME --value V -- CMD`: campaigns, runs CMD while leader
/// (PALISADE_FENCING_TOKEN is the leader's token, above every earlier
/// leader's) and stops it when leadership is lost. `--observe` prints leaders.
pub async fn elect(a: ElectArgs) -> Result<i32> {
    if a.observe {
        if let Some(url) = a.backend.as_deref()
            && !url.starts_with("palisade://")
        {
            eprintln!(
                "palisade: --observe follows the Palisade server's Observe stream; on {url} \
                 read the election's keys with that system's own tools (docs/recipes.md)"
            );
            return Ok(exit::USAGE);
        }
        return observe(&a.name, &a.endpoints).await;
    }
    let value = a.value.unwrap_or_default();
    let as_lock = LockArgs {
        name: a.name,
        backend: a.backend,
        endpoints: a.endpoints,
        ttl: a.ttl,
        wait: a.wait,
        lock_delay: Duration::ZERO,
        permits: None,
        read: false,
        write: false,
        grace: a.grace,
        metrics_file: a.metrics_file,
        command: a.command,
    };
    hold(as_lock, Claim::Lead { value }).await
}

/// Prints the election's leader each time it changes, as one JSON object a
/// line: `{"name", "leader": session or null, "token", "value"}`. Follows the
/// leader's `Observe` stream; when it breaks (the node went away), observes
/// again through whichever node leads now.
async fn observe(name: &str, endpoints: &Endpoints) -> Result<i32> {
    palisade_core::limits::validate_name(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    let admin = match admin(endpoints) {
        Ok(admin) => admin,
        Err(code) => return Ok(code),
    };
    let mut last = None;
    loop {
        let mut changes = match admin.observe(name).await {
            Ok(changes) => changes,
            Err(e) => return Ok(query_failed("no leader answered", &e, exit::FAILURE)),
        };
        while let Some(Ok(view)) = changes.next().await {
            if let Some(v) = &view
                && v.shape != "election"
            {
                eprintln!("palisade: {name:?} is a {}, not an election", v.shape);
                return Ok(exit::FAILURE);
            }
            let leader = view
                .and_then(|v| v.holder)
                .map(|h| (h.session.get(), h.token.get(), h.value));
            if last.as_ref() != Some(&leader) {
                let line = match &leader {
                    Some((session, token, value)) => serde_json::json!({
                        "name": name, "leader": session, "token": token, "value": value,
                    }),
                    None => serde_json::json!({
                        "name": name, "leader": null, "token": null, "value": null,
                    }),
                };
                println!("{line}");
                last = Some(leader);
            }
        }
        // The stream broke: a moment for the cluster, then the next leader.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs CMD holding `a.name` under `claim`, stopping it when the hold is lost.
async fn hold(a: LockArgs, claim: Claim) -> Result<i32> {
    let usage = |e: &dyn std::fmt::Display| {
        eprintln!("palisade: {e}");
        Ok(exit::USAGE)
    };
    let (url, spec) = match session_for(&a) {
        Ok(pair) => pair,
        Err(e) => return usage(&e),
    };
    let options = LockOptions {
        wait: a.wait,
        lock_delay: a.lock_delay,
        claim: claim.clone(),
    };
    let acquired = async {
        let locks = with_progress(
            // Other backends' URLs may hold a password: name only the scheme.
            if url.scheme == "palisade" {
                format!("waiting for a leader at {}", url.rest)
            } else {
                format!("connecting to the {} backend", url.scheme)
            },
            backends::connect(&url, &spec),
        )
        .await?;
        match locks.acquire(&a.name, &options).await {
            Ok(lease) => Ok((locks, lease)),
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(2), locks.close()).await;
                Err(e)
            }
        }
    };
    let safety = palisade_core::safety::LockSafety::new();
    let (locks, lease) = match acquired.await {
        Ok(pair) => pair,
        Err(e @ LockError::InvalidInput(_)) => return usage(&e),
        Err(e) => {
            if e == LockError::GrantTooLate {
                safety.grant_too_late();
            }
            let hint = not_obtained_hint(&e);
            eprintln!("palisade: lock {:?} not obtained: {e}{hint}", a.name);
            write_safety(a.metrics_file.as_deref(), &safety);
            return Ok(exit::NOT_OBTAINED);
        }
    };
    eprintln!(
        "palisade: holding {:?}{} with fencing token {} ({} backend)",
        a.name,
        held_as(&claim, &*lease),
        lease.token(),
        locks.backend()
    );
    let env = holder_env(&a.name, &claim, &*lease);
    let lost = lease.lost();
    let ended = run_holding(
        &a.command,
        &env,
        async move {
            lost.await;
            "the lease could not be kept alive".to_owned()
        },
        a.grace,
    )
    .await;
    let outcome = match ended? {
        Ended::Exited(status) => {
            safety.work_ended(lease.guaranteed_until(), std::time::Instant::now());
            if let Err(e) = lease.release().await {
                eprintln!("palisade: release of {:?}: {e}", a.name);
            }
            shell_status(status)
        }
        Ended::Lost { reason, status } => {
            // The command ran from the end of its guarantee until it stopped:
            // a window in which another holder may have had the lock.
            let guaranteed_until = lease.guaranteed_until();
            let stopped = std::time::Instant::now();
            safety.work_ended(guaranteed_until, stopped);
            eprintln!(
                "palisade: lock {:?} lost ({reason}); stopped the command ({status}) {:.1} s \
                 after its guarantee ran out",
                a.name,
                stopped
                    .saturating_duration_since(guaranteed_until)
                    .as_secs_f64()
            );
            drop(lease);
            exit::LOST
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), locks.close()).await;
    write_safety(a.metrics_file.as_deref(), &safety);
    Ok(outcome)
}

/// The backend and the session `a` asks for.
fn session_for(a: &LockArgs) -> Result<(BackendUrl, SessionSpec), String> {
    let url: BackendUrl = match &a.backend {
        Some(url) => url.parse().map_err(|e| format!("{e}"))?,
        None => BackendUrl {
            scheme: "palisade".into(),
            rest: a.endpoints.endpoints.join(","),
        },
    };
    let (tls, bearer_token) = a.endpoints.credentials().map_err(|e| format!("{e}"))?;
    let spec = SessionSpec {
        ttl: a.ttl,
        tls: tls.map(Into::into),
        bearer_token,
        retry_for: Some(a.endpoints.retry_for),
        ..SessionSpec::default()
    };
    Ok((url, spec))
}

/// What the CLI adds to a lock not obtained: hints about a Palisade cluster
/// that cannot be reached, nothing for other backends or errors.
fn not_obtained_hint(e: &LockError) -> &'static str {
    match e {
        // The hints are about a Palisade cluster.
        LockError::Unavailable { backend, why, .. }
            if *backend == palisade_client::DESCRIPTOR.name =>
        {
            unreachable_hint(*why)
        }
        _ => "",
    }
}

/// How `lease` holds its lock, as the "holding" line says it: nothing for a
/// plain lock.
fn held_as(claim: &Claim, lease: &dyn palisade_core::FencedLease) -> String {
    match claim {
        Claim::Lock => String::new(),
        Claim::Permit { permits } => format!(" as permit {} of {permits}", lease.slot()),
        Claim::Read => " as a reader".to_owned(),
        Claim::Write => " as the writer".to_owned(),
        Claim::Lead { value } => format!(" as leader (value {value:?})"),
    }
}

/// The environment the command runs with: the lock, its token, and a
/// permit's slot.
fn holder_env(
    name: &str,
    claim: &Claim,
    lease: &dyn palisade_core::FencedLease,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("PALISADE_LOCK".to_owned(), name.to_owned()),
        (
            "PALISADE_FENCING_TOKEN".to_owned(),
            lease.token().to_string(),
        ),
    ];
    if let Claim::Permit { .. } = claim {
        env.push(("PALISADE_PERMIT_SLOT".to_owned(), lease.slot().to_string()));
    }
    env
}

/// Writes the lock-safety figures to `path` whole or not at all (a temporary
/// file renamed into place, as a textfile collector expects); a failure is
/// reported, not fatal.
pub(crate) fn write_safety(
    path: Option<&std::path::Path>,
    safety: &palisade_core::safety::LockSafety,
) {
    let Some(path) = path else { return };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let written = std::fs::write(&tmp, safety.render()).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        eprintln!("palisade: cannot write {}: {e}", path.display());
    }
}

/// Awaits `work`; if it takes more than a second (nodes down, an election),
/// says so on stderr — a counter on a terminal, one line otherwise — so that a
/// person does not stare at a silent command.
async fn with_progress<T>(what: String, work: impl std::future::Future<Output = T>) -> T {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    tokio::pin!(work);
    let mut shown = false;
    loop {
        tokio::select! {
            out = &mut work => {
                if shown && terminal {
                    eprintln!();
                }
                return out;
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if terminal {
                    eprint!("\rpalisade: {what}… {} s", started.elapsed().as_secs());
                } else if !shown {
                    eprintln!("palisade: {what}…");
                }
                shown = true;
            }
        }
    }
}

/// What to try when the cluster could not be reached, by what the nodes did;
/// empty when the failure says enough.
fn unreachable_hint(why: Unreachable) -> &'static str {
    match why {
        Unreachable::Refused => {
            "\n  hint: is `palisade serve` running at that address? Name the cluster's \
             nodes with --endpoints or PALISADE_ENDPOINTS."
        }
        Unreachable::NoLeader => {
            "\n  hint: the nodes answer but have no leader yet: a majority of the members \
             must be running and able to reach each other's peer ports."
        }
        Unreachable::TimedOut => {
            "\n  hint: nothing answered in time: check the address and the network, and \
             give --ca if the cluster speaks TLS."
        }
        Unreachable::Unknown => "",
    }
}

/// Prints why a query failed, with a hint, and gives its exit status: usage
/// errors 2, anything else `unreachable`.
fn query_failed(what: &str, e: &ClientError, unreachable: i32) -> i32 {
    let hint = match e {
        ClientError::Unavailable { why, .. } => unreachable_hint(*why),
        _ => "",
    };
    eprintln!("palisade: {what}: {e}{hint}");
    match e {
        ClientError::InvalidInput(_) => exit::USAGE,
        _ => unreachable,
    }
}

/// The client for a query command, or the exit status of a bad option.
fn admin(endpoints: &Endpoints) -> Result<Admin, i32> {
    endpoints
        .config()
        .and_then(|c| Admin::new(&c))
        .map_err(|e| {
            eprintln!("palisade: {e}");
            exit::USAGE
        })
}

/// `palisade status`.
pub async fn status(a: QueryArgs) -> Result<i32> {
    let admin = match admin(&a.endpoints) {
        Ok(admin) => admin,
        Err(code) => return Ok(code),
    };
    let s = match with_progress(a.endpoints.waiting(), admin.status()).await {
        Ok(s) => s,
        Err(e) => return Ok(query_failed("no node answered", &e, exit::FAILURE)),
    };
    if a.json {
        let members = |m: &[palisade_client::Member]| {
            m.iter()
                .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "peer_addr": m.peer_addr}))
                .collect::<Vec<_>>()
        };
        let v = serde_json::json!({
            "id": s.id,
            "leader": s.leader,
            "term": s.term,
            "commit_index": s.commit_index,
            "last_applied": s.last_applied,
            "state": s.state,
            "members": members(&s.members),
            "learners": members(&s.learners),
            "snapshot": s.snapshot.map(|n| serde_json::json!({
                "index": n.index,
                "bytes": n.bytes,
                "last_build_ms": n.last_build.map(|d| d.as_millis() as u64),
                "last_install_ms": n.last_install.map(|d| d.as_millis() as u64),
            })),
        });
        println!("{v}");
    } else {
        println!("answered by  node {} ({})", s.id, s.state);
        println!(
            "leader       {}",
            s.leader
                .map_or_else(|| "none".to_owned(), |l| format!("node {l}"))
        );
        println!("term         {}", s.term);
        println!("commit index {}", s.commit_index);
        println!("applied      {}", s.last_applied);
        for m in &s.members {
            println!(
                "member       {} {} (peers {}){}",
                m.id,
                m.addr,
                m.peer_addr,
                if Some(m.id) == s.leader {
                    "  (leader)"
                } else {
                    ""
                }
            );
        }
        for m in &s.learners {
            println!("learner      {} {} (peers {})", m.id, m.addr, m.peer_addr);
        }
        match s.snapshot {
            Some(n) => println!(
                "snapshot     index {}, {}{}{}",
                n.index,
                human_bytes(n.bytes),
                n.last_build.map_or(String::new(), |d| format!(
                    ", last built in {} ms",
                    d.as_millis()
                )),
                n.last_install.map_or(String::new(), |d| format!(
                    ", last installed in {} ms",
                    d.as_millis()
                )),
            ),
            None => println!("snapshot     none yet"),
        }
    }
    Ok(0)
}

/// `1.4 MiB`, `512 B`.
fn human_bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// `palisade locks`.
pub async fn locks(a: QueryArgs) -> Result<i32> {
    let admin = match admin(&a.endpoints) {
        Ok(admin) => admin,
        Err(code) => return Ok(code),
    };
    let locks = match with_progress(a.endpoints.waiting(), admin.list()).await {
        Ok(locks) => locks,
        Err(e) => return Ok(query_failed("no leader answered", &e, exit::FAILURE)),
    };
    if a.json {
        // One array, `[]` when nothing is held: a script parses one document.
        let all: Vec<_> = locks
            .iter()
            .map(|l| {
                let h = l.holder.as_ref();
                let mut v = serde_json::json!({
                    "name": l.name,
                    "holder": h.map(|h| h.session.get()),
                    "holder_label": h.map_or("", |h| h.label.as_str()),
                    "token": h.map(|h| h.token.get()),
                    "waiters": l.waiters.iter().map(|w| w.get()).collect::<Vec<_>>(),
                    "in_lock_delay": l.in_lock_delay,
                });
                // A plain lock reads as it always did; a recipe adds what it
                // is and every holder.
                if l.shape != "mutex" {
                    v["shape"] = l.shape.clone().into();
                    if l.permits > 0 {
                        v["permits"] = l.permits.into();
                    }
                    v["holders"] = l
                        .holders
                        .iter()
                        .map(|h| {
                            serde_json::json!({
                                "session": h.session.get(),
                                "label": h.label,
                                "token": h.token.get(),
                                "shared": h.shared,
                                "slot": h.slot,
                                "value": h.value,
                            })
                        })
                        .collect();
                }
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(all));
    } else {
        println!(
            "{:<32} {:>8} {:>10} {:>8}  holder",
            "name", "session", "token", "waiters"
        );
        for l in &locks {
            let h = l.holder.as_ref();
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            let recipe = match l.shape.as_str() {
                "mutex" => String::new(),
                "semaphore" => {
                    format!(" (semaphore: {} of {} permits)", l.holders.len(), l.permits)
                }
                "read_write" if l.holders.iter().any(|h| h.shared) => {
                    format!(" (read/write: {} readers)", l.holders.len())
                }
                "read_write" => " (read/write: the writer)".to_owned(),
                "election" => format!(
                    " (election: leader's value {:?})",
                    h.map_or("", |h| h.value.as_str())
                ),
                other => format!(" ({other})"),
            };
            println!(
                "{:<32} {:>8} {:>10} {:>8}  {}{}{recipe}",
                l.name,
                or_dash(h.map(|h| h.session.to_string())),
                or_dash(h.map(|h| h.token.to_string())),
                l.waiters.len(),
                h.map_or("", |h| h.label.as_str()),
                if l.in_lock_delay { " (lock-delay)" } else { "" }
            );
        }
    }
    Ok(0)
}

/// `palisade check-token`: exit 0 when current, 1 when stale, 3 when the
/// cluster could not be asked.
pub async fn check_token(a: CheckTokenArgs) -> Result<i32> {
    let admin = match admin(&a.endpoints) {
        Ok(admin) => admin,
        Err(code) => return Ok(code),
    };
    let (current, holder) =
        match with_progress(a.endpoints.waiting(), admin.check_token(&a.name, a.token)).await {
            Ok(answer) => answer,
            Err(e) => return Ok(query_failed("could not ask", &e, exit::NOT_ASKED)),
        };
    if a.json {
        println!(
            "{}",
            serde_json::json!({"name": a.name, "token": a.token.get(), "current": current,
                "current_token": holder.map(FencingToken::get)})
        );
    } else if current {
        println!(
            "token {} is the current holder's token for {:?}",
            a.token, a.name
        );
    } else {
        println!(
            "token {} is stale for {:?}; current: {}",
            a.token,
            a.name,
            holder.map_or("none (not held)".into(), |t| t.to_string())
        );
    }
    Ok(if current { 0 } else { exit::FAILURE })
}

/// `palisade cluster …`.
pub async fn cluster(c: ClusterCommand) -> Result<i32> {
    let endpoints = match &c {
        ClusterCommand::AddLearner { endpoints, .. }
        | ClusterCommand::SetVoters { endpoints, .. }
        | ClusterCommand::Snapshot { endpoints } => endpoints.clone(),
    };
    let admin = match admin(&endpoints) {
        Ok(admin) => admin,
        Err(code) => return Ok(code),
    };
    let waiting = endpoints.waiting();
    match c {
        ClusterCommand::AddLearner { id, addr, .. } => {
            match with_progress(waiting, admin.add_learner(id, &addr)).await {
                Ok(index) => {
                    println!("node {id} ({addr}) added as a learner at log index {index}");
                }
                Err(e) => return Ok(query_failed("add-learner", &e, exit::FAILURE)),
            }
        }
        ClusterCommand::SetVoters { voters, .. } => {
            if voters.is_empty() {
                eprintln!("palisade: give at least one voter");
                return Ok(exit::USAGE);
            }
            match with_progress(waiting, admin.change_membership(&voters)).await {
                Ok(index) => println!("voters are now {voters:?} (log index {index})"),
                Err(e) => return Ok(query_failed("set-voters", &e, exit::FAILURE)),
            }
        }
        ClusterCommand::Snapshot { .. } => {
            match with_progress(waiting, admin.take_snapshot()).await {
                Ok(s) => println!(
                    "node {}: snapshot at log index {}, {}, built in {} ms",
                    s.id,
                    s.index,
                    human_bytes(s.bytes),
                    s.build.as_millis()
                ),
                Err(e) => return Ok(query_failed("snapshot", &e, exit::FAILURE)),
            }
        }
    }
    Ok(0)
}
