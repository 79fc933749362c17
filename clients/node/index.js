'use strict';
// Palisade's Node.js client: distributed locks with fencing tokens, over the
// nodes' HTTP/JSON API (docs/http.md), with no dependencies.
//
//   const { Client } = require('palisade');
//   const client = new Client(['127.0.0.1:7420']);
//   await client.lock('jobs/nightly', { ttl: 10 }, async (lease) => {
//     console.log(lease.token); // a bigint fencing token
//   });
//   const permit = await client.acquire('pool', { claim: 'permit', permits: 3, wait: 30 });
//   const leader = await client.campaign('primary', '10.0.0.7:5432', { wait: 3600 });
//   await leader.proclaim('10.0.0.7:6432');
//
// See README.md for the lease guarantee and what `lease.signal` means, and
// index.d.ts for every option.

const { Client, Lease, FENCING_TOKEN_HEADER } = require('./lib/client');
const errors = require('./lib/errors');
const { LockInfo, Holder, Leader, Member, Status } = require('./lib/models');

const { fromWire: _fromWire, ...errorClasses } = errors;

module.exports = {
  Client,
  Lease,
  FENCING_TOKEN_HEADER,
  LockInfo,
  Holder,
  Leader,
  Member,
  Status,
  ...errorClasses,
  version: require('./package.json').version,
};
