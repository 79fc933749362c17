//! `palisade fence-store`: the fenced object store (its HTTP client is
//! `palisade_fence::client`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use palisade_harness::FencingArg;

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

#[cfg(test)]
mod tests {
    use crate::certs_cmd::{CertsCommand, run};
    use palisade_fence::Fencing;
    use palisade_fence::client::{StoreAddr, request};

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
