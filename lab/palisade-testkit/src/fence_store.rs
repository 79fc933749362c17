//! A real `palisade fence-store` process.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, loopback, wait_until};

/// A fenced object store (fencing on, or off for its twin), run from the `palisade` binary at
/// `bin` on a loopback port, its data in a temporary directory; killed on drop.
pub struct FenceStoreProcess {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl FenceStoreProcess {
    /// Starts the store and waits until it listens.
    ///
    /// # Errors
    /// When it cannot be started or does not listen within 30 s.
    pub fn start(bin: &Path) -> std::io::Result<Self> {
        Self::start_with(bin, "on")
    }

    /// Starts its unfenced twin (`--fencing off`: every write accepted, every
    /// read answered), to show what fencing prevents.
    ///
    /// # Errors
    /// As [`FenceStoreProcess::start`].
    pub fn start_unfenced(bin: &Path) -> std::io::Result<Self> {
        Self::start_with(bin, "off")
    }

    fn start_with(bin: &Path, fencing: &str) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let mut child = Command::new(bin)
            .args(["fence-store", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--fencing", fencing])
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let up = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(None))
                && TcpStream::connect_timeout(&loopback(port), Duration::from_millis(200)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(
                "the fence store did not start listening",
            ));
        }
        Ok(FenceStoreProcess {
            child,
            port,
            _dir: dir,
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for FenceStoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
