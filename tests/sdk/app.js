'use strict';
// An HTTP app for tests/sdk_join.rs, CommonJS, instrumented the zero-code way
// by the test (`node --require @opentelemetry/auto-instrumentations-node/register`,
// run from this folder), never changed for uvspan. app.mjs is the same app as
// an ES module.
//   node app.js DIR
// GET /r/<i>: fs.stat(DIR/1-i) -> fs.access(DIR/2-i) -> await
// fs.promises.stat(DIR/3-i) -> dns.lookup(localhost) -> fs.statSync(DIR/4-i)
// -> "ok". GET /quit: answers, stops listening, and exits QUIT_MS later (the
// SDK exports on its own schedule meanwhile). Prints
// {"marker":"listening","port":..} once it listens. At the top level it
// stats DIR/settings.
const http = require('http');
const fs = require('fs');
const dns = require('dns');
const path = require('path');

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
