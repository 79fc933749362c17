//! Raft peer traffic over gRPC: the client side (openraft's network factory) and
//! the server side (the `palisade.v1.Raft` service).
//!
//! openraft's messages travel as JSON inside a protobuf `bytes` field: only Palisade
//! nodes speak this service, and JSON keeps the peer protocol readable while the
//! client-facing API stays typed protobuf. One HTTP/2 channel per peer is reused
//! for every RPC (openraft's example builds an HTTP client per call).
//!
//! With TLS, a node dials peers with its own certificate, trusts only the
//! cluster's CA, and expects the peer's certificate to be valid for
//! `node-ID.palisade` ([`peer_server_name`]): a certificate of another node of
//! the same CA cannot answer in the target's place. It accepts a Raft message
//! only from a member whose certificate names the node id the message claims to
//! come from ([`PeerCheck`]), checked in an interceptor before the message body
//! is read.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Fuse};
use futures_util::{Stream, StreamExt};
use openraft::OptionalSend;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use palisade_proto::h2_channel::{H2Channel, TlsDialing};
use palisade_proto::v1::RaftPayload;
use palisade_proto::v1::raft_client::RaftClient;
use palisade_proto::v1::raft_server;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::io::{MessageFate, MessageFatesHook};
use crate::security::PeerCheck;
use crate::security::conn::CallGuard;
use crate::security::identity::conn_info;
use crate::typ::{
    Node, NodeId, Raft, RaftError, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote,
};

/// What travels in the JSON of an `InstallSnapshot` call; the snapshot's
/// bytes travel raw beside it (`RaftPayload.data`).
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    vote: Vote,
    meta: SnapshotMeta,
}

/// Makes one [`Peer`] per target node.
pub struct PeerFactory {
    /// TLS to peers; `None`: plaintext.
    pub tls: Option<TlsDialing>,
    /// The network the peers are on.
    pub io: crate::io::Io,
    /// This node's id.
    pub source: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for PeerFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Peer {
        Peer {
            source: self.source,
            target,
            client: peer_channel(&self.io, self.tls.as_ref(), target, &node.peer())
                .map(RaftClient::new),
            fates: self.io.message_fates.clone(),
        }
    }
}

/// A lazily connecting channel to node `target`'s peer listener at `addr`,
/// expecting its certificate (with `tls`); `None` when the address is unusable.
pub fn peer_channel(
    io: &crate::io::Io,
    tls: Option<&TlsDialing>,
    target: NodeId,
    addr: &str,
) -> Option<H2Channel> {
    let dialer = io.dialer(addr);
    let dialer = match tls {
        Some(tls) => tls
            .dialer(dialer, &peer_server_name(target))
            .map_err(|e| e.to_string()),
        None => Ok(dialer),
    };
    dialer
        .and_then(|d| {
            H2Channel::new(addr, tls.is_some(), Duration::from_secs(1), d)
                .map_err(|e| e.to_string())
        })
        .map_err(|e| tracing::error!(target, error = %e, "unusable peer address"))
        .ok()
}

/// The connection to one peer.
pub struct Peer {
    source: NodeId,
    target: NodeId,
    /// `None` when the address did not parse; every RPC then reports unreachable.
    client: Option<RaftClient<H2Channel>>,
    /// A simulator's lossy link; `None`: every message is delivered.
    fates: Option<MessageFatesHook>,
}

impl Peer {
    /// One call; a remote node's own error counts as unreachable (openraft's
    /// network API has no typed remote error any more; both back off alike).
    async fn call<Req, Resp>(
        &mut self,
        kind: &'static str,
        req: &Req,
        data: Vec<u8>,
        ttl: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let unreachable = |msg: String| RPCError::Unreachable(Unreachable::from_string(msg));
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| unreachable(format!("node {} has an unusable address", self.target)))?;
        let json = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let payload = RaftPayload { json, data };
        let fate = self.fates.as_ref().map_or(MessageFate::Deliver, |f| {
            f.0.fate(self.source, self.target, kind)
        });
        if let MessageFate::Duplicate(after) = fate {
            let (mut copy, payload) = (client.clone(), payload.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ignored = tokio::time::timeout(ttl, send(&mut copy, kind, payload, ttl)).await;
            });
        }
        let call = async {
            match fate {
                MessageFate::LoseRequest => std::future::pending().await,
                MessageFate::Delay(held) => tokio::time::sleep(held).await,
                _ => {}
            }
            let reply = send(client, kind, payload, ttl).await;
            if fate == MessageFate::LoseReply {
                std::future::pending::<()>().await;
            }
            reply
        };
        let reply = tokio::time::timeout(ttl, call)
            .await
            .map_err(|_| unreachable(format!("{kind} to node {} timed out", self.target)))?
            .map_err(|s| unreachable(format!("{kind} to node {}: {s}", self.target)))?;
        let result: Result<Resp, RaftError> = serde_json::from_slice(&reply.into_inner().json)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| unreachable(format!("{kind} to node {}: {e}", self.target)))
    }
}

