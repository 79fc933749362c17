//! Starting a node: storage, Raft, bootstrap, the lease keeper and the two gRPC
//! listeners (clients, peers).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};
use serde::{Deserialize, Serialize};

use crate::io::{Io, OpenMode};
use crate::leases::LeaseKeeper;
use crate::network::{PeerFactory, RaftService};
use crate::proposer::Proposer;
use crate::security::conn::{Accepting, Counters, incoming};
use crate::security::{Gatekeeper, PeerCheck, SecurityConfig, Tls};
use crate::service::Api;
use crate::store::log::LogStore;
use crate::store::sm::StateMachineStore;
use crate::typ::{NodeAddr, NodeId, Raft};

/// Everything a node needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This node's id (> 0).
    pub id: NodeId,
    /// Where to listen for clients.
    pub listen: SocketAddr,
    /// Where to listen for peers (Raft traffic only).
    pub listen_peer: SocketAddr,
    /// The address clients use to reach this one.
    pub advertise: String,
    /// The address peers use to reach this one.
    pub advertise_peer: String,
    /// TLS, the policy file, and limits.
    pub security: SecurityConfig,
    /// Where the log, vote and snapshots live.
    pub data_dir: PathBuf,
    /// The cluster to bootstrap on a fresh data directory: every node, by id.
    /// Just this node when empty (single-node mode).
    pub initial_cluster: BTreeMap<NodeId, NodeAddr>,
    /// Take a snapshot (and compact the log) after this many entries.
    pub snapshot_every: u64,
    /// Start as a learner-to-be: do not bootstrap; wait for a leader to add us.
    pub join: bool,
    /// Where to serve `/metrics` and the status page (none: no such listener).
    /// On a TLS node it speaks HTTPS and authenticates, unless `metrics_open`.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve `metrics_listen` as plain HTTP to everyone even on a TLS node (a
    /// Prometheus on the same host; the command line allows it on loopback
    /// only).
    pub metrics_open: bool,
}

