//! Concurrent lock requests of one manager share one pipeline per node.
//!
//! Why: a profile of 16 tasks sharing one manager over five local nodes (the
//! `redlock-5 × 16` row of `palisade bench redis`) showed the client and the five
//! servers each using about one core, the servers at ~6 µs per command: one read
//! and one write system call per command, because each request went out on its
//! own. On the client, a third of the time went to wake-ups and allocation per
//! request (a channel message, a response channel and a timer for each node of
//! each acquisition). Here the requests that arrive while a batch is forming go
//! to each node as one pipeline — one write, one read and one timer per node per
//! batch — and every request's answer is still tallied on its own, so each
//! caller learns its outcome the moment a majority of *its* answers settles it.
//!
//! A batch is run by a task of its own, spawned by the request that opened it:
//! a caller that gives up (its future dropped) cannot cancel the requests of the
//! others. The task drives every node to an answer or to the per-node timeout
//! even after every caller has been answered, so a release reaches every node
//! that can be reached, not only the majority that settled it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::oneshot;

use crate::node::{Batch, Node};
use crate::tally::Tally;

/// Most requests in one pipeline; a larger batch is sent as several.
const MAX_PIPELINE: usize = 512;

/// What a request asks of every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `SET key value NX PX ttl`: granted when the key was free.
    Set { ttl_ms: u64 },
    /// Compare-and-delete: granted when our value was there and is now gone.
    Release,
    /// Compare-and-pexpire: granted when our value was there and now expires
    /// `ttl_ms` from the node's receipt of the request.
    Extend { ttl_ms: u64 },
}

impl Request {
    /// Whether a node younger than the minimum uptime must not be asked: it must
    /// not grant or extend (the delayed-restart rule); a release always goes out.
    pub fn needs_uptime(self) -> bool {
        !matches!(self, Request::Release)
    }
}

/// One request as the nodes see it.
#[derive(Debug)]
pub(crate) struct Item {
    pub request: Request,
    pub key: String,
    pub value: String,
}

/// One caller waiting for its tally.
struct Waiter {
    tally: Tally,
    /// Answer only once every node answered (or timed out), not at the majority.
    wait_all: bool,
    reply: Option<oneshot::Sender<Tally>>,
}

struct Queued {
    item: Item,
    timeout: Duration,
    waiter: Waiter,
}

/// Requests gathering for the next batch.
#[derive(Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    /// Pipelines sent (one per batch, each to every node) and the requests
    /// they carried, since the manager was made.
    batches: AtomicU64,
    requests: AtomicU64,
}

/// How well a manager's concurrent requests were batched: the mean batch is
/// `requests / batches`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batches sent; each went to every node as one pipeline.
    pub batches: u64,
    /// Requests (acquisitions, releases, extensions) they carried.
    pub requests: u64,
}

impl Batcher {
    pub fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.batches.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

#[derive(Default)]
struct Queue {
    requests: Vec<Queued>,
    /// A task has been spawned to send what is queued.
    forming: bool,
}

/// Sends `item` to every node with the others gathering now and returns its
/// tally: early, once a majority of `needed` settles it (`wait_all` false), or
/// once every node answered or timed out.
pub(crate) async fn ask_all(
    nodes: &Arc<[Node]>,
    batcher: &Arc<Batcher>,
    item: Item,
    timeout: Duration,
    needed: usize,
    wait_all: bool,
) -> Tally {
    let (reply, answer) = oneshot::channel();
    let queued = Queued {
        item,
        timeout,
        waiter: Waiter {
            tally: Tally::new(nodes.len(), needed),
            wait_all,
            reply: Some(reply),
        },
    };
    let opens_batch = {
        let mut q = batcher.queue.lock().expect("poisoned");
        q.requests.push(queued);
        !std::mem::replace(&mut q.forming, true)
    };
    if opens_batch {
        let (nodes, batcher) = (Arc::clone(nodes), Arc::clone(batcher));
        tokio::spawn(async move {
            // Requests made in the same instant join this batch: the tasks
            // already queued on this worker run before the first yield returns,
            // and a second lets those woken on the other workers in too (+10 %
            // pairs/s with 16 tasks in `cargo bench --bench rslock`).
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            let requests = {
                let mut q = batcher.queue.lock().expect("poisoned");
                q.forming = false;
                std::mem::take(&mut q.requests)
            };
            run(&nodes, &batcher, requests).await;
        });
    }
    // The batch task ends only by answering; an error here means the runtime is
    // shutting down, and nothing was learnt from any node.
    answer
        .await
        .unwrap_or_else(|_| Tally::unanswered(nodes.len(), needed))
}

/// Sends a batch: requests with the same per-node timeout share pipelines.
async fn run(nodes: &[Node], batcher: &Batcher, mut requests: Vec<Queued>) {
    // One manager normally uses one TTL, hence one timeout: one group.
    requests.sort_by_key(|q| q.timeout);
    let mut groups = Vec::new();
    while !requests.is_empty() {
        let timeout = requests[0].timeout;
        let len = requests
            .iter()
            .take(MAX_PIPELINE)
            .take_while(|q| q.timeout == timeout)
            .count();
        let rest = requests.split_off(len);
        batcher.batches.fetch_add(1, Ordering::Relaxed);
        batcher.requests.fetch_add(len as u64, Ordering::Relaxed);
        groups.push(run_group(
            nodes,
            timeout,
            std::mem::replace(&mut requests, rest),
        ));
    }
    futures_util::future::join_all(groups).await;
}

async fn run_group(nodes: &[Node], timeout: Duration, requests: Vec<Queued>) {
    let (items, mut waiters): (Vec<Item>, Vec<Waiter>) =
        requests.into_iter().map(|q| (q.item, q.waiter)).unzip();
    let batch = Batch::new(items);
    let mut answers: FuturesUnordered<_> = nodes
        .iter()
        .map(|n| n.send_batch(timeout, &batch))
        .collect();
    while let Some(node_answers) = answers.next().await {
        for (waiter, answer) in waiters.iter_mut().zip(node_answers) {
            waiter.tally.record(answer);
            let done =
                waiter.tally.pending == 0 || (!waiter.wait_all && waiter.tally.settled().is_some());
            if done && let Some(reply) = waiter.reply.take() {
                let mut tally = waiter.tally;
                tally.counts.unsettled = tally.pending;
                let _ = reply.send(tally);
            }
        }
    }
}
