//! A server that accepts connections and never answers.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Accepts TCP connections and never reads or writes: the worst kind of node, one
/// that looks up but swallows every request. Closed on drop.
pub struct SilentServer {
    addr: SocketAddr,
    /// Accepted connections are kept open until drop.
    held: Arc<Mutex<Vec<TcpStream>>>,
    /// Tells the accept thread to exit at its next wake-up.
    stop: Arc<AtomicBool>,
}

impl SilentServer {
    /// Listens on a loopback port of its own choosing.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let held = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (keep, stopped) = (held.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(s) = stream {
                    keep.lock().expect("poisoned").push(s);
                }
            }
        });
        Ok(SilentServer { addr, held, stop })
    }

    /// `redis://127.0.0.1:PORT`, for use as a Redis node.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept thread so it sees the flag and closes the listener.
        let _ = TcpStream::connect(self.addr);
        for s in self.held.lock().expect("poisoned").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
