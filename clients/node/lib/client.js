'use strict';
// The client: sessions kept alive in the background, and leases on them.
//
// How sessions map to locks (as in the Python client): a lease lives on a
// server session. The client opens sessions on demand, one pool per distinct
// TTL, and reuses them: an acquire takes the first live session of its TTL
// that has nothing to do with that lock name (no lease on it, no acquire,
// cancel or release of it in flight), and opens a new one only if there is
// none. So a program holding many locks with one TTL has one session and one
// keep-alive timer, while two concurrent acquires of the *same* lock in one
// program use two sessions and exclude each other through the server's FIFO
// queue, exactly like two processes (on one session, an acquire of a name it
// already holds returns the same grant — the server's rule that makes retries
// safe — which would let both in).
//
// Each session has a keep-alive timer and a watchdog timer. When a session is
// lost (its guarantee ran out, the server says unknown_session, or the client
// is closed) every lease on it is lost — its `signal` aborts with LeaseLost —
// the session is never used again, and a session whose guarantee merely ran
// out is closed in the background so that its locks go free at once rather
// than after the TTL. The timers keep the process alive only while the
// session has a lease or an acquire in flight.
//
// Recipes (docs/recipes.md): an acquire claims a plain lock by default, or,
// with `claim`, a semaphore permit, a reader's or the writer's share of a
// read/write lock, or an election's leadership. They use the sessions exactly
// as plain locks do: two concurrent acquires of permits of one semaphore in
// one program hold them on two sessions, like two processes.

const os = require('node:os');

const { Connector, now, debug, sleep } = require('./connector');
const {
  GrantTooLate,
  InvalidInput,
  LeaseLost,
  NotHolder,
  ProtocolError,
  SessionExpired,
  StaleToken,
  Unavailable,
  UnknownSession,
  WaitTimeout,
  WouldBlock,
  WrongShape,
} = require('./errors');
const { LockInfo, Leader, Status, big } = require('./models');

/** The header fenced HTTP resources (`palisade fence-store`) read the token from. */
const FENCING_TOKEN_HEADER = 'Fencing-Token';

/** Pause between keep-alive attempts after a failure, in ms (capped at the interval). */
const RETRY_PAUSE_MS = 100;

const ms = (seconds) => Math.round(seconds * 1000);

/**
 * A duration argument in seconds, refused locally only when it cannot be sent
 * at all (not a number, negative, NaN, infinite); the server judges the rest
 * (e.g. a TTL of 0).
 */
function duration(value, what) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new InvalidInput(`${what} must be a finite number of seconds >= 0, not ${String(value)}`);
  }
  return value;
}

function checkOptions(opts, allowed, what) {
  if (opts === undefined || opts === null) return {};
  if (typeof opts !== 'object') throw new InvalidInput(`${what}: options must be an object`);
  for (const k of Object.keys(opts)) {
    // A misspelt option must not silently mean its default (`wiat: 30`).
    if (!allowed.includes(k)) throw new InvalidInput(`${what}: unknown option ${JSON.stringify(k)}`);
  }
  return opts;
}

/** A token argument: a bigint, a safe non-negative integer, or a decimal string. */
function tokenArg(token) {
  if (typeof token === 'bigint' && token >= 0n) return token;
  if (typeof token === 'number' && Number.isSafeInteger(token) && token >= 0) return BigInt(token);
  if (typeof token === 'string' && /^(0|[1-9][0-9]*)$/.test(token)) return BigInt(token);
  throw new InvalidInput(`a token is a non-negative integer (bigint, number or decimal string), not ${String(token)}`);
}

function quote(name) {
  return JSON.stringify(name);
}

const CLAIMS = ['lock', 'permit', 'read', 'write', 'lead'];

/**
 * The claim of acquire options and the acquire body's fields for it (none for
 * a plain lock, whose request stays what it always was). Only what cannot be
 * sent as meant is refused here; the server judges the rest (the range of
 * `permits`, the length of `value`).
 */
