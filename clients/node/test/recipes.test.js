'use strict';
// Recipes on one real node: semaphore permits, read/write locks, elections
// (docs/recipes.md). Waits are for conditions, with long timeouts; nothing
// asserts a duration.

const assert = require('node:assert/strict');
const { test, before, after, afterEach } = require('node:test');

const palisade = require('..');
const { startCluster, eventually } = require('../test-support/nodes');

let cluster;
let addr;
const made = [];

/** A client of the shared node, closed after the test. */
function client(options = {}) {
  const c = new palisade.Client([addr], options);
  made.push(c);
  return c;
}

async function waiters(c, name) {
  const info = await c.get(name);
  return info ? info.waiters.length : 0;
}

before(async () => {
  cluster = await startCluster(1);
  addr = cluster.endpoints[0];
});
afterEach(async () => {
  await Promise.all(made.splice(0).map((c) => c.close()));
});
after(async () => {
  await cluster.kill();
});

test('a semaphore of 2 admits 2 at once, in distinct slots', async () => {
  const a = client({ label: 'a' });
  const b = client({ label: 'b' });
  const c = client();
  const pa = await a.acquire('r/sem2', { claim: 'permit', permits: 2 });
  const pb = await b.acquire('r/sem2', { claim: 'permit', permits: 2 });
  assert.deepEqual(new Set([pa.slot, pb.slot]), new Set([0, 1]));
  assert.equal(pa.claim, 'permit');
  assert.ok(pb.token > pa.token);
  await assert.rejects(c.acquire('r/sem2', { claim: 'permit', permits: 2 }), palisade.WouldBlock);
  const info = await a.get('r/sem2');
  assert.equal(info.shape, 'semaphore');
  assert.equal(info.permits, 2);
  assert.deepEqual(info.waiters, []);
  assert.deepEqual(
    info.holders.map((h) => [h.session, h.label, h.token, h.shared, h.slot]),
    [[pa.sessionId, 'a', pa.token, true, pa.slot], [pb.sessionId, 'b', pb.token, true, pb.slot]],
  );
  assert.ok(info.holders[0] instanceof palisade.Holder);
  assert.equal(info.holder, pb.sessionId); // the newest holder
  assert.equal(info.token, pb.token);
  const { slot } = pa;
  await pa.release();
  await c.lock('r/sem2', { claim: 'permit', permits: 2 }, async (pc) => {
    assert.equal(pc.slot, slot); // the freed slot
    assert.ok(pc.token > pb.token);
  });
  await pb.release();
  assert.equal(await a.get('r/sem2'), null);
});

test('semaphore contenders never exceed the permits and all are served', async () => {
  // Six contenders (a client each, like six processes) for a semaphore of 2:
  // by their own count never more than 2 hold at once, concurrent holders
  // never share a slot, every one is served. Each holder keeps its permit
  // until a second one holds too (or nobody is left to come), so two at once
  // is reached without relying on timing.
  const contenders = 6;
  const permits = 2;
  const holding = new Set(); // the slots held right now, by the holders' own account
  let peak = 0;
  let done = 0;
  const grants = []; // [slot, token]
  const contend = async (c) => {
    const lease = await c.acquire('r/sem-contended', { claim: 'permit', permits, wait: 120 });
    assert.ok(!holding.has(lease.slot), `slot ${lease.slot} granted twice at once`);
    assert.ok(lease.slot >= 0 && lease.slot < permits);
    holding.add(lease.slot);
    peak = Math.max(peak, holding.size);
    assert.ok(holding.size <= permits, `${holding.size} holders of a semaphore of ${permits}`);
    grants.push([lease.slot, lease.token]);
    await eventually('a second holder, or nobody left to come', () => holding.size === permits || done + holding.size === contenders, 60_000);
    holding.delete(lease.slot); // before the release: the count never overstates
    done += 1;
    await lease.release();
  };
  await Promise.all(Array.from({ length: contenders }, () => contend(client())));
  assert.equal(done, contenders);
  assert.equal(peak, permits);
  assert.equal(new Set(grants.map(([s, t]) => `${s}/${t}`)).size, contenders); // no slot granted twice with one token
  for (let s = 0; s < permits; s++) {
    const tokens = grants.filter(([slot]) => slot === s).map(([, t]) => t);
    assert.deepEqual(tokens, [...tokens].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0))); // a slot's next grant is above its last
  }
  assert.equal(await client().get('r/sem-contended'), null);
});

