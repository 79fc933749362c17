// Type-checked by test.sh with `tsc --strict --noEmit` (not run): the
// declarations of index.d.ts used as a program would use them.
import {
  Client, Lease, LockInfo, Status, TokenCheck, PalisadeError, StaleToken, LeaseLost, WouldBlock,
  FENCING_TOKEN_HEADER, version,
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
  await client.close();
  const h: 'Fencing-Token' = FENCING_TOKEN_HEADER;
  const v: string = version;
  void [n, s, holder, all, check, leader, term, h, v];
}

void main;
