//! `palisade fence-store`: the fenced object store, and a small HTTP client for it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use palisade_fence::Fencing;

/// Whether the store checks tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FencingArg {
    /// Reject writes whose token is below the highest accepted (409).
    On,
    /// Accept every write (to show what goes wrong without fencing).
    Off,
}

impl From<FencingArg> for Fencing {
    fn from(f: FencingArg) -> Self {
        match f {
            FencingArg::On => Fencing::On,
            FencingArg::Off => Fencing::Off,
        }
    }
}

/// `palisade fence-store`.
#[derive(Args)]
pub struct FenceStoreArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7430")]
    listen: std::net::SocketAddr,
    /// Where objects and their tokens live (one redb file).
    #[arg(long, default_value = "palisade-objects")]
    data_dir: PathBuf,
    /// Check fencing tokens (on) or accept every write (off).
    #[arg(long, value_enum, default_value = "on")]
    fencing: FencingArg,
    /// Append one JSON line per decision on a fenced request (put, delete, fenced
    /// read; accepted or refused, with its monotonic-clock time) to this file.
    #[arg(long)]
    journal: Option<PathBuf>,
}

/// Serves the store until SIGINT/SIGTERM.
pub async fn serve(a: FenceStoreArgs) -> Result<i32> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("binding {}", a.listen))?;
    eprintln!(
        "palisade: fenced object store on http://{} (data in {}, fencing {:?})",
        a.listen,
        a.data_dir.display(),
        a.fencing
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let mut store = palisade_fence::ObjectStore::open(&a.data_dir, a.fencing.into())?;
    if let Some(path) = &a.journal {
        let journal = palisade_fence::Journal::open(path)
            .with_context(|| format!("opening the journal {}", path.display()))?;
        store = store.with_journal(journal);
    }
    palisade_fence::http::serve_store(listener, store, shutdown).await?;
    Ok(0)
}

/// A reply of the store: status, `Fencing-Token` header if any, body.
pub struct Reply {
    pub status: u16,
    pub token: Option<u64>,
    pub body: String,
}

/// One request to the store at `addr` (`HOST:PORT`).
pub async fn request(
    method: &str,
    addr: &str,
    key: &str,
    token: Option<u64>,
    body: &str,
) -> Result<Reply> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}/v1/objects/{key}"));
    if let Some(t) = token {
        req = req.header(palisade_fence::http::FENCING_TOKEN_HEADER, t.to_string());
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned())))?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .context("the store did not answer")??;
    let status = resp.status().as_u16();
    let token = resp
        .headers()
        .get(palisade_fence::http::FENCING_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        token,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}
