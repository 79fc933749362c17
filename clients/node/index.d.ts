// Type declarations of Palisade's Node.js client (hand-written; the code is
// the CommonJS of index.js and lib/). Node >= 18.

/// <reference types="node" />

/** The header fenced HTTP resources (`palisade fence-store`) read the token from: `"Fencing-Token"`. */
export declare const FENCING_TOKEN_HEADER: 'Fencing-Token';

/** This package's version. */
export declare const version: string;

/** PEM text (a string containing `-----BEGIN`), its bytes, or the path of a PEM file. */
export type Pem = string | Buffer;

/** TLS to the nodes. */
export interface TlsOptions {
  /** The cluster's CA (e.g. `certs/ca.pem` of `palisade certs init`): the only CA trusted. Required. */
  ca: Pem;
  /** A client certificate of that CA, which says who the client is; goes with `key`. */
  cert?: Pem;
  /** The client certificate's private key; goes with `cert`. */
  key?: Pem;
}

/** Options of {@link Client}. Unknown options are refused (`InvalidInput`). All durations are in seconds. */
export interface ClientOptions {
  /** The default session TTL of {@link Client.acquire}: how long a lock outlives this process dying silently. Default 10. */
  ttl?: number;
  /** The default wait of {@link Client.acquire} (0: `WouldBlock` at once if held). Default 0. */
  wait?: number;
  /** The default lock-delay of {@link Client.acquire}. Default 0. */
  lockDelay?: number;
  /** Switches to TLS (>= 1.2, ALPN `http/1.1`); each node's certificate must name the host dialled. */
  tls?: TlsOptions;
  /** A bearer token (`palisade certs token NAME`); refused without `tls` (credentials never travel in plaintext). */
  token?: string;
  /** Shown next to the locks this client holds (default `"HOST/pid N"`). */
  label?: string;
  /** Each attempt's timeout (a waiting acquire's attempt: the wait left + this). Default 2. */
  rpcTimeout?: number;
  /** How long a call retries across leader changes and unreachable nodes before `Unavailable`. Default 10. */
  retryFor?: number;
  /** Subtracted from every guarantee; default a tenth of the TTL, at least 0.05, never more than half the TTL. */
  safetyMargin?: number;
}

/**
 * What an acquire claims on a name (docs/recipes.md): a plain lock (`'lock'`,
 * the default), one of `permits` permits of a counting semaphore
 * (`'permit'`), a reader's or the writer's share of a read/write lock
 * (`'read'`, `'write'`), or leadership of an election with a `value`
 * (`'lead'`). A name's shape is fixed by the first claim on it and kept while
 * anyone holds or waits for it; a claim of another shape is refused with
 * {@link WrongShape}.
 */
export type Claim = 'lock' | 'permit' | 'read' | 'write' | 'lead';

/** What a name is, as {@link LockInfo.shape} says: fixed by the first claim on it. */
export type Shape = 'mutex' | 'semaphore' | 'read_write' | 'election';

/**
 * The claim of {@link AcquireOptions}: `permits` goes with `'permit'` only
 * (every claim on the name gives the same; the server takes 1 to 10,000),
 * `value` with `'lead'` only (at most 1024 bytes). A shared claim (`'permit'`,
 * `'read'`) takes no lock-delay: the client's default is not applied to it,
 * and one given is refused by the server (`InvalidInput`).
 */
export type ClaimOptions =
  | { claim?: 'lock' | 'read' | 'write'; permits?: never; value?: never }
  | { claim: 'permit'; permits: number; value?: never }
  | { claim: 'lead'; value: string; permits?: never };

/** Options of every acquire ({@link Client.acquire}, {@link Client.lock}, {@link Client.campaign}). Unknown options are refused (`InvalidInput`). */
export interface LeaseOptions {
  /** The session TTL in seconds (default the client's). Leases of one TTL share a session. */
  ttl?: number;
  /** Seconds to wait in the lock's FIFO queue (default the client's; 0: `WouldBlock` at once if held). A long poll. */
  wait?: number;
  /** After this holder's session expires (not after a clean release) the lock stays unavailable this long, in seconds. */
  lockDelay?: number;
  /** Called when the lease is lost (after `lease.signal` aborted). Its errors are ignored. */
  onLost?: (lease: Lease) => void | Promise<void>;
  /**
   * Gives up the acquire when it aborts: the call rejects with the signal's
   * reason and the wait is cancelled on the server (in the background, which
   * also releases a grant made meanwhile).
   */
  signal?: AbortSignal;
}

