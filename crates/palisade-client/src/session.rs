//! The session: its lease as this client may rely on it, and the keep-alive loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::{CloseSessionRequest, CreateSessionRequest, KeepAliveRequest};
use tokio::sync::watch;

use crate::connector::Connector;
use crate::{ClientConfig, ClientError, SessionId};

/// One session and its guarantee.
pub(crate) struct Session {
    pub id: SessionId,
    /// The session's key, which every call on the session presents.
    pub key: Vec<u8>,
    pub ttl: Duration,
    conn: Arc<Connector>,
    /// Until when the lease is guaranteed, on our monotonic clock: the send time
    /// of the last acknowledged keep-alive + TTL − margin. Only moves forward,
    /// except to "now" when the session is known dead.
    guaranteed_until: watch::Sender<Instant>,
    dead: AtomicBool,
    /// The keep-alive task, set right after the session is built.
    keepalive: std::sync::OnceLock<tokio::task::AbortHandle>,
}

impl Session {
    pub async fn open(
        conn: Arc<Connector>,
        config: &ClientConfig,
    ) -> Result<Arc<Session>, ClientError> {
        let sent = palisade_core::clock::now();
        let label = config.label.clone();
        let reply = conn
            .call(conn.retry_for, |ch| {
                let req = CreateSessionRequest {
                    ttl_ms: config.session_ttl.as_millis() as u64,
                    label: label.clone(),
                };
                async move { LocksClient::new(ch).create_session(req).await }
            })
            .await?;
        let id = SessionId::new(reply.session_id)
            .ok_or_else(|| ClientError::Protocol("the server opened session 0".into()))?;
        let ttl = Duration::from_millis(reply.ttl_ms);
        let margin = config
            .safety_margin
            .unwrap_or_else(|| (ttl / 10).max(Duration::from_millis(50)))
            .min(ttl / 2);
        let session = Arc::new(Session {
            id,
            key: reply.session_key,
            ttl,
            conn,
            guaranteed_until: watch::Sender::new(sent + ttl - margin),
            dead: AtomicBool::new(false),
            keepalive: std::sync::OnceLock::new(),
        });
        // Spawned once the session exists: a task started inside its
        // construction could look for it before it is there, and give up.
        let task = tokio::spawn(keep_alive(Arc::downgrade(&session), margin));
        let _ = session.keepalive.set(task.abort_handle());
        Ok(session)
    }

    pub fn remaining(&self) -> Duration {
        self.guaranteed_until
            .borrow()
            .saturating_duration_since(palisade_core::clock::now())
    }

    pub fn check_alive(&self) -> Result<(), ClientError> {
        if self.dead.load(Ordering::SeqCst) || self.remaining().is_zero() {
            Err(ClientError::SessionExpired)
        } else {
            Ok(())
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<Instant> {
        self.guaranteed_until.subscribe()
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.guaranteed_until
            .send_replace(palisade_core::clock::now());
    }

    pub async fn close(&self) -> Result<(), ClientError> {
        if let Some(task) = self.keepalive.get() {
            task.abort();
        }
        let req = CloseSessionRequest {
            session_id: self.id.get(),
            session_key: self.key.clone(),
        };
        let result = self
            .conn
            .call(self.conn.retry_for, |ch| {
                let req = req.clone();
                async move { LocksClient::new(ch).close_session(req).await }
            })
            .await;
        self.mark_dead();
        result.map(|_| ())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.keepalive.get() {
            task.abort();
        }
        if self.dead.load(Ordering::SeqCst) {
            return;
        }
        // Best effort: closing releases our locks now instead of after the TTL.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let conn = self.conn.clone();
            let req = CloseSessionRequest {
                session_id: self.id.get(),
                session_key: std::mem::take(&mut self.key),
            };
            rt.spawn(async move {
                let _ = conn
                    .call(Duration::from_secs(2), |ch| {
                        let req = req.clone();
                        async move { LocksClient::new(ch).close_session(req).await }
                    })
                    .await;
            });
        }
    }
}

/// Sends a keep-alive every quarter TTL (sooner after a failure) for as long as
/// the session exists.
async fn keep_alive(session: std::sync::Weak<Session>, margin: Duration) {
    let mut pause = Duration::ZERO;
    loop {
        tokio::time::sleep(pause).await;
        let Some(s) = session.upgrade() else { return };
        let every = s.ttl / 4;
        let attempt_timeout = s.conn.rpc_timeout.min(every);
        let sent = palisade_core::clock::now();
        let id = s.id.get();
        let reply = s
            .conn
            .call(attempt_timeout, |ch| {
                let mut req = tonic::Request::new(KeepAliveRequest {
                    session_id: id,
                    session_key: s.key.clone(),
                });
                req.set_timeout(attempt_timeout);
                async move { LocksClient::new(ch).keep_alive(req).await }
            })
            .await;
        match reply {
            Ok(r) => {
                let ttl = Duration::from_millis(r.ttl_ms).min(s.ttl);
                let until = sent + ttl.saturating_sub(margin);
                s.guaranteed_until.send_if_modified(|current| {
                    let later = until > *current;
                    if later {
                        *current = until;
                    }
                    later
                });
                pause = every;
            }
            Err(ClientError::SessionExpired) => {
                tracing::warn!(session = id, "session expired on the server");
                s.mark_dead();
                return;
            }
            Err(e) => {
                tracing::debug!(session = id, error = %e, "keep-alive failed; retrying");
                pause = Duration::from_millis(100).min(every);
            }
        }
    }
}
