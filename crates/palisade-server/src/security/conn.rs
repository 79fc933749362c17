//! Accepting connections with limits: a cap on open connections per listener,
//! and idle connections closed.
//!
//! "Idle" is judged on calls, not bytes: an HTTP/2 client answers the server's
//! pings by itself, so a connection that only exchanges pings would never look
//! idle to a byte counter. Every call marks its connection busy while it runs
//! (see [`ConnInfo::begin_call`]); a connection with no call in flight and none
//! started for [`Limits::idle_timeout`] is closed.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus::{IntCounter, IntCounterVec, Opts};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use super::TlsAcceptor;

/// Bounds on what one caller can hold open. Each is documented in
/// docs/security.md and counted in [`Counters`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections per listener; more are closed at once after accept.
    pub max_connections: usize,
    /// A connection with no call in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Calls in flight per authenticated identity (waiting acquires included),
    /// unless a role of the identity says otherwise (`max_calls`).
    pub max_calls_per_identity: usize,
    /// Sessions open at once per authenticated identity (on a TLS node),
    /// unless a role of the identity says otherwise (`max_sessions`).
    pub max_sessions_per_identity: usize,
    /// Time a client gets to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// TLS handshakes in progress per listener; a connection past it is closed
    /// at once.
    pub max_handshakes: usize,
    /// TLS handshakes in progress per source address: one host that opens
    /// connections and never finishes their handshakes cannot fill the
    /// listener's [`Limits::max_handshakes`] for everyone else.
    pub max_handshakes_per_ip: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(300),
            max_calls_per_identity: 4096,
            max_sessions_per_identity: 10_000,
            handshake_timeout: Duration::from_secs(10),
            max_handshakes: 256,
            max_handshakes_per_ip: 16,
        }
    }
}

/// What the limits and the gatekeeper turned away, for logs, tests and the
/// node's `/metrics` (`palisade_refused_total{reason}`).
#[derive(Debug)]
pub struct Counters {
    family: IntCounterVec,
    /// Connections closed at once because the listener was full.
    pub refused_connections: IntCounter,
    /// Connections closed for being idle.
    pub idle_closed: IntCounter,
    /// Calls refused because their identity had too many in flight.
    pub refused_calls: IntCounter,
    /// Sessions refused because their identity had too many open.
    pub refused_sessions: IntCounter,
    /// Calls refused for bad or missing credentials, or missing permission.
    pub refused_auth: IntCounter,
    /// Connections closed at once because too many TLS handshakes were in
    /// progress (on the listener, or from the same address).
    pub refused_handshakes: IntCounter,
}

impl Default for Counters {
    fn default() -> Self {
        let family = IntCounterVec::new(
            Opts::new(
                "palisade_refused_total",
                "Connections and calls the node turned away, by reason (connections, idle, calls_per_identity, sessions_per_identity, auth, handshakes).",
            ),
            &["reason"],
        )
        .expect("valid counter");
        let of = |reason: &str| family.with_label_values(&[reason]);
        Counters {
            refused_connections: of("connections"),
            idle_closed: of("idle"),
            refused_calls: of("calls_per_identity"),
            refused_sessions: of("sessions_per_identity"),
            refused_auth: of("auth"),
            refused_handshakes: of("handshakes"),
            family,
        }
    }
}

impl Counters {
    /// Adds the counters to a node's registry.
    ///
    /// # Errors
    /// When the registry already holds them.
    pub fn register(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.family.clone()))
    }
}

/// The TLS handshakes in progress on one listener, by source address.
#[derive(Default)]
struct Handshakes {
    total: usize,
    by_ip: std::collections::HashMap<std::net::IpAddr, usize>,
}

impl Handshakes {
    /// Counts a new handshake from `ip`, unless the listener's or that
    /// address's cap is reached.
    fn begin(&mut self, ip: std::net::IpAddr, limits: &Limits) -> bool {
        if self.total >= limits.max_handshakes {
            return false;
        }
        let from_ip = self.by_ip.entry(ip).or_default();
        if *from_ip >= limits.max_handshakes_per_ip {
            return false;
        }
        *from_ip += 1;
        self.total += 1;
        true
    }

    fn end(&mut self, ip: std::net::IpAddr) {
        self.total -= 1;
        // The map holds only addresses with a handshake in progress.
        if let Some(n) = self.by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.by_ip.remove(&ip);
            }
        }
    }
}

/// Per-connection facts every request on it can see (a request extension).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The certificate chain the peer presented in the TLS handshake (already
    /// verified against the cluster's CA); `None` without TLS or without a
    /// client certificate.
    pub peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    activity: Arc<Activity>,
}

#[derive(Debug)]
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `started` when the last call began or ended.
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

impl ConnInfo {
    /// Marks the connection busy until the returned guard is dropped.
    pub fn begin_call(&self) -> CallGuard {
        self.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        self.activity.touch();
        CallGuard(self.activity.clone())
    }
}

/// Held while a call runs on a connection.
#[derive(Debug)]
pub struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted TCP connection under the limits.
pub struct LimitedConn {
    inner: Box<dyn crate::io::Conn>,
    info: ConnInfo,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
    counters: Arc<Counters>,
    _slot: OwnedSemaphorePermit,
}