/** Options of {@link Client.acquire} and {@link Client.lock}: a lease's options and what is claimed. */
export type AcquireOptions = LeaseOptions & ClaimOptions;

/** Options of {@link Client.campaign} (the claim is `'lead'` with its value). */
export type CampaignOptions = LeaseOptions;

/** Options of {@link Client.observe}. Unknown options are refused (`InvalidInput`). */
export interface ObserveOptions {
  /** Seconds between two looks at the lock. Default 0.25. */
  interval?: number;
  /** Ends the observation (the iteration ends, without an error) when it aborts. */
  signal?: AbortSignal;
}

/**
 * A granted lock: its fencing token, and how long it is still guaranteed.
 *
 * Pass {@link Lease.token} to every write on the protected resource, which
 * must refuse tokens lower than the highest it has seen: that, not
 * {@link Lease.signal}, is what makes a holder that paused past its lease
 * harmless. While a lease is held (not released, not lost) its session's
 * keep-alive timer keeps the process alive.
 */
export declare class Lease {
  private constructor();
  /** The lock name. */
  readonly name: string;
  /** The fencing token: the Raft log index of the entry that granted it. Only grows, per lock and across failovers. */
  readonly token: bigint;
  /** The id of the session that holds the lock (shown as `holder` by {@link Client.get}). */
  readonly sessionId: bigint;
  /** What was claimed (`'lock'` for a plain lock). */
  readonly claim: Claim;
  /**
   * A semaphore permit's slot, `0..permits` (0 for every other claim). A slot
   * is held by one holder at a time and its next grant has a larger token:
   * fence the resource by `(name, slot)`.
   */
  readonly slot: number;
  /**
   * Aborts the moment the lease can no longer be guaranteed — its session's
   * guarantee ran out (measured from when the last acknowledged keep-alive was
   * sent), the server no longer knows the session, or the client was closed —
   * with a {@link LeaseLost} as its `reason`. Never aborted by a release. Pass
   * it to the work done under the lock (`fetch(url, { signal })`,
   * `signal.throwIfAborted()`) so that the work stops.
   */
  readonly signal: AbortSignal;
  /** Whether the lease was lost (`signal.aborted`). */
  readonly lost: boolean;
  /** The token as an HTTP header `[name, value]` for a fenced store: `["Fencing-Token", "34"]`. */
  fencingHeader(): [typeof FENCING_TOKEN_HEADER, string];
  /** Seconds the lock is still guaranteed, on this process's monotonic clock; 0 once lost or released. */
  remaining(): number;
  /**
   * Until when the lock is guaranteed, as a `performance.now()` value (ms):
   * the send time of the last acknowledged keep-alive + TTL - safety margin.
   */
  guaranteedUntil(): number;
  /**
   * Releases the lock; the next waiter is granted it at once. Calling it again
   * does nothing. Rejects with {@link LeaseLost} if the lease was lost before
   * (the lock was freed with its session); {@link NotHolder} or
   * {@link StaleToken} if it was no longer this lease's (nothing changed);
   * {@link Unavailable} if no leader answered — the release is then retried in
   * the background, and if that fails too the session is given up so that the
   * lock goes free within its TTL.
   */
  release(): Promise<void>;
  /**
   * As the leader of an election (a grant of claim `'lead'`), changes the
   * value observers see (`POST /v1/locks/proclaim` with this lease's token).
   * Proclaiming the same value again is harmless, so it is retried across
   * leader changes like a release. Rejects with {@link NotHolder} if this
   * lease was released (refused without asking) or its session holds the name
   * no more, {@link StaleToken} if its session holds it under a newer grant,
   * {@link LeaseLost} if the lease was lost, {@link WrongShape} if the name is
   * no election, {@link InvalidInput} for a value over 1024 bytes,
   * {@link Unavailable} (the value may or may not have changed).
   */
  proclaim(value: string): Promise<void>;
  /** `Lease(name="…", token=…, session=…, lost=…)` (and `claim=…, slot=…` for a recipe). */
  toString(): string;
}

