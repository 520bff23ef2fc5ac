// The app of tests/db_spans.rs: an HTTP service whose routes each run one
// database pattern with a real driver (pg, mysql2, ioredis), one pooled
// connection per server shared by concurrent requests.
//
//   node app.js   with PG_URL, MYSQL_PORT, REDIS_PORT, DB_USER, DB_PASSWORD, DB_NAME
//
// GET /ROUTE/I runs ROUTE for request I; the query names I (an alias, a key)
// so that the test can tell whose operation a span is. Prints
// {"marker":"listening","port":..}; GET /quit ends it.
'use strict';
const http = require('http');

const pg = new (require('pg').Pool)({ connectionString: process.env.PG_URL, max: 1 });
const my = require('mysql2').createPool({
  host: '127.0.0.1', port: +process.env.MYSQL_PORT, user: process.env.DB_USER,
  password: process.env.DB_PASSWORD, database: process.env.DB_NAME, connectionLimit: 1,
});
const redis = new (require('ioredis'))(+process.env.REDIS_PORT, '127.0.0.1');

const routes = {
  pg: (i) => pg.query(`SELECT ${i} AS r${i}`),
  pgparam: (i) => pg.query(`SELECT $1::int AS p${i}`, [i]),
  pgsleep: (i) => pg.query(`SELECT pg_sleep(0.02), ${i} AS s${i}`),
  pgmissing: (i) => pg.query(`SELECT * FROM missing_table_${i}`).then(() => { throw new Error('no error'); }, () => {}),
  pgtx: async (i) => {
    const c = await pg.connect();
    try {
      await c.query('BEGIN');
      await c.query(`SELECT ${i} AS t${i}`);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
  },
  mysql: (i) => my.promise().query(`SELECT ${i} AS m${i}`),
  mysqlprep: (i) => my.promise().execute(`SELECT ? AS e${i}`, [i]),
  redis: (i) => redis.set(`k${i}`, String(i)).then(() => redis.get(`k${i}`)),
  redispipe: (i) => redis.pipeline().set(`q${i}`, 'x').get(`q${i}`).exec(),
  rediserr: (i) => redis.set(`z${i}`, 'abc').then(() => redis.incr(`z${i}`)).then(() => { throw new Error('no error'); }, () => {}),
};

const server = http.createServer((req, res) => {
  const [, route, i] = req.url.split('/');
  if (route === 'quit') {
    res.end('bye');
    server.close();
    Promise.all([pg.end(), my.promise().end()]).then(() => redis.disconnect());
    return;
  }
  const run = routes[route];
  if (!run) {
    res.statusCode = 404;
    return res.end();
  }
  run(+i).then(
    () => { res.statusCode = 200; res.end('ok'); },
    (e) => { res.statusCode = 500; res.end(String(e)); },
  );
});
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ marker: 'listening', port: server.address().port }));
});