/// One gRPC call of `kind` carrying `payload`.
async fn send(
    client: &mut RaftClient<H2Channel>,
    kind: &'static str,
    payload: RaftPayload,
    ttl: Duration,
) -> Result<Response<RaftPayload>, Status> {
    let mut request = Request::new(payload);
    request.set_timeout(ttl);
    match kind {
        "append" => client.append_entries(request).await,
        "vote" => client.vote(request).await,
        _ => client.install_snapshot(request).await,
    }
}

/// How long a replication request that carries nothing but a newer commit index
/// waits for the next request with entries to carry the index instead.
///
/// openraft sends one such request to every follower after each commit, and its
/// replication stream waits for the answer before it sends the next entries. Under
/// one client the next entries (the next operation's) follow a client round trip
/// later, so the commit-only request doubled the peer messages per operation and
/// put its round trip in front of the next one. A follower needs the commit index
/// only to apply, which no answer waits for (clients are answered by the leader), and
/// the leader's heartbeats carry it too; safety does not depend on it at all.
const COMMIT_ONLY_HOLD: Duration = Duration::from_millis(2);

/// openraft's replication requests to one peer, with the commit-only ones held
/// back for up to [`COMMIT_ONLY_HOLD`] and dropped when a later request carries
/// their commit index.
struct Coalesced<S> {
    input: Fuse<S>,
    /// A request taken from `input` while holding a commit-only one that it
    /// could not replace; the next to go.
    next: Option<AppendEntriesRequest<TypeConfig>>,
}

impl<S> Coalesced<S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    fn new(input: S) -> Self {
        Coalesced {
            input: input.fuse(),
            next: None,
        }
    }

    /// The next request to send; `None` when openraft ended the stream.
    async fn next(&mut self) -> Option<AppendEntriesRequest<TypeConfig>> {
        let mut request = match self.next.take() {
            Some(request) => request,
            None => self.input.next().await?,
        };
        let hold_until = tokio::time::Instant::now() + COMMIT_ONLY_HOLD;
        while request.entries.is_empty() {
            match tokio::time::timeout_at(hold_until, self.input.next()).await {
                Ok(Some(later)) if replaces(&later, &request) => request = later,
                Ok(Some(later)) => {
                    self.next = Some(later);
                    break;
                }
                // The stream ended (a one-off probe or heartbeat) or nothing came.
                Ok(None) | Err(_) => break,
            }
        }
        Some(request)
    }
}

/// One replication stream to a peer: what it sends and how.
struct AppendStream<'p, S> {
    peer: &'p mut Peer,
    requests: Coalesced<S>,
    option: RPCOption,
}

/// Whether `later` says everything the entry-less `held` says: same leader,
/// same position in the follower's log, a commit index at least as new.
/// openraft's answer to `later` then acknowledges `held`'s range as well (its
/// inflight queue drains every range an answer's matching log id covers).
fn replaces(
    later: &AppendEntriesRequest<TypeConfig>,
    held: &AppendEntriesRequest<TypeConfig>,
) -> bool {
    later.vote == held.vote
        && later.prev_log_id == held.prev_log_id
        && later.leader_commit >= held.leader_commit
}