function claimOf(o) {
  const claim = o.claim === undefined ? 'lock' : o.claim;
  if (!CLAIMS.includes(claim)) {
    throw new InvalidInput(`claim: one of ${CLAIMS.map(quote).join(', ')}, not ${typeof claim === 'string' ? quote(claim) : String(claim)}`);
  }
  if (o.permits !== undefined && claim !== 'permit') throw new InvalidInput('permits: only for claim "permit"');
  if (o.value !== undefined && claim !== 'lead') throw new InvalidInput('value: only for claim "lead"');
  switch (claim) {
    case 'permit':
      if (!Number.isSafeInteger(o.permits)) throw new InvalidInput(`claim "permit" needs permits, an integer, not ${String(o.permits)}`);
      return [claim, { claim, permits: o.permits }];
    case 'lead':
      if (typeof o.value !== 'string') throw new InvalidInput(`claim "lead" needs value, a string, not ${String(o.value)}`);
      return [claim, { claim, value: o.value }];
    case 'read':
    case 'write':
      return [claim, { claim }];
    default:
      return [claim, {}];
  }
}

/** Whether two looks at an election show the same leader (both none, too). */
function sameLeader(a, b) {
  return a === null ? b === null : a.equals(b);
}

/** Runs `fn` in the background; its failure is only logged (NODE_DEBUG=palisade). */
function background(what, fn) {
  Promise.resolve()
    .then(fn)
    .catch((e) => debug('%s: %s', what, e && e.message));
}

/** One server session, its guarantee, and the timers that keep it. */
class Session {
  constructor(client, id, key, requestedTtl, ttl, margin, guaranteedUntil) {
    this._client = client;
    this._conn = client._conn;
    this.id = id;
    this.key = key;
    this.requestedTtl = requestedTtl;
    this.ttl = ttl; // seconds, as granted
    this.margin = margin; // seconds
    /** Lock names this session is busy with. */
    this.busy = new Set();
    // On performance.now(): the send time of the last acknowledged keep-alive
    // (or of the create) + TTL - margin. Only moves forward, except to "now"
    // when the session is known to be gone.
    this._until = guaranteedUntil;
    this._dead = false;
    this._leases = new Set();
    this._aborts = new Set(); // AbortControllers of acquires in flight
    this._kaTimer = null;
    this._wdTimer = null;
  }

  start() {
    this._scheduleKeepAlive((this.ttl * 1000) / 3);
    this._armWatchdog();
  }

  /** What every call on the session presents. */
  ids() {
    return { session_id: this.id, session_key: this.key };
  }

  get dead() {
    return this._dead;
  }

  guaranteedUntil() {
    return this._until;
  }

  /** Seconds still guaranteed. */
  remaining() {
    return this._dead ? 0 : Math.max(0, this._until - now()) / 1000;
  }

  alive() {
    return !this._dead && this._until > now();
  }

  /** Takes `lease` on, unless the guarantee has run out already (then the
   * grant came too late to be relied on). */
  adopt(lease) {
    if (!this.alive()) return false;
    this._leases.add(lease);
    this._refTimers();
    return true;
  }

  forget(lease) {
    this._leases.delete(lease);
    this._refTimers();
  }

  /** Aborts `controller` when the session is lost (now, if it is). */
  watch(controller) {
    if (this._dead) {
      controller.abort();
      return;
    }
    this._aborts.add(controller);
    this._refTimers();
  }

  unwatch(controller) {
    this._aborts.delete(controller);
    this._refTimers();
  }

  /** The timers hold the process open only while something relies on the session. */
  _refTimers() {
    const needed = this._leases.size > 0 || this._aborts.size > 0;
    for (const t of [this._kaTimer, this._wdTimer]) {
      if (t) {
        if (needed) t.ref();
        else t.unref();
      }
    }
  }

  _advance(until) {
    if (!this._dead && until > this._until) this._until = until;
  }

