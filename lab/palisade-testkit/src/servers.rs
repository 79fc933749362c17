//! One shape for every correctness backend's servers, so the drills and the
//! benchmarks start, kill, pause and restart them without knowing which
//! backend they drive: [`Servers`], and the [`LAUNCHERS`] that start them, one
//! per backend of `palisade_backends::REGISTRY` (by its descriptor's name).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use crate::{EtcdCluster, PalisadeNode, PostgresServer, ZooKeeperEnsemble};

/// A future the [`Servers`] answer with.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Makes a backend URL from the addresses its servers are reached at.
pub type UrlFor = std::sync::Arc<dyn Fn(&[String]) -> String + Send + Sync>;

/// What a launcher is asked to start.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The `palisade` binary (Palisade's nodes are its `serve`).
    pub exe: PathBuf,
    /// How many servers (members, nodes).
    pub servers: usize,
    /// A `palisade certs init` directory: the servers run TLS with its
    /// certificates where the backend's launcher supports it.
    pub certs: Option<PathBuf>,
}

/// A running set of one backend's servers; all stopped when dropped.
pub trait Servers: Send + Sync {
    /// How many servers.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each server's client address (`HOST:PORT`), in order.
    fn addrs(&self) -> Vec<String>;

    /// Makes the backend URL for clients that reach the servers at the
    /// addresses given (the servers' own, or proxies in front of them, in
    /// order); it owns what it needs.
    fn url_for(&self) -> UrlFor;

    /// The backend URL for clients that reach the servers directly.
    fn url(&self) -> String {
        (self.url_for())(&self.addrs())
    }

    /// `kill -9` of server `i`.
    fn kill(&mut self, i: usize);

    /// Starts server `i` again (same ports, same data).
    ///
    /// # Errors
    /// When it does not come up.
    fn start(&mut self, i: usize) -> std::io::Result<()>;

    /// Whether server `i`'s process runs.
    fn is_running(&self, i: usize) -> bool;

    /// The process to stop (`SIGSTOP`) to pause server `i`; `None` when it
    /// is down, or when stopping one process would not pause the server
    /// (PostgreSQL's sessions run in processes of their own).
    fn pid(&self, i: usize) -> Option<u32>;

    /// The server that leads now (a single server leads), if one does.
    fn leader(&self) -> Answer<'_, Option<usize>>;

    /// Every server answers and exactly one leads, all caught up: what a
    /// drill's trial must start on.
    fn healthy(&self) -> Answer<'_, bool>;

    /// Whether a client behind proxies must map the addresses the servers
    /// advertise (a follower names its leader) to the proxies.
    fn advertises_addresses(&self) -> bool {
        false
    }

    /// Whether, with [`Launch::certs`], clients authenticate to these
    /// servers with the certificates' client identity.
    fn takes_client_certificate(&self) -> bool {
        false
    }

    /// The servers' logs, by file name, for keeping a drill's story.
    fn logs(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// How to start one backend's servers.
pub struct Launcher {
    /// The backend's descriptor name (`palisade_backends::REGISTRY`).
    pub backend: &'static str,
    /// What to install when its server binaries are missing.
    pub package: &'static str,
    /// Whether stopping one process (`SIGSTOP`) pauses one server.
    pub pausable: bool,
    /// What `palisade bench lock` measures of it by default: how many
    /// servers, and what its URL adds.
    pub bench: &'static [(usize, &'static str)],
    /// Starts them.
    pub start: fn(&Launch) -> std::io::Result<Box<dyn Servers>>,
}

/// One launcher per correctness backend, in report order.
pub static LAUNCHERS: &[Launcher] = &[
    Launcher {
        backend: "palisade",
        package: "the palisade binary",
        pausable: true,
        bench: &[(1, ""), (3, "")],
        start: |l| Ok(Box::new(PalisadeCluster::start(l)?)),
    },
    Launcher {
        backend: "zookeeper",
        package: "zookeeper",
        pausable: true,
        bench: &[(1, ""), (3, "")],
        start: |l| Ok(Box::new(ZooKeeperEnsemble::start(l.servers)?)),
    },
    Launcher {
        backend: "etcd",
        package: "etcd-server",
        pausable: true,
        bench: &[(3, "")],
        start: |l| Ok(Box::new(EtcdCluster::start(l.servers)?)),
    },
    Launcher {
        backend: "postgres",
        package: "postgresql",
        // Its sessions run in processes of their own: stopping the
        // postmaster would not pause the server.
        pausable: false,
        // Waiters woken by `NOTIFY`, and polling only, as behind a pooler
        // that cannot `LISTEN`.
        bench: &[(1, ""), (1, "?palisade_wait=poll")],
        start: |_| Ok(Box::new(PostgresServer::start()?)),
    },
];

