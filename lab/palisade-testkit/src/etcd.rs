//! A real etcd cluster: `etcd` processes (Debian's `etcd-server`, or the binary
//! named by `PALISADE_ETCD`), each with its own data directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_ports, loopback, wait_until};

/// One member of an [`EtcdCluster`].
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl EtcdMember {
    /// `127.0.0.1:PORT`: where clients reach it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// `n` etcd members forming one cluster on loopback, stopped on drop.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    members: Vec<EtcdMember>,
    tls: Option<TlsFiles>,
}

/// The PEM files of a member speaking TLS to its clients.
#[derive(Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

fn binary() -> PathBuf {
    std::env::var_os("PALISADE_ETCD").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl EtcdCluster {
    /// Starts `n` members and waits until each accepts connections.
    ///
    /// # Errors
    /// When `etcd` is missing or a member does not come up in 30 s.
    pub fn start(n: usize) -> std::io::Result<Self> {
        Self::start_with(n, None)
    }

    /// Starts `n` members that speak only TLS to clients, with `cert`/`key`
    /// (every member the same; peers talk plaintext on loopback) and admit
    /// only clients with a certificate of `ca` (`--client-cert-auth`).
    ///
    /// # Errors
    /// As [`EtcdCluster::start`].
    pub fn start_tls(n: usize, cert: &Path, key: &Path, ca: &Path) -> std::io::Result<Self> {
        Self::start_with(
            n,
            Some(TlsFiles {
                cert: cert.to_owned(),
                key: key.to_owned(),
                ca: ca.to_owned(),
            }),
        )
    }

    fn start_with(n: usize, tls: Option<TlsFiles>) -> std::io::Result<Self> {
        // A port found free may be taken by another test before etcd binds
        // it: a cluster that does not come up is started again on new ports.
        let mut last_err = None;
        for _ in 0..3 {
            let dir = tempfile::Builder::new().prefix("palisade-etcd").tempdir()?;
            let ports = free_ports(2 * n)?;
            let members = (0..n)
                .map(|i| EtcdMember {
                    name: format!("m{}", i + 1),
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    child: None,
                })
                .collect();
            let mut cluster = EtcdCluster {
                dir,
                bin: binary(),
                members,
                tls: tls.clone(),
            };
            match (0..n).try_for_each(|i| cluster.start_member(i)) {
                Ok(()) => return Ok(cluster),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Starts (or restarts, on the same ports and data) member `i` (0-based).
    ///
    /// # Errors
    /// When it does not accept connections within 30 s.
    pub fn start_member(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let data = self.dir.path().join(&m.name);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))?;
        let mut command = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let mut child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "palisade-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot start {:?} (apt-get install etcd-server): {e}",
                        self.bin
                    ),
                )
            })?;
        let port = m.client_port;
        let up = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(None))
                && TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "etcd member {} did not start: {}",
                m.name,
                std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
            )));
        }
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Turns on etcd's authentication: a `root` user, and for each
    /// `(user, prefix)` a user allowed to read and write the keys under
    /// `prefix` and nothing else. With `--client-cert-auth` (see
    /// [`EtcdCluster::start_tls`]) a client certificate's common name is the
    /// user; a name that is no user may do nothing. Asked through etcd's JSON
    /// gateway with `curl`, presenting `cert`/`key` (of the CA).
    ///
    /// # Errors
    /// When the cluster does not speak TLS, curl is missing or etcd refuses a
    /// step.
    pub fn enable_auth(
        &self,
        cert: &Path,
        key: &Path,
        users: &[(&str, &str)],
    ) -> std::io::Result<()> {
        let tls = self
            .tls
            .as_ref()
            .ok_or_else(|| std::io::Error::other("enable_auth needs a TLS cluster"))?;
        let call = |path: &str, body: String| -> std::io::Result<()> {
            let out = Command::new("curl")
                .args(["-sS", "--fail-with-body", "--max-time", "10"])
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key)
                .args(["-H", "Content-Type: application/json", "-d", &body])
                .arg(format!("https://{}/v3/auth/{path}", self.members[0].addr()))
                .output()?;
            if out.status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "etcd /v3/auth/{path} {body}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )))
            }
        };
        let add_user = |name: &str| {
            call(
                "user/add",
                format!(r#"{{"name":"{name}","options":{{"no_password":true}}}}"#),
            )
        };
        use base64::Engine as _;
        // etcd's gateway spells bytes in standard base64.
        let b64 = base64::engine::general_purpose::STANDARD;
        add_user("root")?;
        call("user/grant", r#"{"user":"root","role":"root"}"#.into())?;
        for (user, prefix) in users {
            let role = format!("{user}-role");
            call("role/add", format!(r#"{{"name":"{role}"}}"#))?;
            let end = prefix_end(prefix.as_bytes());
            call(
                "role/grant",
                format!(
                    r#"{{"name":"{role}","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                    b64.encode(prefix.as_bytes()),
                    b64.encode(&end)
                ),
            )?;
            add_user(user)?;
            call(
                "user/grant",
                format!(r#"{{"user":"{user}","role":"{role}"}}"#),
            )?;
        }
        call("enable", "{}".into())
    }

    /// `kill -9` of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether member `i` is the cluster's leader, asked over etcd's JSON gateway
    /// (`POST /v3/maintenance/status`); `None` when it does not answer.
    pub fn is_leader(&self, i: usize) -> Option<bool> {
        let port = self.members[i].client_port;
        let mut stream =
            TcpStream::connect_timeout(&loopback(port), Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let request = format!(
            "POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\
             Connection: close\r\n\r\n{{}}"
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        let member = json_string_field(&reply, "member_id")?;
        let leader = json_string_field(&reply, "leader")?;
        Some(member == leader && leader != "0")
    }

    /// The index of the member that is the leader, if one is and says so.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.is_leader(i) == Some(true))
    }

    /// Whether member `i`'s process runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// The members.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// Every member's client address.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::addr).collect()
    }
}

/// The value of `"field":"VALUE"` in a JSON text (etcd's gateway writes 64-bit
/// integers as strings).
fn json_string_field(text: &str, field: &str) -> Option<String> {
    let start = text.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let end = text[start..].find('"')? + start;
    Some(text[start..end].to_owned())
}

/// The smallest key above every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
