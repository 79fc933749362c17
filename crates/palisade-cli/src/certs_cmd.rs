//! `palisade certs …`: a certificate authority for newcomers (rcgen), and bearer
//! tokens for the policy file.
//!
//! Node certificates name their node (`palisade:node:ID` URI, and the DNS name
//! `node-ID.palisade` that peers expect when they dial it) and the hosts it is
//! reached at; client certificates name their client (`palisade:client:NAME`
//! URI and common name). Keys are ECDSA P-256, written with mode 0600.

use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};

/// How long the CA is valid.
const CA_DAYS: i64 = 3650;
/// How long node and client certificates are valid by default.
const LEAF_DAYS: i64 = 825;

/// `palisade certs …`.
#[derive(Subcommand)]
pub enum CertsCommand {
    /// Make a CA and certificates for NODES nodes and the named clients in DIR.
    Init {
        /// Where to write them (created; existing files are not overwritten).
        dir: PathBuf,
        /// Node certificates for ids 1..=NODES.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Client certificates, by name (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "admin")]
        clients: Vec<String>,
        /// Host names and IP addresses the nodes are reached at, besides
        /// localhost, 127.0.0.1 and ::1 (comma-separated).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
    },
    /// Add a node certificate, signed by the CA in DIR.
    Node {
        /// The directory holding ca.pem and ca-key.pem.
        dir: PathBuf,
        /// The node id.
        id: u64,
        /// Extra host names and IP addresses (comma-separated).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
    },
    /// Add a client certificate, signed by the CA in DIR.
    Client {
        /// The directory holding ca.pem and ca-key.pem.
        dir: PathBuf,
        /// The client's name (its identity in the policy file).
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = LEAF_DAYS)]
        days: i64,
        /// Make a certificate that expired yesterday (to test refusals).
        #[arg(long, hide = true)]
        expired: bool,
    },
    /// Print a new bearer token for NAME and the policy-file line that admits it.
    Token {
        /// The user the token authenticates.
        name: String,
    },
}

/// Runs `palisade certs …`.
pub fn run(c: CertsCommand) -> Result<i32> {
    match c {
        CertsCommand::Init {
            dir,
            nodes,
            clients,
            hosts,
        } => {
            if nodes == 0 {
                bail!("--nodes must be at least 1");
            }
            std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
            let ca_key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(DnType::CommonName, "Palisade cluster CA");
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            valid_for(&mut params, CA_DAYS, false);
            let ca_cert = params.self_signed(&ca_key)?;
            write(&dir.join("ca.pem"), &ca_cert.pem(), false)?;
            write(&dir.join("ca-key.pem"), &ca_key.serialize_pem(), true)?;
            let issuer = Issuer::new(params, ca_key);
            for id in 1..=nodes {
                node_cert(&dir, &issuer, id, &hosts)?;
            }
            for name in &clients {
                client_cert(&dir, &issuer, name, LEAF_DAYS, false)?;
            }
            println!(
                "CA, {nodes} node and {} client certificates written to {}",
                clients.len(),
                dir.display()
            );
            println!("keep ca-key.pem offline once every certificate you need is made");
        }
        CertsCommand::Node { dir, id, hosts } => {
            node_cert(&dir, &load_issuer(&dir)?, id, &hosts)?;
        }
        CertsCommand::Client {
            dir,
            name,
            days,
            expired,
        } => {
            client_cert(&dir, &load_issuer(&dir)?, &name, days, expired)?;
        }
        CertsCommand::Token { name } => {
            if name.is_empty() {
                bail!("the user name must not be empty");
            }
            let token = hex::encode(rand::random::<[u8; 32]>());
            let digest = hex::encode(Sha256::digest(token.as_bytes()));
            println!("token: {token}");
            println!("policy entry:");
            println!("[[users]]\nname = {name:?}\ntoken_sha256 = [\"{digest}\"]\nroles = []");
        }
    }
    Ok(0)
}

fn load_issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .with_context(|| format!("{}", dir.join(name).display()))
    };
    let key = KeyPair::from_pem(&read("ca-key.pem")?)?;
    Ok(Issuer::from_ca_cert_pem(&read("ca.pem")?, key)?)
}

fn valid_for(params: &mut CertificateParams, days: i64, expired: bool) {
    let now = time::OffsetDateTime::now_utc();
    if expired {
        params.not_before = now - time::Duration::days(30);
        params.not_after = now - time::Duration::days(1);
    } else {
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(days);
    }
}

fn node_cert(dir: &Path, issuer: &Issuer<'_, KeyPair>, id: u64, hosts: &[String]) -> Result<()> {
    if id == 0 {
        bail!("node ids start at 1");
    }
    let mut names: Vec<String> = vec![
        format!("node-{id}.palisade"),
        "localhost".into(),
        "127.0.0.1".into(),
        "::1".into(),
    ];
    names.extend(hosts.iter().filter(|h| !h.is_empty()).cloned());
    let mut params = CertificateParams::new(names)?;
    params
        .subject_alt_names
        .push(SanType::URI(format!("palisade:node:{id}").try_into()?));
    params
        .distinguished_name
        .push(DnType::CommonName, format!("palisade node {id}"));
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    valid_for(&mut params, LEAF_DAYS, false);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    write(&dir.join(format!("node-{id}.pem")), &cert.pem(), false)?;
    write(
        &dir.join(format!("node-{id}-key.pem")),
        &key.serialize_pem(),
        true,
    )?;
    Ok(())
}

fn client_cert(
    dir: &Path,
    issuer: &Issuer<'_, KeyPair>,
    name: &str,
    days: i64,
    expired: bool,
) -> Result<()> {
    if name.is_empty() || name.contains(['/', '\0']) || name.parse::<IpAddr>().is_ok() {
        bail!("client name {name:?}: must be non-empty, without '/'");
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .subject_alt_names
        .push(SanType::URI(format!("palisade:client:{name}").try_into()?));
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    valid_for(&mut params, days, expired);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    write(&dir.join(format!("client-{name}.pem")), &cert.pem(), false)?;
    write(
        &dir.join(format!("client-{name}-key.pem")),
        &key.serialize_pem(),
        true,
    )?;
    Ok(())
}

/// Writes a new file; refuses to overwrite one (a CA key lost to a typo is a
/// cluster re-keyed).
fn write(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("{} (existing files are never overwritten)", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("{}", path.display()))?;
    Ok(())
}
