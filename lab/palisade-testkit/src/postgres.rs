//! A real PostgreSQL server, in a cluster of its own.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::free_port;

/// The database superuser created by `initdb` (independent of the OS user).
const SUPERUSER: &str = "postgres";

/// A PostgreSQL server on a loopback port, with a fresh cluster in a temporary
/// directory, `trust` authentication for the superuser `postgres`, and its Unix
/// socket inside that directory. Stopped (`pg_ctl stop -m immediate`) and deleted
/// on drop.
///
/// Binaries (`initdb`, `pg_ctl`): the directory `$PALISADE_PG_BINDIR`, else the
/// first directory on `PATH` that has both, else Debian's
/// `/usr/lib/postgresql/<version>/bin` (highest version).
///
/// PostgreSQL refuses to run as root. When the tests run as root, the server runs
/// as the OS user `$PALISADE_PG_USER`, else `postgres`, else `nobody` (from
/// `/etc/passwd`): the temporary directory is handed to that user and every
/// PostgreSQL program is started with its uid and gid. The temporary directory's
/// parent (`$TMPDIR`, usually `/tmp`) must be searchable by that user.
pub struct PostgresServer {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    running: bool,
}

impl PostgresServer {
    /// Creates a cluster and starts the server on a free loopback port.
    ///
    /// # Errors
    /// When the binaries are missing, no user to run as is found, `initdb` fails,
    /// or the server does not come up in 30 s (the error quotes its log).
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(|_| Ok(()))
    }

    /// Starts a server that speaks only TLS on TCP, with `cert`/`key` as its
    /// certificate, and admits only clients with a certificate of `ca` whose
    /// common name is the role they log in as (`hostssl … cert`; the
    /// superuser is `postgres`).
    ///
    /// # Errors
    /// As [`PostgresServer::start`], or when the files cannot be copied.
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path) -> std::io::Result<Self> {
        Self::start_with(|server| {
            let data = server.data_dir();
            for (from, to) in [(cert, "server.crt"), (key, "server.key"), (ca, "root.crt")] {
                std::fs::copy(from, data.join(to))?;
                if let Some((uid, gid)) = server.run_as {
                    std::os::unix::fs::chown(data.join(to), Some(uid), Some(gid))?;
                }
            }
            // PostgreSQL refuses a key others can read.
            std::fs::set_permissions(
                data.join("server.key"),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )?;
            let conf = data.join("postgresql.conf");
            let mut text = std::fs::read_to_string(&conf)?;
            text.push_str(
                "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n",
            );
            std::fs::write(&conf, text)?;
            // The Unix socket stays trusted (for the tests' own checks); TCP
            // is TLS with a client certificate, or nothing.
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 cert\n",
            )
        })
    }

    fn start_with(
        configure: impl Fn(&PostgresServer) -> std::io::Result<()>,
    ) -> std::io::Result<Self> {
        let bindir = find_bindir()?;
        let run_as = if running_as_root() {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new().prefix("palisade-pg").tempdir()?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let mut server = PostgresServer {
            dir,
            bindir,
            run_as,
            port: 0,
            running: false,
        };
        server.init()?;
        configure(&server)?;
        let mut last_err = None;
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        cmd.env("HOME", self.dir.path())
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .env_remove("PGPORT")
            .env_remove("PGHOST")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            // std drops root's supplementary groups before switching uid.
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn run(&self, what: &str, cmd: &mut Command) -> std::io::Result<Output> {
        let out = cmd.output().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot run {what} from {:?}: {e}", self.bindir),
            )
        })?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(std::io::Error::other(format!(
                "{what} failed ({}): {} {} {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_tail()
            )))
        }
    }

    fn init(&self) -> std::io::Result<()> {
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            // A throwaway cluster: skip the fsync of the freshly written files.
            .arg("--no-sync");
        self.run("initdb", &mut cmd)?;
        // In postgresql.conf rather than on pg_ctl's `-o`, which goes through a
        // shell command line and would split a path with spaces.
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n",
            self.socket_dir().display().to_string().replace('\'', "''")
        );
        let path = self.data_dir().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(&conf);
        std::fs::write(&path, text)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args([
                "-w",
                "-t",
                "30",
                "-o",
                &format!("-p {}", self.port),
                "start",
            ]);
        // pg_ctl leaves the server running detached; its own output is not needed.
        self.run("pg_ctl start", &mut cmd)?;
        self.running = true;
        Ok(())
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host to connect to: `127.0.0.1`.
    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// The database superuser (`postgres`), which needs no password.
    pub fn user(&self) -> &'static str {
        SUPERUSER
    }

    /// Connection parameters in `key=value` form, for `tokio_postgres::connect`:
    /// `host=127.0.0.1 port=PORT user=postgres dbname=postgres`.
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname=postgres",
            self.port
        )
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory holding the Unix socket (`.s.PGSQL.PORT`).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let tail: Vec<_> = log.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: no checkpoint, like a
    /// crash). Dropping does the same.
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"]);
        if self.run("pg_ctl stop", &mut cmd).is_err() {
            // Without pg_ctl's help, kill the postmaster named in its pid file.
            let pid = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
                .ok()
                .and_then(|s| s.lines().next().map(str::to_owned));
            if let Some(pid) = pid {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
    }
}

