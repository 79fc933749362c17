// Type-checked by test.sh with `tsc --strict --noEmit` (not run): the
// declarations of index.d.ts used as a program would use them.
import {
  Client, Lease, LockInfo, Status, TokenCheck, PalisadeError, StaleToken, LeaseLost, WouldBlock,
  FENCING_TOKEN_HEADER, version, Holder, Leader, Claim, Shape, AcquireOptions, WrongShape,
} from 'palisade';

async function main(): Promise<void> {
  const client = new Client(['127.0.0.1:7420'], {
    ttl: 10, wait: 0, lockDelay: 0, retryFor: 5, rpcTimeout: 2, safetyMargin: 0.5, label: 'types',
    tls: { ca: 'certs/ca.pem', cert: Buffer.from(''), key: '-----BEGIN PRIVATE KEY-----' },
    token: 'abc',
  });
  const n: number = await client.lock('jobs/nightly', { ttl: 10, wait: 30 }, async (lease: Lease) => {
    const token: bigint = lease.token;
    const signal: AbortSignal = lease.signal;
    signal.throwIfAborted();
    const left: number = lease.remaining();
    const until: number = lease.guaranteedUntil();
    const header: [string, string] = lease.fencingHeader();
    const lost: boolean = lease.lost;
    const sid: bigint = lease.sessionId;
    void [token, left, until, header, lost, sid];
    return 1;
  });
  const s: string = await client.lock('x', (lease) => lease.name);
  const ac = new AbortController();
  const lease = await client.acquire('jobs/x', { wait: 1, signal: ac.signal, onLost: (l) => console.log(l.token) });
  await lease.release();
  const info: LockInfo | null = await client.get('jobs/x');
  const holder: bigint | null = info ? info.holder : null;
  const all: LockInfo[] = await client.locks();
  const check: TokenCheck = await client.checkToken('jobs/x', 7n);
  await client.checkToken('jobs/x', '7');
  const st: Status = await client.status();
  const leader: string | null = st.leaderAddr();
  const term: bigint = st.term;
  try {
    await client.acquire('jobs/y');
  } catch (e) {
    if (e instanceof StaleToken) {
      const cur: bigint | null = e.currentToken;
      void cur;
    }
    if (e instanceof PalisadeError) {
      const code: string = e.code;
      const status: number | undefined = e.status;
      void [code, status, e.leader];
    }
    if (e instanceof WouldBlock || e instanceof LeaseLost) void e.message;
  }
  await recipes(client);
  await client.close();
  const h: 'Fencing-Token' = FENCING_TOKEN_HEADER;
  const v: string = version;
  void [n, s, holder, all, check, leader, term, h, v];
}

void main;

async function recipes(client: Client): Promise<void> {
  const permit: Lease = await client.acquire('pool', { claim: 'permit', permits: 3, wait: 30 });
  const slot: number = permit.slot;
  const claim: Claim = permit.claim;
  await client.lock('doc', { claim: 'read' }, async (reader) => reader.token);
  await client.lock('doc', { claim: 'write', wait: 10, lockDelay: 1 }, async (writer) => writer.slot);
  const options: AcquireOptions = { claim: 'lead', value: '10.0.0.7:5432', wait: 3600, onLost: (l) => void l.token };
  const elected: Lease = await client.acquire('primary', options);
  await elected.proclaim('10.0.0.7:6432');
  const leader: Lease = await client.campaign('primary', '10.0.0.7:5432', { wait: 3600, ttl: 5 });
  await leader.release();
  // @ts-expect-error a permit needs its number of permits
  await client.acquire('pool', { claim: 'permit' });
  // @ts-expect-error permits belong to claim 'permit' only
  await client.acquire('doc', { claim: 'read', permits: 3 });
  // @ts-expect-error a value belongs to claim 'lead' only
  await client.acquire('x', { value: 'v' });
  // @ts-expect-error no such claim
  await client.acquire('x', { claim: 'mutex' });
  // @ts-expect-error a campaign's claim is 'lead'
  await client.campaign('primary', 'v', { claim: 'read' });
  const info: LockInfo | null = await client.get('pool');
  if (info) {
    const shape: Shape = info.shape;
    const permits: number = info.permits;
    const holders: readonly Holder[] = info.holders;
    for (const h of holders) {
      const row: [bigint, string, bigint, boolean, number, string] = [h.session, h.label, h.token, h.shared, h.slot, h.value];
      void row;
    }
    const l: Leader | null = info.leader();
    void [shape, permits, l];
  }
  const now: Leader | null = await client.leader('primary');
  if (now) {
    const row: [string, bigint, string, bigint, string, boolean] = [now.name, now.session, now.label, now.token, now.value, now.equals(null)];
    void row;
  }
  const ac = new AbortController();
  for await (const seen of client.observe('primary', { interval: 0.5, signal: ac.signal })) {
    if (seen === null) continue;
    const token: bigint = seen.token;
    void token;
    break;
  }
  try {
    await client.acquire('pool');
  } catch (e) {
    if (e instanceof WrongShape) void e.code;
  }
  await permit.release();
  void [slot, claim];
}
