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
    /// Calls in flight per authenticated identity (waiting acquires included).
    pub max_calls_per_identity: usize,
    /// Time a client gets to finish its TLS handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(300),
            max_calls_per_identity: 4096,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// What the limits turned away, for logs and tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections closed at once because the listener was full.
    pub refused_connections: AtomicU64,
    /// Connections closed for being idle.
    pub idle_closed: AtomicU64,
    /// Calls refused because their identity had too many in flight.
    pub refused_calls: AtomicU64,
    /// Calls refused for bad or missing credentials, or missing permission.
    pub refused_auth: AtomicU64,
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
                this.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
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
/// else's accept; its connection slot is taken before the handshake.
pub fn incoming(
    mut listener: Accepting,
    limits: Limits,
    counters: Arc<Counters>,
    tls: Option<TlsAcceptor>,
) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                counters.refused_connections.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %remote, limit = limits.max_connections, "connection refused: too many open connections");
                drop(stream);
                continue;
            };
            let conn_counters = counters.clone();
            let idle_timeout = limits.idle_timeout;
            let limited = move |inner: Box<dyn crate::io::Conn>, peer_certs| LimitedConn {
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
            };
            match &tls {
                None => {
                    if tx.send(Ok(limited(stream, None))).await.is_err() {
                        return;
                    }
                }
                Some(acceptor) => {
                    let handshake = acceptor.accept(stream);
                    let (tx, timeout) = (tx.clone(), limits.handshake_timeout);
                    // The connection slot travels inside `limited`: held
                    // through the handshake, given back if it fails.
                    let build = limited;
                    tokio::spawn(async move {
                        match tokio::time::timeout(timeout, handshake).await {
                            Ok(Ok(stream)) => {
                                let certs = stream
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .filter(|c| !c.is_empty())
                                    .map(|c| {
                                        Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())
                                    });
                                let _ = tx.send(Ok(build(Box::new(stream), certs))).await;
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