type AppendReplies<'s> =
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("append", &rpc, Vec::new(), option.hard_ttl())
            .await
    }

    /// openraft's sequential stream (one request in flight, the next sent after
    /// its answer), except that commit-only requests are held back briefly and
    /// dropped when a later request carries their commit index
    /// ([`COMMIT_ONLY_HOLD`]).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AppendReplies<'s>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let stream = AppendStream {
            peer: self,
            requests: Coalesced::new(input),
            option,
        };
        let replies = futures_util::stream::unfold(Some(stream), |stream| async move {
            let mut stream = stream?;
            let request = stream.requests.next().await?;
            let prev = request.prev_log_id;
            let last = request.entries.last().map(|e| e.log_id).or(prev);
            let option = stream.option.clone();
            match stream.peer.append_entries(request, option).await {
                Ok(reply) => {
                    // Go on after a full success only, as openraft's own sequential
                    // stream does: a conflict, a higher vote or a partial append
                    // ends the stream and openraft starts the next one.
                    let go_on = match &reply {
                        AppendEntriesResponse::Success => true,
                        AppendEntriesResponse::PartialSuccess(matched) => *matched == last,
                        _ => false,
                    };
                    let result = reply.into_stream_result(prev, last);
                    let go_on = go_on && result.is_ok();
                    Some((Ok(result), go_on.then_some(stream)))
                }
                Err(e) => Some((Err(e), None)),
            }
        });
        Box::pin(async move { Ok(Box::pin(replies) as AppendReplies<'s>) })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, Vec::new(), option.hard_ttl()).await
    }

    /// The whole snapshot in one call: the header as JSON, the bytes raw.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let header = SnapshotHeader {
            vote,
            meta: snapshot.meta,
        };
        let data = snapshot.snapshot.into_inner();
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = self.call("snapshot", &header, data, option.hard_ttl()) => Ok(sent?),
        }
    }
}

/// The name a peer's certificate must be valid for when this node dials it.
/// `palisade certs` writes it into node `id`'s certificate (and no other's).
pub fn peer_server_name(id: NodeId) -> String {
    format!("node-{id}.palisade")
}

/// The server side: hands peers' messages to the local Raft, and answers
/// members' status questions.
pub struct RaftService {
    raft: Raft,
    check: PeerCheck,
    status: Arc<crate::status::StatusSource>,
}

/// What the interceptor learned about the sender, handed to the handler.
#[derive(Clone)]
struct Sender {
    /// The node its certificate names (`None` without TLS).
    node: Option<NodeId>,
    /// Keeps the connection marked busy while the message is handled.
    _busy: Option<Arc<CallGuard>>,
}

/// Admits peer traffic before its body is read: the sender's certificate must
/// name a member (or any node of the CA while this node has no membership yet,
/// before it joined).
#[derive(Clone)]
pub struct PeerGate {
    raft: Raft,
    check: PeerCheck,
}

impl Interceptor for PeerGate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let busy = conn_info(&req).map(|c| Arc::new(c.begin_call()));
        let membership = self
            .raft
            .metrics()
            .borrow_watched()
            .membership_config
            .clone();
        let members = membership.membership();
        let has_members = members.nodes().next().is_some();
        let node = self
            .check
            .node_of(&req, |id| !has_members || members.get_node(&id).is_some())?;
        req.extensions_mut().insert(Sender { node, _busy: busy });
        Ok(req)
    }
}

impl RaftService {
    /// Serves `raft` (and this node's `status`) to peers, admitting them by `check`.
    pub fn new(
        raft: Raft,
        check: PeerCheck,
        status: Arc<crate::status::StatusSource>,
    ) -> InterceptedService<raft_server::RaftServer<Self>, PeerGate> {
        let gate = PeerGate {
            raft: raft.clone(),
            check: check.clone(),
        };
        InterceptedService::new(
            raft_server::RaftServer::new(RaftService {
                raft,
                check,
                status,
            })
            .max_decoding_message_size(256 * 1024 * 1024),
            gate,
        )
    }
}

/// The sender the interceptor admitted (kept until the handler returns).
fn sender<T>(req: &mut Request<T>) -> Result<Sender, Status> {
    req.extensions_mut()
        .remove::<Sender>()
        .ok_or_else(|| Status::internal("raft message not admitted by the peer gate"))
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    decode_json(&req.into_inner().json)
}

