// app.js as an ES module (tests/sdk_join.rs): `node --import
// @opentelemetry/auto-instrumentations-node/register app.mjs DIR`.
import http from 'node:http';
import fs from 'node:fs';
import dns from 'node:dns';
import path from 'node:path';

const dir = process.argv[2];
const P = (name) => path.join(dir, name);
// The app's own settings, read at the top level (tests/startup.rs: a span).
fs.statSync(P('settings'), { throwIfNoEntry: false });

const server = http.createServer((req, res) => {
  if (req.url === '/quit') {
    res.end('bye');
    server.close();
    setTimeout(() => process.exit(0), +(process.env.QUIT_MS || 1500));
    return;
  }
  const i = req.url.split('/')[2];
  fs.stat(P(`1-${i}`), () => {
    fs.access(P(`2-${i}`), async () => {
      try { await fs.promises.stat(P(`3-${i}`)); } catch {}
      dns.lookup('localhost', () => {
        fs.statSync(P(`4-${i}`), { throwIfNoEntry: false });
        res.end('ok');
      });
    });
  });
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ marker: 'listening', port: server.address().port }) + '\n');
});
