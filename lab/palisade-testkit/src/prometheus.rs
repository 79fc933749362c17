//! A real Prometheus server (Debian's `prometheus` package) scraping given
//! targets.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, http_get, wait_until};

/// A `prometheus` on a loopback port scraping `targets` every second, with
/// its storage in a temporary directory; killed on drop. Binary:
/// `$PALISADE_PROMETHEUS` or `prometheus` on `PATH`.
pub struct PrometheusServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl PrometheusServer {
    /// Starts Prometheus scraping `/metrics` of every `HOST:PORT` in
    /// `targets` (job `palisade`) once a second.
    ///
    /// # Errors
    /// When the binary is missing or the server is not ready within 60 s.
    pub fn start(targets: &[String]) -> std::io::Result<Self> {
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        Self::start_with_jobs(&format!(
            "  - job_name: palisade\n    static_configs:\n      - targets: [{list}]\n"
        ))
    }

    /// Starts Prometheus with `jobs` as its `scrape_configs` list (YAML, each
    /// item indented two spaces), scraping once a second.
    ///
    /// # Errors
    /// When the binary is missing or the server is not ready within 60 s.
    pub fn start_with_jobs(jobs: &str) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n{jobs}"
            ),
        )?;
        let mut server = PrometheusServer {
            child: None,
            port: 0,
            dir,
        };
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

    fn spawn(&mut self) -> std::io::Result<()> {
        let bin =
            std::env::var_os("PALISADE_PROMETHEUS").map_or("prometheus".into(), PathBuf::from);
        let log = std::fs::File::create(self.dir.path().join("prometheus.log"))?;
        let mut child = Command::new(&bin)
            .arg(format!(
                "--config.file={}",
                self.dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={}", self.addr()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {} ({e}); `apt-get install prometheus`",
                        bin.display()
                    ),
                )
            })?;
        let addr = self.addr();
        let ready = wait_until(Duration::from_secs(60), || {
            matches!(child.try_wait(), Ok(None))
                && matches!(http_get(&addr, "/-/ready"), Ok((200, _)))
        });
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "prometheus did not become ready: {}",
                self.log()
            )));
        }
        self.child = Some(child);
        Ok(())
    }

    /// `127.0.0.1:PORT`: its web interface and HTTP API.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The JSON answer of an instant query (`/api/v1/query`) for `expr`.
    ///
    /// # Errors
    /// When the server cannot be reached or answers other than 200.
    pub fn query(&self, expr: &str) -> std::io::Result<String> {
        let (status, body) = http_get(
            &self.addr(),
            &format!("/api/v1/query?query={}", percent_encode(expr)),
        )?;
        if status != 200 {
            return Err(std::io::Error::other(format!(
                "query {expr:?}: HTTP {status}: {body}"
            )));
        }
        Ok(body)
    }
}

/// Every byte but unreserved ASCII as `%XX`, as a URL query value needs.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            super::percent_encode("sum(a{job=\"p\"}) > 0"),
            "sum%28a%7Bjob%3D%22p%22%7D%29%20%3E%200"
        );
    }
}
