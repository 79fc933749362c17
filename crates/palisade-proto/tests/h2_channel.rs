//! `H2Channel` against a real tonic server on loopback: answers and statuses
//! arrive as tonic's own channel would deliver them, a refused connection says
//! so, and the channel dials again once its connection is gone.

use std::time::Duration;

use palisade_proto::h2_channel::H2Channel;
use palisade_proto::v1::RaftPayload;
use palisade_proto::v1::raft_client::RaftClient;
use palisade_proto::v1::raft_server::{Raft, RaftServer};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// Echoes `append_entries` (the JSON reversed, the data doubled); refuses
/// `vote` with a status carrying metadata.
struct Echo;

#[tonic::async_trait]
impl Raft for Echo {
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let p = req.into_inner();
        let mut json = p.json;
        json.reverse();
        let data = [p.data.clone(), p.data].concat();
        Ok(Response::new(RaftPayload { json, data }))
    }
    async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let mut status = Status::failed_precondition("no vote today");
        status
            .metadata_mut()
            .insert("palisade-error", "not_leader".parse().expect("ascii"));
        Err(status)
    }
    async fn install_snapshot(
        &self,
        _: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("no snapshots"))
    }
    async fn node_status(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("no status"))
    }
}

/// Serves [`Echo`] on `listener` until the returned sender is dropped or fired.
fn serve(listener: TcpListener) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = async_stream(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                RaftServer::new(Echo)
                    .max_decoding_message_size(LARGE)
                    .max_encoding_message_size(LARGE),
            )
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    stop
}

/// The listener's connections as the stream tonic takes.
fn async_stream(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

/// Larger than any default message limit, like a snapshot.
const LARGE: usize = 64 * 1024 * 1024;

/// Binds `addr` once the server that had it has let go of it (its shutdown
/// runs on its own task; how long that takes is up to the machine).
async fn bind_when_free(addr: std::net::SocketAddr) -> TcpListener {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{addr} still in use after 30 s: {e}"),
        }
    }
}

fn channel(addr: &str) -> H2Channel {
    H2Channel::new(
        addr,
        false,
        Duration::from_secs(1),
        H2Channel::tcp_dialer(addr.to_owned()),
    )
    .expect("a valid authority")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_answers_statuses_and_large_payloads_arrive_whole() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let _stop = serve(listener);
    let mut client = RaftClient::new(channel(&addr)).max_decoding_message_size(LARGE);

    let reply = client
        .append_entries(RaftPayload {
            json: b"abc".to_vec(),
            data: vec![7; 3],
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(reply.json, b"cba");
    assert_eq!(reply.data, vec![7; 6]);

    // Beyond every HTTP/2 window and the send buffer: flow control has to work
    // both ways (a snapshot travels like this).
    let big: Vec<u8> = (0..12 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let reply = client
        .append_entries(RaftPayload {
            json: Vec::new(),
            data: big.clone(),
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(reply.data.len(), big.len() * 2);
    assert!(reply.data[..big.len()] == big[..] && reply.data[big.len()..] == big[..]);

    let refused = client
        .vote(RaftPayload::default())
        .await
        .expect_err("vote is refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(refused.message(), "no vote today");
    assert_eq!(
        refused
            .metadata()
            .get("palisade-error")
            .and_then(|v| v.to_str().ok()),
        Some("not_leader")
    );

    // Many calls at once share the one connection.
    let calls: Vec<_> = (0..64u8)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .append_entries(RaftPayload {
                        json: vec![i, 0],
                        data: Vec::new(),
                    })
                    .await
                    .map(|r| r.into_inner().json)
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let answer = call.await.expect("the task ran").expect("answered");
        assert_eq!(answer, vec![0, i as u8]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_says_so_and_the_channel_dials_again_later() {
    // A port nothing listens on: take one, then close it.
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    let mut client = RaftClient::new(channel(&addr.to_string()));
    let refused = client
        .append_entries(RaftPayload::default())
        .await
        .expect_err("nothing listens");
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&refused);
    let mut kinds = Vec::new();
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kinds.push(io.kind());
        }
        cause = e.source();
    }
    assert_eq!(
        kinds,
        vec![std::io::ErrorKind::ConnectionRefused],
        "{refused:?}"
    );

    // A server comes up on that port: the next call connects.
    let listener = bind_when_free(addr).await;
    let stop = serve(listener);
    let reply = client
        .append_entries(RaftPayload {
            json: b"xy".to_vec(),
            data: Vec::new(),
        })
        .await
        .expect("answered once the server is up");
    assert_eq!(reply.into_inner().json, b"yx");

    // It goes away (its connections closed) and comes back: after at most one
    // failed call, the channel is connected again.
    drop(stop);
    let listener = bind_when_free(addr).await;
    let _stop = serve(listener);
    let mut answered = false;
    for _ in 0..2 {
        if client.append_entries(RaftPayload::default()).await.is_ok() {
            answered = true;
            break;
        }
    }
    assert!(answered, "the channel never dialed the restarted server");
}
