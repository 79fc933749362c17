'use strict';
// TLS, client certificates, bearer tokens and the policy file's roles, on a
// real node started with --tls-* and --auth (as the Python client's tests).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test, before, after } = require('node:test');

const palisade = require('..');
const { Node, freePort, tempDir, runPalisade, newToken } = require('../test-support/nodes');

let node;
let certs;
let locker;
let reader;
let base;

before(async () => {
  base = tempDir();
  certs = path.join(base, 'certs');
  runPalisade(['certs', 'init', certs, '--nodes', '1', '--clients', 'alice,mallory']);
  locker = newToken('locker');
  reader = newToken('reader');
  const policy = path.join(base, 'policy.toml');
  fs.writeFileSync(policy, `
[roles.jobs]
lock = ["jobs/"]
read = ["jobs/"]
[roles.readall]
read = [""]

[[users]]
name = "alice"
roles = ["jobs"]
[[users]]
name = "locker"
token_sha256 = ["${locker.sha256}"]
roles = ["jobs"]
[[users]]
name = "reader"
token_sha256 = ["${reader.sha256}"]
roles = ["readall"]
`);
  node = new Node(1, `127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`, path.join(base, 'data'), [
    '--tls-cert', path.join(certs, 'node-1.pem'),
    '--tls-key', path.join(certs, 'node-1-key.pem'),
    '--tls-ca', path.join(certs, 'ca.pem'),
    '--auth', policy,
  ]);
  await node.start();
});
after(async () => {
  await node.kill();
});

/** A client of the secure node; the CA is given as a path unless `tls` says otherwise. */
async function withClient(options, fn) {
  const { addr, ...rest } = options;
  const tls = { ca: path.join(certs, 'ca.pem'), ...(rest.tls || {}) };
  const c = new palisade.Client([addr || node.addr], { ...rest, tls });
  try {
    return await fn(c);
  } finally {
    await c.close();
  }
}

const alice = () => ({ cert: path.join(certs, 'client-alice.pem'), key: path.join(certs, 'client-alice-key.pem') });

test('a client certificate (as file paths) locks within its role', async () => {
  await withClient({ tls: alice() }, async (c) => {
    await c.lock('jobs/cert', async (lease) => {
      assert.ok(lease.token > 0n);
      assert.equal((await c.get('jobs/cert')).token, lease.token);
    });
    // alice's role covers only jobs/.
    await assert.rejects(c.acquire('other/cert'), (e) => e instanceof palisade.PermissionDenied && e.code === 'permission_denied' && e.status === 403);
  });
});

test('a client certificate given as PEM text', async () => {
  const pem = (f) => fs.readFileSync(path.join(certs, f), 'utf8');
  const c = new palisade.Client([node.addr], {
    tls: { ca: pem('ca.pem'), cert: pem('client-alice.pem'), key: fs.readFileSync(path.join(certs, 'client-alice-key.pem')) },
  });
  try {
    await c.lock('jobs/pem', async (lease) => assert.ok(lease.token > 0n));
  } finally {
    await c.close();
  }
});

test('a bearer token', async () => {
  await withClient({ token: locker.token }, async (c) => {
    await c.lock('jobs/token', async (lease) => {
      assert.equal((await c.checkToken('jobs/token', lease.token)).current, true);
    });
  });
});

test('a read-only role cannot lock (403) but can read', async () => {
  await withClient({ token: locker.token }, (l) => withClient({ token: reader.token }, async (r) => {
    await l.lock('jobs/read-only', async (lease) => {
      await assert.rejects(r.acquire('jobs/read-only'), (e) => e instanceof palisade.PermissionDenied && e.status === 403);
      assert.equal((await r.get('jobs/read-only')).token, lease.token);
      assert.deepEqual((await r.locks()).map((x) => x.name), ['jobs/read-only']);
    });
  }));
});

test('an unknown token is unauthenticated (401)', async () => {
  await withClient({ token: '00'.repeat(32) }, async (c) => {
    await assert.rejects(c.acquire('jobs/wrong-token'), (e) => e instanceof palisade.Unauthenticated && e.code === 'unauthenticated' && e.status === 401);
    await assert.rejects(c.locks(), palisade.Unauthenticated);
  });
});

test('no credentials is unauthenticated', async () => {
  await withClient({}, async (c) => {
    await assert.rejects(c.acquire('jobs/anonymous'), palisade.Unauthenticated);
  });
});

test('a certificate not in the policy cannot lock', async () => {
  const mallory = { cert: path.join(certs, 'client-mallory.pem'), key: path.join(certs, 'client-mallory-key.pem') };
  await withClient({ tls: mallory }, async (c) => {
    await assert.rejects(c.acquire('jobs/mallory'), palisade.PermissionDenied);
  });
});

test('plaintext to a TLS node fails', async () => {
  const c = new palisade.Client([node.addr], { retryFor: 0.5 });
  try {
    await assert.rejects(c.acquire('jobs/plaintext'), (e) => e instanceof palisade.Unavailable && /serving TLS/.test(e.message));
  } finally {
    await c.close();
  }
});

test('an untrusted CA is refused', async () => {
  const other = path.join(tempDir(), 'other');
  runPalisade(['certs', 'init', other, '--nodes', '1']);
  const c = new palisade.Client([node.addr], { tls: { ca: path.join(other, 'ca.pem') }, token: locker.token, retryFor: 0.5 });
  try {
    await assert.rejects(c.acquire('jobs/untrusted'), (e) => e instanceof palisade.Unavailable && /certificate verify failed/.test(e.message));
  } finally {
    await c.close();
  }
});

test('localhost is in the node certificate (the host dialled is checked)', async () => {
  const port = node.addr.split(':')[1];
  await withClient({ addr: `localhost:${port}`, token: locker.token }, async (c) => {
    await c.lock('jobs/localhost', async (lease) => assert.ok(lease.token > 0n));
  });
});
