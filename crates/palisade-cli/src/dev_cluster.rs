//! `palisade dev-cluster`: a local N-node cluster in one terminal, for trying
//! Palisade and for developing against it (like `consul agent -dev`).
//!
//! Each node is a real `palisade serve` child process of this one, on loopback
//! ports from `--port` up (client port, peer port = client port + 1, then the
//! next node). Their log lines are shown prefixed with the node id, so a person
//! sees every election and leader change as it happens. Ctrl-C (or SIGTERM)
//! stops every node; a node that dies on its own stops the others too, so the
//! cluster never runs half-alive unnoticed. `--metrics-port` gives each node
//! its metrics and status page.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::exit;

/// `palisade dev-cluster`.
#[derive(Args)]
pub struct DevClusterArgs {
    /// How many nodes (1, 3 or 5 make sense: a majority of them must run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    nodes: u64,
    /// The first node's client port; node i listens on PORT + 2(i-1) for
    /// clients and the port after it for peers.
    #[arg(long, default_value_t = 7420)]
    port: u16,
    /// Keep the nodes' data here (node-1, node-2, …) and reuse it on the next
    /// start. Default: a temporary directory, deleted when the cluster stops.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Serve each node's metrics and status page: node i on PORT + i − 1
    /// (`http://127.0.0.1:PORT/` is node 1's status page).
    #[arg(long)]
    metrics_port: Option<u16>,
}

/// Runs the cluster until Ctrl-C or until a node ends.
pub async fn run(a: DevClusterArgs) -> Result<i32> {
    let last_port = u32::from(a.port) + 2 * u32::try_from(a.nodes)? - 1;
    if last_port > u32::from(u16::MAX) {
        bail!("--port {} leaves no room for {} nodes", a.port, a.nodes);
    }
    let ports: Vec<u16> = (0..a.nodes).map(|i| a.port + 2 * i as u16).collect();
    if let Some(m) = a.metrics_port
        && u32::from(m) + u32::try_from(a.nodes)? - 1 > u32::from(u16::MAX)
    {
        bail!("--metrics-port {m} leaves no room for {} nodes", a.nodes);
    }
    let temporary = match &a.data_dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("palisade-dev-").tempdir()?),
    };
    let root = match (&a.data_dir, &temporary) {
        (Some(dir), _) => dir.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => unreachable!("one of the two is set"),
    };
    let members: Vec<String> = ports
        .iter()
        .zip(1..)
        .map(|(port, id)| format!("{id}=127.0.0.1:{port}"))
        .collect();
    let endpoints: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut children: Vec<Child> = Vec::new();
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    // The nodes share this machine's cores.
    let threads = colocated_worker_threads(a.nodes);
    for (port, id) in ports.iter().zip(1u64..) {
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .args(["--id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(root.join(format!("node-{id}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if a.nodes > 1 {
            cmd.args(["--initial-cluster", &members.join(",")]);
        }
        if let Some(threads) = threads {
            cmd.args(["--worker-threads", &threads.to_string()]);
        }
        if let Some(m) = a.metrics_port {
            let port = m + (id - 1) as u16;
            cmd.args(["--metrics-listen", &format!("127.0.0.1:{port}")]);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => bail!("starting node {id}: {e}"),
        };
        let stderr = child.stderr.take().expect("piped");
        let ended = ended_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("node {id} | {}", without_timestamp(&line));
            }
            // Its stderr closes when it exits.
            let _ = ended.send(id);
        });
        children.push(child);
    }
    println!(
        "palisade dev-cluster: {} node(s), data in {}{}",
        a.nodes,
        root.display(),
        if temporary.is_some() {
            " (deleted on exit)"
        } else {
            ""
        }
    );
    println!("In another terminal:");
    println!("  export PALISADE_ENDPOINTS={}", endpoints.join(","));
    println!(
        "  {} lock demo -- sh -c 'echo token $PALISADE_FENCING_TOKEN'",
        invoked_as(&exe)
    );
    if let Some(m) = a.metrics_port {
        println!("Status page: http://127.0.0.1:{m}/ (metrics at /metrics)");
    }
    println!("Ctrl-C stops every node.");
    let code = tokio::select! {
        _ = crate::child::interrupted() => 0,
        Some(id) = ended_rx.recv() => {
            eprintln!("palisade dev-cluster: node {id} stopped; stopping the others");
            exit::FAILURE
        }
    };
    stop_all(&mut children).await;
    drop(temporary);
    Ok(code)
}

/// `palisade` when that name on PATH is this program, else its full path (a
/// build that was not installed).
fn invoked_as(exe: &std::path::Path) -> String {
    let on_path = match (std::env::var_os("PATH"), std::fs::canonicalize(exe)) {
        (Some(path), Ok(exe)) => std::env::split_paths(&path)
            .any(|dir| std::fs::canonicalize(dir.join("palisade")).is_ok_and(|p| p == exe)),
        _ => false,
    };
    if on_path {
        "palisade".into()
    } else {
        exe.display().to_string()
    }
}

/// SIGTERM to every node, then SIGKILL to any still running after 5 s.
async fn stop_all(children: &mut [Child]) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for child in children.iter() {
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    for child in children.iter_mut() {
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// A node's log line without its RFC 3339 timestamp: the terminal shows them
/// as they come, and the prefix keeps the line short.
fn without_timestamp(line: &str) -> &str {
    match line.split_once(' ') {
        Some((first, rest)) if first.len() > 20 && first.ends_with('Z') && first.contains('T') => {
            rest.trim_start()
        }
        _ => line,
    }
}

/// The `--worker-threads` of each of `nodes` nodes sharing this machine: its
/// cores split between them, at least one each; `None` when
/// `PALISADE_WORKER_THREADS` is set (the nodes inherit it). Threads beyond the
/// cores only add context switches to every commit. (The testkit's clusters
/// follow the same rule; it cannot call this one, the product does not link
/// the rigs and the rigs do not link the binary.)
fn colocated_worker_threads(nodes: u64) -> Option<usize> {
    if std::env::var_os("PALISADE_WORKER_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    Some((cores / nodes.max(1) as usize).max(1))
}

#[cfg(test)]
mod tests {
    use super::without_timestamp;

    #[test]
    fn timestamps_are_cut_and_other_lines_kept() {
        assert_eq!(
            without_timestamp(
                "2026-12-04T04:00:57.920339Z  INFO palisade_server::node: node 1 leads (term 1)"
            ),
            "INFO palisade_server::node: node 1 leads (term 1)"
        );
        assert_eq!(
            without_timestamp("palisade: node 1 serving clients"),
            "palisade: node 1 serving clients"
        );
    }
}
