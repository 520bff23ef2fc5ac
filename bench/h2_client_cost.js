'use strict';
// HTTP/2 client streams under requests: an HTTP/1.1 server (this process,
// the one traced) whose handler makes CALLS (default 2) h2c calls at once
// to a backend in a child process and answers when they end; a driver in
// another child process sends REQUESTS (default 2000) requests, 8 at a
// time, each with a traceparent. Writes {"streams": N} to $BENCH_OUT when
// they are answered, and exits 2 s later. For bench/h2_client_cost.sh.
const fs = require('fs');
const http = require('http');
const http2 = require('http2');
const { spawn } = require('child_process');

const calls = Number(process.env.CALLS || 2);
const total = Number(process.env.REQUESTS || 2000);
const child = (code) => spawn(process.execPath, ['-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
const backend = child(`
  const s = require('http2').createServer();
  s.on('stream', (st) => { st.respond({ ':status': 200 }); st.end('ok'); });
  s.listen(0, '127.0.0.1', () => console.log(s.address().port));`);

backend.stdout.once('data', (port) => {
  const session = http2.connect(`http://127.0.0.1:${Number(port)}`);
  let streams = 0;
  const front = http.createServer((req, res) => {
    let left = calls;
    if (!left) return res.end('x');
    for (let k = 0; k < calls; k++) {
      const h = session.request({ ':path': req.url, traceparent: req.headers.traceparent });
      streams++;
      h.resume();
      h.on('end', () => { if (--left === 0) res.end('x'); });
    }
  });
  front.listen(0, '127.0.0.1', () => {
    // Let uvspan attach first.
    setTimeout(() => {
      const driver = child(`
        const http = require('http');
        const crypto = require('crypto');
        const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
        let sent = 0, done = 0;
        const one = () => {
          if (sent >= ${total}) return;
          const traceparent = '00-' + crypto.randomBytes(16).toString('hex') + '-00f067aa0ba902b7-01';
          http.get({ host: '127.0.0.1', port: ${front.address().port}, path: '/r/' + sent++, agent, headers: { traceparent } }, (r) => {
            r.resume();
            r.on('end', () => { if (++done === ${total}) process.exit(0); one(); });
          });
        };
        for (let k = 0; k < 8; k++) one();`);
      driver.on('exit', () => {
        fs.writeFileSync(process.env.BENCH_OUT, JSON.stringify({ streams }) + '\n');
        setTimeout(() => { session.close(); front.close(); backend.kill(); }, 2000);
      });
    }, 1500);
  });
});