  /**
   * The session can no longer be relied on: every lease on it is lost.
   * `reason`: `expired` (the guarantee ran out), `unknown_session` (the server
   * said so), `abandoned` (a release or cancel could not be confirmed),
   * `closed` (by Client.close, which closes it).
   */
  lose(reason) {
    if (this._dead) return;
    this._dead = true;
    this._until = Math.min(this._until, now());
    clearTimeout(this._kaTimer);
    clearTimeout(this._wdTimer);
    this._kaTimer = this._wdTimer = null;
    const leases = [...this._leases];
    const aborts = [...this._aborts];
    this._leases.clear();
    this._aborts.clear();
    // A long poll on a lost session ends now (SessionExpired), and the server
    // takes the wait out of the queue as the caller went away.
    for (const a of aborts) a.abort();
    this._client._retire(this);
    debug('session %s lost (%s)', this.id, reason);
    for (const lease of leases) lease._markLost(reason);
    if (reason === 'expired' || reason === 'abandoned') {
      // Its holders have been told; closing frees the locks for others now
      // instead of after the TTL (if the server still has it).
      background(`closing session ${this.id}`, () => this.closeOnServer(this._conn.retryFor));
    }
  }

  /** Best effort: closing releases every lock of the session at once. */
  async closeOnServer(budget) {
    try {
      await this._conn.simple('POST', '/v1/sessions/close', this.ids(), budget);
    } catch (e) {
      debug('closing session %s: %s', this.id, e.message);
    }
  }

  /** Loses the session the moment the guarantee passes — a timer, so that a
   * keep-alive stuck on a silent node does not delay it. */
  _armWatchdog() {
    this._wdTimer = null;
    if (this._dead) return;
    const left = this._until - now();
    if (left <= 0) {
      this.lose('expired');
      return;
    }
    // Fires again (and re-arms) if the guarantee moved on meanwhile.
    this._wdTimer = setTimeout(() => this._armWatchdog(), Math.ceil(left));
    this._refTimers();
  }

  _scheduleKeepAlive(pause) {
    if (this._dead) return;
    this._kaTimer = setTimeout(() => {
      this._kaTimer = null;
      this._keepAlive().catch((e) => debug('keep-alive of session %s: %s', this.id, e.message));
    }, pause);
    this._refTimers();
  }

  /** A keep-alive every third of the TTL, every 0.1 s after a failure. */
  async _keepAlive() {
    if (this._dead) return;
    const every = (this.ttl * 1000) / 3;
    const attemptBudget = Math.min(this._conn.rpcTimeout, every / 1000);
    const sent = now(); // the guarantee runs from the send time
    let ttl;
    try {
      const reply = await this._conn.simple('POST', '/v1/sessions/keepalive', this.ids(), attemptBudget);
      if (typeof reply.ttl_ms !== 'number') throw new ProtocolError(`unexpected answer to keep-alive: ${JSON.stringify(reply)}`);
      ttl = Math.min(reply.ttl_ms / 1000, this.ttl);
    } catch (e) {
      if (e instanceof UnknownSession) {
        this.lose('unknown_session');
        return;
      }
      debug('keep-alive of session %s failed: %s; retrying', this.id, e.message);
      this._scheduleKeepAlive(Math.min(RETRY_PAUSE_MS, every));
      return;
    }
    this._advance(sent + (ttl - this.margin) * 1000);
    this._scheduleKeepAlive(every);
  }
}

/**
 * A granted lock: its fencing token, and how long it is still guaranteed.
 * Pass `token` to every write on the protected resource, which must refuse
 * tokens lower than the highest it has seen: that, not `signal`, is what makes
 * a holder that paused past its lease harmless.
 */
class Lease {
  constructor(client, session, name, token, onLost, claim = 'lock', slot = 0) {
    this._client = client;
    this._session = session;
    this._name = name;
    this._token = token;
    this._onLost = onLost;
    this._claim = claim;
    this._slot = slot;
    this._released = false;
    this._lost = false;
    this._controller = new AbortController();
  }

  /** The lock name. */
  get name() {
    return this._name;
  }

  /** The fencing token: the Raft log index of the entry that granted it. */
  get token() {
    return this._token;
  }

  /** The id of the session that holds the lock (shown as `holder`). */
  get sessionId() {
    return BigInt(this._session.id);
  }

  /** What was claimed: 'lock', 'permit', 'read', 'write' or 'lead'. */
  get claim() {
    return this._claim;
  }

  /** A semaphore permit's slot, 0..permits (0 for every other claim): fence by (name, slot). */
  get slot() {
    return this._slot;
  }

  /** Aborts (with a LeaseLost as its reason) the moment the lease can no longer
   * be guaranteed. Never aborted by a release. */
  get signal() {
    return this._controller.signal;
  }

