'use strict';
// Talking to the nodes: persistent HTTP/1.1 connections (a keep-alive Agent),
// TLS, finding and following the leader, retrying with backoff — as the
// Python and Rust clients do.

const fs = require('node:fs');
const http = require('node:http');
const https = require('node:https');
const { debuglog } = require('node:util');
const { performance } = require('node:perf_hooks');

const { InvalidInput, ProtocolError, Unavailable, PalisadeError, fromWire } = require('./errors');

const debug = debuglog('palisade');
const now = () => performance.now();

/**
 * `HOST:PORT` (`[v6]:PORT` too) as `{host, port}`. A URL is refused rather
 * than guessed at: whether the node speaks TLS is decided by the `tls` option.
 */
function splitEndpoint(endpoint) {
  const bad = () => new InvalidInput(`endpoint ${JSON.stringify(endpoint)}: expected HOST:PORT`);
  if (typeof endpoint !== 'string' || endpoint.includes('://')) throw bad();
  const at = endpoint.lastIndexOf(':');
  if (at < 0) throw bad();
  let host = endpoint.slice(0, at);
  const port = endpoint.slice(at + 1);
  if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1);
  if (!host || !/^[0-9]+$/.test(port) || !(Number(port) > 0 && Number(port) < 65536)) throw bad();
  return { host, port: Number(port) };
}

/** PEM contents (string with "-----BEGIN" or a Buffer) or the path of a PEM file. */
function pem(value, what) {
  if (value === undefined || value === null) return undefined;
  if (Buffer.isBuffer(value)) return value;
  if (typeof value !== 'string') throw new InvalidInput(`tls.${what}: expected PEM text, a Buffer or a file path`);
  if (value.includes('-----BEGIN')) return value;
  try {
    return fs.readFileSync(value);
  } catch (e) {
    throw new InvalidInput(`TLS files: tls.${what}: ${e.message}`);
  }
}

const TLS_VERIFY = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'CERT_SIGNATURE_FAILURE',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** A transport failure in a person's words (`tls`: whether we spoke TLS). */
function describe(e, tls) {
  const code = (e && e.code) || '';
  if (code.startsWith('HPE_')) {
    return `not an HTTP/1.1 answer (${e.message})${tls ? '' : ': is the node serving TLS? (give the tls option)'}`;
  }
  if (code === 'EPROTO' || code.startsWith('ERR_SSL_')) {
    const m = /SSL routines:[^:]*:([^:]+):/.exec(e.message || '');
    const why = m ? m[1] : e.message || code;
    return `TLS handshake failed (${why})${/wrong version number/.test(why) ? ': is the node serving plaintext?' : ''}`;
  }
  switch (code) {
    case 'PALISADE_TIMEOUT':
      return 'timed out';
    case 'ECONNREFUSED':
      return 'connection refused';
    case 'ECONNRESET':
      return 'connection reset';
    default:
      if (e && TLS_VERIFY.has(e.code)) return `TLS: certificate verify failed: ${e.message}`;
      return (e && (e.message || e.code)) || String(e);
  }
}

// Failures that on a *reused* connection most likely mean the node closed it
// while it sat idle: worth one more try on a fresh connection to the same node
// before calling the node down.
const STALE = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);

function transportError(message, code) {
  const e = new Error(message);
  e.code = code;
  return e;
}

/** Waits `ms`, or less if `signal` aborts meanwhile. */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal && signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      if (signal) signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    if (signal) signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * The JSON object of an answer. A body that is not one is a transport-level
 * failure for 5xx (a proxy in between, a node going down) and a protocol error
 * otherwise.
 */
function parse(status, data) {
  let answer;
  try {
    answer = JSON.parse(data.toString('utf8'));
  } catch (_) {
    answer = undefined;
  }
  if (answer !== null && typeof answer === 'object' && !Array.isArray(answer)) return answer;
  if (status >= 500) throw transportError(`HTTP ${status} without JSON`, 'PALISADE_NOT_JSON');
  throw new ProtocolError(`HTTP ${status}: not a JSON object: ${JSON.stringify(data.toString('utf8').slice(0, 200))}`);
}

/**
 * Connections to the nodes, and which one is the leader as far as we know.
 * A connection serves one call at a time (the Agent's pool per node), so
 * concurrent calls — a long-polling acquire and the keep-alives — never share one.
 */
class Connector {
  constructor(endpoints, { tls, token, rpcTimeout, retryFor }) {
    if (!endpoints.length) throw new InvalidInput('no endpoints given');
    for (const e of endpoints) splitEndpoint(e);
    this.rpcTimeout = rpcTimeout;
    this.retryFor = retryFor;
    this.tls = Boolean(tls);
    this._headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    if (token !== undefined && token !== null) this._headers.Authorization = `Bearer ${token.trim()}`;
    if (tls) {
      this._agent = new https.Agent({
        keepAlive: true,
        ca: pem(tls.ca, 'ca'), // the only CA trusted
        cert: pem(tls.cert, 'cert'),
        key: pem(tls.key, 'key'),
        minVersion: 'TLSv1.2',
        // The server offers h2 and http/1.1; node:https speaks HTTP/1.1.
        ALPNProtocols: ['http/1.1'],
      });
      this._module = https;
    } else {
      this._agent = new http.Agent({ keepAlive: true });
      this._module = http;
    }
    this.endpoints = [...endpoints];
    this._leader = null;
    this._next = -1; // the first rotation starts at endpoints[0]
    this._closed = false;
  }

  // -- which node ---------------------------------------------------------

  _target() {
    if (this._leader !== null) return this._leader;
    this._next = (this._next + 1) % this.endpoints.length;
    return this.endpoints[this._next];
  }