/** One holder of a lock ({@link LockInfo.holders}). */
export declare class Holder {
  private constructor();
  /** Its session's id. */
  readonly session: bigint;
  /** That session's label. */
  readonly label: string;
  /** The token of its grant. */
  readonly token: bigint;
  /** A reader or a semaphore permit, beside others. */
  readonly shared: boolean;
  /** A semaphore permit's slot (0 otherwise). */
  readonly slot: number;
  /** An election leader's value (`''` otherwise). */
  readonly value: string;
}

/** The leader of an election ({@link Client.leader}, {@link Client.observe}). */
export declare class Leader {
  private constructor();
  /** The election's name. */
  readonly name: string;
  /** The leader's session id. */
  readonly session: bigint;
  /** That session's label. */
  readonly label: string;
  /** The token of its leadership: every new leader's is above the last. */
  readonly token: bigint;
  /** The value it campaigned with or last proclaimed. */
  readonly value: string;
  /** Whether `other` is the same leadership with the same value. */
  equals(other: Leader | null): boolean;
}

/** One lock as the leader sees it. */
export declare class LockInfo {
  private constructor();
  readonly name: string;
  /** The holder's session id; null while the lock only has waiters (or is in lock-delay). */
  readonly holder: bigint | null;
  /** The holder's label (`label` of its client). */
  readonly holderLabel: string;
  /** The current grant's token; null while not held. */
  readonly token: bigint | null;
  /** The FIFO queue of waiting session ids. */
  readonly waiters: readonly bigint[];
  /** Whether the lock is in lock-delay (its holder's session expired). */
  readonly inLockDelay: boolean;
  /** `'mutex'` for a plain lock, else the recipe. */
  readonly shape: Shape;
  /** A semaphore's size; 0 for the other shapes. */
  readonly permits: number;
  /**
   * Every holder in grant order: of a recipe as the server lists them, of a
   * plain lock its one holder (if held). Of several, {@link LockInfo.holder}
   * and {@link LockInfo.token} are the newest's.
   */
  readonly holders: readonly Holder[];
  /** The election's leader as this view shows it; null when nobody leads (or the name is no election). */
  leader(): Leader | null;
}

/** A member or learner of the cluster. */
export declare class Member {
  private constructor();
  /** The node id. */
  readonly id: bigint;
  /** The client address (`--listen`). */
  readonly addr: string;
  /** The peer address (`--listen-peer`). */
  readonly peerAddr: string;
}

/** One node's view of the cluster (`GET /v1/status`). */
export declare class Status {
  private constructor();
  /** The id of the node that answered. */
  readonly id: bigint;
  /** The leader's node id; null while none is known. */
  readonly leader: bigint | null;
  readonly term: bigint;
  /** `"leader"`, `"follower"`, `"candidate"`, `"learner"`, … */
  readonly state: string;
  readonly commitIndex: bigint;
  readonly lastApplied: bigint;
  readonly members: readonly Member[];
  readonly learners: readonly Member[];
  readonly snapshotIndex: bigint;
  readonly snapshotBytes: number;
  /** Commit latency percentiles on that node, in µs (0 when not measured yet). */
  readonly commitP50Us: number;
  readonly commitP99Us: number;
  /** The leader's client address, if it is a known member. */
  leaderAddr(): string | null;
}

/** What {@link Client.checkToken} answers. */
export interface TokenCheck {
  /** Whether the token is still the current holder's. */
  current: boolean;
  /** The current token; null when the lock is not held. */
  currentToken: bigint | null;
}

/**
 * A client of a Palisade cluster.
 *
 * `endpoints`: any nodes, `HOST:PORT` (an array, or one comma-separated
 * string); the leader is found from there and followed. Nothing is sent
 * before the first call; sessions are opened by the first acquire (one per
 * distinct TTL, shared by the leases of that TTL; two concurrent acquires of
 * the same name use two sessions, so they exclude each other like two
 * processes). Call {@link Client.close} at the end: it frees the locks at once.
 *
 * Throws {@link InvalidInput} for bad options (no endpoints, a URL instead of
 * `HOST:PORT`, a token without `tls`, a negative duration, unreadable TLS files).
 */