impl Connected for LimitedConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for LimitedConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        // Nothing to read: the server is waiting for the peer. Check idleness
        // whenever the timer fires; re-arm it while calls are running.
        while this.idle.as_mut().poll(cx).is_ready() {
            let activity = &this.info.activity;
            let deadline = activity.last() + this.idle_timeout;
            if activity.in_flight.load(Ordering::Relaxed) > 0 {
                this.idle.as_mut().reset(Instant::now() + this.idle_timeout);
            } else if deadline <= Instant::now() {
                this.counters.idle_closed.inc();
                tracing::debug!(peer = ?this.info.remote, "closing an idle connection");
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle",
                )));
            } else {
                this.idle.as_mut().reset(deadline);
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for LimitedConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The stream of accepted connections of one listener, for
/// `serve_with_incoming_shutdown`. The accept loop stops when the stream is
/// dropped.
pub type Incoming = ReceiverStream<io::Result<LimitedConn>>;

/// What a listener accepts on: a TCP socket, or a simulated network's address.
pub enum Accepting {
    /// The operating system's TCP.
    Tcp(TcpListener),
    /// A [`crate::io::Net`]'s listener.
    Net(Box<dyn crate::io::Listener>),
}

impl Accepting {
    async fn accept(&mut self) -> io::Result<(Box<dyn crate::io::Conn>, SocketAddr)> {
        match self {
            Accepting::Tcp(listener) => {
                let (stream, remote) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok((Box::new(stream), remote))
            }
            Accepting::Net(listener) => listener.accept().await,
        }
    }
}

/// Accepts on `listener` under `limits`, with TLS when `tls` is given.
///
/// A TLS handshake runs in a task of its own, bounded by
/// [`Limits::handshake_timeout`], so a slow or silent client holds up no one
/// else's accept. Handshakes in progress do not hold connection slots (taken
/// once the handshake is done): they have caps of their own, per listener and
/// per source address ([`Limits::max_handshakes`],
/// [`Limits::max_handshakes_per_ip`]), so a host that floods a port with
/// connections that never finish their handshake cannot keep out a member
/// that does.
pub fn incoming(
    mut listener: Accepting,
    limits: Limits,
    counters: Arc<Counters>,
    tls: Option<TlsAcceptor>,
) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(std::sync::Mutex::new(Handshakes::default()));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tx.closed() => return,
            };
            let (stream, remote) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let conn_counters = counters.clone();
            let idle_timeout = limits.idle_timeout;
            let slots = slots.clone();
            let max_connections = limits.max_connections;
            // Takes a connection slot, or refuses the connection.
            let limited = move |inner: Box<dyn crate::io::Conn>, peer_certs| {
                let Ok(slot) = slots.try_acquire_owned() else {
                    conn_counters.refused_connections.inc();
                    tracing::warn!(peer = %remote, limit = max_connections, "connection refused: too many open connections");
                    return None;
                };
                Some(LimitedConn {
                    inner,
                    info: ConnInfo {
                        remote: Some(remote),
                        peer_certs,
                        activity: Arc::new(Activity {
                            started: Instant::now(),
                            in_flight: AtomicUsize::new(0),
                            last_ms: AtomicU64::new(0),
                        }),
                    },
                    idle_timeout,
                    idle: Box::pin(tokio::time::sleep(idle_timeout)),
                    counters: conn_counters,
                    _slot: slot,
                })
            };
            match &tls {
                None => {
                    if let Some(conn) = limited(stream, None)
                        && tx.send(Ok(conn)).await.is_err()
                    {
                        return;
                    }
                }
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    let (tx, timeout) = (tx.clone(), limits.handshake_timeout);
                    if !handshakes
                        .lock()
                        .expect("poisoned")
                        .begin(remote.ip(), &limits)
                    {
                        counters.refused_handshakes.inc();
                        tracing::warn!(peer = %remote, "connection refused: too many TLS handshakes in progress");
                        continue;
                    }
                    let handshakes = handshakes.clone();
                    tokio::spawn(async move {
                        let outcome = tokio::time::timeout(timeout, handshake).await;
                        handshakes.lock().expect("poisoned").end(remote.ip());
                        match outcome {
                            Ok(Ok(stream)) => {
                                let certs = stream
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .filter(|c| !c.is_empty())
                                    .map(|c| {
                                        Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())
                                    });
                                if let Some(conn) = limited(Box::new(stream), certs) {
                                    let _ = tx.send(Ok(conn)).await;
                                }
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(peer = %remote, error = %e, "TLS handshake failed");
                            }
                            Err(_) => {
                                tracing::debug!(peer = %remote, "TLS handshake timed out");
                            }
                        }
                    });
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_capped_per_address_and_per_listener() {
        let limits = Limits {
            max_handshakes: 3,
            max_handshakes_per_ip: 2,
            ..Limits::default()
        };
        let (a, b, c): (std::net::IpAddr, std::net::IpAddr, std::net::IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let mut h = Handshakes::default();
        assert!(h.begin(a, &limits));
        assert!(h.begin(a, &limits));
        assert!(!h.begin(a, &limits), "a third from one address");
        assert!(h.begin(b, &limits));
        assert!(!h.begin(c, &limits), "a fourth on the listener");
        h.end(a);
        assert!(h.begin(c, &limits));
        for ip in [a, b, c] {
            h.end(ip);
        }
        assert_eq!(h.total, 0);
        assert!(h.by_ip.is_empty(), "the map shrinks: {:?}", h.by_ip);
    }
}