  /** Whether the lease was lost. */
  get lost() {
    return this._lost;
  }

  /** The token as an HTTP header `[name, value]` for a fenced store. */
  fencingHeader() {
    return [FENCING_TOKEN_HEADER, String(this._token)];
  }

  /** Seconds the lock is still guaranteed (0 once lost or released). */
  remaining() {
    if (this._released || this._lost) return 0;
    return this._session.remaining();
  }

  /** Until when (a `performance.now()` value, in ms) the lock is guaranteed. */
  guaranteedUntil() {
    return this._session.guaranteedUntil();
  }

  _markLost(reason) {
    if (this._released || this._lost) return;
    this._lost = true;
    const why = {
      expired: 'its guarantee ran out (keep-alives did not get through)',
      unknown_session: 'the server no longer knows its session',
      abandoned: 'a release or cancel on its session could not be confirmed',
      closed: 'the client was closed',
    }[reason] || reason;
    this._controller.abort(
      new LeaseLost(`the lease on ${quote(this._name)} (token ${this._token}) was lost: ${why}`),
    );
    if (this._onLost) {
      try {
        const r = this._onLost(this);
        if (r && typeof r.then === 'function') r.then(undefined, (e) => debug('onLost of %s rejected: %s', this._name, e));
      } catch (e) {
        // A callback's bug must not kill the keep-alive.
        debug('onLost of %s threw: %s', this._name, e);
      }
    }
  }

  /**
   * Releases the lock; the next waiter is granted it at once. Calling it again
   * does nothing. Rejects with LeaseLost if the lease was lost before (the lock
   * was freed with its session); NotHolder or StaleToken if it was no longer
   * this lease's; Unavailable if no leader answered — the release is then
   * retried in the background, and if that fails too the session is given up
   * so that the lock goes free within its TTL.
   */
  async release() {
    if (this._released) return;
    this._released = true;
    const session = this._session;
    const client = this._client;
    session.forget(this);
    if (this._lost || session.dead) {
      // The session is gone or being closed: that frees the lock.
      client._free(session, this._name);
      throw new LeaseLost(`the lease on ${quote(this._name)} (token ${this._token}) was lost before its release`);
    }
    try {
      await client._release(session, this._name, this._token);
    } catch (e) {
      if (e instanceof Unavailable) {
        client._releaseInBackground(session, this._name, this._token);
        throw new Unavailable(`${e.message}; the release is retried in the background`, { cause: e });
      }
      client._free(session, this._name);
      if (e instanceof UnknownSession || ((e instanceof NotHolder || e instanceof StaleToken) && this._lost)) {
        throw new LeaseLost(`the lease on ${quote(this._name)} was lost: ${e.message}`, { cause: e });
      }
      throw e;
    }
    client._free(session, this._name);
  }

  /**
   * As the leader of an election (a grant of claim 'lead'), changes the value
   * observers see (POST /v1/locks/proclaim with this lease's token).
   * Proclaiming the same value again is harmless, so it is retried across
   * leader changes like a release. Rejects with NotHolder if this lease was
   * released (refused without asking) or its session holds the name no more,
   * StaleToken if its session holds it under a newer grant, LeaseLost if the
   * lease was lost, WrongShape if the name is no election, InvalidInput for
   * a value over 1024 bytes, Unavailable (the value may or may not have changed).
   */
  async proclaim(value) {
    if (typeof value !== 'string') throw new InvalidInput(`an election value is a string, not ${typeof value}`);
    if (this._released) throw new NotHolder(`the lease on ${quote(this._name)} (token ${this._token}) was released`);
    if (this._lost || this._session.dead) {
      throw new LeaseLost(`the lease on ${quote(this._name)} (token ${this._token}) was lost before the proclaim`);
    }
    try {
      await this._client._proclaim(this._session, this._name, this._token, value);
    } catch (e) {
      if (e instanceof UnknownSession || ((e instanceof NotHolder || e instanceof StaleToken) && this._lost)) {
        throw new LeaseLost(`the lease on ${quote(this._name)} was lost: ${e.message}`, { cause: e });
      }
      throw e;
    }
  }