/// The launcher of the backend called `name`.
pub fn launcher(name: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().find(|l| l.backend == name)
}

/// Palisade nodes forming one cluster, with TLS on every link when launched
/// with certificates.
pub struct PalisadeCluster {
    nodes: Vec<PalisadeNode>,
    certs: Option<PathBuf>,
}

impl PalisadeCluster {
    /// Starts `launch.servers` nodes.
    ///
    /// # Errors
    /// When a node does not start.
    pub fn start(launch: &Launch) -> std::io::Result<Self> {
        let certs = launch.certs.clone();
        let nodes = PalisadeNode::cluster_with(&launch.exe, launch.servers as u64, |id| {
            certs
                .as_deref()
                .map_or_else(Vec::new, |dir| node_tls_args(dir, id))
        })?;
        Ok(PalisadeCluster { nodes, certs })
    }

    /// An admin client for the nodes at `addrs` (with the client certificate
    /// under TLS).
    fn admin(&self, addrs: Vec<String>) -> Option<palisade_client::Admin> {
        let mut config = palisade_client::ClientConfig::new(addrs);
        if let Some(dir) = &self.certs {
            let (ca, cert, key) = client_tls_files(dir);
            config.tls = palisade_client::TlsOptions::from_files(&ca, Some((&cert, &key))).ok();
        }
        palisade_client::Admin::new(&config).ok()
    }
}

impl Servers for PalisadeCluster {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(PalisadeNode::addr).collect()
    }

    fn url_for(&self) -> UrlFor {
        std::sync::Arc::new(|addrs| format!("palisade://{}", addrs.join(",")))
    }

    fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    fn start(&mut self, i: usize) -> std::io::Result<()> {
        self.nodes[i].start()
    }

    fn is_running(&self, i: usize) -> bool {
        self.nodes[i].is_running()
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    fn leader(&self) -> Answer<'_, Option<usize>> {
        Box::pin(async move {
            let admin = self.admin(self.addrs())?;
            let leader = admin.status().await.ok()?.leader?;
            usize::try_from(leader.checked_sub(1)?).ok()
        })
    }

    /// Every node answers, all agree on one leader and term, and every node
    /// has applied what the leader had committed (a lagging node cannot be
    /// elected, so a leader fault would then leave the cluster without one,
    /// which is a different drill).
    fn healthy(&self) -> Answer<'_, bool> {
        Box::pin(async move {
            let mut answers = Vec::new();
            for addr in self.addrs() {
                let Some(admin) = self.admin(vec![addr]) else {
                    return false;
                };
                match tokio::time::timeout(Duration::from_secs(1), admin.status()).await {
                    Ok(Ok(s)) => answers.push(s),
                    _ => return false,
                }
            }
            let Some(first) = answers.first() else {
                return false;
            };
            if first.leader.is_none()
                || !answers
                    .iter()
                    .all(|s| s.leader == first.leader && s.term == first.term)
            {
                return false;
            }
            let committed = answers
                .iter()
                .find(|s| Some(s.id) == first.leader)
                .map_or(u64::MAX, |l| l.commit_index);
            answers.iter().all(|s| s.last_applied >= committed)
        })
    }

    fn advertises_addresses(&self) -> bool {
        true
    }

    fn takes_client_certificate(&self) -> bool {
        true
    }

    fn logs(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|n| (format!("node-{}.log", n.id()), n.log()))
            .collect()
    }
}

/// A node's `serve` flags for TLS with the certificates of `palisade certs
/// init DIR --nodes N`.
pub fn node_tls_args(dir: &Path, id: u64) -> Vec<String> {
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

/// The CA, certificate and key of the client `drill` of `palisade certs init
/// DIR --clients drill`.
pub fn client_tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("ca.pem"),
        dir.join("client-drill.pem"),
        dir.join("client-drill-key.pem"),
    )
}

