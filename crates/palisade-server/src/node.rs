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
/// In phases: check what can be refused before the data directory is touched
/// (the membership, TLS, the policy), bind the listeners, open the storage,
/// start Raft (and bootstrap a fresh cluster), build the API, serve.
///
/// # Errors
/// See [`ServerError`].
pub async fn run_on(
    config: ServerConfig,
    io: Io,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serving: impl FnOnce() + Send,
) -> Result<(), ServerError> {
    let initial = initial_membership(&config)?;
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
    let listeners = Listeners::bind(&config, &io).await?;
    let storage = Storage::open(&config, &io)?;
    let node = Started::raft(&config, &io, storage, tls.as_ref(), &counters).await?;
    bootstrap(&node.raft, &config, initial).await?;
    let serve = Serve {
        config,
        io,
        tls,
        counters,
        gatekeeper,
    };
    serve.run(listeners, node, shutdown, serving).await
}

/// The membership a fresh data directory is bootstrapped with: the configured
/// cluster, or just this node; refused when this node is not in it.
fn initial_membership(config: &ServerConfig) -> Result<BTreeMap<NodeId, NodeAddr>, ServerError> {
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
    Ok(initial)
}

/// Binds `addr` with SO_REUSEADDR, as tokio's own `bind` sets it: a node
/// restarted at once after a crash must get its ports back despite
/// connections in TIME_WAIT.
fn bind_reusing(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServerError> {
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
}

/// A node's listeners, bound before its data directory is touched.
struct Listeners {
    client: Accepting,
    peer: Accepting,
    /// The operators' HTTP listener (`/metrics`, the status page).
    http: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(config: &ServerConfig, io: &Io) -> Result<Self, ServerError> {
        let listen = async |addr: SocketAddr| match &io.net {
            None => bind_reusing(addr).map(Accepting::Tcp),
            Some(net) => net
                .bind(addr)
                .await
                .map(Accepting::Net)
                .map_err(|source| ServerError::Bind { addr, source }),
        };
        Ok(Listeners {
            client: listen(config.listen).await?,
            peer: listen(config.listen_peer).await?,
            // The operators' HTTP listener is the operating system's only.
            http: match io.net {
                None => config.metrics_listen.map(bind_reusing).transpose()?,
                Some(_) => None,
            },
        })
    }
}

/// The data directory, opened: held locked until the node stops.
struct Storage {
    dir_lock: crate::store::dir_lock::DirLock,
    sm: StateMachineStore,
    log: LogStore,
    commit_clock: Arc<crate::commit_clock::CommitClock>,
}

impl Storage {
    fn open(config: &ServerConfig, io: &Io) -> Result<Self, ServerError> {
        // A second process on this directory is refused here, before anything
        // in it is read or written.
        let dir_lock = crate::store::dir_lock::DirLock::acquire_on(&config.data_dir, io)?;
        check_identity(config, io)?;
        let dir_err = |e: std::io::Error| ServerError::DataDir {
            dir: config.data_dir.clone(),
            why: e.to_string(),
        };
        let commit_clock = Arc::new(crate::commit_clock::CommitClock::default());
        // The state machine first: the log is made to agree with its snapshot.
        let sm = StateMachineStore::open_on(&config.data_dir, io)
            .map_err(dir_err)?
            .with_commit_clock(commit_clock.clone());
        let applied = *sm.shared().last_applied.read().expect("poisoned");
        let log = LogStore::open_beside(&config.data_dir, io, applied)
            .map_err(dir_err)?
            .with_commit_clock(commit_clock.clone());
        Ok(Storage {
            dir_lock,
            sm,
            log,
            commit_clock,
        })
    }
}

/// Raft started on the storage, with what the API and the operators' pages
/// read beside it.
struct Started {
    raft: Raft,
    shared: Arc<crate::store::sm::Shared>,
    /// The log's committed index.
    committed: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The log's last index.
    last_log: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Any entry in the log at startup may have been acknowledged before a
    /// crash (see `Api::linearize`).
    read_floor: (u64, u64),
    commit_clock: Arc<crate::commit_clock::CommitClock>,
    node_metrics: crate::metrics::NodeMetrics,
    _dir_lock: crate::store::dir_lock::DirLock,
}

impl Started {
    async fn raft(
        config: &ServerConfig,
        io: &Io,
        storage: Storage,
        tls: Option<&Tls>,
        counters: &Arc<Counters>,
    ) -> Result<Self, ServerError> {
        let Storage {
            dir_lock,
            sm,
            log,
            commit_clock,
        } = storage;
        let node_metrics = crate::metrics::NodeMetrics::new(
            &sm.counters(),
            commit_clock.histogram(),
            log.fsync_histogram(),
            counters,
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
        let (committed_log, last_log) = (log.clone(), log.clone());
        let read_floor = (log.vote_term(), log.last_index());
        let shared = sm.shared();
        let peers = PeerFactory {
            tls: tls.map(Tls::to_peers),
            io: io.clone(),
            source: config.id,
        };
        let raft = Raft::new(config.id, Arc::new(raft_config), peers, log, sm)
            .await
            .map_err(|e| ServerError::Raft(e.to_string()))?;
        Ok(Started {
            raft,
            shared,
            committed: Arc::new(move || committed_log.committed_index()),
            last_log: Arc::new(move || last_log.last_index()),
            read_floor,
            commit_clock,
            node_metrics,
            _dir_lock: dir_lock,
        })
    }
}

/// Initializes a fresh node of a static cluster with `initial`.
///
/// Every node of a static cluster may initialize with the same membership
/// (the first entry is identical everywhere), but each initialization starts
/// an election at once, and rival first-term candidates make the first leader
/// step down again. So the lowest id starts at once and the others only if no
/// leader has reached them within BOOTSTRAP_GRACE — the cluster still forms
/// while its lowest id is down.
async fn bootstrap(
    raft: &Raft,
    config: &ServerConfig,
    initial: BTreeMap<NodeId, NodeAddr>,
) -> Result<(), ServerError> {
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;
    if initialized || config.join {
        return Ok(());
    }
    let first = initial.keys().next() == Some(&config.id);
    let single = initial.len() == 1;
    let bootstrap = {
        let raft = raft.clone();
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
    if !first {
        tokio::spawn(bootstrap);
        return Ok(());
    }
    bootstrap.await;
    if single {
        // A single node elects itself at once, but openraft 0.10's initialize
        // returns before that election has run: wait for it, so that a fresh
        // node takes requests as soon as it serves.
        let _ = raft
            .wait(Some(BOOTSTRAP_GRACE))
            .current_leader(config.id, "the single node leads")
            .await;
    }
    Ok(())
}

/// What serving needs beside the started node.
struct Serve {
    config: ServerConfig,
    io: Io,
    tls: Option<Tls>,
    counters: Arc<Counters>,
    gatekeeper: Arc<Gatekeeper>,
}

impl Serve {
    /// Serves clients, peers and operators until `shutdown` (or until one of
    /// the listeners fails), then stops Raft.
    async fn run(
        self,
        listeners: Listeners,
        node: Started,
        shutdown: impl Future<Output = ()> + Send + 'static,
        serving: impl FnOnce() + Send,
    ) -> Result<(), ServerError> {
        let Serve {
            config,
            io,
            tls,
            counters,
            gatekeeper,
        } = self;
        let (api, status, keeper) = api(&node, &io, tls.as_ref(), &gatekeeper);
        let Started {
            raft,
            shared,
            committed,
            node_metrics,
            _dir_lock,
            ..
        } = node;
        tracing::debug!(id = config.id, listen = %config.listen, listen_peer = %config.listen_peer, tls = tls.is_some(), data_dir = %config.data_dir.display(), "palisade node serving");
        let limits = config.security.limits;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let clients = serve_clients(
            &api,
            gatekeeper.clone(),
            listeners.client,
            limits,
            counters.clone(),
            tls.as_ref(),
            stopped(stop_rx.clone()),
        );
        let peer_check = PeerCheck {
            tls: tls.is_some(),
            counters: counters.clone(),
        };
        let peers = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(CONNECTION_KEEPALIVE))
            .add_service(RaftService::new(raft.clone(), peer_check, status.clone()))
            .serve_with_incoming_shutdown(
                incoming(
                    listeners.peer,
                    limits,
                    counters.clone(),
                    tls.as_ref().map(Tls::peer_listener),
                ),
                stopped(stop_rx.clone()),
            );
        let http = listeners.http.map(|listener| {
            let observed = crate::http::Observed {
                raft: raft.clone(),
                shared,
                committed,
                metrics: node_metrics,
                status,
                access: None,
            };
            let tls = tls.as_ref().filter(|_| !config.metrics_open);
            let operators = Operators {
                listener,
                limits,
                counters,
                tls: tls.map(|tls| (tls.client_listener(), gatekeeper.clone())),
            };
            tokio::spawn(operators.serve(observed, stopped(stop_rx.clone())))
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
        // The data directory stays locked until Raft has stopped.
        drop(_dir_lock);
        clients.map_err(|source| ServerError::Serve {
            addr: config.listen,
            source,
        })?;
        peers.map_err(|source| ServerError::Serve {
            addr: config.listen_peer,
            source,
        })
    }
}

/// Serves gRPC and the HTTP/JSON API (docs/http.md) on the client listener:
/// they share its TLS, limits and gatekeeper; HTTP/1.1 is accepted for the
/// JSON calls.
fn serve_clients(
    api: &Api,
    gatekeeper: Arc<Gatekeeper>,
    listener: Accepting,
    limits: crate::security::conn::Limits,
    counters: Arc<Counters>,
    tls: Option<&Tls>,
    stopped: impl Future<Output = ()> + Send,
) -> impl Future<Output = Result<(), tonic::transport::Error>> {
    let routes = tonic::service::Routes::new(api.locks())
        .add_service(api.cluster())
        .into_axum_router()
        .merge(crate::json_api::router(api.clone()))
        .fallback(crate::json_api::unknown_path);
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(CONNECTION_KEEPALIVE))
        .accept_http1(true)
        .layer(tower::util::MapResponseLayer::new(
            crate::wire_errors::mark::<tonic::body::Body>,
        ))
        .layer(crate::security::gate::GateLayer(gatekeeper))
        .add_routes(routes.into())
        .serve_with_incoming_shutdown(
            incoming(listener, limits, counters, tls.map(Tls::client_listener)),
            stopped,
        )
}

/// HTTP/2 keep-alive pings on client and peer connections.
const CONNECTION_KEEPALIVE: Duration = Duration::from_secs(10);

/// The client API on a started node, the status source the peers' and
/// operators' listeners share, and the lease keeper's task.
fn api(
    node: &Started,
    io: &Io,
    tls: Option<&Tls>,
    gatekeeper: &Arc<Gatekeeper>,
) -> (
    Api,
    Arc<crate::status::StatusSource>,
    tokio::task::JoinHandle<()>,
) {
    let raft = &node.raft;
    let proposer = Proposer::start(raft.clone());
    let leases = LeaseKeeper::with_planted(
        raft.clone(),
        proposer.clone(),
        node.shared.clone(),
        io.planted,
        io.clock_rate,
    );
    let keeper = tokio::spawn(leases.clone().run());
    let status = Arc::new(crate::status::StatusSource::new(
        raft.clone(),
        node.shared.clone(),
        leases.clone(),
        node.committed.clone(),
        tls.map(Tls::to_peers),
        io.clone(),
    ));
    let api = Api::new(
        raft.clone(),
        proposer,
        node.shared.clone(),
        leases,
        node.committed.clone(),
        node.read_floor,
        gatekeeper.clone(),
    )
    .with_commit_clock(node.commit_clock.clone())
    .with_session_keys(io.session_keys.clone())
    .with_last_log_index(node.last_log.clone());
    (api, status, keeper)
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
