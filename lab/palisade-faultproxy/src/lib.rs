//! Palisade's fault proxy: a TCP proxy placed on one link (one client to one
//! server) that can delay, black-hole or sever the traffic on it.
//!
//! Kernel netem is not available where Palisade's drills run, so delays and
//! partitions are made here, in user space, per link:
//! - **delay**: every chunk is delivered `delay` after it was read, in order, in both
//!   directions. Throughput is not throttled; latency is added.
//! - **black hole**: bytes are held (not dropped) until the link is healed, as a
//!   partition looks to TCP: the connection stays up, nothing gets through, and
//!   retransmitted data arrives after the heal. It can hold the answers alone
//!   (server to client), so requests arrive and are acted on while the client
//!   hears nothing: a lost reply.
//! - **sever**: every open connection on the link is closed at once.
//!
//! The controls are atomics read on every chunk, so a fault takes effect on data
//! already in flight through the proxy.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;
/// Chunks queued per direction before the reader waits (back-pressure).
const QUEUE: usize = 1024;

/// The fault settings of one link, shared by all its connections.
#[derive(Debug, Default)]
pub struct Link {
    delay_us: AtomicU64,
    black_hole: AtomicBool,
    /// Only the server-to-client direction is held.
    replies_held: AtomicBool,
    /// Bumped to sever every open connection.
    generation: AtomicU64,
    changed: Notify,
    /// Where new connections go instead of the proxy's upstream, once set.
    redirect: Mutex<Option<SocketAddr>>,
}

impl Link {
    /// Adds `delay` to every chunk from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// The added delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::SeqCst))
    }

    /// Holds all traffic until [`Link::heal`].
    pub fn partition(&self) {
        self.black_hole.store(true, Ordering::SeqCst);
    }

    /// Holds what the server sends until [`Link::heal`]; what the client sends
    /// still arrives. Severing the link then loses the held answers.
    pub fn partition_replies(&self) {
        self.replies_held.store(true, Ordering::SeqCst);
    }

    /// Removes the partition (both kinds) and the delay; held bytes flow again.
    pub fn heal(&self) {
        self.black_hole.store(false, Ordering::SeqCst);
        self.replies_held.store(false, Ordering::SeqCst);
        self.set_delay(Duration::ZERO);
        self.changed.notify_waiters();
    }

    /// Closes every connection currently open on the link.
    pub fn sever(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Sends every new connection to `upstream` instead, and closes the open
    /// ones (so a client reconnects there): the address the client knows now
    /// names another server, as after a failover that moves an address.
    pub fn redirect(&self, upstream: SocketAddr) {
        *self.redirect.lock().expect("poisoned") = Some(upstream);
        self.sever();
    }

    /// Where a new connection goes: the redirect, else `upstream`.
    fn upstream(&self, upstream: SocketAddr) -> SocketAddr {
        self.redirect.lock().expect("poisoned").unwrap_or(upstream)
    }

    async fn wait_while_partitioned(&self, direction: Direction) {
        loop {
            let notified = self.changed.notified();
            let held = self.black_hole.load(Ordering::SeqCst)
                || (direction == Direction::Replies && self.replies_held.load(Ordering::SeqCst));
            if !held {
                return;
            }
            notified.await;
        }
    }
}

/// Which way bytes go through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Requests,
    Replies,
}

/// A running proxy: clients connect to [`FaultProxy::addr`], traffic goes to the
/// upstream. Stops accepting when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    link: Arc<Link>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a loopback port of its own choosing, forwarding to `upstream`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let link = Arc::new(Link::default());
        let accept_link = link.clone();
        let accept_task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let link = accept_link.clone();
                let upstream = link.upstream(upstream);
                tokio::spawn(async move {
                    match TcpStream::connect(upstream).await {
                        Ok(server) => relay(client, server, link).await,
                        Err(e) => tracing::debug!(%upstream, error = %e, "upstream refused"),
                    }
                });
            }
        });
        Ok(FaultProxy {
            addr,
            link,
            accept_task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The link's controls.
    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.link.sever();
    }
}

/// A proxy in front of each server of a cluster: a client that reaches the
/// cluster through them is cut off from every server at once, and healed at
/// once. Stops accepting when dropped.
pub struct FaultProxies {
    proxies: Vec<FaultProxy>,
}

