//! The correctness backends over TLS, as a user reaches them, each against a
//! real server that speaks only TLS and admits only client certificates of its
//! CA (`palisade certs` makes every certificate):
//! - PostgreSQL: `--backend 'postgres://…?sslmode=verify-full&sslrootcert=…&sslcert=…&sslkey=…'`;
//! - etcd: `--backend etcd://HOST:PORT --ca ca.pem --cert c.pem --key k.pem`,
//!   with etcd's authentication on, so a certificate's common name is the
//!   etcd user whose roles decide which locks it may take;
//! - ZooKeeper: `--backend zk://HOST:PORT --ca … --cert … --key …` against its
//!   `secureClientPort` with `ssl.clientAuth=need`.

use std::path::Path;
use std::process::{Command, Output};

use palisade_testkit::{EtcdCluster, PostgresServer, ZooKeeperEnsemble};

fn palisade(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .env("PALISADE_LOG", "warn")
        .output()
        .unwrap()
}

fn certs_in(dir: &Path, clients: &str) {
    let out = palisade(&[
        "certs",
        "init",
        dir.to_str().unwrap(),
        "--nodes",
        "1",
        "--clients",
        clients,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn path(d: &Path, name: &str) -> String {
    d.join(name).to_str().unwrap().to_owned()
}

/// `palisade lock --backend BACKEND EXTRA… NAME -- echo token=…`.
fn lock(backend: &str, extra: &[String], name: &str) -> Output {
    let mut args = vec!["lock", "--backend", backend];
    args.extend(extra.iter().map(String::as_str));
    args.extend([
        "--ttl",
        "5s",
        name,
        "--",
        "sh",
        "-c",
        "echo token=$PALISADE_FENCING_TOKEN",
    ]);
    palisade(&args)
}

/// The token a successful `lock` printed.
fn token(out: &Output) -> u64 {
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("token="),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    said.trim().trim_start_matches("token=").parse().unwrap()
}

/// `--ca` of `d`, and `--cert/--key` of its client `client`.
fn creds(d: &Path, client: Option<&str>) -> Vec<String> {
    let mut v = vec!["--ca".to_owned(), path(d, "ca.pem")];
    if let Some(name) = client {
        v.extend([
            "--cert".to_owned(),
            path(d, &format!("client-{name}.pem")),
            "--key".to_owned(),
            path(d, &format!("client-{name}-key.pem")),
        ]);
    }
    v
}

/// Each case refused: the exit status, the reason in the message, no token.
fn refused(cases: Vec<(&str, Output, &str, i32)>) {
    for (what, out, says, code) in cases {
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{what}: exit {:?}: {}", out.status.code(), err.trim());
        assert!(!out.status.success(), "{what}: accepted");
        assert!(err.contains(says), "{what}: {err}");
        assert_eq!(out.status.code(), Some(code), "{what}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("token="),
            "{what}"
        );
    }
}

/// Two locks in a row whose tokens rise.
fn tokens_rise(take: impl Fn() -> Output) {
    let first = token(&take());
    let second = token(&take());
    assert!(
        second > first,
        "tokens rise over TLS too: {first} then {second}"
    );
}

/// `--ca` and `--token-file`: refused where the backend takes no bearer token.
fn with_token_file(dir: &Path, certs: &Path) -> Vec<String> {
    let file = dir.join("token");
    std::fs::write(&file, "secret\n").unwrap();
    vec![
        "--ca".to_owned(),
        path(certs, "ca.pem"),
        "--token-file".to_owned(),
        file.to_str().unwrap().to_owned(),
    ]
}

#[test]
fn postgres_a_lock_over_tls_with_a_client_certificate_and_every_wrong_way_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    certs_in(&certs, "postgres,intruder");
    certs_in(&other, "postgres");
    let pg = PostgresServer::start_tls(
        &certs.join("node-1.pem"),
        &certs.join("node-1-key.pem"),
        &certs.join("ca.pem"),
    )
    .unwrap();
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port());
    let url = |ca: &str, client: Option<(&Path, &str)>| {
        let mut u = format!("{base}?sslmode=verify-full&sslrootcert={ca}");
        if let Some((d, name)) = client {
            u.push_str(&format!(
                "&sslcert={}&sslkey={}",
                path(d, &format!("client-{name}.pem")),
                path(d, &format!("client-{name}-key.pem"))
            ));
        }
        u
    };
    let pg_lock = |backend: &str| lock(backend, &[], "tls/demo");
    tokens_rise(|| pg_lock(&url(&path(&certs, "ca.pem"), Some((&certs, "postgres")))));
    refused(vec![
        ("plaintext", pg_lock(&base), "no encryption", 75),
        (
            "no client certificate",
            pg_lock(&url(&path(&certs, "ca.pem"), None)),
            "connection requires a valid client certificate",
            75,
        ),
        (
            "a certificate for another role",
            pg_lock(&url(&path(&certs, "ca.pem"), Some((&certs, "intruder")))),
            "certificate authentication failed",
            75,
        ),
        (
            "a server of a CA we do not trust",
            pg_lock(&url(&path(&other, "ca.pem"), Some((&other, "postgres")))),
            "unauthenticated: postgres: the server's certificate is not trusted",
            75,
        ),
        (
            "a mode that checks no name",
            pg_lock(&format!("{base}?sslmode=require")),
            "would not check the server's name",
            2,
        ),
    ]);
}

#[test]
fn etcd_a_lock_over_tls_as_an_etcd_user_and_every_wrong_way_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    certs_in(&certs, "nightly,mallory");
    certs_in(&other, "nightly");
    let etcd = EtcdCluster::start_tls(
        1,
        &certs.join("node-1.pem"),
        &certs.join("node-1-key.pem"),
        &certs.join("ca.pem"),
    )
    .unwrap();
    // nightly may take locks under jobs/ only; mallory is no etcd user.
    etcd.enable_auth(
        &certs.join("client-nightly.pem"),
        &certs.join("client-nightly-key.pem"),
        &[("nightly", "/palisade/locks/jobs/")],
    )
    .unwrap();
    let backend = format!("etcd://{}", etcd.endpoints()[0]);
    tokens_rise(|| lock(&backend, &creds(&certs, Some("nightly")), "jobs/nightly"));
    refused(vec![
        (
            "a lock outside the user's role",
            lock(&backend, &creds(&certs, Some("nightly")), "billing/ledger"),
            "permission denied",
            75,
        ),
        (
            "a certificate whose name is no etcd user",
            lock(&backend, &creds(&certs, Some("mallory")), "jobs/nightly"),
            "permission denied",
            75,
        ),
        (
            "no client certificate",
            lock(&backend, &creds(&certs, None), "jobs/nightly"),
            "refused this client's certificate",
            75,
        ),
        (
            "a server of a CA we do not trust",
            lock(&backend, &creds(&other, Some("nightly")), "jobs/nightly"),
            "invalid peer certificate",
            75,
        ),
        (
            "a bearer token, which etcd does not take",
            lock(
                &backend,
                &with_token_file(dir.path(), &certs),
                "jobs/nightly",
            ),
            "authenticates clients by certificate",
            2,
        ),
    ]);
}

