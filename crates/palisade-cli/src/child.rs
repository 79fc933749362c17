//! Running a command while holding a lock, and stopping it when the lock is lost.
//!
//! `etcdctl lock` never stops its child when the lease is lost; `consul lock` does
//! but passes no lock index. Palisade does both: the child gets the lock's identity
//! in its environment, and is stopped (SIGTERM, then SIGKILL after a grace period)
//! the moment the holder can no longer guarantee the lock.

use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// How a supervised command ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited on its own while the lock was held.
    Exited(ExitStatus),
    /// The lock was lost; the command was stopped.
    Lost {
        /// Why the lock was lost.
        reason: String,
        /// The status it ended with after being stopped.
        status: ExitStatus,
    },
}

/// Spawns `argv` with `env` added, and waits for it or for `lost`, whichever comes
/// first. SIGINT/SIGTERM sent to us are forwarded to the child.
pub async fn run_holding(
    argv: &[String],
    env: &[(String, String)],
    lost: impl Future<Output = String>,
    grace: Duration,
) -> Result<Ended> {
    let (program, args) = argv.split_first().context("no command given after --")?;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().cloned())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {program:?}"))?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(status?)),
            reason = &mut lost => {
                let status = stop(&mut child, grace).await?;
                return Ok(Ended::Lost { reason, status });
            }
            _ = interrupt.recv() => forward(&child, Signal::SIGINT),
            _ = terminate.recv() => forward(&child, Signal::SIGTERM),
        }
    }
}

fn forward(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }
}

/// SIGTERM, then SIGKILL if it has not exited after `grace`.
async fn stop(child: &mut Child, grace: Duration) -> Result<ExitStatus> {
    forward(child, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => Ok(status?),
        Err(_) => {
            child.start_kill()?;
            Ok(child.wait().await?)
        }
    }
}

/// The shell convention for a status: the exit code, or 128 + the signal number.
pub fn shell_status(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(crate::exit::FAILURE)
}

/// Completes on SIGINT or SIGTERM: how servers run until stopped.
pub async fn interrupted() {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default action (exit) applies; wait forever.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
