'use strict';
// lease.signal: aborted when the server no longer knows the session, and by
// the timer when keep-alives stop getting through (the node SIGSTOPped past
// the TTL). Waits are for events, with long timeouts; nothing depends on a
// fixed short sleep.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { performance } = require('node:perf_hooks');
const { test } = require('node:test');

const palisade = require('..');
const { startCluster, closeSessionBehindItsBack } = require('../test-support/nodes');

/** Resolves when `signal` aborts; rejects after `ms`. */
function aborted(signal, ms = 30_000) {
  if (signal.aborted) return Promise.resolve();
  return Promise.race([
    once(signal, 'abort'),
    new Promise((_, reject) => setTimeout(() => reject(new Error('the signal was not aborted')), ms).unref()),
  ]);
}

test('lost when the server drops the session; lock() rejects with LeaseLost', async (t) => {
  const cluster = await startCluster(1);
  t.after(() => cluster.kill());
  const [addr] = cluster.endpoints;
  const c = new palisade.Client([addr], { ttl: 2 });
  t.after(() => c.close());
  const lostCalls = [];
  let held;
  await assert.rejects(
    c.lock('l/dropped', { onLost: (l) => lostCalls.push(l) }, async (lease) => {
      held = lease;
      await closeSessionBehindItsBack(addr, lease);
      // The next keep-alive (a third of the TTL) hears unknown_session.
      await aborted(lease.signal);
      assert.ok(lease.signal.reason instanceof palisade.LeaseLost);
      assert.equal(lease.signal.reason.code, 'lease_lost');
      assert.throws(() => lease.signal.throwIfAborted(), palisade.LeaseLost);
      assert.equal(lease.lost, true);
      assert.equal(lease.remaining(), 0);
      return 'not returned';
    }),
    palisade.LeaseLost,
  );
  assert.deepEqual(lostCalls, [held]);
  // The client opens a new session for the next lock.
  await c.lock('l/dropped', async (again) => {
    assert.ok(again.token > held.token);
    assert.notEqual(again.sessionId, held.sessionId);
  });

  // The callback's own error is not masked by the loss.
  await assert.rejects(
    c.lock('l/masked', async (lease) => {
      await closeSessionBehindItsBack(addr, lease);
      await aborted(lease.signal);
      throw new RangeError("the callback's own error");
    }),
    RangeError,
  );
});

test('lost by the timer when the node is stopped, before anyone else is granted', async (t) => {
  const cluster = await startCluster(1);
  t.after(() => cluster.kill());
  const node = cluster.nodes[0];
  const a = new palisade.Client(cluster.endpoints, { ttl: 1, rpcTimeout: 0.5 });
  const b = new palisade.Client(cluster.endpoints, { retryFor: 60 });
  t.after(() => Promise.all([a.close(), b.close()]));
  const lease = await a.acquire('l/stopped');
  node.signal('SIGSTOP');
  let lostAt;
  try {
    await aborted(lease.signal, 60_000);
    lostAt = performance.now();
    assert.equal(lease.remaining(), 0);
    assert.ok(lease.guaranteedUntil() <= lostAt);
    assert.ok(lease.signal.reason instanceof palisade.LeaseLost);
    assert.match(lease.signal.reason.message, /guarantee ran out/);
  } finally {
    node.signal('SIGCONT');
  }
  const other = await b.acquire('l/stopped', { wait: 60 });
  assert.ok(other.token > lease.token);
  assert.ok(lostAt < performance.now());
  await other.release();
  await assert.rejects(lease.release(), palisade.LeaseLost);
});

test('a wait whose session cannot be kept alive ends with SessionExpired', async (t) => {
  const cluster = await startCluster(1);
  t.after(() => cluster.kill());
  const node = cluster.nodes[0];
  const holder = new palisade.Client(cluster.endpoints, { ttl: 30 });
  const waiter = new palisade.Client(cluster.endpoints, { ttl: 1, rpcTimeout: 0.5, retryFor: 2 });
  t.after(() => Promise.all([holder.close(), waiter.close()]));
  const held = await holder.acquire('l/wait-expired');
  const outcome = waiter.acquire('l/wait-expired', { wait: 20 }).then(
    (l) => ({ granted: l }),
    (e) => ({ error: e }),
  );
  const deadline = Date.now() + 30_000;
  while (((await holder.get('l/wait-expired')) || { waiters: [] }).waiters.length === 0) {
    assert.ok(Date.now() < deadline, 'the waiter never queued');
    await new Promise((r) => setTimeout(r, 50));
  }
  node.signal('SIGSTOP');
  let result;
  try {
    result = await Promise.race([
      outcome,
      new Promise((_, reject) => setTimeout(() => reject(new Error('the wait did not end')), 60_000).unref()),
    ]);
  } finally {
    node.signal('SIGCONT');
  }
  assert.ok(result.error instanceof palisade.SessionExpired, String(result.error || result.granted));
  await held.release();
});
