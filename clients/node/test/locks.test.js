'use strict';
// Locks on one real node: grants, tokens, FIFO waiting, refusals, reads.

const assert = require('node:assert/strict');
const { test, before, after, afterEach } = require('node:test');

const palisade = require('..');
const { startCluster, eventually, freePort, sleep } = require('../test-support/nodes');

let cluster;
let addr;
const made = [];

/** A client of the shared node, closed after the test. */
function client(options = {}) {
  const c = new palisade.Client([addr], options);
  made.push(c);
  return c;
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

test('acquire, token, reads, release', async () => {
  const c = client({ label: 'tester' });
  let token;
  let lease;
  const result = await c.lock('t/basic', { ttl: 10 }, async (l) => {
    lease = l;
    assert.equal(typeof lease.token, 'bigint');
    assert.ok(lease.token > 0n);
    assert.equal(lease.name, 't/basic');
    assert.equal(lease.lost, false);
    assert.equal(lease.signal.aborted, false);
    assert.ok(lease.remaining() > 0 && lease.remaining() <= 10, String(lease.remaining()));
    assert.deepEqual(lease.fencingHeader(), ['Fencing-Token', String(lease.token)]);
    const info = await c.get('t/basic');
    assert.ok(info instanceof palisade.LockInfo);
    assert.deepEqual(
      [info.holder, info.token, info.holderLabel, info.waiters, info.inLockDelay],
      [lease.sessionId, lease.token, 'tester', [], false],
    );
    assert.deepEqual(await c.checkToken('t/basic', lease.token), { current: true, currentToken: lease.token });
    assert.deepEqual(await c.checkToken('t/basic', String(lease.token)), { current: true, currentToken: lease.token });
    assert.ok((await c.locks()).some((l) => l.name === 't/basic'));
    token = lease.token;
    return 'the result';
  });
  assert.equal(result, 'the result');
  assert.equal(lease.remaining(), 0);
  assert.equal(lease.lost, false);
  assert.equal(lease.signal.aborted, false, 'a release does not abort the signal');
  assert.equal(await c.get('t/basic'), null);
  assert.deepEqual(await c.checkToken('t/basic', token), { current: false, currentToken: null });
  await lease.release(); // a second release does nothing
});

test('tokens rise across holders', async () => {
  const a = client();
  const b = client();
  const tokens = [];
  for (const c of [a, b, a]) tokens.push(await c.lock('t/rise', (lease) => lease.token));
  assert.ok(tokens[0] < tokens[1] && tokens[1] < tokens[2], tokens.join(' '));
});

test('acquire and release without a callback', async () => {
  const c = client();
  const lease = await c.acquire('t/manual', { ttl: 5 });
  assert.ok(lease instanceof palisade.Lease);
  assert.equal((await c.get('t/manual')).token, lease.token);
  await lease.release();
  assert.equal(await c.get('t/manual'), null);
  const again = await c.acquire('t/manual', { ttl: 5 });
  assert.ok(again.token > lease.token);
  await again.release();
});

test('many locks of one TTL share one session', async () => {
  const c = client();
  // Concurrent: the second waits for the session the first is opening.
  const [l1, l2] = await Promise.all([c.acquire('t/share/1'), c.acquire('t/share/2')]);
  assert.equal(l1.sessionId, l2.sessionId);
  // (Their tokens may be equal: the server batches concurrent commands into
  // one log entry, and a token is per lock.)
  const l3 = await c.acquire('t/share/3');
  assert.equal(l3.sessionId, l1.sessionId);
  assert.ok(l3.token > l1.token && l3.token > l2.token);
  await l3.release();
  await Promise.all([l1.release(), l2.release()]);
});

test('two acquires of the same name in one client exclude each other', async () => {
  const c = client();
  const first = await c.acquire('t/same');
  let second = null;
  const waiting = c.acquire('t/same', { wait: 60 }).then((l) => { second = l; return l; });
  await eventually('the second acquire queued', async () => (await c.get('t/same')).waiters.length === 1);
  assert.equal(second, null);
  await first.release();
  const got = await waiting;
  assert.ok(got.token > first.token);
  assert.notEqual(got.sessionId, first.sessionId);
  await got.release();
});

test('waiters are granted in FIFO order', async () => {
  const holder = client();
  const w1 = client();
  const w2 = client();
  const first = await holder.acquire('t/fifo');
  const granted = [];
  const waiters = async () => ((await holder.get('t/fifo')) || { waiters: [] }).waiters.length;
  const p1 = w1.acquire('t/fifo', { wait: 60 }).then((l) => { granted.push(['w1', l]); return l; });
  await eventually('w1 queued', async () => (await waiters()) === 1);
  const p2 = w2.acquire('t/fifo', { wait: 60 }).then((l) => { granted.push(['w2', l]); return l; });
  await eventually('w2 queued', async () => (await waiters()) === 2);
  assert.equal(granted.length, 0);
  await first.release();
  const l1 = await p1;
  assert.equal(granted[0][0], 'w1');
  assert.ok(l1.token > first.token);
  await sleep(200); // w2 must still be waiting: w1 holds the lock
  assert.equal(granted.length, 1);
  await l1.release();
  const l2 = await p2;
  assert.deepEqual(granted.map((g) => g[0]), ['w1', 'w2']);
  assert.ok(l2.token > l1.token);
  await l2.release();
});

test('would_block and wait_timeout', async () => {
  const a = client();
  const b = client();
  await a.lock('t/busy', async (lease) => {
    const e = await assert.rejects(b.acquire('t/busy'), palisade.WouldBlock);
    await assert.rejects(b.acquire('t/busy'), (err) => err.code === 'would_block' && err.status === 409 && err instanceof palisade.PalisadeError);
    await assert.rejects(b.acquire('t/busy', { wait: 0.3 }), (err) => err instanceof palisade.WaitTimeout && err.code === 'wait_timeout');
    const info = await a.get('t/busy');
    assert.equal(info.token, lease.token);
    assert.deepEqual(info.waiters, []);
    return e;
  });
});

test('bad input is refused and changes nothing; a stale release is refused', async () => {
  const c = client();
  await c.lock('t/bad', async (lease) => {
    const before = await c.locks();
    await assert.rejects(c.acquire(''), (e) => e instanceof palisade.InvalidInput && e.code === 'invalid_input' && e.status === 400 && /empty/.test(e.message));
    await assert.rejects(c.acquire('x'.repeat(100_000)), palisade.InvalidInput);
    await assert.rejects(c.acquire('t/bad-ttl', { ttl: 0 }), palisade.InvalidInput); // the server's judgement
    await assert.rejects(c.acquire('t/bad-ttl', { ttl: -1 }), palisade.InvalidInput); // refused locally
    await assert.rejects(c.acquire('t/bad-opt', { wiat: 5 }), /unknown option "wiat"/);
    await assert.rejects(c.checkToken('t/bad', -1), palisade.InvalidInput);
    await assert.rejects(c._release(lease._session, 't/bad', lease.token - 1n), (e) => {
      assert.ok(e instanceof palisade.StaleToken);
      assert.equal(e.code, 'stale_token');
      assert.equal(e.status, 409);
      assert.equal(e.currentToken, lease.token);
      assert.equal(e.presentedToken, lease.token - 1n);
      return true;
    });
    await assert.rejects(c._release(lease._session, 't/bad-never-held', lease.token), palisade.NotHolder);
    assert.deepEqual(await c.locks(), before);
    assert.equal((await c.checkToken('t/bad', lease.token)).current, true);
    assert.equal(lease.lost, false);
  });
  assert.equal(await c.get('t/bad'), null);
});

test('the callback error is thrown after the release', async () => {
  const c = client();
  await assert.rejects(c.lock('t/throw', async () => { throw new RangeError('the callback\'s own'); }), RangeError);
  assert.equal(await c.get('t/throw'), null);
});

test('client-side refusals', async () => {
  assert.throws(() => new palisade.Client([]), palisade.InvalidInput);
  assert.throws(() => new palisade.Client(['http://127.0.0.1:7420']), palisade.InvalidInput);
  assert.throws(() => new palisade.Client(['127.0.0.1']), palisade.InvalidInput);
  assert.throws(() => new palisade.Client(['127.0.0.1:7420'], { token: 'secret' }), /plaintext/);
  assert.throws(() => new palisade.Client(['127.0.0.1:7420'], { wait: -1 }), palisade.InvalidInput);
  assert.throws(() => new palisade.Client(['127.0.0.1:7420'], { retry_for: 1 }), /unknown option/);
  assert.throws(() => new palisade.Client(['127.0.0.1:7420'], { tls: { ca: '/nonexistent/ca.pem' } }), /TLS files/);
  const c = new palisade.Client('127.0.0.1:7420, 127.0.0.1:7421');
  assert.equal(String(c), 'Client(endpoints=["127.0.0.1:7420","127.0.0.1:7421"], tls=false)');
  await c.close();
  await assert.rejects(client().lock('t/no-callback', {}), palisade.InvalidInput);
});

test('an unreachable cluster is unavailable', async () => {
  const c = new palisade.Client([`127.0.0.1:${await freePort()}`], { retryFor: 0.5 });
  await assert.rejects(c.acquire('t/nobody'), (e) => e instanceof palisade.Unavailable && /connection refused/.test(e.message));
  await c.close();
});

test('closing the client loses the leases and releases the locks at once', async () => {
  const lostSeen = [];
  const a = new palisade.Client([addr], { ttl: 60 });
  const lease = await a.acquire('t/close', { onLost: (l) => lostSeen.push(l) });
  await a.close();
  assert.equal(lease.lost, true);
  assert.ok(lease.signal.aborted);
  assert.ok(lease.signal.reason instanceof palisade.LeaseLost);
  assert.deepEqual(lostSeen, [lease]);
  assert.equal(lease.remaining(), 0);
  await assert.rejects(lease.release(), palisade.LeaseLost);
  // Released at once, not after the 60 s TTL.
  const again = await client().acquire('t/close');
  assert.ok(again.token > lease.token);
  await again.release();
  await assert.rejects(a.acquire('t/close'), palisade.InvalidInput);
});

test('an aborted acquire gives up its wait', async () => {
  const a = client();
  const b = client();
  const held = await a.acquire('t/abort');
  const ac = new AbortController();
  const waiting = b.acquire('t/abort', { wait: 60, signal: ac.signal });
  await eventually('b queued', async () => (await a.get('t/abort')).waiters.length === 1);
  ac.abort();
  await assert.rejects(waiting, (e) => e.name === 'AbortError');
  await eventually('the wait taken out of the queue', async () => (await a.get('t/abort')).waiters.length === 0);
  await held.release();
  assert.equal(await a.get('t/abort'), null);
});

test('status', async () => {
  const st = await client().status();
  assert.ok(st instanceof palisade.Status);
  assert.equal(st.state, 'leader');
  assert.equal(st.leader, 1n);
  assert.equal(st.id, 1n);
  assert.equal(st.leaderAddr(), addr);
  assert.ok(st.term >= 1n);
});

test('names are sent verbatim', async () => {
  const c = client();
  const name = 't/odd name&x=1?#%+';
  await c.lock(name, async (lease) => {
    const info = await c.get(name);
    assert.equal(info.name, name);
    assert.equal(info.token, lease.token);
    assert.equal((await c.checkToken(name, lease.token)).current, true);
  });
});
