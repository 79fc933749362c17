'use strict';
// Palisade's Node.js client: distributed locks with fencing tokens, over the
// nodes' HTTP/JSON API (docs/http.md), with no dependencies.
//
//   const { Client } = require('palisade');
//   const client = new Client(['127.0.0.1:7420']);
//   await client.lock('jobs/nightly', { ttl: 10 }, async (lease) => {
//     console.log(lease.token); // a bigint fencing token
//   });
//
// See README.md for the lease guarantee and what `lease.signal` means, and
// index.d.ts for every option.

const { Client, Lease, FENCING_TOKEN_HEADER } = require('./lib/client');
const errors = require('./lib/errors');
const { LockInfo, Member, Status } = require('./lib/models');

const { fromWire: _fromWire, ...errorClasses } = errors;

module.exports = {
  Client,
  Lease,
  FENCING_TOKEN_HEADER,
  LockInfo,
  Member,
  Status,
  ...errorClasses,
  version: require('./package.json').version,
};
