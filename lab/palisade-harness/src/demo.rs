//! `palisade demo essay`: the essay's figure, on real processes.
//!
//! Client 1 acquires the lock and is paused (SIGSTOP, like a long GC pause) past
//! its lease. The server expires its session and client 2 acquires the lock with a
//! higher token and writes to the storage. Client 1 resumes, unaware, and writes
//! with its old token. With fencing on, the store rejects that write (409) and keeps
//! client 2's object; with fencing off, client 1 silently overwrites it — the lost
//! update the essay warns about.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_client::{AcquireOptions, Admin, Client, ClientConfig};
use palisade_fence::client::{StoreAddr, request};
use palisade_testkit::{PalisadeNode, free_port};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::FencingArg;

/// The demos.
#[derive(Subcommand)]
pub enum DemoCommand {
    /// The essay's example: a paused holder, a second holder, and the storage.
    Essay(EssayArgs),
    /// One client of the essay demo (run by `demo essay`).
    #[command(hide = true)]
    EssayClient(ClientArgs),
}

/// `palisade demo essay`.
#[derive(Args)]
pub struct EssayArgs {
    /// Whether the storage checks fencing tokens.
    #[arg(long, value_enum, default_value = "on")]
    fencing: FencingArg,
}

/// One client process.
#[derive(Args)]
pub struct ClientArgs {
    #[arg(long)]
    endpoints: String,
    #[arg(long)]
    store: String,
    #[arg(long)]
    name: String,
    /// Pause ourselves (SIGSTOP) after acquiring, before writing.
    #[arg(long)]
    pause: bool,
}

/// Runs a demo; returns the exit status.
pub async fn run(c: DemoCommand) -> Result<i32> {
    match c {
        DemoCommand::Essay(a) => essay(a).await,
        DemoCommand::EssayClient(a) => essay_client(a).await,
    }
}

const KEY: &str = "essay/file";

/// Acquire, maybe pause, write; report each step on stdout as `STEP value`.
async fn essay_client(a: ClientArgs) -> Result<i32> {
    let mut config = ClientConfig::new(a.endpoints.split(','));
    config.session_ttl = Duration::from_secs(1);
    let client = Client::connect(config).await?;
    let wait = AcquireOptions {
        wait: Duration::from_secs(60),
        ..Default::default()
    };
    let guard = client.acquire("essay", &wait).await?;
    let token = guard.token().get();
    println!("ACQUIRED {token}");
    if a.pause {
        // The stop-the-world pause: nothing of this process runs, not even the
        // keep-alive task, until SIGCONT.
        kill(Pid::this(), Signal::SIGSTOP)?;
    }
    let body = format!("written by {} with token {token}", a.name);
    let reply = request("PUT", &StoreAddr::plain(&a.store), KEY, Some(token), &body).await?;
    println!("WRITE {} {}", reply.status, reply.body);
    std::mem::forget(guard);
    Ok(0)
}

struct Timeline {
    start: Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl AsRef<str>) {
        println!(
            "[{:>7.3} s] {who:<9} {}",
            self.start.elapsed().as_secs_f64(),
            what.as_ref()
        );
    }
}

