//! `palisade fence-store`: the fenced object store (its HTTP client is
//! `palisade_fence::client`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use palisade_auth::Policy;
use palisade_backends::FencingArg;
use palisade_fence::access::Access;
use palisade_fence::http::ServeOptions;
use palisade_fence::verify::TokenVerifier;

use crate::duration_arg;

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
    /// Verify client certificates against this CA (PEM; the cluster's CA):
    /// a verified certificate names its holder for --auth.
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// The policy file (the same format as `palisade serve --auth`): every
    /// request must authenticate (a client certificate of --tls-ca, or a
    /// bearer token); `lock` prefixes grant writes, `read` prefixes reads.
    /// Re-read on SIGHUP. Needs --tls-cert: credentials never travel in
    /// plaintext.
    #[arg(long, requires = "tls_cert")]
    auth: Option<PathBuf>,
    /// The Palisade cluster that issues the tokens (comma-separated
    /// HOST:PORT): a token above an object's highest is then believed only
    /// after the cluster says it is the lock's current grant (one question per
    /// new token; see --verify-tokens).
    #[arg(long, value_delimiter = ',')]
    cluster: Vec<String>,
    /// The cluster's CA (PEM), to reach --cluster over TLS.
    #[arg(long)]
    cluster_ca: Option<PathBuf>,
    /// The store's own certificate (PEM) for the cluster; it needs the `read`
    /// right on the locks.
    #[arg(long, requires = "cluster_key")]
    cluster_cert: Option<PathBuf>,
    /// The key of --cluster-cert (PEM).
    #[arg(long, requires = "cluster_cert")]
    cluster_key: Option<PathBuf>,
    /// A file holding the store's bearer token for the cluster.
    #[arg(long)]
    cluster_token_file: Option<PathBuf>,
    /// With --cluster: ask the cluster about new tokens (on), or trust every
    /// token as a store without --cluster does (off).
    #[arg(long, value_enum, default_value = "on")]
    verify_tokens: OnOff,
    /// How long a client may take to send a request's headers.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    header_timeout: Duration,
    /// How long a client may take to send a request's body.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    body_timeout: Duration,
}

/// A switch.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// Serves the store until SIGINT/SIGTERM.
pub async fn serve(a: FenceStoreArgs) -> Result<i32> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let mut options = ServeOptions {
        header_timeout: a.header_timeout.max(Duration::from_millis(100)),
        body_timeout: a.body_timeout.max(Duration::from_millis(100)),
        ..ServeOptions::default()
    };
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        options.tls = Some(palisade_fence::http::tls_acceptor_verifying(
            cert,
            key,
            a.tls_ca.as_deref(),
        )?);
    }
    if let Some(path) = &a.auth {
        let policy = Policy::load(path).map_err(anyhow::Error::msg)?;
        options.access = Access::policy(policy);
        tokio::spawn(reload_on_hangup(path.clone(), options.access.clone()));
    }
    if !a.cluster.is_empty() && a.verify_tokens == OnOff::On {
        let mut config = palisade_client::ClientConfig::new(a.cluster.clone());
        (config.tls, config.bearer_token) = palisade_client::credentials_from_files(
            a.cluster_ca.as_deref(),
            a.cluster_cert.as_deref().zip(a.cluster_key.as_deref()),
            a.cluster_token_file.as_deref(),
        )?;
        let admin = palisade_client::Admin::new(&config)?;
        options.verifier = Some(Arc::new(TokenVerifier::new(admin)));
    }
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("binding {}", a.listen))?;
    eprintln!(
        "palisade: fenced object store on {}://{} (data in {}, fencing {:?}, {}, {})",
        if options.tls.is_some() {
            "https"
        } else {
            "http"
        },
        a.listen,
        a.data_dir.display(),
        a.fencing,
        if options.access.is_open() {
            "open to every client"
        } else {
            "clients authenticated by the policy"
        },
        if options.verifier.is_some() {
            "new tokens checked with the cluster"
        } else {
            "every token trusted"
        },
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
    palisade_fence::http::serve_with(listener, store, options, shutdown).await?;
    Ok(0)
}

/// Re-reads the policy file on every SIGHUP; a file that does not parse
/// leaves the policy in force as it was.
async fn reload_on_hangup(path: PathBuf, access: Access) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    while hangups.recv().await.is_some() {
        match Policy::load(&path) {
            Ok(policy) => {
                eprintln!(
                    "palisade: fence-store policy reloaded from {} ({} users)",
                    path.display(),
                    policy.user_count()
                );
                access.replace(policy);
            }
            Err(e) => eprintln!("palisade: policy not reloaded, the old one stays: {e}"),
        }
    }
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