  toString() {
    const claim = this._claim === 'lock' ? '' : `claim=${this._claim}, slot=${this._slot}, `;
    return `Lease(name=${quote(this._name)}, token=${this._token}, session=${this._session.id}, ${claim}lost=${this._lost})`;
  }
}

const CLIENT_OPTIONS = ['ttl', 'wait', 'lockDelay', 'tls', 'token', 'label', 'rpcTimeout', 'retryFor', 'safetyMargin'];
const CAMPAIGN_OPTIONS = ['ttl', 'wait', 'lockDelay', 'onLost', 'signal'];
const ACQUIRE_OPTIONS = [...CAMPAIGN_OPTIONS, 'claim', 'permits', 'value'];

/** A client of a Palisade cluster (see index.d.ts for the options). */
class Client {
  constructor(endpoints, options = {}) {
    const o = checkOptions(options, CLIENT_OPTIONS, 'Client');
    if (typeof endpoints === 'string') {
      endpoints = endpoints.split(',').map((e) => e.trim()).filter(Boolean);
    }
    if (!Array.isArray(endpoints)) throw new InvalidInput('endpoints: expected an array of HOST:PORT or one comma-separated string');
    const tls = o.tls === undefined || o.tls === null ? null : o.tls;
    if (tls !== null) {
      if (typeof tls !== 'object') throw new InvalidInput('tls: expected {ca, cert?, key?}');
      checkOptions(tls, ['ca', 'cert', 'key'], 'tls');
      if (tls.ca === undefined || tls.ca === null) throw new InvalidInput('tls.ca is required: the cluster\'s CA is the only one trusted');
      if ((tls.cert == null) !== (tls.key == null)) throw new InvalidInput('tls.cert and tls.key go together');
    }
    if (tls === null && o.token != null) {
      throw new InvalidInput('a bearer token needs tls (credentials never travel in plaintext)');
    }
    if (o.token != null) {
      if (typeof o.token !== 'string' || !o.token.trim() || !/^[\x21-\x7e]+$/.test(o.token.trim())) {
        throw new InvalidInput('the bearer token is empty or not printable');
      }
    }
    this._ttl = duration(o.ttl === undefined ? 10 : o.ttl, 'ttl');
    this._wait = duration(o.wait === undefined ? 0 : o.wait, 'wait');
    this._lockDelay = duration(o.lockDelay === undefined ? 0 : o.lockDelay, 'lockDelay');
    this._margin = o.safetyMargin === undefined ? null : duration(o.safetyMargin, 'safetyMargin');
    this._label = o.label !== undefined ? String(o.label) : `${os.hostname()}/pid ${process.pid}`;
    this._conn = new Connector(endpoints, {
      tls,
      token: o.token,
      rpcTimeout: duration(o.rpcTimeout === undefined ? 2 : o.rpcTimeout, 'rpcTimeout'),
      retryFor: duration(o.retryFor === undefined ? 10 : o.retryFor, 'retryFor'),
    });
    this._sessions = [];
    this._opening = new Map(); // requested TTL -> Promise of the session being opened
    this._closed = false;
    this._closing = null;
  }

  // -- sessions -------------------------------------------------------------

  _checkOpen() {
    if (this._closed) throw new InvalidInput('the client is closed');
  }

  /** A live session of `ttl` not busy with `name`, marked busy with it. */
  async _sessionFor(ttl, name) {
    for (;;) {
      this._checkOpen();
      for (const s of this._sessions) {
        if (s.requestedTtl === ttl && !s.busy.has(name) && s.alive()) {
          s.busy.add(name);
          return s;
        }
      }
      const pending = this._opening.get(ttl);
      if (pending) {
        // Concurrent acquires of other names share the session being opened.
        await pending.catch(() => {});
        continue;
      }
      const opening = this._openSession(ttl);
      this._opening.set(ttl, opening);
      let session;
      try {
        session = await opening;
      } finally {
        this._opening.delete(ttl);
      }
      if (this._closed) {
        session.lose('closed');
        await session.closeOnServer(this._conn.rpcTimeout);
        this._checkOpen();
      }
      this._sessions.push(session);
      session.busy.add(name);
      return session;
    }
  }

