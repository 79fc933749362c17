//! Who a certificate names.
//!
//! Palisade's certificates (`palisade certs init`) name their holder in a URI
//! subject-alternative name: `palisade:node:ID` for a node, `palisade:client:NAME`
//! for a client. A client certificate from another CA (a company PKI, say) that
//! has no such URI is named by its subject's common name. A node certificate is
//! never a client identity, and a client certificate never a node's: each
//! listener accepts only its own kind.

/// The URI scheme prefix of a node's certificate.
pub const NODE_URI_PREFIX: &str = "palisade:node:";
/// The URI scheme prefix of a client's certificate.
pub const CLIENT_URI_PREFIX: &str = "palisade:client:";

/// What a verified certificate says its holder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A Palisade node, by id.
    Node(u64),
    /// A client, by name.
    Client(String),
}

/// Reads the principal out of a DER certificate (already verified by TLS
/// against the cluster's CA).
///
/// # Errors
/// A message when the certificate cannot be parsed or names nobody.
pub fn principal_of(der: &[u8]) -> Result<Principal, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                if let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) {
                    return id
                        .parse()
                        .ok()
                        .filter(|id| *id > 0)
                        .map(Principal::Node)
                        .ok_or_else(|| format!("certificate names a bad node id {uri:?}"));
                }
                if let Some(client) = uri.strip_prefix(CLIENT_URI_PREFIX) {
                    if client.is_empty() {
                        return Err("certificate names an empty client".into());
                    }
                    return Ok(Principal::Client(client.to_owned()));
                }
            }
        }
    }
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or("certificate has neither a palisade: URI nor a common name")?;
    Ok(Principal::Client(cn.to_owned()))
}
