'use strict';
// The other side of tests/realcode/app.js, not traced.
//
//   node driver.js upstream          an upstream HTTP server; prints {"marker":"upstream","port":..}
//                                    and serves until its stdin closes
//   node driver.js load PORT N C ROUTE...
//                                    per route, N requests one at a time, then N more C at a time
//                                    (keep-alive), each /ROUTE/<i>; a line per answer:
//                                    {"marker":"req","route":..,"i":..,"status":..}; then GET /quit
const http = require('http');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const [mode, ...args] = process.argv.slice(2);

if (mode === 'upstream') {
  const s = http.createServer((req, res) => setTimeout(() => res.end(`up ${req.url}\n`), 2));
  s.listen(0, '127.0.0.1', () => out({ marker: 'upstream', port: s.address().port }));
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
} else if (mode === 'load') {
  const [portArg, nArg, cArg, ...routes] = args;
  const port = +portArg, N = +nArg, C = +cArg;
  const agent = new http.Agent({ keepAlive: true, maxSockets: C });
  const get = (p) =>
    new Promise((resolve, reject) => {
      const r = http.get({ host: '127.0.0.1', port, path: p, agent }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      });
      r.on('error', reject);
      r.setTimeout(20000, () => r.destroy(new Error(`timeout ${p}`)));
    });
  const one = async (route, i) => out({ marker: 'req', route, i, status: await get(`/${route}/${i}`) });
  (async () => {
    for (const route of routes) {
      for (let i = 0; i < N; i++) await one(route, i);
      let next = N;
      const lane = async () => { while (next < 2 * N) await one(route, next++); };
      await Promise.all(Array.from({ length: C }, lane));
    }
    await get('/quit').catch(() => {});
    agent.destroy();
    out({ marker: 'done' });
  })().catch((e) => { console.error(e); process.exit(3); });
} else {
  console.error('usage: driver.js upstream | load PORT N C ROUTE...');
  process.exit(2);
}
