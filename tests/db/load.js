// Load for tests/db/app.js: N requests of each route, C at a time, then
// /quit (unless QUIT=0). Prints {"marker":"sent","route":..,"i":..,"status":..} per request.
//   node load.js PORT N C ROUTE...
'use strict';
const http = require('http');
const [port, n, c, ...routes] = process.argv.slice(2);
const agent = new http.Agent({ keepAlive: true, maxSockets: +c });
const get = (path) => new Promise((resolve, reject) => {
  http.get({ host: '127.0.0.1', port: +port, path, agent }, (res) => {
    res.resume();
    res.on('end', () => resolve(res.statusCode));
  }).on('error', reject);
});
(async () => {
  const jobs = [];
  for (const route of routes) for (let i = 0; i < +n; i++) jobs.push([route, i]);
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const [route, i] = jobs[next++];
      const status = await get(`/${route}/${i}`);
      console.log(JSON.stringify({ marker: 'sent', route, i, status }));
    }
  };
  await Promise.all(Array.from({ length: +c }, worker));
  if (process.env.QUIT !== '0') await get('/quit');
  agent.destroy();
})().catch((e) => { console.error(e); process.exit(1); });
