//! The guard of a correctness lock.

use std::future::Future;
use std::time::{Duration, Instant};

use palisade_core::{FencingToken, LeaseState};
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::{ProclaimRequest, ReleaseRequest};

use crate::{Client, ClientError};

/// The header name fenced HTTP resources read the token from.
pub const FENCING_TOKEN_HEADER: &str = "Fencing-Token";

/// Proof that this session was granted a lock, with the grant's fencing token.
///
/// Pass [`FencedGuard::token`] to every write on the protected resource; the
/// resource must reject tokens lower than the highest it has seen. Dropping the
/// guard releases the lock in the background (best effort).
pub struct FencedGuard {
    client: Client,
    name: String,
    token: FencingToken,
    slot: u32,
    released: bool,
    /// The end of the work was recorded in the lock-safety figures (or must
    /// not be: a grant given back unused).
    noted: bool,
}

impl FencedGuard {
    pub(crate) fn new(client: Client, name: String, token: FencingToken, slot: u32) -> Self {
        FencedGuard {
            client,
            name,
            token,
            slot,
            released: false,
            noted: false,
        }
    }

    /// The fencing token: the Raft log index of the entry that granted this lock.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// A semaphore permit's slot, `0..permits` (`0` for every other claim):
    /// each slot is held by one permit at a time, with a token above every
    /// earlier grant of that slot, so a resource fenced per permit keys its
    /// fence by `(name, slot)`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The token as an HTTP header `(name, value)` for a fenced store.
    pub fn fencing_header(&self) -> (&'static str, String) {
        (FENCING_TOKEN_HEADER, self.token.to_string())
    }

    /// The token as a SQL parameter (`BIGINT`; tokens stay below 2^63).
    pub fn sql_token(&self) -> i64 {
        i64::try_from(self.token.get()).unwrap_or(i64::MAX)
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long the lock is still guaranteed (see the crate docs).
    pub fn remaining(&self) -> Duration {
        self.client.remaining()
    }

    /// Until when the lock is guaranteed, on this process's monotonic clock (the
    /// send time of the last acknowledged keep-alive + TTL − margin). Moves forward
    /// with each keep-alive; set to "now" when the session is known to be gone.
    pub fn guaranteed_until(&self) -> Instant {
        self.client.guaranteed_until()
    }

    /// Held; jeopardy when less than half the TTL is guaranteed (keep-alives are
    /// failing); lost at zero.
    pub fn state(&self) -> LeaseState {
        LeaseState::classify(self.remaining(), self.client.session_ttl() / 2)
    }

    /// Completes when the guarantee runs out. Owns what it needs.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.client.session.subscribe();
        async move {
            loop {
                let until = *rx.borrow_and_update();
                if until <= palisade_core::clock::now() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        }
    }

    /// The work under the lock ends now (a release, or the guard dropped): how
    /// much guarantee was left, or how long it ran past it.
    fn note_work_ended(&mut self) {
        if !std::mem::replace(&mut self.noted, true) {
            self.client
                .lock_safety()
                .work_ended(self.guaranteed_until(), palisade_core::clock::now());
        }
    }

    /// Gives back a grant that came too late to be used (no work was done
    /// under it: nothing to record).
    pub(crate) fn give_back(mut self) {
        self.noted = true;
    }

    /// Releases the lock; the next waiter (if any) is granted it at once.
    ///
    /// # Errors
    /// [`ClientError::NotHolder`] / [`ClientError::StaleToken`] when the lock was
    /// no longer ours (nothing changed then), [`ClientError::Unavailable`].
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.released = true;
        self.note_work_ended();
        release(&self.client, &self.name, self.token).await
    }

    /// As the leader of an election (a grant of [`crate::Claim::Lead`]),
    /// changes the value observers see. Proclaiming the same value again is
    /// harmless, so a retry after a lost answer is safe.
    ///
    /// # Errors
    /// [`ClientError::NotHolder`] / [`ClientError::StaleToken`] when this
    /// session leads no more, [`ClientError::WrongShape`] when the name is no
    /// election, [`ClientError::InvalidInput`] for a value over 1024 bytes,
    /// [`ClientError::Unavailable`].
    pub async fn proclaim(&self, value: &str) -> Result<(), ClientError> {
        let client = &self.client;
        client
            .conn
            .call(client.conn.retry_for, |ch| {
                let mut req = tonic::Request::new(ProclaimRequest {
                    session_id: client.session.id.get(),
                    name: self.name.clone(),
                    token: self.token.get(),
                    value: value.to_owned(),
                    session_key: client.session.key.clone(),
                });
                req.set_timeout(client.conn.rpc_timeout);
                async move { LocksClient::new(ch).proclaim(req).await }
            })
            .await
            .map(|_| ())
    }
}

async fn release(client: &Client, name: &str, token: FencingToken) -> Result<(), ClientError> {
    let session = client.session.id.get();
    let attempts = std::sync::atomic::AtomicUsize::new(0);
    let answer = client
        .conn
        .call(client.conn.retry_for, |ch| {
            attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut req = tonic::Request::new(ReleaseRequest {
                session_id: session,
                name: name.to_owned(),
                token: token.get(),
                session_key: client.session.key.clone(),
            });
            // A connection that went silent (a partitioned leader) is given up
            // on and the release retried elsewhere, instead of hanging.
            req.set_timeout(client.conn.rpc_timeout);
            async move { LocksClient::new(ch).release(req).await }
        })
        .await;
    match answer {
        // A retry (the first attempt's answer was lost: a timeout, a leader
        // change) that finds the grant gone: the first attempt released it.
        // Nothing else can have: the server answered, so the session is alive,
        // and while a session lives only its own release ends its grant
        // (expiry ends the session; a grant is never taken away otherwise).
        Err(ClientError::NotHolder(_) | ClientError::StaleToken { .. })
            if attempts.load(std::sync::atomic::Ordering::Relaxed) > 1 =>
        {
            Ok(())
        }
        other => other.map(|_| ()),
    }
}

impl Drop for FencedGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.note_work_ended();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, name, token) = (
                self.client.clone(),
                std::mem::take(&mut self.name),
                self.token,
            );
            rt.spawn(async move {
                let _ = release(&client, &name, token).await;
            });
        }
    }
}

impl std::fmt::Debug for FencedGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

/// The Palisade guard behind the backend-neutral correctness-lock API.
impl palisade_core::FencedLease for FencedGuard {
    fn name(&self) -> &str {
        FencedGuard::name(self)
    }

    fn token(&self) -> FencingToken {
        FencedGuard::token(self)
    }

    fn slot(&self) -> u32 {
        FencedGuard::slot(self)
    }

    fn remaining(&self) -> Duration {
        FencedGuard::remaining(self)
    }

    fn guaranteed_until(&self) -> Instant {
        FencedGuard::guaranteed_until(self)
    }

    fn state(&self) -> LeaseState {
        FencedGuard::state(self)
    }

    fn lost(&self) -> palisade_core::lock::BoxFuture<'static, ()> {
        Box::pin(FencedGuard::lost(self))
    }

    fn release(
        self: Box<Self>,
    ) -> palisade_core::lock::BoxFuture<'static, Result<(), palisade_core::LockError>> {
        Box::pin(async move { (*self).release().await.map_err(Into::into) })
    }
}
