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

/** One lock as the leader sees it. */
class LockInfo {
  constructor({ name, holder, holderLabel, token, waiters, inLockDelay }) {
    this.name = name;
    this.holder = holder;
    this.holderLabel = holderLabel;
    this.token = token;
    this.waiters = waiters;
    this.inLockDelay = inLockDelay;
    Object.freeze(this.waiters);
    Object.freeze(this);
  }

  /** Builds it from the wire's LOCK object. */
  static fromJSON(lock) {
    if (lock === null || typeof lock !== 'object' || typeof lock.name !== 'string') {
      throw new ProtocolError(`not a lock: ${JSON.stringify(lock)}`);
    }
    return new LockInfo({
      name: lock.name,
      holder: optBig(lock.holder, 'holder'),
      holderLabel: String(lock.holder_label || ''),
      token: optBig(lock.token, 'token'),
      waiters: (lock.waiters || []).map((w) => big(w, 'waiter')),
      inLockDelay: Boolean(lock.in_lock_delay),
    });
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

module.exports = { LockInfo, Member, Status, big, optBig };