impl FaultProxies {
    /// One proxy per `upstreams` address (`HOST:PORT`), in that order.
    ///
    /// # Errors
    /// When an address is not `IP:PORT`, or no loopback port can be bound.
    pub async fn start(upstreams: &[String]) -> std::io::Result<Self> {
        let mut proxies = Vec::with_capacity(upstreams.len());
        for upstream in upstreams {
            let addr = upstream.parse().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{upstream:?} is not IP:PORT: {e}"),
                )
            })?;
            proxies.push(FaultProxy::start(addr).await?);
        }
        Ok(FaultProxies { proxies })
    }

    /// Where clients connect, in the order of the upstreams.
    pub fn addrs(&self) -> Vec<String> {
        self.proxies.iter().map(|p| p.addr().to_string()).collect()
    }

    /// The links' controls, to keep apart from the proxies (which stop when
    /// dropped).
    pub fn links(&self) -> Links {
        Links(self.proxies.iter().map(|p| p.link().clone()).collect())
    }

    /// Drops everything in both directions on every link.
    pub fn partition(&self) {
        self.links().partition();
    }
}

/// The controls of several links, applied to all of them.
#[derive(Clone)]
pub struct Links(Vec<Arc<Link>>);

impl Links {
    /// [`Link::partition`] on each.
    pub fn partition(&self) {
        self.0.iter().for_each(|l| l.partition());
    }

    /// [`Link::heal`] on each.
    pub fn heal(&self) {
        self.0.iter().for_each(|l| l.heal());
    }
}

async fn relay(client: TcpStream, server: TcpStream, link: Arc<Link>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let generation = link.generation.load(Ordering::SeqCst);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pipe(
        client_read,
        server_write,
        link.clone(),
        Direction::Requests,
        generation,
    );
    let down = pipe(
        server_read,
        client_write,
        link.clone(),
        Direction::Replies,
        generation,
    );
    let severed = async {
        loop {
            let notified = link.changed.notified();
            if link.generation.load(Ordering::SeqCst) != generation {
                return;
            }
            notified.await;
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        () = severed => {}
    }
}

/// One direction: a reader stamps each chunk with its delivery time, a writer
/// delivers in order at that time, so a delay adds latency without serialising
/// round trips behind each other.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Arc<Link>,
    direction: Direction,
    generation: u64,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let link_w = link.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = Instant::now() + link.delay();
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            link_w.wait_while_partitioned(direction).await;
            // Severed while these bytes waited (a heal may wake this writer
            // before the relay closes the connection): they are lost.
            if link_w.generation.load(Ordering::SeqCst) != generation {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn relays_and_delays_at_least_the_delay() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 5];
        c.write_all(b"hello").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");

        proxy.link().set_delay(Duration::from_millis(50));
        let start = std::time::Instant::now();
        c.write_all(b"again").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"again");
        // A lower bound only: the delay applies in both directions.
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    /// A server that answers every connection with `tag` and closes.
    async fn tag_server(tag: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(tag).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn redirect_sends_new_connections_elsewhere_and_closes_old_ones() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 5];
        old.write_all(b"first").await.unwrap();
        old.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"first");

        proxy.link().redirect(tag_server(b"other").await);
        let n = old.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "a connection to the old upstream is still open");
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        new.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"other");
    }

    #[tokio::test]
    async fn partition_holds_bytes_until_heal_and_sever_closes() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.link().partition();
        c.write_all(b"held!").await.unwrap();
        let mut buf = [0u8; 5];
        let early = tokio::time::timeout(Duration::from_millis(100), c.read_exact(&mut buf)).await;
        assert!(early.is_err(), "bytes crossed a partition");
        proxy.link().heal();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"held!");

        proxy.link().sever();
        let n = c.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "severed connection still open");
    }

    /// An echo server that also reports every chunk it received.
    async fn recording_echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        let _ = tx.send(buf[..n].to_vec());
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn partitioned_replies_let_requests_through_and_a_sever_loses_the_answers() {
        let (server, mut received) = recording_echo_server().await;
        let proxy = FaultProxy::start(server).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.link().partition_replies();
        c.write_all(b"asked").await.unwrap();
        assert_eq!(
            received.recv().await.unwrap(),
            b"asked",
            "the request arrived"
        );
        let mut buf = [0u8; 5];
        let early = tokio::time::timeout(Duration::from_millis(100), c.read_exact(&mut buf)).await;
        assert!(early.is_err(), "an answer crossed the partition");
        proxy.link().heal();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"asked");

        // Held answers die with the connection.
        proxy.link().partition_replies();
        c.write_all(b"again").await.unwrap();
        assert_eq!(received.recv().await.unwrap(), b"again");
        proxy.link().sever();
        proxy.link().heal();
        let n = c.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "a held answer arrived after the sever");
    }
}
