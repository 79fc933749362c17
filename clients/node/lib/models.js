'use strict';
// What the read calls return: locks, token checks, the cluster's status.
// The wire sends numbers that grow without bound (session ids, tokens,
// indices, terms, node ids) as decimal strings; here they are bigint.

const { ProtocolError } = require('./errors');

/** A wire number (a decimal string, or a safe JSON integer) as a bigint. */
function big(value, what) {
  if (typeof value === 'string' && /^(0|[1-9][0-9]*)$/.test(value)) return BigInt(value);
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  throw new ProtocolError(`${what} is not a number: ${JSON.stringify(value)}`);
}

function optBig(value, what) {
  return value === null || value === undefined ? null : big(value, what);
}

function num(value, what) {
  if (value === undefined || value === null) return 0;
  if (typeof value === 'number' && Number.isFinite(value)) return value;
  if (typeof value === 'string' && /^[0-9]+$/.test(value)) return Number(value);
  throw new ProtocolError(`${what} is not a number: ${JSON.stringify(value)}`);
}

/** A small wire number (a slot, a semaphore's size): a JSON integer. */
function small(value, what) {
  if (value === undefined || value === null) return 0;
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return value;
  throw new ProtocolError(`${what} is not a number: ${JSON.stringify(value)}`);
}

/**
 * One holder of a lock: its session (and that session's label), the token of
 * its grant; `shared` for a reader or a semaphore permit (beside others),
 * `slot` a permit's slot (0 otherwise), `value` an election leader's value
 * ('' otherwise).
 */
class Holder {
  constructor({ session, label, token, shared = false, slot = 0, value = '' }) {
    this.session = session;
    this.label = label;
    this.token = token;
    this.shared = shared;
    this.slot = slot;
    this.value = value;
    Object.freeze(this);
  }

  /** Builds it from an entry of the wire's `holders`. */
  static fromJSON(h) {
    if (h === null || typeof h !== 'object') throw new ProtocolError(`not a holder: ${JSON.stringify(h)}`);
    return new Holder({
      session: big(h.session, 'holder session'),
      label: String(h.label || ''),
      token: big(h.token, 'holder token'),
      shared: Boolean(h.shared),
      slot: small(h.slot, 'slot'),
      value: String(h.value || ''),
    });
  }
}

/**
 * The leader of an election: its session (and label), the token of its
 * leadership, and the value it campaigned with or last proclaimed.
 */
class Leader {
  constructor({ name, session, label, token, value }) {
    this.name = name;
    this.session = session;
    this.label = label;
    this.token = token;
    this.value = value;
    Object.freeze(this);
  }

  /** Whether `other` is the same leadership with the same value. */
  equals(other) {
    return other instanceof Leader && other.name === this.name && other.session === this.session
      && other.token === this.token && other.value === this.value && other.label === this.label;
  }
}

/**
 * One lock as the leader sees it. `shape` is 'mutex' (a plain lock),
 * 'semaphore', 'read_write' or 'election'; `permits` a semaphore's size (0
 * otherwise); `holders` every holder in grant order — of a recipe as the
 * server lists them, of a plain lock its one holder (if held), as the Rust
 * client does.
 */
class LockInfo {
  constructor({ name, holder, holderLabel, token, waiters, inLockDelay, shape = 'mutex', permits = 0, holders = [] }) {
    this.name = name;
    this.holder = holder;
    this.holderLabel = holderLabel;
    this.token = token;
    this.waiters = waiters;
    this.inLockDelay = inLockDelay;
    this.shape = shape;
    this.permits = permits;
    this.holders = holders;
    Object.freeze(this.waiters);
    Object.freeze(this.holders);
    Object.freeze(this);
  }

  /** Builds it from the wire's LOCK object. */
  static fromJSON(lock) {
    if (lock === null || typeof lock !== 'object' || typeof lock.name !== 'string') {
      throw new ProtocolError(`not a lock: ${JSON.stringify(lock)}`);
    }
    const holder = optBig(lock.holder, 'holder');
    const holderLabel = String(lock.holder_label || '');
    const token = optBig(lock.token, 'token');
    let holders;
    if (lock.holders !== undefined && lock.holders !== null) {
      if (!Array.isArray(lock.holders)) throw new ProtocolError(`holders is not a list: ${JSON.stringify(lock.holders)}`);
      holders = lock.holders.map(Holder.fromJSON);
    } else if (holder !== null && token !== null) {
      // A plain lock (or a server from before the recipes): its one holder is it.
      holders = [new Holder({ session: holder, label: holderLabel, token })];
    } else {
      holders = [];
    }
    return new LockInfo({
      name: lock.name,
      holder,
      holderLabel,
      token,
      waiters: (lock.waiters || []).map((w) => big(w, 'waiter')),
      inLockDelay: Boolean(lock.in_lock_delay),
      shape: typeof lock.shape === 'string' && lock.shape ? lock.shape : 'mutex',
      permits: small(lock.permits, 'permits'),
      holders,
    });
  }

  /** The election's leader as this view shows it; null when nobody leads (or the name is no election). */
  leader() {
    if (this.shape !== 'election' || this.holders.length === 0) return null;
    const h = this.holders[this.holders.length - 1];
    return new Leader({ name: this.name, session: h.session, label: h.label, token: h.token, value: h.value });
  }
}

/** A member or learner of the cluster. */
class Member {
  constructor({ id, addr, peerAddr }) {
    this.id = id;
    this.addr = addr;
    this.peerAddr = peerAddr;
    Object.freeze(this);
  }

  static fromJSON(m) {
    return new Member({ id: big(m.id, 'member id'), addr: String(m.addr), peerAddr: String(m.peer_addr) });
  }
}

/** One node's view of the cluster (GET /v1/status). */
class Status {
  constructor(fields) {
    Object.assign(this, fields);
    Object.freeze(this.members);
    Object.freeze(this.learners);
    Object.freeze(this);
  }

  static fromJSON(s) {
    if (s === null || typeof s !== 'object') throw new ProtocolError(`not a status: ${JSON.stringify(s)}`);
    return new Status({
      id: big(s.id, 'id'),
      leader: optBig(s.leader, 'leader'),
      term: big(s.term, 'term'),
      state: String(s.state),
      commitIndex: big(s.commit_index, 'commit_index'),
      lastApplied: big(s.last_applied, 'last_applied'),
      members: (s.members || []).map(Member.fromJSON),
      learners: (s.learners || []).map(Member.fromJSON),
      snapshotIndex: optBig(s.snapshot_index, 'snapshot_index') ?? 0n,
      snapshotBytes: num(s.snapshot_bytes, 'snapshot_bytes'),
      commitP50Us: num(s.commit_p50_us, 'commit_p50_us'),
      commitP99Us: num(s.commit_p99_us, 'commit_p99_us'),
    });
  }

  /** The leader's client address, if it is a known member. */
  leaderAddr() {
    const m = this.members.find((x) => x.id === this.leader);
    return m ? m.addr : null;
  }
}

module.exports = { LockInfo, Holder, Leader, Member, Status, big, optBig };