fn decode_json<T: DeserializeOwned>(json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|json| {
            Response::new(RaftPayload {
                json,
                data: Vec::new(),
            })
        })
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        mut req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let sender = sender(&mut req)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        self.check
            .same_sender(sender.node, Some(rpc.vote.leader_id.node_id))?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, mut req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let sender = sender(&mut req)?;
        let rpc: VoteRequest<TypeConfig> = decode(req)?;
        self.check
            .same_sender(sender.node, Some(rpc.vote.leader_id.node_id))?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        mut req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let sender = sender(&mut req)?;
        let payload = req.into_inner();
        let header: SnapshotHeader = decode_json(&payload.json)?;
        self.check
            .same_sender(sender.node, Some(header.vote.leader_id.node_id))?;
        let snapshot = Snapshot {
            meta: header.meta,
            snapshot: std::io::Cursor::new(payload.data),
        };
        let installed: Result<SnapshotResponse<TypeConfig>, RaftError> = self
            .raft
            .install_full_snapshot(header.vote, snapshot)
            .await
            .map_err(RaftError::Fatal);
        encode(&installed)
    }

    /// Read-only and admitted like Raft traffic (with TLS: members only).
    async fn node_status(
        &self,
        mut req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let _sender = sender(&mut req)?;
        let asked: crate::status::ReportRequest = decode(req)?;
        encode(&self.status.report(&asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typ::{Entry, EntryPayload, LeaderId, LogId};
    use futures_util::stream;

    fn log_id(index: u64) -> LogId {
        LogId::new(
            LeaderId {
                term: 2,
                node_id: 1,
            },
            index,
        )
    }

    /// A request after `prev` carrying entries `entries` and commit index `commit`.
    fn request(prev: u64, entries: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: (prev + 1..=prev + entries)
                .map(|i| Entry {
                    log_id: log_id(i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    fn shape(r: &AppendEntriesRequest<TypeConfig>) -> (u64, usize, u64) {
        let index = |l: &Option<LogId>| l.map_or(0, |l| l.index);
        (
            index(&r.prev_log_id),
            r.entries.len(),
            index(&r.leader_commit),
        )
    }

    async fn sent(
        requests: &mut Coalesced<impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin>,
    ) -> Vec<(u64, usize, u64)> {
        let mut sent = Vec::new();
        while let Some(r) = requests.next().await {
            sent.push(shape(&r));
        }
        sent
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_is_dropped_when_the_next_one_carries_its_commit() {
        let input = stream::iter(vec![
            request(4, 1, 4),
            request(5, 0, 5),
            request(5, 2, 5),
            request(7, 0, 6),
            request(7, 0, 7),
            request(7, 1, 7),
        ]);
        let got = sent(&mut Coalesced::new(input)).await;
        assert_eq!(got, vec![(4, 1, 4), (5, 2, 5), (7, 1, 7)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_goes_alone_when_nothing_follows_in_time_or_it_cannot_be_replaced()
     {
        // Nothing more within the hold: sent after it, then the late request.
        let late = stream::once(async {
            tokio::time::sleep(COMMIT_ONLY_HOLD * 3).await;
            request(5, 1, 5)
        });
        let input = stream::iter(vec![request(5, 0, 5)]).chain(late);
        let started = tokio::time::Instant::now();
        let mut requests = Coalesced::new(Box::pin(input));
        assert_eq!(requests.next().await.as_ref().map(shape), Some((5, 0, 5)));
        assert_eq!(started.elapsed(), COMMIT_ONLY_HOLD);
        assert_eq!(requests.next().await.as_ref().map(shape), Some((5, 1, 5)));
        assert!(requests.next().await.is_none());

        // A later request from another position (a probe after a conflict) or with
        // an older commit cannot stand in for it: both go, in order.
        let input = stream::iter(vec![
            request(5, 0, 5),
            request(3, 1, 5),
            request(4, 0, 5),
            request(4, 1, 3),
        ]);
        let got = sent(&mut Coalesced::new(input)).await;
        assert_eq!(got, vec![(5, 0, 5), (3, 1, 5), (4, 0, 5), (4, 1, 3)]);

        // A heartbeat (a stream of one) goes at once.
        let started = tokio::time::Instant::now();
        let got = sent(&mut Coalesced::new(stream::iter(vec![request(9, 0, 9)]))).await;
        assert_eq!(got, vec![(9, 0, 9)]);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
