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
    /// Serve HTTPS with this certificate (PEM; `palisade certs` makes one).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// Serves the store until SIGINT/SIGTERM.
pub async fn serve(a: FenceStoreArgs) -> Result<i32> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("binding {}", a.listen))?;
    let acceptor = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(palisade_fence::http::tls_acceptor(cert, key)?),
        _ => None,
    };
    eprintln!(
        "palisade: fenced object store on {}://{} (data in {}, fencing {:?})",
        if acceptor.is_some() { "https" } else { "http" },
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
    match acceptor {
        Some(acceptor) => {
            palisade_fence::http::serve_store_tls(listener, store, acceptor, shutdown).await?
        }
        None => palisade_fence::http::serve_store(listener, store, shutdown).await?,
    }
    Ok(0)
}

/// A reply of the store: status, `Fencing-Token` header if any, body.
pub struct Reply {
    pub status: u16,
    pub token: Option<u64>,
    pub body: String,
}

/// Where the store is, and whether it speaks TLS.
#[derive(Clone)]
pub struct StoreAddr {
    /// `HOST:PORT`.
    pub addr: String,
    /// HTTPS, trusting only the given CA; `None`: plain HTTP.
    pub tls: Option<tokio_rustls::TlsConnector>,
}

impl StoreAddr {
    /// A store over plain HTTP.
    pub fn plain(addr: impl Into<String>) -> Self {
        StoreAddr {
            addr: addr.into(),
            tls: None,
        }
    }

    /// A store over HTTPS whose certificate the CA in `ca` (PEM) signed.
    pub fn tls(addr: impl Into<String>, ca: &std::path::Path) -> Result<Self> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for cert in
            CertificateDer::pem_file_iter(ca).with_context(|| format!("{}", ca.display()))?
        {
            roots.add(cert.with_context(|| format!("{}", ca.display()))?)?;
        }
        let config = tokio_rustls::rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(StoreAddr {
            addr: addr.into(),
            tls: Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
                config,
            ))),
        })
    }
}

/// One request to the store.
pub async fn request(
    method: &str,
    store: &StoreAddr,
    key: &str,
    token: Option<u64>,
    body: &str,
) -> Result<Reply> {
    let addr = &store.addr;
    let scheme = if store.tls.is_some() { "https" } else { "http" };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{scheme}://{addr}/v1/objects/{key}"))
        .header(hyper::header::HOST, addr.as_str());
    if let Some(t) = token {
        req = req.header(palisade_fence::http::FENCING_TOKEN_HEADER, t.to_string());
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned())))?;
    let resp = tokio::time::timeout(Duration::from_secs(30), async {
        match &store.tls {
            None => {
                let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
                Ok(client.request(req).await?)
            }
            Some(connector) => {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                let name = rustls_pki_types::ServerName::try_from(
                    host.trim_matches(['[', ']']).to_owned(),
                )?;
                let tls = connector.connect(name, tcp).await?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                        .await?;
                tokio::spawn(conn);
                anyhow::Ok(sender.send_request(req).await?)
            }
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs_cmd::{CertsCommand, run};

    /// The store over HTTPS: fenced writes work as over HTTP, a client that
    /// trusts another CA or speaks plaintext gets nothing, and neither harms the
    /// next client.
    #[tokio::test]
    async fn the_store_serves_https_with_the_same_contract() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let other = dir.path().join("other");
        for d in [&certs, &other] {
            run(CertsCommand::Init {
                dir: d.clone(),
                nodes: 1,
                clients: vec![],
                hosts: vec![],
            })
            .unwrap();
        }
        let acceptor = palisade_fence::http::tls_acceptor(
            &certs.join("node-1.pem"),
            &certs.join("node-1-key.pem"),
        )
        .unwrap();
        let store =
            palisade_fence::ObjectStore::open(&dir.path().join("objects"), Fencing::On).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(palisade_fence::http::serve_store_tls(
            listener,
            store,
            acceptor,
            std::future::pending(),
        ));

        let wrong_ca = StoreAddr::tls(&addr, &other.join("ca.pem")).unwrap();
        assert!(request("PUT", &wrong_ca, "k", Some(40), "x").await.is_err());
        assert!(
            request("PUT", &StoreAddr::plain(&addr), "k", Some(40), "x")
                .await
                .map_or(true, |r| r.status != 200)
        );

        let store = StoreAddr::tls(&addr, &certs.join("ca.pem")).unwrap();
        let r = request("PUT", &store, "k", Some(34), "written with 34")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let r = request("PUT", &store, "k", Some(33), "stale")
            .await
            .unwrap();
        assert_eq!(r.status, 409, "{}", r.body);
        let r = request("GET", &store, "k", None, "").await.unwrap();
        assert_eq!(
            (r.status, r.token, r.body.as_str()),
            (200, Some(34), "written with 34")
        );
    }
}
