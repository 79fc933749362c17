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
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().cloned())
        .kill_on_drop(true);
    // Off a terminal (cron, systemd, scripts) the command gets a process group
    // of its own, and stopping it signals the whole group: a shell's children
    // must not go on writing after the lock is lost. At a terminal it stays in
    // ours, so that it may still read the terminal (a background group may
    // not), and Ctrl-C reaches all of it anyway.
    let own_group = !std::io::IsTerminal::is_terminal(&std::io::stdin());
    if own_group {
        command.process_group(0);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {program:?}"))?;
    let target = Target {
        pid: child.id(),
        group: own_group,
    };
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(status?)),
            reason = &mut lost => {
                let status = stop(&mut child, target, grace).await?;
                return Ok(Ended::Lost { reason, status });
            }
            _ = interrupt.recv() => target.signal(Signal::SIGINT),
            _ = terminate.recv() => target.signal(Signal::SIGTERM),
        }
    }
}

/// Whom a signal for the command goes to.
#[derive(Clone, Copy)]
struct Target {
    pid: Option<u32>,
    /// The command leads a process group of its own: signal the group.
    group: bool,
}

impl Target {
    fn signal(self, sig: Signal) {
        if let Some(pid) = self.pid {
            let pid = pid as i32;
            let _ = kill(Pid::from_raw(if self.group { -pid } else { pid }), sig);
        }
    }
}

/// SIGTERM, then SIGKILL if it has not exited after `grace`; with a group of
/// its own, the whole group gets both (what the command left behind too).
async fn stop(child: &mut Child, target: Target, grace: Duration) -> Result<ExitStatus> {
    target.signal(Signal::SIGTERM);
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status?,
        Err(_) => {
            child.start_kill()?;
            child.wait().await?
        }
    };
    if target.group {
        target.signal(Signal::SIGKILL);
    }
    Ok(status)
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