impl PostgresServer {
    /// Whether the server was started and not stopped or killed since.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// `kill -9` of the postmaster: no shutdown, no checkpoint. Its backends
    /// notice and exit; the next start runs crash recovery from the WAL.
    pub fn kill9(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let pid = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned));
        if let Some(pid) = pid {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            // Wait for the postmaster and its backends to be gone before a restart
            // reuses the data directory.
            let gone = || !std::path::Path::new(&format!("/proc/{pid}")).exists();
            let start = std::time::Instant::now();
            while !gone() && start.elapsed() < std::time::Duration::from_secs(30) {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    /// Starts it again on the same port and data directory (after [`stop`] or
    /// [`kill9`]: crash recovery runs first).
    ///
    /// [`stop`]: PostgresServer::stop
    /// [`kill9`]: PostgresServer::kill9
    ///
    /// # Errors
    /// When it does not come up in 30 s.
    pub fn restart(&mut self) -> std::io::Result<()> {
        if self.running {
            return Ok(());
        }
        // A postmaster killed with -9 leaves its pid file; pg_ctl copes with a
        // stale one, but backends may linger a moment holding shared memory.
        let mut last = None;
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(last.expect("at least one attempt"))
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn running_as_root() -> bool {
    // /proc/self belongs to the process's effective uid.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// uid and gid of the first existing user among the candidates.
fn unprivileged_user() -> std::io::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let wanted: Vec<String> = match std::env::var("PALISADE_PG_USER") {
        Ok(u) => vec![u],
        Err(_) => vec!["postgres".into(), "nobody".into()],
    };
    for name in &wanted {
        for line in passwd.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() >= 4
                && fields[0] == name
                && let (Ok(uid), Ok(gid)) = (fields[2].parse(), fields[3].parse())
                && uid != 0
            {
                return Ok((uid, gid));
            }
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!(
            "PostgreSQL will not run as root and none of the users {wanted:?} exists \
             (set PALISADE_PG_USER)"
        ),
    ))
}

fn has_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

fn find_bindir() -> std::io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PALISADE_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(path) = std::env::var_os("PATH")
        && let Some(dir) = std::env::split_paths(&path).find(|d| has_binaries(d))
    {
        return Ok(dir);
    }
    // Debian installs the server outside PATH, one directory per major version.
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_binaries(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "initdb and pg_ctl not found in $PALISADE_PG_BINDIR, PATH or \
             /usr/lib/postgresql/*/bin (apt-get install postgresql)",
        )
    })
}
