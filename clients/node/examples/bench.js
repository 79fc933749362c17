#!/usr/bin/env node
'use strict';
// One client acquiring and releasing a lock of its own, back to back, for a
// while: the Node client's row of `palisade bench server --lang node`.
//
//   node examples/bench.js --endpoints 127.0.0.1:7420 --duration 5
//
// Prints one JSON line: {"pairs": N, "elapsed_s": S, "acquire_us": [...]}
// (every acquire's latency, in µs, on this process's monotonic clock).

const fs = require('node:fs');
const { performance } = require('node:perf_hooks');
const { parseArgs } = require('node:util');

const { Client } = require('..'); // require('palisade') in your code

async function main() {
  const { values: a } = parseArgs({
    options: {
      endpoints: { type: 'string', default: process.env.PALISADE_ENDPOINTS || '127.0.0.1:7420' },
      duration: { type: 'string', default: '5' },
      ca: { type: 'string' },
      cert: { type: 'string' },
      key: { type: 'string' },
      'token-file': { type: 'string' },
    },
  });
  const token = a['token-file'] ? fs.readFileSync(a['token-file'], 'utf8').trim() : undefined;
  const tls = a.ca ? { ca: a.ca, cert: a.cert, key: a.key } : undefined;
  const duration = Number(a.duration) * 1000;
  const name = `bench-node-${process.pid}`;
  const client = new Client(a.endpoints, { tls, token, retryFor: 30 });
  const acquireUs = [];
  let elapsed;
  try {
    // The session is opened by the first acquire: not measured.
    await (await client.acquire(name)).release();
    const start = performance.now();
    while (performance.now() - start < duration) {
      const t = performance.now();
      const lease = await client.acquire(name);
      acquireUs.push(Math.round((performance.now() - t) * 1000));
      await lease.release();
    }
    elapsed = (performance.now() - start) / 1000;
  } finally {
    await client.close();
  }
  console.log(JSON.stringify({ pairs: acquireUs.length, elapsed_s: elapsed, acquire_us: acquireUs }));
}

main().catch((e) => {
  console.error(`bench: ${e}`);
  process.exitCode = 1;
});
