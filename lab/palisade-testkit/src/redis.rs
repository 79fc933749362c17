//! A real `redis-server` process.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, loopback, wait_until};

/// A `redis-server` on a loopback port, without persistence unless asked, killed
/// on drop. Binary: `$PALISADE_REDIS_SERVER` or `redis-server` on `PATH`.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    /// Set when the server runs under the clock-shift preload.
    clock: Option<crate::clock::ClockShift>,
}

impl RedisServer {
    /// Starts a server with no persistence (`save ""`, `appendonly no`).
    ///
    /// # Errors
    /// When the binary is missing or the server does not answer `PING` in 10 s.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g.
    /// `["--replicaof", "127.0.0.1", "6379"]`).
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with(extra_args: &[&str]) -> std::io::Result<Self> {
        Self::launch(RedisServer {
            child: None,
            port: 0,
            dir: tempfile::tempdir()?,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            clock: None,
        })
    }

    /// Starts a server whose wall clock can be jumped (see [`RedisServer::clock`]):
    /// Redis expires keys by `gettimeofday()`, so a jump ahead expires locks early.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with_clock_shift() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let clock = crate::clock::ClockShift::new(dir.path().join("clock-offset-ms"))?;
        Self::launch(RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: Vec::new(),
            clock: Some(clock),
        })
    }

    /// Spawns on a free port, retrying on another if the port was taken meanwhile.
    fn launch(mut server: RedisServer) -> std::io::Result<Self> {
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

    /// The clock of a server started with [`RedisServer::start_with_clock_shift`].
    pub fn clock(&self) -> Option<&crate::clock::ClockShift> {
        self.clock.as_ref()
    }

    fn binary() -> PathBuf {
        std::env::var_os("PALISADE_REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"))
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let port = self.port.to_string();
        let mut command = Command::new(Self::binary());
        if let Some(clock) = &self.clock {
            command.envs(clock.env());
        }
        let mut child = command
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--dir".as_ref(), self.dir.path().as_os_str()])
            .args(["--logfile", "redis.log", "--protected-mode", "no"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot start {:?}: {e} (apt-get install redis-server)",
                        Self::binary()
                    ),
                )
            })?;
        let up = wait_until(Duration::from_secs(10), || {
            matches!(child.try_wait(), Ok(None)) && ping(self.port)
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            return Err(std::io::Error::other(format!(
                "redis-server on port {} did not come up: {}",
                self.port,
                log.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            )));
        }
        self.child = Some(child);
        Ok(())
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process (SIGKILL): everything not persisted is lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, with the same arguments.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