export declare class Client {
  constructor(endpoints: string | readonly string[], options?: ClientOptions);

  /**
   * Acquires lock `name` and resolves to its {@link Lease}; release it with
   * {@link Lease.release}.
   *
   * Rejects with {@link WouldBlock}, {@link WaitTimeout}, {@link InvalidInput},
   * {@link PermissionDenied}, {@link Unauthenticated}, {@link LimitReached},
   * {@link WrongShape} (the name is another recipe, or this session holds it
   * in the other mode), {@link SessionExpired} (the session's guarantee ran
   * out during the wait), {@link GrantTooLate}, or {@link Unavailable} —
   * after which the outcome is unknown and the acquire is cancelled in the
   * background. `options.claim` takes a recipe instead of a plain lock:
   * `{ claim: 'permit', permits: 3 }`, `{ claim: 'read' }`, `{ claim: 'write' }`,
   * `{ claim: 'lead', value: '10.0.0.7:5432' }`.
   */
  acquire(name: string, options?: AcquireOptions): Promise<Lease>;

  /**
   * Acquires `name`, runs `fn(lease)` and releases the lock when it ends (also
   * when it throws); resolves to what `fn` resolved to. Rejects with `fn`'s own
   * error if it threw (never masked by a release error), with
   * {@link LeaseLost} if the lease was lost while `fn` ran (what `fn` did after
   * `lease.signal` aborted was not protected by the lock), and else as
   * {@link Client.acquire} does.
   */
  lock<T>(name: string, options: AcquireOptions, fn: (lease: Lease) => T | Promise<T>): Promise<T>;
  lock<T>(name: string, fn: (lease: Lease) => T | Promise<T>): Promise<T>;

  /**
   * Campaigns for leadership of the election `name` with `value`, and
   * resolves to the leader's {@link Lease} once this candidate leads:
   * {@link Client.acquire} with `{ claim: 'lead', value }`. Candidates queue
   * FIFO; give a `wait` long enough to stand in line (the client's default
   * wait is 0: {@link WouldBlock} if someone leads). Leadership ends with
   * {@link Lease.release} or the loss of the lease (`lease.signal`);
   * {@link Lease.proclaim} changes the value.
   */
  campaign(name: string, value: string, options?: CampaignOptions): Promise<Lease>;

  /**
   * The leader of the election `name` now (a linearizable read of the lock on
   * the leader), null when nobody leads. Rejects with {@link WrongShape}
   * (decided by the client) if the name is held as another shape. A snapshot:
   * it may have changed by the time it resolves.
   */
  leader(name: string): Promise<Leader | null>;

  /**
   * The leader of the election `name` (null when nobody leads) at the first
   * look and then each time it changes (another session, token or value):
   * `for await (const leader of client.observe('primary')) …`.
   *
   * This **polls**: it reads the lock (as {@link Client.leader}) every
   * `interval` seconds, so it reports the leader as it is at each look, and a
   * leadership shorter than `interval` can be missed altogether (the server
   * has no watch stream yet). It ends when `signal` aborts or the loop stops;
   * a failed look (`Unavailable` after `retryFor`, `WrongShape`) ends it by
   * throwing.
   */
  observe(name: string, options?: ObserveOptions): AsyncGenerator<Leader | null, void, undefined>;

  /** One lock, read linearizably on the leader; null when nobody holds or waits for it. */
  get(name: string): Promise<LockInfo | null>;

  /** Every lock the caller may read, read linearizably on the leader. */
  locks(): Promise<LockInfo[]>;

  /**
   * Whether `token` is still the current holder's token for `name`, and the
   * current token. A weaker check than the resource storing the token: the
   * holder can lose the lock right after.
   */
  checkToken(name: string, token: bigint | number | string): Promise<TokenCheck>;

  /** The cluster as the node this client talks to (the leader once known) sees it. */
  status(): Promise<Status>;

  /**
   * Closes every session — their leases are lost (`signal` aborts) and their
   * locks released at once — and the connections. Best effort (a session not
   * closed expires after its TTL). Idempotent; later calls reject with `InvalidInput`.
   */
  close(): Promise<void>;

