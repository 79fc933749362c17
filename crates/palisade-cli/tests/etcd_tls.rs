//! The etcd backend over TLS, as a user reaches it: `palisade lock --backend
//! etcd://HOST:PORT --ca ca.pem --cert client.pem --key client-key.pem`
//! against a real etcd that speaks only TLS to clients, admits only client
//! certificates of its CA (`--client-cert-auth`) and has authentication on, so
//! a certificate's common name is the etcd user whose roles decide which locks
//! it may take (`palisade certs` makes every certificate).

use std::path::Path;
use std::process::Command;

use palisade_testkit::EtcdCluster;

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
fn a_lock_over_tls_as_an_etcd_user_and_every_wrong_way_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let other = dir.path().join("other");
    certs_in(&certs, "nightly,mallory");
    certs_in(&other, "nightly");
    let f = |d: &Path, n: &str| d.join(n).to_str().unwrap().to_owned();
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
    let lock = |name: &str, extra: &[String]| {
        let mut args = vec!["lock".to_owned(), "--backend".into(), backend.clone()];
        args.extend(extra.iter().cloned());
        args.extend(
            [
                "--ttl",
                "5s",
                name,
                "--",
                "sh",
                "-c",
                "echo token=$PALISADE_FENCING_TOKEN",
            ]
            .map(str::to_owned),
        );
        palisade(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let creds = |d: &Path, client: Option<&str>| {
        let mut v = vec!["--ca".to_owned(), f(d, "ca.pem")];
        if let Some(name) = client {
            v.extend([
                "--cert".to_owned(),
                f(d, &format!("client-{name}.pem")),
                "--key".to_owned(),
                f(d, &format!("client-{name}-key.pem")),
            ]);
        }
        v
    };
    let token = |out: &std::process::Output| -> u64 {
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("token="),
            "{said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        said.trim().trim_start_matches("token=").parse().unwrap()
    };

    let first = token(&lock("jobs/nightly", &creds(&certs, Some("nightly"))));
    let second = token(&lock("jobs/nightly", &creds(&certs, Some("nightly"))));
    assert!(
        second > first,
        "tokens rise over TLS too: {first} then {second}"
    );

    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "secret\n").unwrap();
    for (what, extra, name, says, code) in [
        (
            "a lock outside the user's role",
            creds(&certs, Some("nightly")),
            "billing/ledger",
            "permission denied",
            75,
        ),
        (
            "a certificate whose name is no etcd user",
            creds(&certs, Some("mallory")),
            "jobs/nightly",
            "permission denied",
            75,
        ),
        (
            "no client certificate",
            creds(&certs, None),
            "jobs/nightly",
            "certificate",
            75,
        ),
        (
            "a server of a CA we do not trust",
            creds(&other, Some("nightly")),
            "jobs/nightly",
            "invalid peer certificate",
            75,
        ),
        (
            "a bearer token, which etcd does not take",
            vec![
                "--ca".to_owned(),
                f(&certs, "ca.pem"),
                "--token-file".to_owned(),
                token_file.to_str().unwrap().to_owned(),
            ],
            "jobs/nightly",
            "authenticates clients by certificate",
            2,
        ),
    ] {
        let out = lock(name, &extra);
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