/// What can stop a node from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory is unusable or belongs to another node.
    #[error("data directory {dir}: {why}")]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// Another process uses the data directory, or it cannot be created.
    #[error(transparent)]
    DirLock(#[from] crate::store::dir_lock::DirLockError),
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Raft refused to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The TLS files or the policy file are unusable.
    #[error("security: {0}")]
    Security(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The listener failed.
    #[error("serving {addr}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
}

/// The identity written into a data directory on first start, so that a data
/// directory is never reused by a different node id.
#[derive(Serialize, Deserialize)]
struct Identity {
    id: NodeId,
}

fn check_identity(config: &ServerConfig, io: &Io) -> Result<(), ServerError> {
    let err = |why: String| ServerError::DataDir {
        dir: config.data_dir.clone(),
        why,
    };
    io.disk
        .create_dir_all(&config.data_dir)
        .map_err(|e| err(e.to_string()))?;
    let path = config.data_dir.join("node.json");
    match io.disk.read(&path) {
        Ok(bytes) => {
            let found: Identity =
                serde_json::from_slice(&bytes).map_err(|e| err(format!("node.json: {e}")))?;
            if found.id != config.id {
                return Err(err(format!(
                    "it belongs to node {}, not node {}",
                    found.id, config.id
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bytes = serde_json::to_vec(&Identity { id: config.id }).expect("serializable");
            let write = || {
                let file = io.disk.open(&path, OpenMode::Truncate)?;
                file.write_all_at(&bytes, 0)?;
                file.sync_data()?;
                io.disk.sync_dir(&config.data_dir)
            };
            write().map_err(|e| err(e.to_string()))
        }
        Err(e) => Err(err(e.to_string())),
    }
}

/// How long a member of a fresh static cluster, other than the lowest id, waits
/// for a leader to reach it before it initializes the cluster itself.
const BOOTSTRAP_GRACE: Duration = Duration::from_secs(3);

/// Runs a node until `shutdown` completes.
///
/// # Errors
/// See [`ServerError`].
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    run_until(config, shutdown, || {}).await
}

/// [`run`], calling `serving` once both listeners are bound, the data
/// directory is this process's and Raft has started: from then on the node
/// takes calls. A node that fails to start never calls it.
///
/// # Errors
/// See [`ServerError`].
pub async fn run_until(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serving: impl FnOnce() + Send,
) -> Result<(), ServerError> {
    run_on(config, Io::os(), shutdown, serving).await
}

/// [`run_until`] on `io`: its disk, network and way of running blocking work
/// (the operating system's in production, a simulator's in `palisade sim`).
///
/// # Errors
/// See [`ServerError`].
pub async fn run_on(
    config: ServerConfig,
    io: Io,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serving: impl FnOnce() + Send,
) -> Result<(), ServerError> {
    if config.id == 0 {
        return Err(ServerError::Config("node ids start at 1".into()));
    }
    let mut initial = config.initial_cluster.clone();
    if initial.is_empty() {
        initial.insert(
            config.id,
            NodeAddr::new(config.advertise.clone(), config.advertise_peer.clone()),
        );
    }
    if !config.join && !initial.contains_key(&config.id) {
        return Err(ServerError::Config(format!(
            "node {} is not in the initial cluster {:?}",
            config.id,
            initial.keys().collect::<Vec<_>>()
        )));
    }
    // Everything that can be refused is checked before the data directory is
    // touched: a node that cannot serve must not initialize a fresh cluster.
    let tls = config
        .security
        .tls
        .as_ref()
        .map(Tls::load)
        .transpose()
        .map_err(ServerError::Security)?;
    let counters = Arc::new(Counters::default());
    let gatekeeper = Arc::new(
        Gatekeeper::new(&config.security, counters.clone()).map_err(ServerError::Security)?,
    );
    // SO_REUSEADDR, as tokio's own `bind` sets it: a node restarted at once
    // after a crash must get its ports back despite connections in TIME_WAIT.
    let bind = |addr: SocketAddr| {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        };
        socket
            .and_then(|s| s.set_reuseaddr(true).map(|()| s))
            .and_then(|s| s.bind(addr).map(|()| s))
            .and_then(|s| s.listen(1024))
            .map_err(|source| ServerError::Bind { addr, source })
    };
    let listen = async |addr: SocketAddr| match &io.net {
        None => bind(addr).map(Accepting::Tcp),
        Some(net) => net
            .bind(addr)
            .await
            .map(Accepting::Net)
            .map_err(|source| ServerError::Bind { addr, source }),
    };
    let client_listener = listen(config.listen).await?;
    let peer_listener = listen(config.listen_peer).await?;
    // The operators' HTTP listener is the operating system's only.
    let http_listener = match io.net {
        None => config.metrics_listen.map(bind).transpose()?,
        Some(_) => None,
    };
    // Held until the node stops: a second process on this directory is refused
    // here, before anything in it is read or written.
    let _dir_lock = crate::store::dir_lock::DirLock::acquire_on(&config.data_dir, &io)?;
    check_identity(&config, &io)?;
    let dir_err = |e: std::io::Error| ServerError::DataDir {
        dir: config.data_dir.clone(),
        why: e.to_string(),
    };
    let commit_clock = Arc::new(crate::commit_clock::CommitClock::default());
    // The state machine first: the log is made to agree with its snapshot.
    let sm = StateMachineStore::open_on(&config.data_dir, &io)
        .map_err(dir_err)?
        .with_commit_clock(commit_clock.clone());
    let shared = sm.shared();
    let applied = *shared.last_applied.read().expect("poisoned");
    let log = LogStore::open_beside(&config.data_dir, &io, applied)
        .map_err(dir_err)?
        .with_commit_clock(commit_clock.clone());
    let node_metrics = crate::metrics::NodeMetrics::new(
        &sm.counters(),
        commit_clock.histogram(),
        log.fsync_histogram(),
        &counters,
    );
    let raft_config = Config {
        cluster_name: "palisade".into(),
        heartbeat_interval: 100,
        election_timeout_min: 600,
        election_timeout_max: 1200,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every.max(1)),
        max_in_snapshot_log_to_keep: 100,
        // Covers sending the whole snapshot in one call and the follower
        // installing it (about 2 s for a million locks); openraft's 200 ms
        // would make a large install time out and start over, forever.
        install_snapshot_timeout: 60_000,
        ..Config::default()
    }
    .validate()
    .map_err(|e| ServerError::Config(e.to_string()))?;
    let committed_log = log.clone();
    let last_log = log.clone();
    let committed: Arc<dyn Fn() -> u64 + Send + Sync> =
        Arc::new(move || committed_log.committed_index());
    // Any entry in the log at startup may have been acknowledged before a crash
    // (see `Api::linearize`).
    let read_floor = (log.vote_term(), log.last_index());
    let peer_tls = tls.as_ref().map(Tls::to_peers);
    let peers = PeerFactory {
        tls: peer_tls.clone(),
        io: io.clone(),
        source: config.id,
    };
    let raft = Raft::new(config.id, Arc::new(raft_config), peers, log, sm)
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    if !initialized && !config.join {
        // Every node of a static cluster may initialize with the same membership
        // (the first entry is identical everywhere), but each initialization
        // starts an election at once, and rival first-term candidates make the
        // first leader step down again. So the lowest id starts at once and the
        // others only if no leader has reached them within BOOTSTRAP_GRACE —
        // the cluster still forms while its lowest id is down.
        let first = initial.keys().next() == Some(&config.id);
        let bootstrap = {
            let (raft, initial) = (raft.clone(), initial.clone());
            async move {
                if !first {
                    tokio::time::sleep(BOOTSTRAP_GRACE).await;
                    if raft.is_initialized().await.unwrap_or(true) {
                        return;
                    }
                }
                if let Err(e) = raft.initialize(initial).await {
                    tracing::info!(error = %e, "initialize skipped");
                }
            }
        };
        if first {
            bootstrap.await;
            if initial.len() == 1 {
                // A single node elects itself at once, but openraft 0.10's
                // initialize returns before that election has run: wait for
                // it, so that a fresh node takes requests as soon as it serves.
                let _ = raft
                    .wait(Some(BOOTSTRAP_GRACE))
                    .current_leader(config.id, "the single node leads")
                    .await;
            }
        } else {
            tokio::spawn(bootstrap);
        }
    }
    let proposer = Proposer::start(raft.clone());
    let leases = LeaseKeeper::with_planted(
        raft.clone(),
        proposer.clone(),
        shared.clone(),
        io.planted,
        io.clock_rate,
    );
    let keeper = tokio::spawn(leases.clone().run());
    let status = Arc::new(crate::status::StatusSource::new(
        raft.clone(),
        shared.clone(),
        leases.clone(),
        committed.clone(),
        peer_tls,
        io.clone(),
    ));
    let shared_for_http = shared.clone();
    let api = Api::new(
        raft.clone(),
        proposer,
        shared,
        leases,
        committed.clone(),
        read_floor,
        gatekeeper.clone(),
    )
    .with_commit_clock(commit_clock)
    .with_session_keys(io.session_keys.clone())
    .with_last_log_index(Arc::new(move || last_log.last_index()));
    tracing::debug!(id = config.id, listen = %config.listen, listen_peer = %config.listen_peer, tls = tls.is_some(), data_dir = %config.data_dir.display(), "palisade node serving");
    let limits = config.security.limits;
    let builder = || {
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
    };
    let (client_server, mut peer_server) = (builder(), builder());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_http = stop_rx.clone();
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // gRPC and the HTTP/JSON API (docs/http.md) share the client listener, its
    // TLS, limits and gatekeeper; HTTP/1.1 is accepted for the JSON calls.
    let routes = tonic::service::Routes::new(api.locks())
        .add_service(api.cluster())
        .into_axum_router()
        .merge(crate::json_api::router(api.clone()))
        .fallback(crate::json_api::unknown_path);
    let clients = client_server
        .accept_http1(true)
        .layer(tower::util::MapResponseLayer::new(
            crate::wire_errors::mark::<tonic::body::Body>,
        ))
        .add_routes(routes.into())
        .serve_with_incoming_shutdown(
            incoming(
                client_listener,
                limits,
                counters.clone(),
                tls.as_ref().map(Tls::client_listener),
            ),
            stopped(stop_rx.clone()),
        );
    let counters_for_http = counters.clone();
    let peer_check = PeerCheck {
        tls: tls.is_some(),
        counters: counters.clone(),
    };
    let peers = peer_server
        .add_service(RaftService::new(raft.clone(), peer_check, status.clone()))
        .serve_with_incoming_shutdown(
            incoming(
                peer_listener,
                limits,
                counters,
                tls.as_ref().map(Tls::peer_listener),
            ),
            stopped(stop_rx),
        );
    let http = http_listener.map(|listener| {
        let observed = crate::http::Observed {
            raft: raft.clone(),
            shared: shared_for_http.clone(),
            committed,
            metrics: node_metrics,
            status,
            access: None,
        };
        let tls = tls.as_ref().filter(|_| !config.metrics_open);
        let operators = Operators {
            listener,
            limits,
            counters: counters_for_http,
            tls: tls.map(|tls| (tls.client_listener(), gatekeeper.clone())),
        };
        tokio::spawn(operators.serve(observed, stopped(stop_rx_http)))
    });
    // Signals are the operating system's; a simulated node has none.
    let reloads = tokio::spawn(async move {
        if io.net.is_none() {
            reload_on_hangup(gatekeeper).await;
        }
    });
    let roles = tokio::spawn(log_role_changes(raft.clone()));
    let stop_on_signal = stop_tx.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_on_signal.send(true);
    });
    // Whichever listener ends first (shutdown, or a failure) ends the other: a
    // node must not go on serving clients with its peer listener gone.
    let stop_both = |served| {
        let _ = stop_tx.send(true);
        served
    };
    serving();
    let (clients, peers) = tokio::join!(async { stop_both(clients.await) }, async {
        stop_both(peers.await)
    });
    reloads.abort();
    roles.abort();
    if let Some(http) = http {
        http.abort();
    }
    keeper.abort();
    let _ = raft.shutdown().await;
    clients.map_err(|source| ServerError::Serve {
        addr: config.listen,
        source,
    })?;
    peers.map_err(|source| ServerError::Serve {
        addr: config.listen_peer,
        source,
    })
}