#[test]
fn zookeeper_a_lock_over_tls_with_a_client_certificate_and_every_wrong_way_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    certs_in(&certs, "nightly");
    certs_in(&other, "nightly");
    let zk = ZooKeeperEnsemble::start_tls(
        1,
        &certs.join("node-1.pem"),
        &certs.join("node-1-key.pem"),
        &certs.join("ca.pem"),
    )
    .unwrap();
    let backend = format!("zk://{}", zk.connect_string());
    tokens_rise(|| lock(&backend, &creds(&certs, Some("nightly")), "jobs/nightly"));
    refused(vec![
        (
            "no client certificate",
            lock(&backend, &creds(&certs, None), "jobs/nightly"),
            "refused handshake",
            75,
        ),
        (
            "a server of a CA we do not trust",
            lock(&backend, &creds(&other, Some("nightly")), "jobs/nightly"),
            "refused handshake",
            75,
        ),
        (
            "plaintext to the TLS port",
            lock(&backend, &[], "jobs/nightly"),
            "no server",
            75,
        ),
        (
            "a bearer token, which ZooKeeper does not take",
            lock(
                &backend,
                &with_token_file(dir.path(), &certs),
                "jobs/nightly",
            ),
            "authenticates clients by certificate",
            2,
        ),
    ]);
}