test('readers share, and a writer waits and gets a larger token', async () => {
  // A client's default lock-delay is not applied to a shared claim (the
  // server refuses one for readers).
  const r1 = client({ lockDelay: 5 });
  const r2 = client();
  const r3 = client();
  const w = client();
  const l1 = await r1.acquire('r/doc', { claim: 'read' });
  const l2 = await r2.acquire('r/doc', { claim: 'read' });
  assert.deepEqual([l1.slot, l2.slot, l1.claim], [0, 0, 'read']);
  let info = await r1.get('r/doc');
  assert.equal(info.shape, 'read_write');
  assert.equal(info.permits, 0);
  assert.deepEqual(info.holders.map((h) => [h.token, h.shared]), [[l1.token, true], [l2.token, true]]);
  await assert.rejects(w.acquire('r/doc', { claim: 'write' }), palisade.WouldBlock);
  let writer = null;
  const waiting = w.acquire('r/doc', { claim: 'write', wait: 120 }).then((l) => { writer = l; return l; });
  await eventually('the writer queued', async () => (await waiters(r1, 'r/doc')) === 1);
  // FIFO: a reader behind the waiting writer waits too.
  await assert.rejects(r3.acquire('r/doc', { claim: 'read' }), palisade.WouldBlock);
  await l1.release();
  assert.equal((await r1.get('r/doc')).holders.length, 1); // the other reader still holds…
  assert.equal(writer, null); // …so the writer still waits
  await l2.release();
  await waiting;
  assert.ok(writer.token > l1.token && writer.token > l2.token);
  assert.equal(writer.slot, 0);
  info = await r1.get('r/doc');
  assert.deepEqual(info.holders.map((h) => [h.session, h.token, h.shared]), [[writer.sessionId, writer.token, false]]);
  await assert.rejects(r3.acquire('r/doc', { claim: 'read' }), palisade.WouldBlock);
  await writer.release();
  await r3.lock('r/doc', { claim: 'read' }, async (l3) => assert.ok(l3.token > writer.token));
});

test('a claim of another shape is wrong_shape and changes nothing', async () => {
  const a = client();
  const b = client();
  const held = [
    await a.acquire('r/shape-sem', { claim: 'permit', permits: 2 }),
    await a.acquire('r/shape-mutex'),
    await a.acquire('r/shape-rw', { claim: 'read' }),
  ];
  const before = await a.locks();
  for (const [name, opts] of [
    ['r/shape-sem', {}],
    ['r/shape-sem', { claim: 'permit', permits: 3 }],
    ['r/shape-sem', { claim: 'read' }],
    ['r/shape-mutex', { claim: 'read' }],
    ['r/shape-mutex', { claim: 'lead', value: 'x' }],
    ['r/shape-rw', { claim: 'permit', permits: 2 }],
    ['r/shape-rw', { claim: 'lock' }],
  ]) {
    await assert.rejects(b.acquire(name, { ...opts, wait: 5 }), (e) => e instanceof palisade.WrongShape && e.code === 'wrong_shape' && e.status === 409);
  }
  assert.deepEqual(await a.locks(), before);
  await assert.rejects(a.leader('r/shape-mutex'), palisade.WrongShape); // decided by the client: not an election
  for (const l of held) await l.release();
  // Refused locally: what cannot be sent as meant.
  await assert.rejects(b.acquire('r/bad', { claim: 'mutex' }), /claim: one of/);
  await assert.rejects(b.acquire('r/bad', { claim: 'permit' }), /needs permits/);
  await assert.rejects(b.acquire('r/bad', { claim: 'read', permits: 2 }), /only for claim "permit"/);
  await assert.rejects(b.acquire('r/bad', { value: 'v' }), /only for claim "lead"/);
  await assert.rejects(b.acquire('r/bad', { claim: 'lead' }), /needs value/);
  await assert.rejects(b.campaign('r/bad', 'v', { claim: 'read' }), /unknown option "claim"/);
  // The server's judgement.
  await assert.rejects(b.acquire('r/bad', { claim: 'permit', permits: 0 }), palisade.InvalidInput);
  await assert.rejects(b.acquire('r/bad', { claim: 'read', lockDelay: 1 }), palisade.InvalidInput); // no lock-delay for a shared claim
});

