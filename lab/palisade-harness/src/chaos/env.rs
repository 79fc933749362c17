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
use palisade_faultproxy::{FaultProxy, Link};
use palisade_fence::journal::{Journal, monotonic_us};
use palisade_testkit::servers::{Launch, Servers, UrlFor, client_tls_files};
use palisade_testkit::{RedisServer, free_port};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use palisade_core::machine::Claim;

use super::worker::{Backend, Between, Command, CounterWrite, Report};

/// How many Redis servers a drill runs (Redlock's five).
pub const REDIS_NODES: usize = 5;
/// How many servers a replicated correctness backend runs in a drill
/// (Palisade nodes, ZooKeeper servers, etcd members).
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
    /// Each correctness backend's servers, by [`Backend::Fenced`] index.
    fenced: HashMap<usize, Box<dyn Servers>>,
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
                .args(["--nodes", &ENSEMBLE_SIZE.to_string(), "--clients", "drill"])
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
            fenced: HashMap::new(),
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
            Backend::Fenced(i) => {
                if !self.fenced.contains_key(&i) {
                    let name = backend.name();
                    let launcher = palisade_testkit::servers::launcher(name)
                        .with_context(|| format!("no testkit launcher for {name}"))?;
                    let launch = Launch {
                        exe: self.exe.clone(),
                        // A launcher of a backend with one server (PostgreSQL)
                        // starts one.
                        servers: ENSEMBLE_SIZE,
                        certs: self.certs.as_ref().map(|d| d.path().to_owned()),
                    };
                    let servers = tokio::task::block_in_place(|| (launcher.start)(&launch))
                        .with_context(|| {
                            format!("starting {name} (apt-get install {})", launcher.package)
                        })?;
                    self.fenced.insert(i, servers);
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

    /// The servers of a correctness backend ([`Env::ensure`]d).
    fn servers(&self, backend: Backend) -> Result<&dyn Servers> {
        match backend {
            Backend::Fenced(i) => self
                .fenced
                .get(&i)
                .map(Box::as_ref)
                .with_context(|| format!("{} is not started", backend.name())),
            Backend::Redis | Backend::Redlock => {
                bail!("{} is drilled through env.redis()", backend.name())
            }
        }
    }

    fn servers_mut(&mut self, backend: Backend) -> Option<&mut Box<dyn Servers>> {
        match backend {
            Backend::Fenced(i) => self.fenced.get_mut(&i),
            Backend::Redis | Backend::Redlock => None,
        }
    }

    /// How many servers `backend` runs in this drill ([`Env::ensure`]d).
    pub fn server_count(&self, backend: Backend) -> usize {
        match backend {
            Backend::Redis => 1,
            Backend::Redlock => REDIS_NODES,
            Backend::Fenced(_) => self.servers(backend).map_or(0, |s| s.len()),
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
            Backend::Fenced(_) => self
                .servers(backend)
                .map_or_else(|_| Vec::new(), |s| s.addrs()),
        }
    }

    /// The index (0-based) of the server of a correctness-lock backend that
    /// leads (a single server leads), waiting up to 60 s for one.
    pub async fn leader(&self, backend: Backend) -> Result<usize> {
        let servers = self.servers(backend)?;
        let started = std::time::Instant::now();
        loop {
            if let Some(i) = servers.leader().await {
                return Ok(i);
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{} has no leader after 60 s", backend.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9` of server `i`.
    pub fn kill_server(&mut self, backend: Backend, i: usize) {
        tokio::task::block_in_place(|| match self.servers_mut(backend) {
            Some(servers) => servers.kill(i),
            None => self.redis[i].kill(),
        });
    }

    /// Starts server `i` again (same ports, same data) after [`Env::kill_server`].
    pub fn start_server(&mut self, backend: Backend, i: usize) -> Result<()> {
        tokio::task::block_in_place(|| match self.servers_mut(backend) {
            Some(servers) => servers.start(i),
            None => self.redis[i].restart(),
        })?;
        Ok(())
    }

    /// The process id of server `i`, for pausing it (`None` when it is down, or
    /// when stopping one process would not pause it: PostgreSQL's sessions run
    /// in processes of their own).
    pub fn server_pid(&self, backend: Backend, i: usize) -> Option<u32> {
        match backend {
            Backend::Redis | Backend::Redlock => self.redis[i].pid(),
            Backend::Fenced(_) => self.servers(backend).ok()?.pid(i),
        }
    }

    /// Brings every server of `backend` back (restarts the killed, continues
    /// the paused) and waits until it is healthy: a trial must start on every
    /// server answering with one leader, all caught up (an election still
    /// running, or a node still catching up from the previous trial's
    /// faults, would make a different drill).
    async fn revive(&mut self, backend: Backend) -> Result<()> {
        for i in 0..self.servers(backend)?.len() {
            if !self.servers(backend)?.is_running(i) {
                self.start_server(backend, i)?;
            } else if let Some(pid) = self.server_pid(backend, i) {
                // A server a trial paused must not stay paused.
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            }
        }
        let servers = self.servers(backend)?;
        let started = std::time::Instant::now();
        while !servers.healthy().await {
            if started.elapsed() > Duration::from_secs(60) {
                bail!(
                    "{} did not become healthy (one leader, all caught up) in 60 s",
                    backend.name()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
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
            for servers in self.fenced.values() {
                for (file, log) in servers.logs() {
                    let _ = std::fs::write(Path::new(&dir).join(file), log);
                }
            }
        }
        self.redis.clear();
        let fenced = std::mem::take(&mut self.fenced);
        tokio::task::block_in_place(move || drop(fenced));
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
    /// A correctness backend's URL over (proxied) addresses.
    url_for: Option<UrlFor>,
    /// Whether a worker maps the servers' advertised addresses to its
    /// proxies.
    maps_addresses: bool,
    /// Whether, under `--tls`, a worker authenticates to the servers by
    /// certificate.
    client_certificate: bool,
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
            url_for: env.servers(backend).ok().map(Servers::url_for),
            maps_addresses: env
                .servers(backend)
                .is_ok_and(Servers::advertises_addresses),
            client_certificate: env
                .servers(backend)
                .is_ok_and(Servers::takes_client_certificate),
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
            Backend::Fenced(_) => {
                for addr in &self.servers {
                    let p = FaultProxy::start(addr.parse()?).await?;
                    servers.push(p.addr().to_string());
                    if self.maps_addresses {
                        address_map.push(format!("{addr}={}", p.addr()));
                    }
                    proxies.push(p);
                }
            }
        }
        let url = self.url_for.as_ref().map(|url_for| url_for(&servers));
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
            if self.client_certificate {
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
