//! The simulated network: turmoil's TCP, for the nodes' listeners, their
//! channels to each other and the clients' channels to them.

use std::net::SocketAddr;

use palisade_client::{DialFuture, Dialer};
use palisade_server::io::{Conn, Listener, Net, NetFuture};

/// turmoil's network, as the server's [`Net`] and the client's [`Dialer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SimNet;

struct SimListener(turmoil::net::TcpListener);

impl Listener for SimListener {
    fn accept(&mut self) -> NetFuture<'_, (Box<dyn Conn>, SocketAddr)> {
        Box::pin(async move {
            let (stream, remote) = self.0.accept().await?;
            Ok((Box::new(stream) as Box<dyn Conn>, remote))
        })
    }
}

impl Net for SimNet {
    fn bind(&self, addr: SocketAddr) -> NetFuture<'static, Box<dyn Listener>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            Ok(Box::new(SimListener(listener)) as Box<dyn Listener>)
        })
    }

    fn connect(&self, authority: String) -> NetFuture<'static, Box<dyn Conn>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as Box<dyn Conn>)
        })
    }
}

impl Dialer for SimNet {
    fn dial(&self, authority: String) -> DialFuture {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as Box<dyn palisade_client::DialedConn>)
        })
    }
}