/// Runs a blocking look at the servers off the runtime's async threads.
fn blocking<T>(look: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(look),
        Err(_) => look(),
    }
}

impl Servers for ZooKeeperEnsemble {
    fn len(&self) -> usize {
        ZooKeeperEnsemble::len(self)
    }

    fn addrs(&self) -> Vec<String> {
        self.endpoints()
    }

    fn url_for(&self) -> UrlFor {
        std::sync::Arc::new(|addrs| format!("zk://{}", addrs.join(",")))
    }

    fn kill(&mut self, i: usize) {
        ZooKeeperEnsemble::kill(self, i);
    }

    fn start(&mut self, i: usize) -> std::io::Result<()> {
        self.start_server(i)
    }

    fn is_running(&self, i: usize) -> bool {
        ZooKeeperEnsemble::is_running(self, i)
    }

    fn pid(&self, i: usize) -> Option<u32> {
        ZooKeeperEnsemble::pid(self, i)
    }

    fn leader(&self) -> Answer<'_, Option<usize>> {
        Box::pin(async move {
            blocking(|| {
                if ZooKeeperEnsemble::len(self) == 1 {
                    return self.mode(0).map(|_| 0);
                }
                ZooKeeperEnsemble::leader(self)
            })
        })
    }

    /// Every server answers `srvr` and, in an ensemble, one says `leader`.
    fn healthy(&self) -> Answer<'_, bool> {
        Box::pin(async move {
            blocking(|| {
                let modes: Vec<_> = (0..ZooKeeperEnsemble::len(self))
                    .map(|i| self.mode(i))
                    .collect();
                let leaders = modes
                    .iter()
                    .filter(|m| matches!(m.as_deref(), Some("leader" | "standalone")))
                    .count();
                modes.iter().all(Option::is_some) && leaders == 1
            })
        })
    }
}

impl Servers for EtcdCluster {
    fn len(&self) -> usize {
        self.members().len()
    }

    fn addrs(&self) -> Vec<String> {
        self.endpoints()
    }

    fn url_for(&self) -> UrlFor {
        std::sync::Arc::new(|addrs| format!("etcd://{}", addrs.join(",")))
    }

    fn kill(&mut self, i: usize) {
        EtcdCluster::kill(self, i);
    }

    fn start(&mut self, i: usize) -> std::io::Result<()> {
        self.start_member(i)
    }

    fn is_running(&self, i: usize) -> bool {
        EtcdCluster::is_running(self, i)
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.members()[i].pid()
    }

    fn leader(&self) -> Answer<'_, Option<usize>> {
        Box::pin(async move { blocking(|| EtcdCluster::leader(self)) })
    }

    /// Every member answers and exactly one says it leads.
    fn healthy(&self) -> Answer<'_, bool> {
        Box::pin(async move {
            blocking(|| {
                let answers: Vec<_> = (0..self.members().len())
                    .map(|i| self.is_leader(i))
                    .collect();
                answers.iter().all(Option::is_some)
                    && answers.iter().filter(|a| **a == Some(true)).count() == 1
            })
        })
    }
}

impl Servers for PostgresServer {
    fn len(&self) -> usize {
        1
    }

    fn addrs(&self) -> Vec<String> {
        vec![format!("{}:{}", self.host(), self.port())]
    }

    fn url_for(&self) -> UrlFor {
        let user = self.user();
        std::sync::Arc::new(move |addrs| format!("postgres://{user}@{}/postgres", addrs.join(",")))
    }

    fn kill(&mut self, _i: usize) {
        self.kill9();
    }

    fn start(&mut self, _i: usize) -> std::io::Result<()> {
        self.restart()
    }

    fn is_running(&self, _i: usize) -> bool {
        PostgresServer::is_running(self)
    }

    fn pid(&self, _i: usize) -> Option<u32> {
        None
    }

    fn leader(&self) -> Answer<'_, Option<usize>> {
        Box::pin(async move { PostgresServer::is_running(self).then_some(0) })
    }

    fn healthy(&self) -> Answer<'_, bool> {
        Box::pin(async move { PostgresServer::is_running(self) })
    }
}
