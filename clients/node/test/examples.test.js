'use strict';
// The examples end to end, against a real node (and a real
// `palisade fence-store`), and the README's Node snippet.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { promisify } = require('node:util');
const { test, before, after } = require('node:test');

const { startCluster, Proc, freePort, tempDir, REPO_ROOT, CLIENT_DIR } = require('../test-support/nodes');

const run = promisify(execFile);
const EXAMPLES = path.join(CLIENT_DIR, 'examples');

let cluster;
let addr;
before(async () => {
  cluster = await startCluster(1);
  addr = cluster.endpoints[0];
});
after(async () => {
  await cluster.kill();
});

/** Runs `node ARGS…`; resolves to {code, stdout, stderr} (a failure is not thrown). */
async function node(args, options = {}) {
  try {
    const { stdout, stderr } = await run(process.execPath, args, { timeout: 120_000, ...options });
    return { code: 0, stdout, stderr };
  } catch (e) {
    return { code: e.code, stdout: e.stdout || '', stderr: e.stderr || String(e) };
  }
}

test('fenced-write.js: a stale write is refused by the fence-store', async (t) => {
  const dir = tempDir();
  const port = await freePort();
  const store = new Proc(
    ['fence-store', '--listen', `127.0.0.1:${port}`, '--data-dir', path.join(dir, 'objects')],
    path.join(dir, 'fence-store.log'),
    'fenced object store on',
  );
  await store.start();
  t.after(() => store.kill());
  const r = await node([path.join(EXAMPLES, 'fenced-write.js'), '--endpoints', addr, '--store', `http://127.0.0.1:${port}`]);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /holder 1 \(token \d+\) wrote: 200/);
  assert.match(r.stdout, /wrote late: 409/);
  assert.match(r.stdout, /the store holds: "written by holder 2"/);
  assert.match(r.stdout, /refused: token \d+ is below \d+/);
});

test('print-token.js prints a token (endpoints from argv and from PALISADE_ENDPOINTS)', async () => {
  const fromArgv = await node([path.join(EXAMPLES, 'print-token.js'), addr, '--lock', 'ex/print']);
  assert.equal(fromArgv.code, 0, fromArgv.stdout + fromArgv.stderr);
  const m1 = /^holding ex\/print with fencing token (\d+)\n$/.exec(fromArgv.stdout);
  assert.ok(m1, fromArgv.stdout);
  const fromEnv = await node([path.join(EXAMPLES, 'print-token.js'), '--lock', 'ex/print'], {
    env: { ...process.env, PALISADE_ENDPOINTS: addr },
  });
  assert.equal(fromEnv.code, 0, fromEnv.stdout + fromEnv.stderr);
  const m2 = /^holding ex\/print with fencing token (\d+)\n$/.exec(fromEnv.stdout);
  assert.ok(m2 && BigInt(m2[1]) > BigInt(m1[1]), fromEnv.stdout);
  // Nothing there: an error and exit status 1.
  const none = await node([path.join(EXAMPLES, 'print-token.js'), `127.0.0.1:${await freePort()}`, '--retry-for', '0.5'], {
    env: { ...process.env, PALISADE_ENDPOINTS: '' },
  });
  assert.equal(none.code, 1);
  assert.match(none.stderr, /Unavailable/);
});

test('bench.js prints one JSON line of pairs', async () => {
  const r = await node([path.join(EXAMPLES, 'bench.js'), '--endpoints', addr, '--duration', '0.3']);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const result = JSON.parse(r.stdout.trim().split('\n').pop());
  assert.ok(result.pairs >= 1 && result.acquire_us.length === result.pairs, r.stdout);
  assert.ok(result.elapsed_s > 0);
});

test("the README's Node snippet prints a token, via require('palisade')", async () => {
  const readme = fs.readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('```js\n');
  assert.ok(start >= 0, 'no js block in the README');
  const snippet = readme.slice(start + 6, readme.indexOf('```', start + 6));
  assert.ok(snippet.includes('"127.0.0.1:7420"'), snippet);
  // A project of its own whose node_modules/palisade is this package.
  const dir = tempDir();
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(CLIENT_DIR, path.join(dir, 'node_modules', 'palisade'), 'dir');
  // The snippet awaits at its top level: run it as the body of an async function.
  const script = `(async () => {\n${snippet.replace('127.0.0.1:7420', addr)}\n})().catch((e) => { console.error(e); process.exitCode = 1; });\n`;
  fs.writeFileSync(path.join(dir, 'snippet.js'), script);
  const r = await node([path.join(dir, 'snippet.js')], { cwd: dir });
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /^holding jobs\/nightly with fencing token [1-9]\d*\n$/);
  // It did not close its client, and the process still ended (idle timers
  // and pooled connections do not hold it open).
});