test('a plain lock reads as a mutex with its one holder', async () => {
  const c = client({ label: 'plain' });
  await c.lock('r/plain', async (lease) => {
    assert.deepEqual([lease.slot, lease.claim], [0, 'lock']);
    const info = await c.get('r/plain');
    assert.deepEqual([info.shape, info.permits], ['mutex', 0]);
    assert.deepEqual(info.holders.map((h) => ({ ...h })), [
      { session: lease.sessionId, label: 'plain', token: lease.token, shared: false, slot: 0, value: '' },
    ]);
    assert.equal(info.leader(), null);
  });
});

test('election: proclaim, observe, and succession with a larger token', async () => {
  const a = client({ label: 'a' });
  const b = client({ label: 'b' });
  const watcher = client();
  assert.equal(await watcher.leader('r/primary'), null);
  const seen = [];
  const ac = new AbortController();
  const observing = (async () => {
    for await (const leader of watcher.observe('r/primary', { interval: 0.05, signal: ac.signal })) seen.push(leader);
  })();
  await eventually('the first look', () => seen.length >= 1);
  assert.equal(seen[0], null);

  const first = await a.campaign('r/primary', '10.0.0.7:5432');
  assert.deepEqual([first.claim, first.slot], ['lead', 0]);
  const now = await watcher.leader('r/primary');
  assert.ok(now instanceof palisade.Leader);
  assert.deepEqual({ ...now }, { name: 'r/primary', session: first.sessionId, label: 'a', token: first.token, value: '10.0.0.7:5432' });
  await eventually('observed the first leader', () => seen.at(-1) !== null);
  await first.proclaim('10.0.0.7:6432');
  const info = await watcher.get('r/primary');
  assert.equal(info.shape, 'election');
  assert.deepEqual(info.holders.map((h) => [h.session, h.token, h.shared, h.value]), [[first.sessionId, first.token, false, '10.0.0.7:6432']]);
  await eventually('observed the new value', () => seen.at(-1) !== null && seen.at(-1).value === '10.0.0.7:6432');

  await assert.rejects(b.campaign('r/primary', '10.0.0.8:5432'), palisade.WouldBlock);
  const waiting = b.campaign('r/primary', '10.0.0.8:5432', { wait: 120 });
  await eventually('the second candidate queued', async () => (await waiters(watcher, 'r/primary')) === 1);
  await first.release();
  const second = await waiting;
  assert.ok(second.token > first.token);
  const leader = await watcher.leader('r/primary');
  assert.deepEqual([leader.session, leader.token, leader.value], [second.sessionId, second.token, '10.0.0.8:5432']);
  await eventually('observed the second leader', () => seen.at(-1) !== null && seen.at(-1).token === second.token);
  await assert.rejects(first.proclaim('10.0.0.7:7432'), palisade.NotHolder); // released: refused without asking
  await second.release();
  await eventually('observed nobody leading', () => seen.at(-1) === null);
  ac.abort();
  await observing;

  assert.deepEqual(seen.filter((x) => x !== null).map((x) => [x.session, x.token, x.value]), [
    [first.sessionId, first.token, '10.0.0.7:5432'],
    [first.sessionId, first.token, '10.0.0.7:6432'],
    [second.sessionId, second.token, '10.0.0.8:5432'],
  ]);
  for (let i = 1; i < seen.length; i++) {
    assert.ok(!(seen[i] === null ? seen[i - 1] === null : seen[i].equals(seen[i - 1])), 'each look reported is a change');
  }
});

test('a stale or deposed leader cannot proclaim', async () => {
  const a = client();
  const b = client();
  const lease = await a.campaign('r/stale', 'a');
  await assert.rejects(a._proclaim(lease._session, 'r/stale', lease.token - 1n, 'forged'), (e) => {
    assert.ok(e instanceof palisade.StaleToken);
    assert.equal(e.currentToken, lease.token);
    assert.equal(e.presentedToken, lease.token - 1n);
    return true;
  });
  await assert.rejects(a.lock('r/stale-mutex', (plain) => plain.proclaim('x')), palisade.WrongShape); // not an election
  await assert.rejects(lease.proclaim('x'.repeat(2000)), palisade.InvalidInput); // over 1024 bytes
  // Deposed: its session is closed behind its back (as an operator might),
  // and the other candidate leads.
  await a._conn.simple('POST', '/v1/sessions/close', lease._session.ids());
  const second = await b.campaign('r/stale', 'b', { wait: 60 });
  assert.ok(second.token > lease.token);
  await assert.rejects(lease.proclaim('a again'), palisade.LeaseLost);
  assert.equal(lease.lost, true);
  const leader = await b.leader('r/stale');
  assert.deepEqual([leader.token, leader.value], [second.token, 'b']);
  await second.release();
});
