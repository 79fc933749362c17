'use strict';
// The errors of the Palisade client.
//
// Every refusal of the server carries a wire code (docs/http.md, "Errors");
// each code has one subclass of PalisadeError here, so callers can catch (or
// `instanceof`-test) the case they handle. SessionExpired, GrantTooLate,
// LeaseLost and ProtocolError are decided by the client itself.

/** Base of every error of this package. */
class PalisadeError extends Error {
  /**
   * @param {string} [message]
   * @param {{code?: string, status?: number, leader?: string|null, cause?: unknown}} [opts]
   */
  constructor(message = '', opts = {}) {
    const code = opts.code || new.target.code || 'error';
    super(message || code, opts.cause !== undefined ? { cause: opts.cause } : undefined);
    this.name = new.target.name;
    /** The wire code (or the client's own code of the same style). */
    this.code = code;
    /** The HTTP status of the refusal; undefined for errors the client decides. */
    this.status = opts.status;
    /** The leader's client address when the server named one (not_leader). */
    this.leader = opts.leader == null ? null : opts.leader;
  }
}
PalisadeError.code = 'error';

function define(name, code, extra) {
  const cls = {
    [name]: class extends (extra || PalisadeError) {},
  }[name];
  cls.code = code;
  return cls;
}

const NotLeader = define('NotLeader', 'not_leader');
const InvalidInput = define('InvalidInput', 'invalid_input');
const UnknownSession = define('UnknownSession', 'unknown_session');
const NotHolder = define('NotHolder', 'not_holder');
const WouldBlock = define('WouldBlock', 'would_block');
const WaitTimeout = define('WaitTimeout', 'wait_timeout');
const LimitReached = define('LimitReached', 'limit_reached');
const Unavailable = define('Unavailable', 'unavailable');
const Unauthenticated = define('Unauthenticated', 'unauthenticated');
const PermissionDenied = define('PermissionDenied', 'permission_denied');
const Cancelled = define('Cancelled', 'cancelled');
const WrongShape = define('WrongShape', 'wrong_shape');
const SessionExpired = define('SessionExpired', 'session_expired');
const GrantTooLate = define('GrantTooLate', 'grant_too_late');
const LeaseLost = define('LeaseLost', 'lease_lost');
const ProtocolError = define('ProtocolError', 'protocol');

/** The token is not the lock's current grant. Nothing changed. */
class StaleToken extends PalisadeError {
  constructor(message = '', opts = {}) {
    super(message, opts);
    /** The current holder's token (null when not held). */
    this.currentToken = opts.currentToken == null ? null : opts.currentToken;
    /** The token the request carried. */
    this.presentedToken = opts.presentedToken == null ? null : opts.presentedToken;
  }
}
StaleToken.code = 'stale_token';

const BY_CODE = new Map(
  [
    NotLeader, InvalidInput, UnknownSession, NotHolder, StaleToken, WouldBlock, WaitTimeout,
    LimitReached, Unavailable, Unauthenticated, PermissionDenied, Cancelled, WrongShape,
  ].map((cls) => [cls.code, cls]),
);

function tokenField(value) {
  if (typeof value === 'string' && /^(0|[1-9][0-9]*)$/.test(value)) return BigInt(value);
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  return null;
}

/**
 * The error for the `error` object of a refusal; an unknown code becomes a
 * plain PalisadeError carrying it.
 */
function fromWire(error, status, leaderHeader) {
  const code = String(error.code || 'error');
  const message = String(error.message || '');
  const leader = error.leader ? String(error.leader) : leaderHeader || null;
  const opts = { code, status, leader };
  if (code === 'stale_token') {
    opts.currentToken = tokenField(error.current_token);
    opts.presentedToken = tokenField(error.presented_token);
  }
  // The server's one answer for "no such session" and "wrong key" (so that
  // session ids reveal nothing): this client's key is right, so its session
  // is gone.
  if (code === 'unauthenticated' && error.session_id != null) {
    return new UnknownSession(message, opts);
  }
  const cls = BY_CODE.get(code) || PalisadeError;
  return new cls(message, opts);
}

module.exports = {
  PalisadeError,
  NotLeader,
  InvalidInput,
  UnknownSession,
  NotHolder,
  StaleToken,
  WouldBlock,
  WaitTimeout,
  LimitReached,
  Unavailable,
  Unauthenticated,
  PermissionDenied,
  Cancelled,
  WrongShape,
  SessionExpired,
  GrantTooLate,
  LeaseLost,
  ProtocolError,
  fromWire,
};