  /** `Client(endpoints=[…], tls=…)` (no credentials). */
  toString(): string;
}

/** The options every error constructor takes. */
export interface PalisadeErrorOptions {
  code?: string;
  status?: number;
  leader?: string | null;
  cause?: unknown;
}

/**
 * Base of every error of this package. `code` is the server's wire code
 * (`"stale_token"`, `"would_block"`, …) or, for errors the client decides,
 * a code of the same style (`"session_expired"`, `"grant_too_late"`,
 * `"lease_lost"`, `"protocol"`); `message` the explanation.
 */
export declare class PalisadeError extends Error {
  constructor(message?: string, options?: PalisadeErrorOptions);
  /** The wire code of this class. */
  static readonly code: string;
  /** The wire code of this error (an unknown code of a newer server is kept as is). */
  readonly code: string;
  /** The HTTP status of the refusal; undefined for errors the client decides. */
  readonly status: number | undefined;
  /** The leader's client address when the refusal named one (`not_leader`), else null. */
  readonly leader: string | null;
}

/** `not_leader` (503): the node is not the leader. The client follows the leader by itself, so this is not normally seen. */
export declare class NotLeader extends PalisadeError {}
/** `invalid_input` (400): malformed or out of bounds (a bad name, TTL, wait, token or key; an unknown option). Nothing changed. */
export declare class InvalidInput extends PalisadeError {}
/** `unknown_session` (404): the server does not know the session (never did, closed, or expired): its locks are no longer held. */
export declare class UnknownSession extends PalisadeError {}
/** `not_holder` (409): the session does not hold (or wait for) the lock. Nothing changed. */
export declare class NotHolder extends PalisadeError {}
/** `stale_token` (409): the token is not the lock's current grant. Nothing changed. */
export declare class StaleToken extends PalisadeError {
  constructor(message?: string, options?: PalisadeErrorOptions & { currentToken?: bigint | null; presentedToken?: bigint | null });
  /** The current holder's token; null when not held. */
  readonly currentToken: bigint | null;
  /** The token the request carried. */
  readonly presentedToken: bigint | null;
}
/** `would_block` (409): the lock is held by another session and the call did not wait. */
export declare class WouldBlock extends PalisadeError {}
/** `wait_timeout` (409): the wait ran out before the lock was granted. */
export declare class WaitTimeout extends PalisadeError {}
/** `limit_reached` (429): a server limit (sessions, waiters, locks, calls in flight for this identity). */
export declare class LimitReached extends PalisadeError {}
/** `unavailable`: no leader answered within `retryFor`; `message` says what each node did. The outcome of a write is unknown. */
export declare class Unavailable extends PalisadeError {}
/** `unauthenticated` (401): no, bad or misplaced credentials. Retrying with the same credentials cannot help. */
export declare class Unauthenticated extends PalisadeError {}
/** `permission_denied` (403): the caller's roles do not cover this call on this name (e.g. a read-only role locking). */
export declare class PermissionDenied extends PalisadeError {}
/** `cancelled` (409): the waiting acquire was cancelled by `/v1/locks/cancel` of the same session. */
export declare class Cancelled extends PalisadeError {}
/** `wrong_shape` (409): the name is another recipe than the call takes it for (a plain lock on a semaphore), or the session holds it in the other mode. */
export declare class WrongShape extends PalisadeError {}
/** `session_expired` (client-side): the session's guarantee ran out (or the session is known to be gone) before or during the call. */
export declare class SessionExpired extends PalisadeError {}
/**
 * `grant_too_late` (client-side): the lock was granted, but the answer arrived
 * after the session's guarantee had run out, so the grant may already be
 * superseded. It is released with the session; try again.
 */
export declare class GrantTooLate extends PalisadeError {}
/**
 * `lease_lost` (client-side): the lease was lost — the reason of
 * `lease.signal`, and what `lock()` and `release()` reject with after a loss.
 */
export declare class LeaseLost extends PalisadeError {}
/** `protocol` (client-side): the server answered something that is not docs/http.md's JSON. */
export declare class ProtocolError extends PalisadeError {}
