'use strict';
// HTTP/2 server streams: an h2c server (this process, the one traced)
// answers each stream at once; a driver in a child process opens SESSIONS
// (default 4) sessions and sends STREAMS (default 40000) GET streams, 16 at
// a time, each with a traceparent (FLAG, default 00: not sampled by its
// caller). Writes {"port": N} to $BENCH_OUT when listening and
// {"port": N, "streams": N} when they are answered, and exits 1 s later.
// For bench/h2_server_cost.sh.
const fs = require('fs');
const http2 = require('http2');
const { spawn } = require('child_process');

const sessions = Number(process.env.SESSIONS || 4);
const total = Number(process.env.STREAMS || 40000);
const flag = process.env.FLAG || '00';
const out = (o) => fs.writeFileSync(process.env.BENCH_OUT, JSON.stringify(o) + '\n');

const server = http2.createServer();
server.on('stream', (st) => {
  st.respond({ ':status': 200, 'content-type': 'text/plain' });
  st.end('ok');
});
server.listen(0, '127.0.0.1', () => {
  const port = server.address().port;
  out({ port });
  // Started when uvspan has attached (the script's caller writes GO).
  const wait = setInterval(() => {
    if (!fs.existsSync(process.env.BENCH_OUT + '.go')) return;
    clearInterval(wait);
    const driver = spawn(process.execPath, ['-e', `
      const http2 = require('http2');
      const crypto = require('crypto');
      let sent = 0, done = 0;
      const per = Math.ceil(${total} / ${sessions});
      for (let s = 0; s < ${sessions}; s++) {
        const c = http2.connect('http://127.0.0.1:${port}');
        let mine = 0;
        const one = () => {
          if (mine >= per || sent >= ${total}) return;
          mine++; sent++;
          const tp = '00-' + crypto.randomBytes(16).toString('hex') + '-' + crypto.randomBytes(8).toString('hex') + '-${flag}';
          const r = c.request({ ':path': '/item/' + sent, traceparent: tp });
          r.resume();
          r.on('end', () => { if (++done === ${total}) process.exit(0); one(); });
        };
        for (let k = 0; k < 4; k++) one();
      }`], { stdio: 'inherit' });
    driver.on('exit', () => {
      out({ port, streams: total });
      setTimeout(() => process.exit(0), 1000);
    });
  }, 20);
});