  async _openSession(ttl) {
    const sent = now(); // the first guarantee runs from here
    const reply = await this._conn.simple('POST', '/v1/sessions', { ttl_ms: ms(ttl), label: this._label });
    let id;
    try {
      id = String(big(reply.session_id, 'session_id'));
    } catch (_) {
      id = null;
    }
    if (id === null || typeof reply.session_key !== 'string' || typeof reply.ttl_ms !== 'number') {
      throw new ProtocolError(`unexpected answer to create session: ${JSON.stringify(reply)}`);
    }
    const granted = reply.ttl_ms / 1000;
    let margin = this._margin !== null ? this._margin : Math.max(granted / 10, 0.05);
    margin = Math.min(margin, granted / 2);
    const session = new Session(this, id, reply.session_key, ttl, granted, margin, sent + (granted - margin) * 1000);
    session.start();
    return session;
  }

  /** A lost session is never picked again. */
  _retire(session) {
    const i = this._sessions.indexOf(session);
    if (i >= 0) this._sessions.splice(i, 1);
  }

  _free(session, name) {
    session.busy.delete(name);
  }

  // -- locks ----------------------------------------------------------------

  /** Acquires lock `name` and resolves to its Lease (see index.d.ts). */
  async acquire(name, options = {}) {
    const o = checkOptions(options, ACQUIRE_OPTIONS, 'acquire');
    this._checkOpen();
    if (typeof name !== 'string') throw new InvalidInput(`a lock name is a string, not ${typeof name}`);
    const [claim, claimFields] = claimOf(o);
    const ttl = o.ttl === undefined ? this._ttl : duration(o.ttl, 'ttl');
    const wait = o.wait === undefined ? this._wait : duration(o.wait, 'wait');
    // A shared claim takes no lock-delay: the client's default is not applied
    // to it (one given here is the server's to refuse).
    const shared = claim === 'permit' || claim === 'read';
    const lockDelay = o.lockDelay === undefined ? (shared ? 0 : this._lockDelay) : duration(o.lockDelay, 'lockDelay');
    if (o.onLost !== undefined && typeof o.onLost !== 'function') throw new InvalidInput('onLost must be a function');
    const userSignal = o.signal;
    if (userSignal) userSignal.throwIfAborted();
    const session = await this._sessionFor(ttl, name);
    let handedOver = false; // whether someone else now frees `name` on `session`
    try {
      if (userSignal) userSignal.throwIfAborted();
      const giveUp = now() + wait * 1000;
      const attempt = () => {
        if (userSignal) userSignal.throwIfAborted();
        if (!session.alive()) throw new SessionExpired(`session ${session.id} expired while acquiring ${quote(name)}`);
        const left = Math.max(0, giveUp - now());
        const body = { ...session.ids(), name, wait_ms: Math.round(left), lock_delay_ms: ms(lockDelay), ...claimFields };
        // A long poll: the answer may take the whole wait.
        return [body, left / 1000 + this._conn.rpcTimeout];
      };
      // A retry after a leader change is safe: the same session acquiring a
      // lock it already holds gets the same grant back.
      const controller = new AbortController();
      const onUserAbort = () => controller.abort();
      if (userSignal) userSignal.addEventListener('abort', onUserAbort, { once: true });
      session.watch(controller);
      let reply;
      try {
        reply = await this._conn.call('POST', '/v1/locks/acquire', attempt, wait + this._conn.retryFor, controller.signal);
      } catch (e) {
        if (e instanceof Unavailable || (userSignal && userSignal.aborted && e === userSignal.reason)) {
          // The outcome is unknown: the server may have granted it meanwhile.
          handedOver = true;
          this._cancelInBackground(session, name);
          throw e;
        }
        if (e instanceof UnknownSession) session.lose('unknown_session');
        // A retry sent after the wait ran out asks with wait_ms 0.
        if (e instanceof WouldBlock && wait > 0) throw new WaitTimeout(`the wait for ${quote(name)} ran out`, { cause: e });
        throw e;
      } finally {
        session.unwatch(controller);
        if (userSignal) userSignal.removeEventListener('abort', onUserAbort);
      }
      let token;
      try {
        token = big(reply.token, 'token');
      } catch (_) {
        throw new ProtocolError(`unexpected answer to acquire: ${JSON.stringify(reply)}`);
      }
      const slot = claim === 'permit' && reply.slot !== undefined ? reply.slot : 0;
      if (!Number.isSafeInteger(slot) || slot < 0) throw new ProtocolError(`unexpected answer to acquire: ${JSON.stringify(reply)}`);
      const lease = new Lease(this, session, name, token, o.onLost, claim, slot);
      if (!session.adopt(lease)) {
        // Granted, but the answer came after the guarantee ran out: the grant
        // may have been expired and handed on already. The lost session is
        // being closed, which releases it.
        throw new GrantTooLate(`the grant of ${quote(name)} (token ${token}) arrived after the session's guarantee ran out`);
      }
      handedOver = true; // the lease frees it on release
      return lease;
    } finally {
      if (!handedOver) this._free(session, name);
    }
  }

