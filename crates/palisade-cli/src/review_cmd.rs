//! `palisade review`: the design-review record of a lock (see
//! [`crate::review`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::review::{Need, ReviewInput, review};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use crate::{duration_arg, exit};

/// What a double holder would cost.
#[derive(Clone, Copy, ValueEnum)]
pub enum NeedArg {
    /// Duplicated work: an efficiency lock will do.
    Efficiency,
    /// Corrupted state: fencing tokens checked by the resource are required.
    Correctness,
}

/// `palisade review`.
#[derive(Args)]
pub struct ReviewArgs {
    /// The lock's name, as the team uses it.
    lock: String,
    /// The lock service by URL: palisade://HOST:PORT[,…], etcd://…, zk://…,
    /// postgres://…, or redis://HOST:PORT[,redis://…] (several: Redlock).
    #[arg(long, env = "PALISADE_BACKEND")]
    backend: String,
    /// What a double holder would cost.
    #[arg(long, value_enum)]
    need: NeedArg,
    /// The resource the lock protects: a fence store's http(s)://HOST:PORT
    /// (asked whether it checks tokens), or `none`.
    #[arg(long)]
    resource: Option<String>,
    /// The CA (PEM) that signed an https:// resource's certificate; the only
    /// one trusted when asking it.
    #[arg(long)]
    resource_ca: Option<PathBuf>,
    /// For a palisade:// backend running TLS: the cluster's CA (PEM).
    #[arg(long, env = "PALISADE_CA")]
    ca: Option<PathBuf>,
    /// For a palisade:// backend: this client's certificate (PEM), for a
    /// cluster that authenticates clients (the `read` role is enough).
    #[arg(long, env = "PALISADE_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, env = "PALISADE_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// For a palisade:// backend: a file holding a bearer token (sent only
    /// over TLS).
    #[arg(long, env = "PALISADE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// The lease length in use.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    ttl: Duration,
    /// How long the work under the lock takes.
    #[arg(long, value_parser = duration_arg)]
    work: Option<Duration>,
    /// The latest drill results: a `palisade chaos --out` directory.
    #[arg(long)]
    drills: Option<PathBuf>,
    /// Write the record here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Writes the record; exit 0 when the set-up meets the need, 1 when it does not
/// (the reasons are in the record and on stderr), 2 for unusable credential flags.
pub async fn run(a: ReviewArgs) -> Result<i32> {
    // Bad credential flags are a usage error (2), not a set-up that fails the
    // need (1).
    let (cluster_tls, cluster_token) = match palisade_client::credentials_from_files(
        a.ca.as_deref(),
        a.cert.as_deref().zip(a.key.as_deref()),
        a.token_file.as_deref(),
    ) {
        Ok(credentials) => credentials,
        Err(e) => {
            eprintln!("palisade: {e}");
            return Ok(exit::USAGE);
        }
    };
    let input = ReviewInput {
        lock: a.lock,
        backend: a.backend,
        resource: a.resource,
        resource_ca: a.resource_ca,
        cluster_tls,
        cluster_token,
        ttl: a.ttl,
        work: a.work,
        drills: a.drills,
        need: match a.need {
            NeedArg::Efficiency => Need::Efficiency,
            NeedArg::Correctness => Need::Correctness,
        },
    };
    let record = review(&input).await;
    match &a.out {
        Some(path) => std::fs::write(path, &record.markdown)
            .with_context(|| format!("writing {}", path.display()))?,
        None => print!("{}", record.markdown),
    }
    for u in &record.unknown {
        eprintln!("palisade: could not get {u}");
    }
    if record.failures.is_empty() {
        Ok(0)
    } else {
        for f in &record.failures {
            eprintln!("palisade: does not meet the need: {f}");
        }
        Ok(exit::FAILURE)
    }
}
