//! The lock API as HTTP/JSON (`/v1/…`, documented in docs/http.md), served on
//! the client listener beside gRPC.
//!
//! Not a second implementation: each call's JSON is decoded into the gRPC
//! request message and handed, with the HTTP request's headers and connection
//! facts (the TLS peer certificate, the connection's call accounting), to the
//! very same [`Locks`] implementation on [`Api`]. So authentication, roles,
//! session ownership, limits and error codes are the gRPC API's by
//! construction; this module only translates.
//!
//! What the translation adds: strict decoding (unknown fields, malformed
//! numbers, session keys that are not 32 hex digits are `invalid_input`, never
//! a 500), identifiers and tokens as decimal strings (JavaScript's numbers lose
//! precision above 2^53), and an HTTP status per error code.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use palisade_proto::v1::locks_server::Locks;
use palisade_proto::v1::{
    AcquireRequest, CancelAcquireRequest, CheckTokenRequest, ClaimKind, CloseSessionRequest,
    CreateSessionRequest, GetRequest, KeepAliveRequest, ListRequest, LockInfo, Member,
    ProclaimRequest, ReleaseRequest, StatusRequest,
};
use palisade_proto::{CURRENT_TOKEN_KEY, ErrorCode, LEADER_KEY, PRESENTED_TOKEN_KEY};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Value, json};
use tonic::Status;

use crate::service::Api;

/// The largest request body taken: every field has a small bound (a name is at
/// most 256 bytes, a label 256), so anything near this is not a lock request.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The header that repeats a `not_leader` answer's leader address.
pub const LEADER_HEADER: &str = "palisade-leader";

/// The `/v1/` routes over `api`.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/sessions", post(create_session))
        .route("/v1/sessions/keepalive", post(keep_alive))
        .route("/v1/sessions/close", post(close_session))
        .route("/v1/locks/acquire", post(acquire))
        .route("/v1/locks/cancel", post(cancel))
        .route("/v1/locks/release", post(release))
        .route("/v1/locks/proclaim", post(proclaim))
        .route("/v1/lock", get(get_lock))
        .route("/v1/locks", get(list))
        .route("/v1/check-token", get(check_token))
        .route("/v1/status", get(status))
        .method_not_allowed_fallback(wrong_method)
        .with_state(api)
}

/// Answers a path no route has: a JSON 404 for HTTP callers, gRPC's
/// `unimplemented` for gRPC callers (who share the listener).
pub async fn unknown_path(request: Request) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let (parts, ()) = Status::unimplemented("no such method")
            .into_http::<()>()
            .into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let path = request.uri().path().to_owned();
    error(
        StatusCode::NOT_FOUND,
        ErrorCode::InvalidInput,
        format!("no such call {path:?}; the calls are listed in docs/http.md"),
    )
}

async fn wrong_method(request: Request) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::InvalidInput,
        format!(
            "{} is not how {:?} is called (calls with a body are POST, reads GET)",
            request.method(),
            request.uri().path()
        ),
    )
}

// ---- Decoding ----------------------------------------------------------------

/// A 64-bit number that travels as a decimal string (and is accepted as a
/// string of digits or a JSON number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decimal(pub u64);

impl Decimal {
    /// Parses digits only: no sign, no spaces, no leading zeros — one spelling
    /// per number, so a token cannot be smuggled past a comparison as `07`.
    pub fn parse(s: &str) -> Option<u64> {
        let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits || (s.len() > 1 && s.starts_with('0')) {
            return None;
        }
        s.parse().ok()
    }
}

