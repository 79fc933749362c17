'use strict';
// A real 3-node cluster: following the leader, and a leader killed with
// SIGKILL while a client holds a lock and another waits for it.

const assert = require('node:assert/strict');
const { performance } = require('node:perf_hooks');
const { test, before, after } = require('node:test');

const palisade = require('..');
const { startCluster, eventually } = require('../test-support/nodes');

let cluster;
before(async () => {
  cluster = await startCluster(3);
});
after(async () => {
  await cluster.kill();
});

test('follows the leader from any node', async () => {
  const leader = await cluster.leader();
  const followers = cluster.endpoints.filter((a) => a !== leader);
  // Only followers given: the first answer names the leader, which is then
  // remembered for every call.
  const c = new palisade.Client(followers);
  try {
    await c.lock('c/follow', async (lease) => {
      assert.equal((await c.checkToken('c/follow', lease.token)).current, true);
      assert.equal((await c.status()).leaderAddr(), leader);
    });
  } finally {
    await c.close();
  }
  // A follower's own answer is not_leader; the client never shows it.
  const d = new palisade.Client([followers[0]]);
  try {
    assert.equal(await d.get('c/follow'), null);
  } finally {
    await d.close();
  }
});

test('leader killed: the holder is told before the waiter is granted, and tokens rise', async () => {
  // A holds a lock through the leader only (it is cut off with it, so its
  // lease must run out); B knows every node and waits for the same lock.
  const leader = await cluster.leader();
  const a = new palisade.Client([leader], { ttl: 2, rpcTimeout: 0.5 });
  const b = new palisade.Client(cluster.endpoints, { ttl: 5, retryFor: 30 });
  try {
    let aLostAt = null;
    const leaseA = await a.acquire('c/killed', { onLost: () => { aLostAt = performance.now(); } });
    leaseA.signal.addEventListener('abort', () => { if (aLostAt === null) aLostAt = performance.now(); });
    let bGrantedAt = null;
    const bWaits = b.acquire('c/killed', { wait: 120 }).then((lease) => {
      bGrantedAt = performance.now();
      return lease;
    });
    await eventually('B queued behind A', async () => {
      const info = await b.get('c/killed');
      return info !== null && info.waiters.length === 1;
    });
    cluster.node(leader).signal('SIGKILL');
    const leaseB = await bWaits;
    assert.ok(leaseA.lost && leaseA.signal.aborted, 'A was not told');
    assert.ok(leaseA.signal.reason instanceof palisade.LeaseLost);
    assert.ok(aLostAt !== null && aLostAt < bGrantedAt, `A lost at ${aLostAt}, B granted at ${bGrantedAt}`);
    assert.ok(leaseA.guaranteedUntil() < bGrantedAt);
    assert.ok(leaseB.token > leaseA.token, `${leaseB.token} > ${leaseA.token}`);
    const st = await b.status();
    assert.ok(st.leaderAddr() !== null && st.leaderAddr() !== leader);
    await leaseB.release();
    // And on: the next grant's token is higher still.
    const next = await b.lock('c/killed', (l) => l.token);
    assert.ok(next > leaseB.token);
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});
