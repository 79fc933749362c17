//! The PostgreSQL backend over TLS, as a user reaches it: `palisade lock
//! --backend 'postgres://…?sslmode=verify-full&sslrootcert=…&sslcert=…&sslkey=…'`
//! against a real PostgreSQL that speaks only TLS on TCP and admits only
//! client certificates of its CA (`palisade certs` makes both).

use std::path::Path;
use std::process::Command;

use palisade_testkit::PostgresServer;

fn palisade(args: &[&str]) -> std::process::Output {
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

#[test]
fn a_lock_over_tls_with_a_client_certificate_and_every_wrong_way_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    certs_in(&certs, "postgres,intruder");
    certs_in(&other, "postgres");
    let f = |d: &Path, n: &str| d.join(n).to_str().unwrap().to_owned();
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
                f(d, &format!("client-{name}.pem")),
                f(d, &format!("client-{name}-key.pem"))
            ));
        }
        u
    };
    let lock = |backend: &str| {
        palisade(&[
            "lock",
            "--backend",
            backend,
            "tls/demo",
            "--",
            "sh",
            "-c",
            "echo token=$PALISADE_FENCING_TOKEN",
        ])
    };

    let ok = lock(&url(&f(&certs, "ca.pem"), Some((&certs, "postgres"))));
    let said = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success() && said.contains("token="),
        "{said} {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let first: u64 = said.trim().trim_start_matches("token=").parse().unwrap();
    let again = lock(&url(&f(&certs, "ca.pem"), Some((&certs, "postgres"))));
    let second: u64 = String::from_utf8_lossy(&again.stdout)
        .trim()
        .trim_start_matches("token=")
        .parse()
        .unwrap();
    assert!(
        second > first,
        "tokens rise over TLS too: {first} then {second}"
    );

    for (what, backend, says) in [
        ("plaintext", base.clone(), "no encryption"),
        (
            "no client certificate",
            url(&f(&certs, "ca.pem"), None),
            "connection requires a valid client certificate",
        ),
        (
            "a certificate for another role",
            url(&f(&certs, "ca.pem"), Some((&certs, "intruder"))),
            "certificate authentication failed",
        ),
        (
            "a server of a CA we do not trust",
            url(&f(&other, "ca.pem"), Some((&other, "postgres"))),
            "invalid peer certificate",
        ),
        (
            "a mode that checks no name",
            format!("{base}?sslmode=require"),
            "would not check the server's name",
        ),
    ] {
        let out = lock(&backend);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(err.contains(says), "{what}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("token="),
            "{what}"
        );
        eprintln!("{what}: exit {:?}: {}", out.status.code(), err.trim());
    }
}