  /** After not_leader from `failed`: go to the node it named, or rotate through
   * the endpoints during an election. */
  _follow(named, failed) {
    if (named && named !== failed) {
      try {
        splitEndpoint(named);
      } catch (_) {
        named = null;
      }
    }
    if (named && named !== failed) {
      if (!this.endpoints.includes(named)) this.endpoints.push(named);
      this._leader = named;
    } else {
      this._leader = null;
    }
  }

  _forgetLeader(addr) {
    if (this._leader === addr) this._leader = null;
  }

  // -- one request ----------------------------------------------------------

  /** One request on one node: `{status, leader, data}`; rejects on transport failures. */
  async _roundtrip(addr, method, path, payload, timeoutMs, signal) {
    for (;;) {
      try {
        return await this._once(addr, method, path, payload, timeoutMs, signal);
      } catch (e) {
        if (e.reused && STALE.has(e.code) && !(signal && signal.aborted)) continue; // see STALE
        throw e;
      }
    }
  }

  _once(addr, method, path, payload, timeoutMs, signal) {
    return new Promise((resolve, reject) => {
      if (this._closed) return reject(transportError('the client is closed', 'PALISADE_CLOSED'));
      if (signal && signal.aborted) return reject(transportError('call aborted', 'PALISADE_ABORTED'));
      const { host, port } = splitEndpoint(addr);
      const headers = { ...this._headers };
      if (payload !== null) headers['Content-Length'] = payload.length;
      let settled = false;
      let req = null;
      const finish = (err, value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (signal) signal.removeEventListener('abort', onAbort);
        if (err) {
          err.reused = Boolean(req && req.reusedSocket);
          // Timed out or broken: the connection's state is unknown, so it is
          // never reused. Destroying it also takes a long-polling acquire out
          // of the lock's queue on the server.
          if (req) req.destroy();
          reject(err);
        } else {
          resolve(value);
        }
      };
      const onAbort = () => finish(transportError('call aborted', 'PALISADE_ABORTED'));
      const timer = setTimeout(() => finish(transportError('timed out', 'PALISADE_TIMEOUT')), Math.max(1, Math.ceil(timeoutMs)));
      if (signal) signal.addEventListener('abort', onAbort, { once: true });
      req = this._module.request({ host, port, method, path, headers, agent: this._agent }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const leader = res.headers['palisade-leader'];
          finish(null, { status: res.statusCode, leader: typeof leader === 'string' ? leader : null, data: Buffer.concat(chunks) });
        });
        res.on('error', (e) => finish(e));
        res.on('aborted', () => finish(transportError('connection reset', 'ECONNRESET')));
      });
      req.on('error', (e) => finish(e));
      req.end(payload === null ? undefined : payload);
    });
  }

  /** Closes every connection; calls still in flight fail. */
  close() {
    this._closed = true;
    this._agent.destroy();
  }

  // -- calls ----------------------------------------------------------------

  /**
   * Calls the leader, following not_leader and retrying transport failures and
   * `unavailable` with backoff, for at most `budget` seconds; then Unavailable
   * saying what each node did. Every other refusal is thrown at once as its
   * PalisadeError. `attempt()` gives each attempt's `[body, timeoutSeconds]`
   * (so that a retried acquire asks only for the wait that is left) and may
   * throw to stop the retries (after `signal` aborted, say).
   */
  async call(method, path, attempt, budget, signal) {
    const started = now();
    const giveUp = started + budget * 1000;
    let backoff = 20;
    const tried = new Map(); // each node's last failure, for the final error
    for (;;) {
      const [body, timeout] = attempt();
      const addr = this._target();
      // Every attempt ends within the budget, answered or not.
      const timeoutMs = Math.max(Math.min(timeout * 1000, giveUp - now()), 1);
      const payload = body === null ? null : Buffer.from(JSON.stringify(body));
      let why;
      try {
        const { status, leader, data } = await this._roundtrip(addr, method, path, payload, timeoutMs, signal);
        const answer = parse(status, data);
        if (status === 200 && !('error' in answer)) {
          this._leader = addr;
          return answer;
        }
        const err = answer.error;
        if (err === null || typeof err !== 'object') {
          throw new ProtocolError(`HTTP ${status} from ${addr} without an error object`);
        }
        if (err.code === 'not_leader') {
          this._follow(err.leader || leader, addr);
          why = this._leader ? 'not the leader' : 'no leader elected yet';
        } else if (err.code === 'unavailable') {
          this._forgetLeader(addr);
          why = String(err.message || 'unavailable');
        } else {
          throw fromWire(err, status, leader);
        }
      } catch (e) {
        if (e instanceof PalisadeError) throw e;
        if (this._closed) throw new Unavailable('the client is closed');
        if (!(signal && signal.aborted)) this._forgetLeader(addr); // else not the node's fault
        why = describe(e, this.tls);
      }
      tried.set(addr, why);
      debug('%s %s on %s: %s; retrying', method, path.split('?')[0], addr, why);
      if (now() + backoff >= giveUp) {
        const each = [...tried].map(([a, w]) => `${a}: ${w}`).join('; ');
        throw new Unavailable(`${each} (tried for ${((now() - started) / 1000).toFixed(1)} s)`);
      }
      if (signal && signal.aborted) {
        attempt(); // says why the call stops (it throws)
        throw new Unavailable(`${method} ${path.split('?')[0]}: call aborted`);
      }
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 500);
    }
  }

  /** A call whose every attempt is the same, with `rpcTimeout` each. */
  simple(method, path, body = null, budget = undefined) {
    return this.call(method, path, () => [body, this.rpcTimeout], budget === undefined ? this.retryFor : budget);
  }
}

module.exports = { Connector, splitEndpoint, describe, now, debug, sleep };
