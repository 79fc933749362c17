//! The gatekeeper as a tower layer in front of every client route, gRPC and
//! HTTP/JSON alike: a call is admitted (its identity established, one of its
//! identity's call slots taken, its connection marked busy) before any handler
//! runs, or refused in its own protocol's words. A handler cannot forget to
//! ask; it finds the [`Caller`] it may need for roles and ownership with
//! [`admitted`].

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tonic::{Request, Status};

use super::{Caller, Gatekeeper};

/// Puts [`Gatekeeper::admit`] in front of a service.
#[derive(Clone)]
pub struct GateLayer(pub Arc<Gatekeeper>);

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            gatekeeper: self.0.clone(),
            inner,
        }
    }
}

/// A service whose every request passed the gatekeeper.
#[derive(Clone)]
pub struct Gate<S> {
    gatekeeper: Arc<Gatekeeper>,
    inner: S,
}

/// The admission of a request, in its extensions: shared, because the JSON
/// API hands its request's extensions on to the gRPC handler it calls.
#[derive(Clone)]
struct Admitted(Arc<Caller>);

impl<S, B> tower::Service<http::Request<B>> for Gate<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self
            .gatekeeper
            .admit(request.headers(), request.extensions())
        {
            Ok(caller) => {
                let caller = Arc::new(caller);
                request.extensions_mut().insert(Admitted(caller.clone()));
                // The service that was polled ready answers; a fresh clone
                // waits for its own poll.
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                let answer = ready.call(request);
                Box::pin(async move {
                    let answered = answer.await;
                    // The call slot is held until the handler has answered (a
                    // streaming handler keeps its own clone for longer).
                    drop(caller);
                    answered
                })
            }
            Err(refused) => {
                let grpc = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/grpc"));
                let answer = if grpc {
                    refused.into_http()
                } else {
                    crate::json_api::refusal(&refused).map(tonic::body::Body::new)
                };
                Box::pin(std::future::ready(Ok(answer)))
            }
        }
    }
}

/// The caller the gate admitted for `req`.
///
/// # Errors
/// `internal` if `req` did not come through a [`Gate`]: a route served
/// outside it is a bug, and answering it unauthenticated would be worse.
pub fn admitted<T>(req: &Request<T>) -> Result<Arc<Caller>, Status> {
    req.extensions()
        .get::<Admitted>()
        .map(|a| a.0.clone())
        .ok_or_else(|| Status::internal("the call did not pass the gatekeeper"))
}
