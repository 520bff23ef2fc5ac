// Records real driver traffic for the wire-protocol parsers' golden tests.
// A TCP proxy between a driver and its server writes each connection's bytes,
// both directions in order, one line per chunk it read:
//   c <hex>   client -> server (what the app wrote on its socket)
//   s <hex>   server -> client (what the app read)
// to OUT/<scenario>.rec (<scenario>-<n>.rec for a scenario's n-th connection
// past the first). Chunk boundaries are the proxy's reads: the parsers must
// not depend on them (their property tests re-chunk every recording).
//
//   node record.js SCENARIO OUT_DIR   with PG_PORT, PG_TRUST_PORT, MYSQL_PORT,
//                                     REDIS_PORT and DB_USER, DB_PASSWORD, DB_NAME
// Prints {"marker":"recorded","scenario":…,"files":[…]} when done.
'use strict';
const net = require('net');
const fs = require('fs');
const path = require('path');

const [scenario, outDir] = process.argv.slice(2);
const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`record.js: ${k} is not set`);
  return v;
};

// A proxy to 127.0.0.1:port; resolves to {port, done()} where done() waits for
// every connection to close and writes the files.
function proxy(port) {
  const conns = [];
  let open = 0;
  let waiters = [];
  const server = net.createServer((client) => {
    const lines = [];
    conns.push(lines);
    open++;
    const upstream = net.connect(port, '127.0.0.1');
    const closed = () => {
      if (--open === 0) waiters.forEach((w) => w());
    };
    let ends = 0;
    const ended = () => {
      if (++ends === 2) closed();
    };
    client.on('data', (d) => {
      lines.push('c ' + d.toString('hex'));
      upstream.write(d);
    });
    upstream.on('data', (d) => {
      lines.push('s ' + d.toString('hex'));
      client.write(d);
    });
    client.on('close', () => {
      upstream.end();
      ended();
    });
    upstream.on('close', () => {
      client.end();
      ended();
    });
    client.on('error', () => {});
    upstream.on('error', () => {});
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        port: server.address().port,
        done: () =>
          new Promise((r) => {
            const finish = () => {
              server.close();
              r(conns);
            };
            if (open === 0) finish();
            else waiters.push(finish);
          }),
      });
    });
  });
}

// Runs fn(proxyPort) and waits for its connections to close.
async function through(port, fn) {
  const p = await proxy(port);
  await fn(p.port);
  return p.done();
}

async function expectError(promise, what) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  throw new Error(`${what}: expected an error, got none`);
}

const scenarios = {
  // npm pg with SCRAM-SHA-256: a simple query, a parameterized query, a named
  // prepared statement run twice, a missing table (42P01), a transaction and
  // a query that waits in the server.
  async pg_scram() {
    const { Client } = require('pg');
    return through(+env('PG_PORT'), async (port) => {
      const c = new Client({ host: '127.0.0.1', port, user: env('DB_USER'), password: env('DB_PASSWORD'), database: env('DB_NAME') });
      await c.connect();
      await c.query("SELECT 1 AS one, 'it''s' AS s");
      await c.query('SELECT $1::int + $2::int AS sum', [40, 2]);
      await c.query({ name: 'by_id', text: 'SELECT $1::text AS v', values: ['secret-a'] });
      await c.query({ name: 'by_id', text: 'SELECT $1::text AS v', values: ['secret-b'] });
      await expectError(c.query('SELECT * FROM missing_table WHERE id = 7'), 'missing table');
      await c.query('BEGIN');
      await c.query('CREATE TEMP TABLE items (id int, name text)');
      await c.query("INSERT INTO items VALUES (1, 'a'), (2, 'b')");
      await c.query('UPDATE items SET name = $1 WHERE id > $2', ['z', 0]);
      await c.query('COMMIT');
      await c.query('SELECT pg_sleep(0.02)');
      await c.end();
    });
  },
  // npm postgres (porsager) with trust: its queries are always the extended
  // protocol; several at once are pipelined on the one connection.
  async porsager_trust() {
    const postgres = require('postgres');
    return through(+env('PG_TRUST_PORT'), async (port) => {
      const sql = postgres({ host: '127.0.0.1', port, user: env('DB_USER'), database: env('DB_NAME'), max: 1, fetch_types: false });
      await sql`SELECT 1 AS one`;
      await Promise.all([sql`SELECT ${1}::int AS a`, sql`SELECT ${'x'}::text AS b`, sql`SELECT ${2}::int AS a`]);
      await expectError(sql`SELECT * FROM missing_table`, 'missing table');
      await sql.end();
    });
  },
  // npm mysql2: a text query, a prepared statement executed twice, a missing
  // table (1146), an INSERT (OK with affected rows).
  async mysql2() {
    const mysql = require('mysql2/promise');
    return through(+env('MYSQL_PORT'), async (port) => {
      const c = await mysql.createConnection({ host: '127.0.0.1', port, user: env('DB_USER'), password: env('DB_PASSWORD'), database: env('DB_NAME') });
      await c.query("SELECT 1 + 1 AS two, 'it''s' AS s");
      await c.execute('SELECT ? + ? AS sum', [40, 2]);
      await c.execute('SELECT ? + ? AS sum', [1, 2]);
      await expectError(c.query('SELECT * FROM missing_table WHERE id = 7'), 'missing table');
      await c.query('CREATE TEMPORARY TABLE items (id INT, name VARCHAR(10))');
      await c.query("INSERT INTO items VALUES (1, 'a'), (2, 'b')");
      await c.end();
    });
  },
  // npm ioredis (RESP2): SET/GET, a pipeline, MULTI/EXEC, an error reply.
  async ioredis() {
    const Redis = require('ioredis');
    return through(+env('REDIS_PORT'), async (port) => {
      const r = new Redis({ host: '127.0.0.1', port, lazyConnect: true });
      await r.connect();
      await r.set('user:1', 'alice');
      await r.get('user:1');
      await r.get('user:missing');
      await r.pipeline().set('n', '1').incr('n').get('n').exec();
      await r.multi().set('m', 'x').get('m').exec();
      await expectError(r.incr('user:1'), 'INCR on a string');
      await r.quit();
    });
  },
  // npm redis (node-redis) with RESP3 (HELLO 3): SET/GET, a hash (a map
  // reply), an error reply.
  async node_redis() {
    const { createClient } = require('redis');
    return through(+env('REDIS_PORT'), async (port) => {
      const r = createClient({ url: `redis://127.0.0.1:${port}`, RESP: 3 });
      r.on('error', () => {});
      await r.connect();
      await r.set('user:2', 'bob');
      await r.get('user:2');
      await r.hSet('h', { a: '1', b: '2' });
      await r.hGetAll('h');
      await expectError(r.incr('user:2'), 'INCR on a string');
      await r.close();
    });
  },
};

(async () => {
  const run = scenarios[scenario];
  if (!run) throw new Error(`record.js: no scenario ${scenario} (${Object.keys(scenarios).join(', ')})`);
  const conns = await run();
  const files = [];
  conns.forEach((lines, i) => {
    const name = i === 0 ? `${scenario}.rec` : `${scenario}-${i}.rec`;
    fs.writeFileSync(path.join(outDir, name), lines.join('\n') + '\n');
    files.push(name);
  });
  console.log(JSON.stringify({ marker: 'recorded', scenario, files }));
})().catch((e) => {
  console.error(`record.js ${scenario}: ${e.stack || e}`);
  process.exit(1);
});