async fn spawn_client(
    exe: &std::path::Path,
    endpoints: &str,
    store: &str,
    name: &str,
    pause: bool,
) -> Result<(
    tokio::process::Child,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
)> {
    let mut cmd = Command::new(exe);
    cmd.args([
        "demo",
        "essay-client",
        "--endpoints",
        endpoints,
        "--store",
        store,
        "--name",
        name,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    if pause {
        cmd.arg("--pause");
    }
    let mut child = cmd.spawn()?;
    let lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    Ok((child, lines))
}

async fn expect_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    prefix: &str,
) -> Result<String> {
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .with_context(|| format!("no {prefix} line within 60 s"))??
        .with_context(|| format!("client exited before {prefix}"))?;
    line.strip_prefix(prefix)
        .map(|s| s.trim().to_owned())
        .with_context(|| format!("expected {prefix}, got {line:?}"))
}

async fn essay(a: EssayArgs) -> Result<i32> {
    let exe = std::env::current_exe()?;
    let node = PalisadeNode::single(&exe)?;
    let endpoints = node.addr();
    let store_dir = tempfile::tempdir()?;
    let store_addr = format!("127.0.0.1:{}", free_port()?);
    let fencing = match a.fencing {
        FencingArg::On => "on",
        FencingArg::Off => "off",
    };
    let mut store = Command::new(&exe)
        .args(["fence-store", "--listen", &store_addr, "--fencing", fencing])
        .arg("--data-dir")
        .arg(store_dir.path())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let ready = Instant::now();
    while tokio::net::TcpStream::connect(&store_addr).await.is_err() {
        if ready.elapsed() > Duration::from_secs(30) {
            bail!("the fenced store did not start");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Timeline {
        start: Instant::now(),
    };
    println!(
        "the essay's example, fencing {fencing}: lock server {endpoints}, storage {store_addr}"
    );

    let (mut c1, mut c1_out) =
        spawn_client(&exe, &endpoints, &store_addr, "client 1", true).await?;
    let t1: u64 = expect_line(&mut c1_out, "ACQUIRED").await?.parse()?;
    t.say("client 1", format!("acquired the lock, token {t1}"));
    t.say(
        "client 1",
        "paused (SIGSTOP): a stop-the-world GC pause; its lease runs out",
    );

    let admin = Admin::new(&ClientConfig::new([endpoints.clone()]))?;
    loop {
        let held_by_c1 =
            admin.list().await?.iter().any(|l| {
                l.name == "essay" && l.holder.as_ref().is_some_and(|h| h.token.get() == t1)
            });
        if !held_by_c1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.say(
        "server",
        "client 1's session expired: the lock is free again",
    );

    let (mut c2, mut c2_out) =
        spawn_client(&exe, &endpoints, &store_addr, "client 2", false).await?;
    let t2: u64 = expect_line(&mut c2_out, "ACQUIRED").await?.parse()?;
    t.say("client 2", format!("acquired the lock, token {t2}"));
    let w2 = expect_line(&mut c2_out, "WRITE").await?;
    t.say("client 2", format!("wrote with token {t2}: {w2}"));
    c2.wait().await?;

    let pid = Pid::from_raw(c1.id().context("client 1 is gone")? as i32);
    kill(pid, Signal::SIGCONT)?;
    t.say(
        "client 1",
        format!("resumed, unaware; writes with its old token {t1}"),
    );
    let w1 = expect_line(&mut c1_out, "WRITE").await?;
    let rejected = w1.starts_with("409");
    t.say(
        "storage",
        if rejected {
            format!("REJECTED the stale write: {w1}")
        } else {
            format!("accepted the stale write: {w1}")
        },
    );
    c1.wait().await?;

    let stored = request("GET", &StoreAddr::plain(&store_addr), KEY, None, "").await?;
    t.say(
        "storage",
        format!(
            "holds {:?} (token {})",
            stored.body,
            stored.token.map_or("-".into(), |v| v.to_string())
        ),
    );
    let _ = store.kill().await;
    let by_client2 = stored.body.contains("client 2");
    match (a.fencing, rejected, by_client2) {
        (FencingArg::On, true, true) => {
            println!("result: fencing rejected token {t1} after {t2}; client 2's write is intact");
            Ok(0)
        }
        (FencingArg::Off, false, false) => {
            println!(
                "result: LOST UPDATE — client 2's write (token {t2}) was overwritten by client 1, whose lease had expired"
            );
            Ok(0)
        }
        _ => {
            println!(
                "result: unexpected outcome (rejected={rejected}, client 2's object kept={by_client2})"
            );
            Ok(crate::exit::FAILURE)
        }
    }
}
