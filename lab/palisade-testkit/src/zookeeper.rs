//! A real ZooKeeper ensemble: Java `QuorumPeerMain` processes from Debian's
//! `zookeeper` package (`/usr/share/java/zookeeper.jar`, or the jar named by
//! `PALISADE_ZOOKEEPER_JAR`), each with its own data directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_ports, loopback, wait_until};

struct Server {
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Child>,
}

/// `n` ZooKeeper servers forming one ensemble on loopback, stopped on drop.
/// `tickTime` is 200 ms, so session timeouts from 0.4 s to 4 s are accepted.
pub struct ZooKeeperEnsemble {
    dir: tempfile::TempDir,
    servers: Vec<Server>,
    /// Clients speak TLS: the server's key and certificate in one PEM file
    /// (how ZooKeeper's PEM key store reads them), and the CA's.
    tls: Option<(PathBuf, PathBuf)>,
}

/// What the servers need on their class path besides the jar's own list:
/// Netty's codec and resolver, for the Netty connection factory TLS needs.
const NETTY_JARS: &[&str] = &[
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

fn jar() -> PathBuf {
    std::env::var_os("PALISADE_ZOOKEEPER_JAR").map_or_else(
        || PathBuf::from("/usr/share/java/zookeeper.jar"),
        PathBuf::from,
    )
}

impl ZooKeeperEnsemble {
    /// Starts `n` servers and waits until each accepts connections.
    ///
    /// # Errors
    /// When Java or the jar is missing, or a server does not come up in 60 s.
    pub fn start(n: usize) -> std::io::Result<Self> {
        Self::start_with(n, None)
    }

    /// Starts `n` servers whose client port speaks only TLS (Netty's
    /// connection factory, `secureClientPort`), with `cert`/`key` (every
    /// server the same; servers talk to each other in plaintext on loopback),
    /// admitting only clients with a certificate of `ca` (`ssl.clientAuth=need`).
    ///
    /// # Errors
    /// As [`ZooKeeperEnsemble::start`], or when the files cannot be read.
    pub fn start_tls(n: usize, cert: &Path, key: &Path, ca: &Path) -> std::io::Result<Self> {
        let pem = [std::fs::read(key)?, std::fs::read(cert)?].concat();
        Self::start_with(n, Some((pem, ca.to_owned())))
    }

    fn start_with(n: usize, tls: Option<(Vec<u8>, PathBuf)>) -> std::io::Result<Self> {
        if !jar().exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} missing (apt-get install zookeeper)", jar().display()),
            ));
        }
        let dir = tempfile::Builder::new().prefix("palisade-zk").tempdir()?;
        let ports = free_ports(3 * n)?;
        let servers = (0..n)
            .map(|i| Server {
                client_port: ports[3 * i],
                quorum_port: ports[3 * i + 1],
                election_port: ports[3 * i + 2],
                child: None,
            })
            .collect();
        let tls = match tls {
            Some((pem, ca)) => {
                let path = dir.path().join("server-key-and-cert.pem");
                std::fs::write(&path, pem)?;
                Some((path, ca))
            }
            None => None,
        };
        let mut ensemble = ZooKeeperEnsemble { dir, servers, tls };
        for i in 0..n {
            ensemble.write_config(i)?;
        }
        for i in 0..n {
            ensemble.start_server(i)?;
        }
        Ok(ensemble)
    }

    fn server_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("zk{}", i + 1))
    }

    fn write_config(&self, i: usize) -> std::io::Result<()> {
        let dir = self.server_dir(i);
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::write(dir.join("data/myid"), format!("{}\n", i + 1))?;
        // maxClientCnxns=0: ZooKeeper's default of 60 connections per address
        // turns away a 64-client benchmark on a standalone server (every client
        // here is 127.0.0.1).
        let mut cfg = format!(
            "tickTime=200\ninitLimit=50\nsyncLimit=25\ndataDir={}\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr\nmaxSessionTimeout=20000\nmaxClientCnxns=0\n",
            dir.join("data").display(),
        );
        let port = self.servers[i].client_port;
        match &self.tls {
            None => cfg.push_str(&format!("clientPort={port}\nclientPortAddress=127.0.0.1\n")),
            Some((key_and_cert, ca)) => cfg.push_str(&format!(
                "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                 ssl.clientAuth=need\n",
                key_and_cert.display(),
                ca.display()
            )),
        }
        if self.servers.len() > 1 {
            for (j, s) in self.servers.iter().enumerate() {
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    j + 1,
                    s.quorum_port,
                    s.election_port
                ));
            }
        }
        std::fs::write(dir.join("zoo.cfg"), cfg)
    }

    /// Starts (or restarts, on the same ports and data) server `i` (0-based).
    ///
    /// # Errors
    /// When it does not accept connections within 60 s.
    pub fn start_server(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        let dir = self.server_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))?;
        let mut class_path = jar().into_os_string();
        if self.tls.is_some() {
            for extra in NETTY_JARS {
                class_path.push(":");
                class_path.push(extra);
            }
        }
        let mut child = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-cp"])
            .arg(class_path)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot start java (apt-get install zookeeper): {e}"),
                )
            })?;
        let port = self.servers[i].client_port;
        let up = wait_until(Duration::from_secs(60), || {
            matches!(child.try_wait(), Ok(None))
                && TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "zookeeper server {} did not start: {}",
                i + 1,
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            )));
        }
        self.servers[i].child = Some(child);
        Ok(())
    }

    /// `kill -9` of server `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.servers[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id of server `i` while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers[i].child.as_ref().map(Child::id)
    }

    /// What server `i` says it is (`leader`, `follower`, `standalone`), asked
    /// with the `srvr` four-letter word; `None` when it does not answer or is
    /// not serving (no quorum).
    pub fn mode(&self, i: usize) -> Option<String> {
        let addr = loopback(self.servers[i].client_port);
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(b"srvr").ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    /// The index of the server that is the ensemble's leader, if one is.
    pub fn leader(&self) -> Option<usize> {
        (0..self.servers.len()).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// How many servers there are.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether the ensemble has no servers.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Whether server `i`'s process runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.servers[i].child.is_some()
    }

    /// Every server's client address, `127.0.0.1:PORT`.
    pub fn endpoints(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.client_port))
            .collect()
    }

    /// ZooKeeper's connect string: `HOST:PORT,HOST:PORT,…`.
    pub fn connect_string(&self) -> String {
        self.endpoints().join(",")
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
    }
}
