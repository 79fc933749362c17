'use strict';
// Real Palisade processes for the tests (no mocks).
//
// The binary is $PALISADE_BIN, default target/debug/palisade of the repository
// (relative paths are taken from the repository root). Every node gets free
// loopback ports and a temporary data directory, is waited for until it prints
// "serving clients on", and is killed at the end (also if the test process
// exits early).

const assert = require('node:assert');
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');

const palisade = require('..');

const REPO_ROOT = path.resolve(__dirname, '..', '..', '..');
const CLIENT_DIR = path.resolve(__dirname, '..');

/** Generous: a loaded 2-core machine may be slow to start a debug binary. */
const START_TIMEOUT_MS = 60_000;

function palisadeBin() {
  const p = process.env.PALISADE_BIN || 'target/debug/palisade';
  const abs = path.isAbsolute(p) ? p : path.join(REPO_ROOT, p);
  if (!fs.existsSync(abs)) throw new Error(`no palisade binary at ${abs} (set PALISADE_BIN)`);
  return abs;
}

/** A free loopback port (bound, read, closed). */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Waits until `check()` (sync or async) is truthy, polling; fails after `timeoutMs`. */
async function eventually(what, check, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let ok = false;
    try {
      ok = await check();
    } catch (_) {
      ok = false;
    }
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

const live = new Set();
process.on('exit', () => {
  for (const p of live) {
    try {
      p.kill('SIGCONT');
      p.kill('SIGKILL');
    } catch (_) {
      // already gone
    }
  }
});

/** A temporary directory, removed by `removeTemp` (or at exit). */
const temps = new Set();
function tempDir(prefix = 'palisade-node-test-') {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  temps.add(d);
  return d;
}
process.on('exit', () => {
  for (const d of temps) fs.rmSync(d, { recursive: true, force: true });
});

/** A palisade process whose output goes to a log file we can wait on. */
class Proc {
  constructor(args, log, ready) {
    this.args = args;
    this.log = log;
    this.ready = ready;
    this.child = null;
    this.exited = null;
  }

  /** Starts the process without waiting for it. */
  launch() {
    const out = fs.openSync(this.log, 'a');
    this.child = spawn(palisadeBin(), this.args, { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    live.add(this.child);
    this.exited = new Promise((resolve) => this.child.on('exit', (code, sig) => {
      live.delete(this.child);
      resolve({ code, sig });
    }));
    return this;
  }

  get running() {
    return this.child !== null && live.has(this.child);
  }

  logText() {
    try {
      return fs.readFileSync(this.log, 'utf8');
    } catch (_) {
      return '';
    }
  }

  /** Waits until the log says it is ready (fails if it exits first). */
  async waitReady() {
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (!this.logText().includes(this.ready)) {
      if (!this.running) throw new Error(`${this.args.join(' ')} exited:\n${this.logText()}`);
      if (Date.now() > deadline) throw new Error(`${this.args.join(' ')} not ready in ${START_TIMEOUT_MS} ms:\n${this.logText()}`);
      await sleep(50);
    }
    return this;
  }

  async start() {
    this.launch();
    return this.waitReady();
  }

  get pid() {
    return this.child.pid;
  }

  signal(sig) {
    this.child.kill(sig);
  }

  /** SIGKILL (after SIGCONT, in case it is stopped) and reap. */
  async kill() {
    if (this.running) {
      this.child.kill('SIGCONT');
      this.child.kill('SIGKILL');
      await this.exited;
    }
  }
}

/** One `palisade serve` node. */
class Node extends Proc {
  constructor(id, addr, peer, data, extra = []) {
    super(
      ['serve', '--id', String(id), '--listen', addr, '--listen-peer', peer, '--data-dir', data, ...extra],
      path.join(path.dirname(data), `node-${id}.log`),
      'serving clients on',
    );
    this.id = id;
    this.addr = addr;
    this.peer = peer;
  }
}

/** Nodes started together. */
class Cluster {
  constructor(nodes, dir) {
    this.nodes = nodes;
    this.dir = dir;
  }

  get endpoints() {
    return this.nodes.map((n) => n.addr);
  }

  node(addr) {
    return this.nodes.find((n) => n.addr === addr);
  }

  /** The client address of the leader all live nodes agree on. */
  async leader(timeoutMs = 60_000, clientOptions = {}) {
    let found = null;
    await eventually('a leader', async () => {
      const seen = new Set();
      for (const n of this.nodes) {
        if (!n.running) continue;
        const c = new palisade.Client([n.addr], { retryFor: 0.5, ...clientOptions });
        try {
          seen.add((await c.status()).leaderAddr());
        } finally {
          await c.close();
        }
      }
      if (seen.size === 1 && !seen.has(null)) {
        found = [...seen][0];
        return true;
      }
      return false;
    }, timeoutMs);
    return found;
  }

  async kill() {
    await Promise.all(this.nodes.map((n) => n.kill()));
  }
}

/**
 * Starts `size` nodes (a static cluster when more than one) with `extra`
 * arguments each, and waits for every one.
 */
async function startCluster(size = 1, extra = []) {
  const dir = tempDir();
  const ports = [];
  for (let i = 0; i < size; i++) ports.push([await freePort(), await freePort()]);
  const spec = ports.map(([p, q], i) => `${i + 1}=127.0.0.1:${p}/127.0.0.1:${q}`).join(',');
  const nodes = ports.map(([p, q], i) => new Node(
    i + 1, `127.0.0.1:${p}`, `127.0.0.1:${q}`, path.join(dir, `data-${i + 1}`),
    [...extra, ...(size > 1 ? ['--initial-cluster', spec] : [])],
  ));
  // All launched before any is waited on: a node of a static cluster may say
  // it serves only once its peers answer.
  for (const n of nodes) n.launch();
  try {
    for (const n of nodes) await n.waitReady();
  } catch (e) {
    await Promise.all(nodes.map((n) => n.kill()));
    throw e;
  }
  return new Cluster(nodes, dir);
}

/** Runs `palisade ARGS…` to its end, returning its stdout. */
function runPalisade(args) {
  return execFileSync(palisadeBin(), args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** `palisade certs token NAME`: the token and its sha256. */
function newToken(name) {
  const out = runPalisade(['certs', 'token', name]);
  const token = /token: ([0-9a-f]+)/.exec(out);
  const sha = /token_sha256 = \["([0-9a-f]{64})"\]/.exec(out);
  assert.ok(token && sha, out);
  return { token: token[1], sha256: sha[1] };
}

/** Closes the sessions of `lease` on the server behind the client's back, with its own credentials. */
async function closeSessionBehindItsBack(addr, lease) {
  const c = new palisade.Client([addr], { retryFor: 10 });
  try {
    await c._conn.simple('POST', '/v1/sessions/close', lease._session.ids());
  } finally {
    await c.close();
  }
}

module.exports = {
  REPO_ROOT,
  CLIENT_DIR,
  palisadeBin,
  freePort,
  eventually,
  tempDir,
  Proc,
  Node,
  Cluster,
  startCluster,
  runPalisade,
  newToken,
  closeSessionBehindItsBack,
  sleep,
};