/// Logs, at INFO and in one line each, every change of this node's role:
/// elections won, leaders followed, leadership lost. Watches openraft's server
/// metrics, which change with the vote and the role only, not per commit.
async fn log_role_changes(raft: Raft) {
    use openraft::ServerState;
    use openraft::async_runtime::WatchReceiver;
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        let now = {
            let m = metrics.borrow_watched();
            (m.id, m.state, m.current_leader, m.vote.leader_id.term)
        };
        // The state before the first election (no vote yet) is not news.
        if last != Some(now) && !(now.2.is_none() && now.3 == 0) {
            let (id, state, leader, term) = now;
            match (state, leader) {
                (ServerState::Leader, _) => tracing::info!("node {id} leads (term {term})"),
                (ServerState::Candidate, _) => {
                    tracing::info!("node {id} stands for election (term {term})")
                }
                (ServerState::Follower, Some(l)) => {
                    tracing::info!("node {id} follows node {l} (term {term})")
                }
                (ServerState::Learner, Some(l)) => {
                    tracing::info!("node {id} is a learner, fed by node {l} (term {term})")
                }
                (ServerState::Shutdown, _) => tracing::info!("node {id} shuts down"),
                (_, None) => tracing::info!("node {id} has no leader (term {term})"),
            }
            last = Some(now);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Re-reads the policy file on every SIGHUP, logging what changed or why the
/// new file was not taken (the old policy then stays in force).
async fn reload_on_hangup(gatekeeper: Arc<Gatekeeper>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    while hangups.recv().await.is_some() {
        match gatekeeper.reload() {
            Ok(users) => tracing::warn!(users, "policy file reloaded"),
            Err(e) => tracing::error!(error = %e, "policy file NOT reloaded; the old policy stays"),
        }
    }
}

/// The operators' listener (`/metrics`, the status page) and how it is
/// served: plain HTTP to everyone, or HTTPS with the client listener's TLS,
/// limits and gatekeeper.
struct Operators {
    listener: tokio::net::TcpListener,
    limits: crate::security::conn::Limits,
    counters: Arc<Counters>,
    tls: Option<(crate::security::TlsAcceptor, Arc<Gatekeeper>)>,
}

impl Operators {
    async fn serve(
        self,
        mut observed: crate::http::Observed,
        stop: impl Future<Output = ()> + Send + 'static,
    ) {
        // An HTTP failure must not take the lock service down with it.
        let failed = |e: &dyn std::fmt::Display| {
            tracing::error!(error = %e, "the metrics listener failed");
        };
        match self.tls {
            None => {
                let router = crate::http::router(Arc::new(observed));
                if let Err(e) = axum::serve(self.listener, router)
                    .with_graceful_shutdown(stop)
                    .await
                {
                    failed(&e);
                }
            }
            Some((acceptor, gatekeeper)) => {
                observed.access = Some(gatekeeper);
                let router = crate::http::router(Arc::new(observed));
                let served = tonic::transport::Server::builder()
                    .accept_http1(true)
                    .add_routes(router.into())
                    .serve_with_incoming_shutdown(
                        incoming(
                            Accepting::Tcp(self.listener),
                            self.limits,
                            self.counters,
                            Some(acceptor),
                        ),
                        stop,
                    )
                    .await;
                if let Err(e) = served {
                    failed(&e);
                }
            }
        }
    }
}