impl Serialize for Decimal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Decimal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Decimal;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a decimal string of digits or a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Decimal, E> {
                Ok(Decimal(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Decimal, E> {
                u64::try_from(v)
                    .map(Decimal)
                    .map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Decimal, E> {
                Decimal::parse(v).map(Decimal).ok_or_else(|| {
                    E::custom(format!(
                        "{v:?} is not a decimal number (digits only, no sign, spaces or leading zeros)"
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// A session key: 32 hex digits (128 bits).
#[derive(Debug, Clone)]
struct SessionKey(Vec<u8>);

impl<'de> Deserialize<'de> for SessionKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match hex::decode(&s) {
            Ok(bytes) if bytes.len() == 16 => Ok(SessionKey(bytes)),
            _ => Err(de::Error::custom(
                "session_key must be the 32 hex digits the session was created with",
            )),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSessionBody {
    ttl_ms: u64,
    #[serde(default)]
    label: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionBody {
    session_id: Decimal,
    session_key: SessionKey,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    session_id: Decimal,
    session_key: SessionKey,
    name: String,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
    /// `lock` (the default), `permit`, `read`, `write` or `lead`.
    #[serde(default)]
    claim: ClaimName,
    #[serde(default)]
    permits: u32,
    #[serde(default)]
    value: String,
}

/// A claim kind as the JSON API spells it.
#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ClaimName {
    #[default]
    Lock,
    Permit,
    Read,
    Write,
    Lead,
}

impl From<ClaimName> for ClaimKind {
    fn from(c: ClaimName) -> ClaimKind {
        match c {
            ClaimName::Lock => ClaimKind::ClaimLock,
            ClaimName::Permit => ClaimKind::ClaimPermit,
            ClaimName::Read => ClaimKind::ClaimRead,
            ClaimName::Write => ClaimKind::ClaimWrite,
            ClaimName::Lead => ClaimKind::ClaimLead,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    session_id: Decimal,
    session_key: SessionKey,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProclaimBody {
    session_id: Decimal,
    session_key: SessionKey,
    name: String,
    token: Decimal,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    session_id: Decimal,
    session_key: SessionKey,
    name: String,
    token: Decimal,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameQuery {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckTokenQuery {
    name: String,
    token: Decimal,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoQuery {}

/// Why a request could not be decoded: answered as `invalid_input` with this
/// HTTP status.
type Undecodable = (StatusCode, String);

fn undecodable((status, message): Undecodable) -> Response {
    error(status, ErrorCode::InvalidInput, message)
}

/// A POST's JSON body. The content type must say JSON: a browser page cannot
/// send that across origins without asking first, so a page a user visits
/// cannot drive a node with the user's client certificate.
async fn json_body<T: DeserializeOwned>(parts: &Parts, body: Body) -> Result<T, Undecodable> {
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be JSON, sent with content-type: application/json".into(),
        ));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {MAX_BODY_BYTES} bytes (or could not be read)"),
            )
        })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("malformed request body: {e}"),
        )
    })
}

/// A GET's query parameters.
fn query<T: DeserializeOwned>(parts: &Parts) -> Result<T, Undecodable> {
    let raw = parts.uri.query().unwrap_or("");
    serde_urlencoded_from_str(raw)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("malformed query: {e}")))
}

fn serde_urlencoded_from_str<T: DeserializeOwned>(raw: &str) -> Result<T, String> {
    let uri: axum::http::Uri = format!("/?{raw}")
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| e.to_string())?;
    axum::extract::Query::<T>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| e.body_text())
}

/// The gRPC request for `message`, carrying the HTTP request's headers (the
/// `authorization` header among them) and extensions (the connection: TLS
/// peer certificate, call accounting), as tonic would have built it.
fn grpc<T>(parts: Parts, message: T) -> tonic::Request<T> {
    tonic::Request::from_http(axum::http::Request::from_parts(parts, message))
}

// ---- Encoding ----------------------------------------------------------------

/// The HTTP status for each wire code (docs/http.md).
pub fn http_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::UnknownSession => StatusCode::NOT_FOUND,
        ErrorCode::NotHolder
        | ErrorCode::StaleToken
        | ErrorCode::WouldBlock
        | ErrorCode::WaitTimeout
        | ErrorCode::Cancelled
        | ErrorCode::WrongShape => StatusCode::CONFLICT,
        ErrorCode::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::NotLeader | ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code.as_str(), "message": message.into()}});
    (status, axum::Json(body)).into_response()
}

/// A refusal of the service, with its code's HTTP status and what the gRPC
/// status carries in metadata (the leader, the tokens of a stale release) as
/// fields.
pub(crate) fn refusal(status: &Status) -> Response {
    let Some(code) = ErrorCode::of(status) else {
        // Not one of Palisade's refusals: a fault of the node, never bad input
        // (the service refuses that with a code).
        tracing::error!(code = ?status.code(), message = status.message(), "HTTP call failed");
        let body = json!({"error": {"code": "internal", "message": status.message()}});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response();
    };
    let text = |key: &str| {
        status
            .metadata()
            .get(key)
            .and_then(|v| v.to_str().ok())
            // An election in progress names no leader: the field is absent.
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let mut error = json!({"code": code.as_str(), "message": status.message()});
    let leader = text(LEADER_KEY);
    for (field, key) in [
        ("leader", LEADER_KEY),
        ("current_token", CURRENT_TOKEN_KEY),
        ("presented_token", PRESENTED_TOKEN_KEY),
        ("session_id", palisade_proto::SESSION_KEY),
    ] {
        if let Some(v) = text(key) {
            error[field] = Value::String(v);
        }
    }
    let mut response = (http_status(code), axum::Json(json!({"error": error}))).into_response();
    if let Some(leader) = leader.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(LEADER_HEADER, leader);
    }
    response
}

