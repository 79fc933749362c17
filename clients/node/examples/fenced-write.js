#!/usr/bin/env node
'use strict';
// A fenced write: the lock's token travels with every write, and the store
// refuses a write whose token is older than one it has accepted.
//
//   palisade serve &                       # a node on 127.0.0.1:7420
//   palisade fence-store &                 # the fenced object store on :7430
//   node examples/fenced-write.js --endpoints 127.0.0.1:7420 --store http://127.0.0.1:7430
//
// Two holders take the lock one after the other, as two workers would. The
// first is then "late" — think of a process that paused past its lease and
// woke up unaware — and writes again with its old token: the store answers
// 409, so the newer holder's data survives. That check, not the lease, is what
// makes a late writer harmless.
//
// Exit status 0 when the stale write was refused, 1 otherwise.

const fs = require('node:fs');
const http = require('node:http');
const https = require('node:https');
const { parseArgs } = require('node:util');

const { Client, FENCING_TOKEN_HEADER } = require('..'); // require('palisade') in your code

/** One request to the store: `{status, body}`. */
function request(store, method, key, body, headers = {}) {
  const url = new URL(`/v1/objects/${key}`, store);
  const mod = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.request(url, { method, headers, timeout: 10_000 }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: timed out`)));
    req.on('error', reject);
    req.end(body);
  });
}

/** `PUT /v1/objects/KEY` with the token in the `Fencing-Token` header. */
function put(store, key, body, token) {
  return request(store, 'PUT', key, body, { [FENCING_TOKEN_HEADER]: String(token) });
}

/** `GET /v1/objects/KEY`: the body of the write that made it. */
function get(store, key) {
  return request(store, 'GET', key);
}

async function main() {
  const { values: args } = parseArgs({
    options: {
      endpoints: { type: 'string', default: process.env.PALISADE_ENDPOINTS || '127.0.0.1:7420' },
      store: { type: 'string', default: 'http://127.0.0.1:7430' },
      lock: { type: 'string', default: 'examples/fenced-write' },
      key: { type: 'string', default: 'examples/fenced-write.txt' },
      ca: { type: 'string' },
      'token-file': { type: 'string' },
    },
  });
  const token = args['token-file'] ? fs.readFileSync(args['token-file'], 'utf8').trim() : undefined;
  const client = new Client(args.endpoints, { tls: args.ca ? { ca: args.ca } : undefined, token });
  try {
    // The first holder writes under the lock, then lets go.
    const first = await client.lock(args.lock, { wait: 30 }, async (lease) => {
      const { status, body } = await put(args.store, args.key, 'written by holder 1\n', lease.token);
      console.log(`holder 1 (token ${lease.token}) wrote: ${status} ${body}`);
      return status === 200 ? lease.token : null;
    });
    if (first === null) return 1;
    // The next holder's token is higher; its write raises the store's fence.
    const second = await client.lock(args.lock, { wait: 30 }, async (lease) => {
      const { status, body } = await put(args.store, args.key, 'written by holder 2\n', lease.token);
      console.log(`holder 2 (token ${lease.token}) wrote: ${status} ${body}`);
      return status === 200 ? lease.token : null;
    });
    if (second === null) return 1;
    // Holder 1 comes back late with its old token.
    const late = await put(args.store, args.key, 'late write by holder 1\n', first);
    console.log(`holder 1 (token ${first}) wrote late: ${late.status} ${late.body}`);
    const stored = await get(args.store, args.key);
    console.log(`the store holds: ${JSON.stringify(stored.body.trim())}`);
    if (late.status === 409) {
      const stale = JSON.parse(late.body);
      console.log(`refused: token ${stale.presented} is below ${stale.highest}, as it must be`);
      return 0;
    }
    console.log('the stale write was NOT refused: is the store running with --fencing off?');
    return 1;
  } finally {
    await client.close();
  }
}

main().then(
  (code) => { process.exitCode = code; },
  (e) => {
    console.error(`fenced-write: ${e}`);
    process.exitCode = 1;
  },
);
