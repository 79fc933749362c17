//! The drill's world: real servers, a fault proxy on every client-server link,
//! client processes, and the history they produce.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_chaos::{Event, EventKind, History};
use palisade_client::{Admin, ClientConfig, TlsOptions};
use palisade_faultproxy::{FaultProxy, Link};
use palisade_fence::journal::{Journal, monotonic_us};
use palisade_testkit::{
    EtcdCluster, PalisadeNode, PostgresServer, RedisServer, ZooKeeperEnsemble, free_port,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use palisade_core::machine::Claim;

use super::worker::{Backend, Between, Command, CounterWrite, Report};

/// How many Redis servers a drill runs (Redlock's five).
pub const REDIS_NODES: usize = 5;
/// How many Palisade nodes a drill runs.
pub const PALISADE_NODES: u64 = 3;
/// How many ZooKeeper servers and etcd members a drill runs.
pub const ENSEMBLE_SIZE: usize = 3;
/// The longest any single worker command may take before the drill gives up.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A fenced object store process with its journal.
struct Store {
    addr: SocketAddr,
    journal: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Every server of the drills, started on first use and kept across trials.
pub struct Env {
    exe: PathBuf,
    /// With `--tls`: the drill's CA, node and client certificates.
    certs: Option<tempfile::TempDir>,
    redis: Vec<RedisServer>,
    nodes: Vec<PalisadeNode>,
    zookeeper: Option<ZooKeeperEnsemble>,
    etcd: Option<EtcdCluster>,
    postgres: Option<PostgresServer>,
    stores: HashMap<bool, Store>,
}

impl Env {
    /// No servers yet; `exe` is this binary (servers and workers are its
    /// subcommands). With `tls`, the Palisade cluster runs TLS on every link and
    /// the workers authenticate by certificate.
    pub fn new(tls: bool) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let certs = if tls {
            let dir = tempfile::tempdir()?;
            let out = std::process::Command::new(&exe)
                .args(["certs", "init"])
                .arg(dir.path())
                .args(["--nodes", &PALISADE_NODES.to_string(), "--clients", "drill"])
                .output()?;
            if !out.status.success() {
                bail!(
                    "palisade certs init: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Some(dir)
        } else {
            None
        };
        Ok(Env {
            exe,
            certs,
            redis: Vec::new(),
            nodes: Vec::new(),
            zookeeper: None,
            etcd: None,
            postgres: None,
            stores: HashMap::new(),
        })
    }

    /// Starts what `backend` and `fenced` need and is not running yet; restarts
    /// servers an earlier trial left down.
    pub async fn ensure(&mut self, backend: Backend, fenced: bool) -> Result<()> {
        match backend {
            Backend::Redis | Backend::Redlock => {
                if self.redis.is_empty() {
                    for _ in 0..REDIS_NODES {
                        self.redis.push(
                            RedisServer::start_with_clock_shift()
                                .context("starting redis-server (apt-get install redis-server)")?,
                        );
                    }
                }
                for r in &mut self.redis {
                    if r.pid().is_none() {
                        r.restart()?;
                    }
                    if let Some(clock) = r.clock() {
                        clock.set_ms(0)?;
                    }
                }
            }
            Backend::Palisade => {
                if self.nodes.is_empty() {
                    let certs = self.certs.as_ref().map(|d| d.path().to_owned());
                    self.nodes = PalisadeNode::cluster_with(&self.exe, PALISADE_NODES, |id| {
                        certs
                            .as_deref()
                            .map_or_else(Vec::new, |dir| node_tls_args(dir, id))
                    })?;
                }
                for n in &mut self.nodes {
                    if n.pid().is_none() {
                        n.start()?;
                    } else if let Some(pid) = n.pid() {
                        // A node a trial paused must not stay paused.
                        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                    }
                }
                self.wait_until_settled().await?;
            }
            Backend::Zookeeper => {
                if self.zookeeper.is_none() {
                    let zk =
                        tokio::task::block_in_place(|| ZooKeeperEnsemble::start(ENSEMBLE_SIZE))
                            .context("starting a ZooKeeper ensemble (apt-get install zookeeper)")?;
                    self.zookeeper = Some(zk);
                }
                self.revive(backend).await?;
            }
            Backend::Etcd => {
                if self.etcd.is_none() {
                    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(ENSEMBLE_SIZE))
                        .context("starting an etcd cluster (apt-get install etcd-server)")?;
                    self.etcd = Some(etcd);
                }
                self.revive(backend).await?;
            }
            Backend::Postgres => {
                if self.postgres.is_none() {
                    let pg = tokio::task::block_in_place(PostgresServer::start)
                        .context("starting PostgreSQL (apt-get install postgresql)")?;
                    self.postgres = Some(pg);
                }
                self.revive(backend).await?;
            }
        }
        if !self.stores.contains_key(&fenced) {
            let store = self.start_store(fenced).await?;
            self.stores.insert(fenced, store);
        }
        Ok(())
    }

    async fn start_store(&self, fenced: bool) -> Result<Store> {
        let dir = tempfile::tempdir()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let journal = dir.path().join("journal.jsonl");
        let child = tokio::process::Command::new(&self.exe)
            .args(["fence-store", "--listen", &addr.to_string()])
            .args(["--fencing", if fenced { "on" } else { "off" }])
            .arg("--data-dir")
            .arg(dir.path().join("objects"))
            .arg("--journal")
            .arg(&journal)
            .args(self.certs.as_ref().map_or_else(Vec::new, |d| {
                // The store's certificate: any of the CA's that names 127.0.0.1.
                let f = |n: &str| d.path().join(n).to_string_lossy().into_owned();
                vec![
                    "--tls-cert".into(),
                    f("node-1.pem"),
                    "--tls-key".into(),
                    f("node-1-key.pem"),
                ]
            }))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let started = std::time::Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("the fenced store did not start");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Store {
            addr,
            journal,
            child,
            _dir: dir,
        })
    }

    /// Waits until the Palisade cluster has a leader that answers.
    pub async fn wait_for_leader(&self) -> Result<u64> {
        let admin = Admin::new(&self.client_config(self.nodes.iter().map(|n| n.addr()))?)?;
        let started = std::time::Instant::now();
        loop {
            if let Ok(status) = admin.status().await
                && let Some(leader) = status.leader
            {
                return Ok(leader);
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("the Palisade cluster has no leader after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every node answers, all agree on one leader and term, and every
    /// node has applied what the leader had committed: a trial must start on a
    /// healthy cluster, not on one still catching up from the previous trial's
    /// faults (a lagging node cannot be elected, so a leader fault would then
    /// leave the cluster without a leader, which is a different drill).
    pub async fn wait_until_settled(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let admins = self
            .nodes
            .iter()
            .map(|n| Ok(Admin::new(&self.client_config([n.addr()])?)?))
            .collect::<Result<Vec<_>>>()?;
        let mut target = None;
        loop {
            let mut answers = Vec::new();
            for a in &admins {
                match tokio::time::timeout(Duration::from_secs(1), a.status()).await {
                    Ok(Ok(s)) => answers.push(s),
                    _ => break,
                }
            }
            if answers.len() == admins.len() {
                let first = &answers[0];
                let agreed = first.leader.is_some()
                    && answers
                        .iter()
                        .all(|s| s.leader == first.leader && s.term == first.term);
                if agreed {
                    let leader = answers.iter().find(|s| Some(s.id) == first.leader);
                    let committed = leader.map_or(u64::MAX, |l| l.commit_index);
                    let target = *target.get_or_insert(committed);
                    if answers.iter().all(|s| s.last_applied >= target) {
                        return Ok(());
                    }
                } else {
                    target = None;
                }
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("the Palisade cluster did not settle (one leader, all caught up) in 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client configuration for the drill's cluster (with its client
    /// certificate under `--tls`).
    fn client_config(&self, addrs: impl IntoIterator<Item = String>) -> Result<ClientConfig> {
        let mut config = ClientConfig::new(addrs);
        if let Some(dir) = &self.certs {
            let (ca, cert, key) = client_tls_files(dir.path());
            config.tls = Some(TlsOptions::from_files(&ca, Some((&cert, &key)))?);
        }
        Ok(config)
    }

    /// How many servers `backend` runs in a drill.
    pub fn server_count(backend: Backend) -> usize {
        match backend {
            Backend::Redis => 1,
            Backend::Redlock => REDIS_NODES,
            Backend::Palisade => PALISADE_NODES as usize,
            Backend::Zookeeper | Backend::Etcd => ENSEMBLE_SIZE,
            Backend::Postgres => 1,
        }
    }

    /// The client addresses (`127.0.0.1:PORT`) of `backend`'s servers.
    fn server_addrs(&self, backend: Backend) -> Vec<String> {
        match backend {
            Backend::Redis | Backend::Redlock => self
                .redis
                .iter()
                .map(|r| palisade_testkit::loopback(r.port()).to_string())
                .collect(),
            Backend::Palisade => self.nodes.iter().map(PalisadeNode::addr).collect(),
            Backend::Zookeeper => self
                .zookeeper
                .as_ref()
                .map_or_else(Vec::new, ZooKeeperEnsemble::endpoints),
            Backend::Etcd => self
                .etcd
                .as_ref()
                .map_or_else(Vec::new, EtcdCluster::endpoints),
            Backend::Postgres => self
                .postgres
                .iter()
                .map(|p| format!("{}:{}", p.host(), p.port()))
                .collect(),
        }
    }

    /// The index (0-based) of the server of a correctness-lock backend that
    /// leads (PostgreSQL's one server leads), waiting up to 60 s for one.
    pub async fn leader(&self, backend: Backend) -> Result<usize> {
        let started = std::time::Instant::now();
        loop {
            let found = match backend {
                Backend::Palisade => {
                    return Ok(usize::try_from(self.wait_for_leader().await? - 1)?);
                }
                Backend::Zookeeper => self
                    .zookeeper
                    .as_ref()
                    .and_then(|zk| tokio::task::block_in_place(|| zk.leader())),
                Backend::Etcd => self
                    .etcd
                    .as_ref()
                    .and_then(|e| tokio::task::block_in_place(|| e.leader())),
                Backend::Postgres => Some(0),
                Backend::Redis | Backend::Redlock => bail!("{} has no leader", backend.name()),
            };
            if let Some(i) = found {
                return Ok(i);
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{} has no leader after 60 s", backend.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9` of server `i` of a correctness-lock backend.
    pub fn kill_server(&mut self, backend: Backend, i: usize) {
        tokio::task::block_in_place(|| match backend {
            Backend::Palisade => self.nodes[i].kill(),
            Backend::Zookeeper => {
                if let Some(zk) = &mut self.zookeeper {
                    zk.kill(i);
                }
            }
            Backend::Etcd => {
                if let Some(e) = &mut self.etcd {
                    e.kill(i);
                }
            }
            Backend::Postgres => {
                if let Some(pg) = &mut self.postgres {
                    pg.kill9();
                }
            }
            Backend::Redis | Backend::Redlock => self.redis[i].kill(),
        });
    }

    /// Starts server `i` again (same ports, same data) after [`Env::kill_server`].
    pub fn start_server(&mut self, backend: Backend, i: usize) -> Result<()> {
        tokio::task::block_in_place(|| -> std::io::Result<()> {
            match backend {
                Backend::Palisade => self.nodes[i].start(),
                Backend::Zookeeper => match &mut self.zookeeper {
                    Some(zk) => zk.start_server(i),
                    None => Ok(()),
                },
                Backend::Etcd => match &mut self.etcd {
                    Some(e) => e.start_member(i),
                    None => Ok(()),
                },
                Backend::Postgres => match &mut self.postgres {
                    Some(pg) => pg.restart(),
                    None => Ok(()),
                },
                Backend::Redis | Backend::Redlock => self.redis[i].restart(),
            }
        })?;
        Ok(())
    }

    /// The process id of server `i`, for pausing it (`None` when it is down, or
    /// for PostgreSQL, whose sessions run in processes of their own: stopping the
    /// postmaster would not stop them).
    pub fn server_pid(&self, backend: Backend, i: usize) -> Option<u32> {
        match backend {
            Backend::Palisade => self.nodes[i].pid(),
            Backend::Zookeeper => self.zookeeper.as_ref().and_then(|zk| zk.pid(i)),
            Backend::Etcd => self.etcd.as_ref().and_then(|e| e.members()[i].pid()),
            Backend::Postgres => None,
            Backend::Redis | Backend::Redlock => self.redis[i].pid(),
        }
    }

    /// Brings every server of `backend` back (restarts the killed, continues
    /// the paused) and waits until it serves with a leader.
    async fn revive(&mut self, backend: Backend) -> Result<()> {
        for i in 0..Self::server_count(backend) {
            let running = match backend {
                Backend::Zookeeper => self.zookeeper.as_ref().is_some_and(|z| z.is_running(i)),
                Backend::Etcd => self.etcd.as_ref().is_some_and(|e| e.is_running(i)),
                Backend::Postgres => self
                    .postgres
                    .as_ref()
                    .is_some_and(PostgresServer::is_running),
                _ => true,
            };
            if !running {
                self.start_server(backend, i)?;
            } else if let Some(pid) = self.server_pid(backend, i) {
                // A server a trial paused must not stay paused.
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            }
        }
        // A trial must start on a healthy ensemble: every server answering, one
        // leader (an election still running would make a different drill).
        let started = std::time::Instant::now();
        loop {
            let healthy = tokio::task::block_in_place(|| match backend {
                Backend::Zookeeper => self.zookeeper.as_ref().is_some_and(|zk| {
                    let modes: Vec<_> = (0..zk.len()).map(|i| zk.mode(i)).collect();
                    modes.iter().all(Option::is_some)
                        && modes
                            .iter()
                            .filter(|m| m.as_deref() == Some("leader"))
                            .count()
                            == 1
                }),
                Backend::Etcd => self.etcd.as_ref().is_some_and(|e| {
                    let answers: Vec<_> = (0..ENSEMBLE_SIZE).map(|i| e.is_leader(i)).collect();
                    answers.iter().all(Option::is_some)
                        && answers.iter().filter(|a| **a == Some(true)).count() == 1
                }),
                _ => true,
            });
            if healthy {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{} did not become healthy in 60 s", backend.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The Redis servers (index 0 is "redis 1").
    pub fn redis(&mut self) -> &mut [RedisServer] {
        &mut self.redis
    }

    /// Stops everything.
    pub async fn shutdown(&mut self) {
        for (_, mut s) in self.stores.drain() {
            let _ = s.child.kill().await;
        }
        if let Some(dir) = std::env::var_os("PALISADE_CHAOS_WORKER_LOGS") {
            for node in &self.nodes {
                let path = Path::new(&dir).join(format!("node-{}.log", node.id()));
                let _ = std::fs::write(path, node.log());
            }
        }
        self.nodes.clear();
        self.redis.clear();
        let (zk, etcd, pg) = (
            self.zookeeper.take(),
            self.etcd.take(),
            self.postgres.take(),
        );
        tokio::task::block_in_place(move || drop((zk, etcd, pg)));
    }
}

/// One run of one scenario: its workers, its history, its faults.
pub struct Trial {
    /// The scenario.
    pub scenario: &'static str,
    /// The variant ("" when none).
    pub variant: &'static str,
    /// The backend.
    pub backend: Backend,
    /// Whether the store checks tokens.
    pub fenced: bool,
    /// The seed.
    pub seed: u64,
    /// The lock this trial contends for (unique per trial).
    pub lock: String,
    /// The counter's key in the store (unique per trial).
    pub key: String,
    /// The lease (Redis TTL, Palisade session TTL).
    pub ttl: Duration,
    start_us: u64,
    events: Arc<Mutex<Vec<Event>>>,
    notes: Vec<String>,
    exe: PathBuf,
    store: SocketAddr,
    journal: PathBuf,
    redis_urls: Vec<SocketAddr>,
    /// The lock servers' client addresses, direct (not proxied).
    servers: Vec<String>,
    /// PostgreSQL: the user in the backend URL.
    pg_user: Option<String>,
    certs: Option<PathBuf>,
}

/// Options of one worker process.
#[derive(Default, Clone)]
pub struct WorkerOptions {
    /// Redlock's per-node timeout.
    pub node_timeout: Option<Duration>,
    /// Redlock's delayed-restart rule.
    pub min_uptime: Option<Duration>,
}

impl Trial {
    /// A trial over the servers of `env` (which must be `ensure`d).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        env: &mut Env,
        scenario: &'static str,
        variant: &'static str,
        backend: Backend,
        fenced: bool,
        seed: u64,
        number: usize,
        ttl: Duration,
    ) -> Result<Trial> {
        let store = env
            .stores
            .get(&fenced)
            .ok_or_else(|| anyhow!("no store for fencing {fenced}"))?;
        let tag = format!(
            "{scenario}{}{variant}-{}-{}-{number}-{seed}",
            if variant.is_empty() { "" } else { "-" },
            backend.name(),
            if fenced { "fenced" } else { "unfenced" }
        );
        Ok(Trial {
            scenario,
            variant,
            backend,
            fenced,
            seed,
            lock: format!("drill-{tag}"),
            key: format!("drill/{tag}/counter"),
            ttl,
            start_us: monotonic_us(),
            events: Arc::new(Mutex::new(Vec::new())),
            notes: Vec::new(),
            exe: env.exe.clone(),
            store: store.addr,
            journal: store.journal.clone(),
            redis_urls: env
                .redis
                .iter()
                .map(|r| palisade_testkit::loopback(r.port()))
                .collect(),
            servers: env.server_addrs(backend),
            pg_user: env.postgres.as_ref().map(|p| p.user().to_owned()),
            certs: env.certs.as_ref().map(|d| d.path().to_owned()),
        })
    }

    /// Records a fault the harness injected (drawn on the timeline).
    pub fn fault(&self, what: impl Into<String>) {
        self.push(0, monotonic_us(), EventKind::Fault { what: what.into() });
    }

    /// Adds a sentence to the report about this trial.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    fn push(&self, client: u32, at_us: u64, kind: EventKind) {
        let event = Event {
            at_us: at_us.saturating_sub(self.start_us),
            client,
            kind,
        };
        self.events.lock().expect("poisoned").push(event);
    }

    /// Starts client `n` with its own proxy on every link.
    pub async fn worker(&self, n: u32, options: WorkerOptions) -> Result<Worker> {
        let mut proxies = Vec::new();
        let mut servers = Vec::new();
        let mut address_map = Vec::new();
        match self.backend {
            Backend::Redis | Backend::Redlock => {
                let count = if self.backend == Backend::Redis {
                    1
                } else {
                    REDIS_NODES
                };
                for addr in &self.redis_urls[..count] {
                    let p = FaultProxy::start(*addr).await?;
                    servers.push(format!("redis://{}", p.addr()));
                    proxies.push(p);
                }
            }
            _ => {
                for addr in &self.servers {
                    let p = FaultProxy::start(addr.parse()?).await?;
                    servers.push(p.addr().to_string());
                    if self.backend == Backend::Palisade {
                        address_map.push(format!("{addr}={}", p.addr()));
                    }
                    proxies.push(p);
                }
            }
        }
        let url = match self.backend {
            Backend::Redis | Backend::Redlock => None,
            Backend::Palisade => Some(format!("palisade://{}", servers.join(","))),
            Backend::Zookeeper => Some(format!("zk://{}", servers.join(","))),
            Backend::Etcd => Some(format!("etcd://{}", servers.join(","))),
            Backend::Postgres => Some(format!(
                "postgres://{}@{}/postgres",
                self.pg_user.as_deref().unwrap_or("postgres"),
                servers.join(",")
            )),
        };
        let store_proxy = FaultProxy::start(self.store).await?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.arg("chaos-worker")
            .args(["--client", &n.to_string()])
            .args(["--backend", self.backend.name()])
            .args(match &url {
                Some(url) => ["--url".to_owned(), url.clone()],
                None => ["--servers".to_owned(), servers.join(",")],
            })
            .args(["--store", &store_proxy.addr().to_string()])
            .args(["--ttl-ms", &self.ttl.as_millis().to_string()]);
        if !address_map.is_empty() {
            cmd.args(["--address-map", &address_map.join(",")]);
        }
        if let Some(dir) = &self.certs {
            let (ca, cert, key) = client_tls_files(dir);
            cmd.arg("--ca").arg(ca);
            if self.backend == Backend::Palisade {
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
        }
        if self.fenced {
            cmd.arg("--fenced");
        }
        if let Some(t) = options.node_timeout {
            cmd.args(["--node-timeout-ms", &t.as_millis().to_string()]);
        }
        if let Some(t) = options.min_uptime {
            cmd.args(["--min-uptime-ms", &t.as_millis().to_string()]);
        }
        // For debugging a drill: PALISADE_CHAOS_WORKER_LOGS=DIR keeps each
        // worker's log (PALISADE_LOG sets its level) in DIR/worker-N.log.
        let stderr = match std::env::var_os("PALISADE_CHAOS_WORKER_LOGS") {
            Some(dir) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(Path::new(&dir).join(format!("worker-{n}.log")))?,
            ),
            None => Stdio::null(),
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let (tx, rx) = mpsc::unbounded_channel();
        let events = self.events.clone();
        let start_us = self.start_us;
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Report>(&line) {
                    Ok(Report::Event { at_us, mut kind }) => {
                        if let EventKind::AcquireOk { valid_until_us, .. } = &mut kind {
                            *valid_until_us = valid_until_us.map(|v| v.saturating_sub(start_us));
                        }
                        events.lock().expect("poisoned").push(Event {
                            at_us: at_us.saturating_sub(start_us),
                            client: n,
                            kind,
                        });
                    }
                    Ok(other) => {
                        let _ = tx.send(other);
                    }
                    Err(_) => tracing::warn!(client = n, %line, "unreadable worker line"),
                }
            }
        });
        Ok(Worker {
            n,
            pid: Pid::from_raw(child.id().context("worker pid")? as i32),
            child,
            stdin,
            replies: rx,
            proxies,
            store_proxy,
        })
    }

    /// The history so far, with the store's journal for this trial's key (and
    /// its permits' slot keys, `KEY/slot-N`) merged in as `Write` events,
    /// sorted by time.
    pub fn history(&self) -> Result<History> {
        let mut events = self.events.lock().expect("poisoned").clone();
        let slot_keys = format!("{}/slot-", self.key);
        for entry in Journal::read_all(&self.journal)? {
            let ours = entry.key == self.key || entry.key.starts_with(&slot_keys);
            if !ours || entry.op != "put" {
                continue;
            }
            let Some(body) = entry.body.as_deref() else {
                continue;
            };
            let Ok(write) = serde_json::from_str::<CounterWrite>(body) else {
                continue;
            };
            events.push(Event {
                at_us: entry.at_us.saturating_sub(self.start_us),
                client: write.client,
                kind: EventKind::Write {
                    lock: write.lock,
                    resource: entry.key.clone(),
                    token: (self.fenced && self.backend.has_tokens()).then_some(entry.token),
                    accepted: entry.accepted,
                    read: write.read,
                    wrote: write.wrote,
                },
            });
        }
        events.sort_by_key(|e| e.at_us);
        Ok(History {
            scenario: self.scenario.into(),
            variant: self.variant.into(),
            backend: self.backend.name().into(),
            fencing: self.fenced,
            seed: self.seed,
            events,
        })
    }

    /// The notes added with [`Trial::note`].
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The Redis server addresses (direct, not proxied), for the harness's probes.
    pub fn redis_addr(&self, i: usize) -> SocketAddr {
        self.redis_urls[i]
    }
}

/// A client process of a trial.
pub struct Worker {
    /// Its number.
    pub n: u32,
    pid: Pid,
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::UnboundedReceiver<Report>,
    proxies: Vec<FaultProxy>,
    store_proxy: FaultProxy,
}

/// A finished command: whether it did what was asked, and what it said.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Success.
    pub ok: bool,
    /// In words.
    pub detail: String,
}

impl Worker {
    async fn send(&mut self, command: &Command) -> Result<()> {
        let mut line = serde_json::to_vec(command)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .await
            .with_context(|| format!("client {} is gone", self.n))
    }

    async fn next_reply(&mut self) -> Result<Report> {
        tokio::time::timeout(COMMAND_TIMEOUT, self.replies.recv())
            .await
            .map_err(|_| anyhow!("client {} did not answer within 60 s", self.n))?
            .ok_or_else(|| anyhow!("client {} exited", self.n))
    }

    /// Waits for the current command to finish.
    pub async fn outcome(&mut self) -> Result<Outcome> {
        loop {
            if let Report::Done { ok, detail } = self.next_reply().await? {
                return Ok(Outcome { ok, detail });
            }
        }
    }

    /// Sends an acquire without waiting for it to finish (see [`Worker::outcome`]).
    pub async fn start_acquire(&mut self, lock: &str, wait: Duration) -> Result<()> {
        self.start_claim(lock, Claim::Lock, wait).await
    }

    /// Sends an acquire of `claim` (a recipe) without waiting for it to finish.
    pub async fn start_claim(&mut self, lock: &str, claim: Claim, wait: Duration) -> Result<()> {
        self.send(&Command::Acquire {
            lock: lock.into(),
            wait_ms: wait.as_millis() as u64,
            claim,
        })
        .await
    }

    /// Claims `claim` on `lock`, with the worker's account of a failure.
    pub async fn try_claim(&mut self, lock: &str, claim: Claim, wait: Duration) -> Result<Outcome> {
        self.start_claim(lock, claim, wait).await?;
        self.outcome().await
    }

    /// Acquires; `true` when granted.
    pub async fn acquire(&mut self, lock: &str, wait: Duration) -> Result<bool> {
        Ok(self.try_acquire(lock, wait).await?.ok)
    }

    /// Acquires, with the worker's account of a failure.
    pub async fn try_acquire(&mut self, lock: &str, wait: Duration) -> Result<Outcome> {
        self.start_acquire(lock, wait).await?;
        self.outcome().await
    }

    /// Increments the counter under the held lock.
    pub async fn increment(&mut self, key: &str) -> Result<Outcome> {
        self.start_increment(key, Between::Nothing).await?;
        self.outcome().await
    }

    /// Starts an increment; with [`Between::Stop`] or [`Between::Hold`] returns
    /// once the worker has read the counter and stopped (or is waiting for
    /// [`Worker::go`]). `Ok(None)` then; `Ok(Some(outcome))` when it finished
    /// without getting there (no lease left).
    pub async fn start_increment(
        &mut self,
        key: &str,
        between: Between,
    ) -> Result<Option<Outcome>> {
        self.send(&Command::Increment {
            key: key.into(),
            between,
        })
        .await?;
        if between == Between::Nothing {
            return Ok(None);
        }
        loop {
            match self.next_reply().await? {
                Report::Done { ok, detail } => return Ok(Some(Outcome { ok, detail })),
                Report::Pausing => {
                    self.wait_stopped().await?;
                    return Ok(None);
                }
                Report::Ready => return Ok(None),
                Report::Event { .. } => {}
            }
        }
    }

    /// Lets a held increment ([`Between::Hold`]) send its write.
    pub async fn go(&mut self) -> Result<()> {
        self.stdin
            .write_all(b"go\n")
            .await
            .with_context(|| format!("client {} is gone", self.n))
    }

    /// Releases the held lock.
    pub async fn release(&mut self) -> Result<Outcome> {
        self.send(&Command::Release).await?;
        self.outcome().await
    }

    /// Stops the process (SIGSTOP) and waits until the kernel reports it stopped.
    pub async fn pause(&mut self) -> Result<()> {
        kill(self.pid, Signal::SIGSTOP)?;
        self.wait_stopped().await
    }

    /// Continues the process (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        kill(self.pid, Signal::SIGCONT)?;
        Ok(())
    }

    async fn wait_stopped(&self) -> Result<()> {
        let stat = format!("/proc/{}/stat", self.pid);
        for _ in 0..6000 {
            if process_state(Path::new(&stat)) == Some('T') {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        bail!("client {} did not stop", self.n)
    }

    /// The process id (for pausing it from elsewhere).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The links from this client to the lock servers (Redis 1‥5, or server
    /// 1‥N of the correctness-lock backend, in order).
    pub fn lock_links(&self) -> Vec<Arc<Link>> {
        self.proxies.iter().map(|p| p.link().clone()).collect()
    }

    /// The link from this client to the store.
    pub fn store_link(&self) -> Arc<Link> {
        self.store_proxy.link().clone()
    }

    /// Heals every link of this client.
    pub fn heal_all(&self) {
        for l in self.lock_links() {
            l.heal();
        }
        self.store_link().heal();
    }

    /// Ends the process: continues it if stopped, asks it to exit, kills it if it
    /// does not.
    pub async fn finish(mut self) {
        let _ = kill(self.pid, Signal::SIGCONT);
        self.heal_all();
        let _ = self.send(&Command::Exit).await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T` for stopped, …).
fn process_state(stat: &Path) -> Option<char> {
    let text = std::fs::read_to_string(stat).ok()?;
    // The command name is in parentheses and may contain spaces; the state follows.
    let after = &text[text.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// `serve`'s TLS flags for node `id`, certificates from `palisade certs init DIR`.
fn node_tls_args(dir: &Path, id: u64) -> Vec<String> {
    let file = |name: String| dir.join(name).to_string_lossy().into_owned();
    vec![
        "--tls-cert".into(),
        file(format!("node-{id}.pem")),
        "--tls-key".into(),
        file(format!("node-{id}-key.pem")),
        "--tls-ca".into(),
        file("ca.pem".into()),
    ]
}

/// The CA, certificate and key of the drill's client.
fn client_tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("ca.pem"),
        dir.join("client-drill.pem"),
        dir.join("client-drill-key.pem"),
    )
}