/// The service's answer as JSON, or its refusal.
fn respond<R>(
    answer: Result<tonic::Response<R>, Status>,
    to_json: impl FnOnce(R) -> Value,
) -> Response {
    match answer {
        Ok(reply) => axum::Json(to_json(reply.into_inner())).into_response(),
        Err(status) => refusal(&status),
    }
}

fn dec(n: u64) -> Decimal {
    Decimal(n)
}

/// `0` means "none" on the wire of gRPC; JSON says `null`.
fn dec_or_null(n: u64) -> Value {
    if n == 0 { Value::Null } else { json!(dec(n)) }
}

fn lock_json(l: LockInfo) -> Value {
    let mut v = json!({
        "name": l.name,
        "holder": dec_or_null(l.holder_session),
        "holder_label": l.holder_label,
        "token": dec_or_null(l.token),
        "waiters": l.waiters.into_iter().map(dec).collect::<Vec<_>>(),
        "in_lock_delay": l.in_lock_delay,
    });
    // A plain lock reads as it always did; a recipe says what it is and
    // lists every holder.
    if l.shape != "mutex" {
        v["shape"] = json!(l.shape);
        if l.permits > 0 {
            v["permits"] = json!(l.permits);
        }
        v["holders"] = l
            .holders
            .into_iter()
            .map(|h| {
                json!({
                    "session": dec(h.session),
                    "label": h.label,
                    "token": dec(h.token),
                    "shared": h.shared,
                    "slot": h.slot,
                    "value": h.value,
                })
            })
            .collect();
    }
    v
}

fn member_json(m: Member) -> Value {
    json!({"id": dec(m.id), "addr": m.addr, "peer_addr": m.peer_addr})
}

// ---- Handlers ----------------------------------------------------------------

/// Splits the request and decodes its JSON body, or answers the decode error.
macro_rules! body_or_answer {
    ($request:expr, $ty:ty) => {{
        let (parts, body) = $request.into_parts();
        match json_body::<$ty>(&parts, body).await {
            Ok(decoded) => (parts, decoded),
            Err(why) => return undecodable(why),
        }
    }};
}

/// Splits the request and decodes its query, or answers the decode error.
macro_rules! query_or_answer {
    ($request:expr, $ty:ty) => {{
        let (parts, _) = $request.into_parts();
        match query::<$ty>(&parts) {
            Ok(decoded) => (parts, decoded),
            Err(why) => return undecodable(why),
        }
    }};
}

async fn create_session(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, CreateSessionBody);
    let message = CreateSessionRequest {
        ttl_ms: r.ttl_ms,
        label: r.label,
    };
    respond(api.create_session(grpc(parts, message)).await, |r| {
        json!({
            "session_id": dec(r.session_id),
            "ttl_ms": r.ttl_ms,
            "session_key": hex::encode(r.session_key),
        })
    })
}

async fn keep_alive(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, SessionBody);
    let message = KeepAliveRequest {
        session_id: r.session_id.0,
        session_key: r.session_key.0,
    };
    respond(
        api.keep_alive(grpc(parts, message)).await,
        |r| json!({"ttl_ms": r.ttl_ms}),
    )
}

async fn close_session(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, SessionBody);
    let message = CloseSessionRequest {
        session_id: r.session_id.0,
        session_key: r.session_key.0,
    };
    respond(api.close_session(grpc(parts, message)).await, |_| json!({}))
}

/// A long poll when `wait_ms` > 0. If the caller goes away first, hyper drops
/// this future and the service takes the wait out of the queue, exactly as for
/// a gRPC call whose stream was reset.
async fn acquire(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, AcquireBody);
    let message = AcquireRequest {
        session_id: r.session_id.0,
        name: r.name,
        wait_ms: r.wait_ms,
        lock_delay_ms: r.lock_delay_ms,
        session_key: r.session_key.0,
        claim: ClaimKind::from(r.claim).into(),
        permits: r.permits,
        value: r.value,
    };
    // A permit's slot is part of its grant; other claims answer as before.
    let permit = r.claim == ClaimName::Permit;
    respond(api.acquire(grpc(parts, message)).await, |r| {
        if permit {
            json!({"token": dec(r.token), "slot": r.slot})
        } else {
            json!({"token": dec(r.token)})
        }
    })
}

async fn cancel(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, CancelBody);
    let message = CancelAcquireRequest {
        session_id: r.session_id.0,
        name: r.name,
        session_key: r.session_key.0,
    };
    respond(
        api.cancel_acquire(grpc(parts, message)).await,
        |_| json!({}),
    )
}

async fn release(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, ReleaseBody);
    let message = ReleaseRequest {
        session_id: r.session_id.0,
        name: r.name,
        token: r.token.0,
        session_key: r.session_key.0,
    };
    respond(api.release(grpc(parts, message)).await, |_| json!({}))
}

