'use strict';
// The app of tests/realcode.rs: an Express service whose routes each use one
// pattern real services use (an HTTP client, fetch, undici, async crypto,
// zlib, compression middleware, a worker thread, timers, a child process),
// then read a file named after the request, then answer with a status
// that tells requests apart (200 + i % 3). A background interval stats a
// file from start to exit (work of no request).
//
//   node app.js DIR UPSTREAM_PORT
//
// Prints {"marker":"listening","port":..}; GET /quit ends it. A route is
// /<pattern>/<i>; the file read after the pattern is DIR/after-<pattern>-<i>.
const fs = require('fs');
const path = require('path');
const http = require('http');
const crypto = require('crypto');
const zlib = require('zlib');
const { execFile } = require('child_process');
const { Worker } = require('worker_threads');
const express = require('express');
const compression = require('compression');

const [dir, upArg] = process.argv.slice(2);
const up = +upArg;
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const none = () => {};

const bg = setInterval(() => fs.stat(path.join(dir, 'bg'), none), 7);

// One worker thread: it spins ~30 ms per message, then replies.
const worker = new Worker(
  `const { parentPort } = require('worker_threads');
   parentPort.on('message', (m) => { const end = Date.now() + 30; while (Date.now() < end); parentPort.postMessage(m); });`,
  { eval: true }
);
const waiting = new Map();
worker.on('message', (m) => { const f = waiting.get(m); waiting.delete(m); f(); });

const keepAlive = new http.Agent({ keepAlive: true });
const upstream = `http://127.0.0.1:${up}`;
// npm undici needs Node 20: loaded on first use.
let undiciPool;
const pool = () => (undiciPool ??= new (require('undici').Pool)(upstream, { connections: 2 }));

// PG_URL: a PostgreSQL (PG_POOL_MAX clients, 8 by default, each timing out at once when idle, so
// that new logins, SCRAM's included, keep happening); REDIS_PORT: a redis.
const pgPool = process.env.PG_URL && new (require('pg').Pool)({ connectionString: process.env.PG_URL, max: +(process.env.PG_POOL_MAX || 8), idleTimeoutMillis: 1 });
// PG_SLEEP: the seconds each query sleeps in the server (5 ms by default).
const pgSleep = +(process.env.PG_SLEEP || 0.005);
const redis = process.env.REDIS_PORT && new (require('ioredis'))(+process.env.REDIS_PORT, '127.0.0.1');

// Each pattern: calls done() once its work is over.
const patterns = {
  http: (i, done) =>
    http.get({ host: '127.0.0.1', port: up, path: `/x/${i}`, agent: keepAlive }, (r) => { r.resume(); r.on('end', done); }),
  fetch: (i, done) => fetch(`${upstream}/x/${i}`).then((r) => r.text()).then(() => done()),
  undici: (i, done) => pool().request({ path: `/x/${i}`, method: 'GET' }).then((r) => r.body.text()).then(() => done()),
  pbkdf2: (i, done) => crypto.pbkdf2('secret', `salt${i}`, 20000, 32, 'sha256', done),
  scrypt: (i, done) => crypto.scrypt('secret', `salt${i}`, 32, done),
  subtle: (i, done) => crypto.subtle.digest('SHA-256', Buffer.alloc(1 << 16, i)).then(() => done()),
  gzip: (i, done) => zlib.gzip(Buffer.alloc(1 << 16, i), done),
  worker: (i, done) => { const id = `${i}-${Math.random()}`; waiting.set(id, done); worker.postMessage(id); },
  timeout: (i, done) => setTimeout(done, 15),
  immediate: (i, done) => setImmediate(done),
  exec: (i, done) => execFile('true', done),
  pg: (i, done) => pgPool.query('SELECT $1::int AS i, pg_sleep($2)', [i, pgSleep], done),
  redis: (i, done) => redis.set(`k${i}`, String(i)).then(() => redis.get(`k${i}`)).then(() => done()),
};

const app = express();
for (const [name, run] of Object.entries(patterns)) {
  app.get(`/${name}/:i`, (req, res) => {
    const i = +req.params.i;
    run(i, () =>
      fs.readFile(path.join(dir, `after-${name}-${i}`), () => res.status(200 + (i % 3)).send(`${name} ${i}\n`))
    );
  });
}
// compression middleware: a gzip'd body (zlib on the threadpool) after a file read.
const body = 'compressible text '.repeat(4000);
app.get('/compress/:i', compression({ threshold: 0 }), (req, res) => {
  const i = +req.params.i;
  fs.readFile(path.join(dir, `after-compress-${i}`), () => res.status(200 + (i % 3)).type('text').send(body));
});

const server = app.listen(0, '127.0.0.1', () => out({ marker: 'listening', port: server.address().port }));
app.get('/quit', (req, res) => {
  res.end('bye');
  clearInterval(bg);
  keepAlive.destroy();
  undiciPool?.close();
  if (pgPool) pgPool.end();
  if (redis) redis.disconnect();
  worker.terminate();
  server.close();
  setTimeout(() => process.exit(0), 50);
});
