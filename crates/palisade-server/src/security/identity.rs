//! Who a certificate names ([`palisade_auth::principal`]), and the connection
//! facts a request carries.

use std::sync::Arc;

use tokio_rustls::rustls::pki_types::CertificateDer;
use tonic::Request;

pub use palisade_auth::principal::{CLIENT_URI_PREFIX, NODE_URI_PREFIX, Principal, principal_of};

use super::conn::ConnInfo;

/// The certificates the peer presented on this request's connection, if it
/// came over TLS with a client certificate.
pub fn peer_certs<T>(req: &Request<T>) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    conn_info(req).and_then(|c| c.peer_certs.clone())
}

/// The connection a request came on.
pub fn conn_info<T>(req: &Request<T>) -> Option<&ConnInfo> {
    req.extensions().get::<ConnInfo>()
}