  /**
   * Acquires `name`, runs `fn(lease)`, and releases the lock when `fn` ends
   * (also when it throws); resolves to what `fn` resolved to.
   */
  async lock(name, options, fn) {
    if (typeof options === 'function' && fn === undefined) {
      fn = options;
      options = {};
    }
    if (typeof fn !== 'function') throw new InvalidInput('lock(name, options, fn) needs a callback; acquire() returns a lease without one');
    const lease = await this.acquire(name, options);
    if (lease.lost) {
      // Never run a callback that starts without a guarantee.
      await lease.release().catch(() => {});
      throw new LeaseLost(`the lease on ${quote(name)} was lost before the callback started`);
    }
    let result;
    try {
      result = await fn(lease);
    } catch (e) {
      // The callback's own error is what the caller must see.
      await lease.release().catch((re) => debug('release of %s after the callback threw: %s', name, re.message));
      throw e;
    }
    // LeaseLost if the lease was lost while the callback ran.
    await lease.release();
    return result;
  }

  /** The leader of `name` (`session` with `token`) says `value` (the wire call). */
  async _proclaim(session, name, token, value) {
    try {
      await this._conn.simple('POST', '/v1/locks/proclaim', { ...session.ids(), name, token: String(token), value });
    } catch (e) {
      if (e instanceof UnknownSession) session.lose('unknown_session');
      throw e;
    }
  }

  // -- elections ------------------------------------------------------------

  /**
   * Campaigns for leadership of the election `name` with `value`; resolves to
   * the leader's Lease once this candidate leads (acquire with claim 'lead').
   */
  async campaign(name, value, options = {}) {
    const o = checkOptions(options, CAMPAIGN_OPTIONS, 'campaign');
    return this.acquire(name, { ...o, claim: 'lead', value });
  }

  /**
   * The leader of the election `name` now (a linearizable read of the lock),
   * null when nobody leads; WrongShape (decided here) if the name is held as
   * another shape.
   */
  async leader(name) {
    const info = await this.get(name);
    if (info === null) return null;
    if (info.shape !== 'election') throw new WrongShape(`${quote(name)} is a ${info.shape}, not an election`);
    return info.leader();
  }

  /**
   * The leader of `name` (null when nobody leads) at the first look and each
   * time it changes, as an async iterable. It polls: one look every
   * `interval` seconds, so a leadership shorter than that can be missed. Ends
   * when `signal` aborts or the caller stops iterating.
   */
  observe(name, options = {}) {
    const o = checkOptions(options, ['interval', 'signal'], 'observe');
    this._checkOpen();
    if (typeof name !== 'string') throw new InvalidInput(`a lock name is a string, not ${typeof name}`);
    const interval = o.interval === undefined ? 0.25 : duration(o.interval, 'interval');
    const { signal } = o;
    const client = this;
    return (async function* observing() {
      let first = true;
      let last = null;
      while (!(signal && signal.aborted)) {
        const current = await client.leader(name);
        if (signal && signal.aborted) return;
        if (first || !sameLeader(current, last)) yield current;
        first = false;
        last = current;
        await sleep(interval * 1000, signal);
      }
    })();
  }