async fn proclaim(State(api): State<Api>, request: Request) -> Response {
    let (parts, r) = body_or_answer!(request, ProclaimBody);
    let message = ProclaimRequest {
        session_id: r.session_id.0,
        name: r.name,
        token: r.token.0,
        value: r.value,
        session_key: r.session_key.0,
    };
    respond(api.proclaim(grpc(parts, message)).await, |_| json!({}))
}

async fn get_lock(State(api): State<Api>, request: Request) -> Response {
    let (parts, q) = query_or_answer!(request, NameQuery);
    let message = GetRequest { name: q.name };
    respond(
        api.get(grpc(parts, message)).await,
        |r| json!({"lock": r.lock.map(lock_json)}),
    )
}

async fn list(State(api): State<Api>, request: Request) -> Response {
    let (parts, NoQuery {}) = query_or_answer!(request, NoQuery);
    respond(
        api.list(grpc(parts, ListRequest {})).await,
        |r| json!({"locks": r.locks.into_iter().map(lock_json).collect::<Vec<_>>()}),
    )
}

async fn check_token(State(api): State<Api>, request: Request) -> Response {
    let (parts, q) = query_or_answer!(request, CheckTokenQuery);
    let message = CheckTokenRequest {
        name: q.name,
        token: q.token.0,
    };
    respond(api.check_token(grpc(parts, message)).await, |r| {
        json!({"current": r.current, "current_token": dec_or_null(r.current_token),
                "issued_through": dec(r.issued_through)})
    })
}

async fn status(State(api): State<Api>, request: Request) -> Response {
    let (parts, NoQuery {}) = query_or_answer!(request, NoQuery);
    respond(api.status(grpc(parts, StatusRequest {})).await, |r| {
        json!({
            "id": dec(r.id),
            "leader": dec_or_null(r.leader),
            "term": dec(r.term),
            "state": r.state,
            "commit_index": dec(r.commit_index),
            "last_applied": dec(r.last_applied),
            "members": r.members.into_iter().map(member_json).collect::<Vec<_>>(),
            "learners": r.learners.into_iter().map(member_json).collect::<Vec<_>>(),
            "snapshot_index": dec(r.snapshot_index),
            "snapshot_bytes": r.snapshot_bytes,
            "commit_p50_us": r.commit_p50_us,
            "commit_p99_us": r.commit_p99_us,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_have_one_spelling() {
        assert_eq!(Decimal::parse("0"), Some(0));
        assert_eq!(Decimal::parse("34"), Some(34));
        assert_eq!(Decimal::parse("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "07",
            " 5",
            "5 ",
            "+5",
            "-5",
            "5.0",
            "1e3",
            "18446744073709551616",
        ] {
            assert_eq!(Decimal::parse(bad), None, "{bad:?}");
        }
        let from = |j: &str| serde_json::from_str::<Decimal>(j).map(|d| d.0).ok();
        assert_eq!(from("\"12\""), Some(12));
        assert_eq!(from("12"), Some(12));
        assert_eq!(from("-1"), None);
        assert_eq!(from("1.5"), None);
        assert_eq!(from("\"012\""), None);
        assert_eq!(
            serde_json::to_string(&Decimal(u64::MAX)).unwrap(),
            "\"18446744073709551615\""
        );
    }

    #[test]
    fn every_code_has_a_status_and_none_is_a_server_error() {
        for code in ErrorCode::ALL {
            let s = http_status(code);
            assert!(
                s.is_client_error() || s == StatusCode::SERVICE_UNAVAILABLE,
                "{code:?}"
            );
        }
    }

    #[test]
    fn bodies_refuse_unknown_fields_and_bad_keys() {
        let ok =
            r#"{"session_id":"5","session_key":"000102030405060708090a0b0c0d0e0f","name":"a"}"#;
        assert!(serde_json::from_str::<AcquireBody>(ok).is_ok());
        let typo = r#"{"session_id":"5","session_key":"000102030405060708090a0b0c0d0e0f","name":"a","wiat_ms":5}"#;
        assert!(serde_json::from_str::<AcquireBody>(typo).is_err());
        let short = r#"{"session_id":"5","session_key":"0001","name":"a"}"#;
        assert!(serde_json::from_str::<AcquireBody>(short).is_err());
        assert!(serde_urlencoded_from_str::<CheckTokenQuery>("name=a&token=07").is_err());
        assert!(serde_urlencoded_from_str::<CheckTokenQuery>("name=a%2Fb&token=7").is_ok());
        assert!(serde_urlencoded_from_str::<NoQuery>("x=1").is_err());
    }
}
