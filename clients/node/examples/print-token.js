#!/usr/bin/env node
'use strict';
// Takes a lock and prints its fencing token.
//
//   node examples/print-token.js [ENDPOINTS] [--lock NAME] [--ttl SECONDS] [--wait SECONDS] [--retry-for SECONDS]
//                                [--ca ca.pem [--cert c.pem --key k.pem | --token-file F]]
//
// ENDPOINTS (comma-separated HOST:PORT) defaults to $PALISADE_ENDPOINTS, then
// 127.0.0.1:7420. Prints "holding NAME with fencing token N"; exit status 0,
// or 1 with the error.

const fs = require('node:fs');
const { parseArgs } = require('node:util');

const { Client } = require('..'); // require('palisade') in your code

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      endpoints: { type: 'string' },
      lock: { type: 'string', default: 'jobs/nightly' },
      ttl: { type: 'string', default: '10' },
      wait: { type: 'string', default: '0' },
      'retry-for': { type: 'string', default: '10' },
      ca: { type: 'string' },
      cert: { type: 'string' },
      key: { type: 'string' },
      'token-file': { type: 'string' },
    },
  });
  const endpoints = values.endpoints || positionals[0] || process.env.PALISADE_ENDPOINTS || '127.0.0.1:7420';
  const tls = values.ca ? { ca: values.ca, cert: values.cert, key: values.key } : undefined;
  const token = values['token-file'] ? fs.readFileSync(values['token-file'], 'utf8').trim() : undefined;
  const client = new Client(endpoints, { tls, token, retryFor: Number(values['retry-for']) });
  try {
    await client.lock(values.lock, { ttl: Number(values.ttl), wait: Number(values.wait) }, async (lease) => {
      console.log(`holding ${lease.name} with fencing token ${lease.token}`);
    });
  } finally {
    await client.close();
  }
}

main().catch((e) => {
  console.error(`print-token: ${e}`);
  process.exitCode = 1;
});