  /** Releases `name` held with `token` by `session` (the wire call). */
  async _release(session, name, token, budget) {
    let attempts = 0;
    const attempt = () => {
      attempts += 1;
      return [{ ...session.ids(), name, token: String(token) }, this._conn.rpcTimeout];
    };
    try {
      await this._conn.call('POST', '/v1/locks/release', attempt, budget === undefined ? this._conn.retryFor : budget);
    } catch (e) {
      // A retry (the first attempt's answer was lost) that finds the grant
      // gone: the first attempt released it. Nothing else can have: the
      // server answered, so the session is alive, and a live session's grant
      // ends only by its own release.
      if ((e instanceof NotHolder || e instanceof StaleToken) && attempts > 1) return;
      if (e instanceof UnknownSession) session.lose('unknown_session');
      throw e;
    }
  }

  _releaseInBackground(session, name, token) {
    background(`release of ${name}`, async () => {
      try {
        await this._release(session, name, token);
      } catch (e) {
        if (e instanceof Unavailable) session.lose('abandoned');
      } finally {
        this._free(session, name);
      }
    });
  }

  /** After an acquire whose outcome is unknown: asks the server to forget the
   * wait, which also releases a grant made meanwhile. `name` stays busy on the
   * session until then, so no later acquire of it on this session can be
   * given that grant and see it cancelled. */
  _cancelInBackground(session, name) {
    background(`cancel of ${name}`, async () => {
      try {
        await this._conn.simple('POST', '/v1/locks/cancel', { ...session.ids(), name });
      } catch (e) {
        if (e instanceof Unavailable) session.lose('abandoned');
        // else nothing to cancel (not_holder), or the session is gone
      } finally {
        this._free(session, name);
      }
    });
  }

  // -- reads ----------------------------------------------------------------

  /** One lock, read linearizably on the leader; null when nobody holds or waits. */
  async get(name) {
    this._checkOpen();
    if (typeof name !== 'string') throw new InvalidInput(`a lock name is a string, not ${typeof name}`);
    const reply = await this._conn.simple('GET', `/v1/lock?${new URLSearchParams({ name })}`);
    return reply.lock === null || reply.lock === undefined ? null : LockInfo.fromJSON(reply.lock);
  }

  /** Every lock the caller may read, read linearizably on the leader. */
  async locks() {
    this._checkOpen();
    const reply = await this._conn.simple('GET', '/v1/locks');
    if (!Array.isArray(reply.locks)) throw new ProtocolError(`unexpected answer to list locks: ${JSON.stringify(reply)}`);
    return reply.locks.map(LockInfo.fromJSON);
  }

  /** Whether `token` is still the current holder's token for `name`. */
  async checkToken(name, token) {
    this._checkOpen();
    if (typeof name !== 'string') throw new InvalidInput(`a lock name is a string, not ${typeof name}`);
    const t = tokenArg(token);
    const reply = await this._conn.simple('GET', `/v1/check-token?${new URLSearchParams({ name, token: String(t) })}`);
    const current = reply.current_token;
    return {
      current: Boolean(reply.current),
      currentToken: current === null || current === undefined ? null : big(current, 'current_token'),
    };
  }

  /** The cluster as the node this client talks to (the leader once known) sees it. */
  async status() {
    this._checkOpen();
    return Status.fromJSON(await this._conn.simple('GET', '/v1/status'));
  }

  // -- lifetime -------------------------------------------------------------

  /**
   * Closes every session — their leases are lost and their locks released at
   * once — and the connections. Best effort (each session close gets one
   * rpcTimeout; a session not closed expires after its TTL). Idempotent.
   */
  close() {
    if (this._closing) return this._closing;
    this._closed = true;
    this._closing = (async () => {
      const todo = this._sessions.splice(0);
      for (const s of todo) s.lose('closed'); // first end every lease's guarantee…
      await Promise.all(todo.map((s) => s.closeOnServer(this._conn.rpcTimeout))); // …then free its locks
      this._conn.close();
    })();
    return this._closing;
  }

  toString() {
    // No credentials here: only where the client goes.
    return `Client(endpoints=${JSON.stringify(this._conn.endpoints)}, tls=${this._conn.tls})`;
  }
}

module.exports = { Client, Lease, FENCING_TOKEN_HEADER };
