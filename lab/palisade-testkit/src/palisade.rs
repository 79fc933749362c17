//! A real `palisade serve` process.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_ports, loopback, wait_until};

/// The `--worker-threads` of each of `nodes` nodes sharing this machine: its
/// cores split between them, at least one each; `None` when
/// `PALISADE_WORKER_THREADS` is set (the nodes inherit it). Threads beyond the
/// cores only add context switches to every commit.
pub fn colocated_worker_threads(nodes: u64) -> Option<usize> {
    if std::env::var_os("PALISADE_WORKER_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    Some((cores / nodes.max(1) as usize).max(1))
}

/// One Palisade node, run from the binary at `bin`, with its data in its own
/// directory that survives restarts (and is removed on drop).
pub struct PalisadeNode {
    bin: PathBuf,
    id: u64,
    port: u16,
    peer_port: u16,
    /// `--metrics-listen`: every test node serves `/metrics`.
    http_port: u16,
    dir: tempfile::TempDir,
    initial_cluster: Option<String>,
    extra_args: Vec<String>,
    /// `--worker-threads` (a cluster's nodes share this machine's cores).
    worker_threads: Option<usize>,
    /// `PALISADE_LOG` for the process (default: the test's own, or `warn`).
    log_filter: Option<String>,
    child: Option<Child>,
}

impl PalisadeNode {
    /// Reserves a loopback port and a data directory for node `id`, without
    /// starting it (a cluster needs every address before any node starts).
    ///
    /// # Errors
    /// When no port or temporary directory can be had.
    pub fn prepare(bin: &Path, id: u64) -> std::io::Result<Self> {
        let ports = free_ports(3)?;
        Self::prepare_on(bin, id, &ports)
    }

    /// `ports`: client, peer and HTTP, in that order.
    fn prepare_on(bin: &Path, id: u64, ports: &[u16]) -> std::io::Result<Self> {
        Ok(PalisadeNode {
            bin: bin.to_owned(),
            id,
            port: ports[0],
            peer_port: ports[1],
            http_port: ports[2],
            dir: tempfile::tempdir()?,
            initial_cluster: None,
            extra_args: Vec::new(),
            worker_threads: None,
            log_filter: None,
            child: None,
        })
    }

    /// A started single-node cluster.
    ///
    /// # Errors
    /// When the node does not start listening within 30 s.
    pub fn single(bin: &Path) -> std::io::Result<Self> {
        let mut n = Self::prepare(bin, 1)?;
        n.start()?;
        Ok(n)
    }

    /// `n` nodes forming a cluster, all started.
    ///
    /// # Errors
    /// When a node does not start.
    pub fn cluster(bin: &Path, n: u64, extra_args: &[&str]) -> std::io::Result<Vec<Self>> {
        Self::cluster_with(bin, n, |_| {
            extra_args.iter().map(|s| s.to_string()).collect()
        })
    }

    /// `n` nodes forming a cluster, all started, node `id` with `args(id)` (its
    /// own certificate, say).
    ///
    /// # Errors
    /// When a node does not start.
    pub fn cluster_with(
        bin: &Path,
        n: u64,
        args: impl Fn(u64) -> Vec<String>,
    ) -> std::io::Result<Vec<Self>> {
        // Every port of the cluster picked at once: all distinct.
        let ports = free_ports(3 * n as usize)?;
        let mut nodes = (1..=n)
            .map(|id| {
                let i = 3 * (id - 1) as usize;
                Self::prepare_on(bin, id, &ports[i..i + 3])
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let spec = nodes
            .iter()
            .map(Self::member_spec)
            .collect::<Vec<_>>()
            .join(",");
        for node in &mut nodes {
            node.initial_cluster = Some(spec.clone());
            node.extra_args = args(node.id);
            node.worker_threads = colocated_worker_threads(n);
        }
        for node in &mut nodes {
            node.start()?;
        }
        Ok(nodes)
    }

    /// Extra arguments for `serve`, used from the next start on.
    pub fn set_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
    }

    /// `PALISADE_LOG` for the process from the next start on (to see its
    /// INFO lines, say).
    pub fn set_log_filter(&mut self, filter: &str) {
        self.log_filter = Some(filter.to_owned());
    }

    /// Starts (or restarts) the process on the same port and data directory.
    ///
    /// # Errors
    /// When the node does not start listening within 30 s.
    pub fn start(&mut self) -> std::io::Result<()> {
        self.kill();
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve")
            .args(["--id", &self.id.to_string(), "--listen", &self.addr()])
            .args(["--listen-peer", &self.peer_addr()])
            .args(["--metrics-listen", &self.http_addr()])
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(&self.extra_args)
            .env(
                "PALISADE_LOG",
                self.log_filter.clone().unwrap_or_else(|| {
                    std::env::var("PALISADE_LOG").unwrap_or_else(|_| "warn".into())
                }),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.log_path())?,
            );
        if let Some(spec) = &self.initial_cluster {
            cmd.args(["--initial-cluster", spec]);
        }
        if let Some(threads) = self.worker_threads {
            cmd.args(["--worker-threads", &threads.to_string()]);
        }
        let mut child = cmd.spawn()?;
        let port = self.port;
        let up = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(None))
                && TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "palisade node {} did not start: {}",
                self.id,
                std::fs::read_to_string(self.log_path()).unwrap_or_default()
            )));
        }
        self.child = Some(child);
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("node.log")
    }

    /// The node's data directory (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The node's log output so far (stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `127.0.0.1:PORT`: where clients reach it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`: where peers reach it.
    pub fn peer_addr(&self) -> String {
        format!("127.0.0.1:{}", self.peer_port)
    }

    /// `127.0.0.1:PORT`: its HTTP listener (`/metrics`).
    pub fn http_addr(&self) -> String {
        format!("127.0.0.1:{}", self.http_port)
    }

    /// `ID=ADDR/PEER_ADDR`, as `--initial-cluster` and `cluster add-learner` take it.
    pub fn member_spec(&self) -> String {
        format!("{}={}/{}", self.id, self.addr(), self.peer_addr())
    }

    /// The node id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The process id while it runs (to pause it with SIGSTOP, for one).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `kill -9`: no clean shutdown, nothing flushed that was not already.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PalisadeNode {
    fn drop(&mut self) {
        self.kill();
        // The data directory goes with us: keep a panic's story where a failing
        // test shows it.
        let log = self.log();
        if log.contains("panicked") {
            eprintln!("--- palisade node {} log (it panicked) ---\n{log}", self.id);
        }
    }
}
