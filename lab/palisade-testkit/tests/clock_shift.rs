//! The clock-shift preload on a real jemalloc-linked `redis-server`: it starts
//! (libfaketime does not), and a wall-clock jump expires keys early — the failure
//! the Redlock clock-jump drill relies on.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use palisade_testkit::{RedisServer, loopback};

/// One RESP command, one reply read (enough for these short replies).
fn cmd(port: u16, parts: &[&str]) -> String {
    let mut s = TcpStream::connect(loopback(port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("*{}\r\n", parts.len());
    for p in parts {
        req.push_str(&format!("${}\r\n{p}\r\n", p.len()));
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The server's wall clock in seconds (`TIME`).
fn server_time(port: u16) -> u64 {
    let reply = cmd(port, &["TIME"]);
    reply.lines().nth(2).unwrap().trim().parse().unwrap()
}

#[test]
fn a_wall_clock_jump_expires_a_redis_key_early() {
    let server =
        RedisServer::start_with_clock_shift().expect("redis-server runs under the preload");
    let port = server.port();
    let before = server_time(port);
    assert!(cmd(port, &["SET", "lock", "holder-1", "PX", "60000"]).starts_with("+OK"));
    assert!(cmd(port, &["GET", "lock"]).contains("holder-1"));

    server
        .clock()
        .unwrap()
        .jump_ahead(Duration::from_secs(120))
        .unwrap();
    // The preload re-reads the offset within 5 ms; wait for the jump to show, with
    // a generous bound, rather than assume when it does.
    let start = Instant::now();
    while server_time(port) < before + 100 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the clock never jumped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // 60 s lease, 120 s jump: Redis now considers the key expired.
    assert!(
        cmd(port, &["GET", "lock"]).starts_with("$-1"),
        "key survived the jump"
    );
    // Monotonic time is untouched: the server keeps serving.
    assert!(cmd(port, &["PING"]).starts_with("+PONG"));
}
