'use strict';
// An HTTP/1.1 server answering at once, and its keep-alive client (4
// connections, one request at a time on each; with PIPELINE=3, three
// requests in one write per connection): writes {"requests": N} to
// $BENCH_OUT when N requests are answered, and exits 2 s later. For
// bench/http1_cost.sh.
const fs = require('fs');
const http = require('http');
const net = require('net');

const N = Number(process.env.REQUESTS || 4000);
const pipeline = Number(process.env.PIPELINE || 1);
const server = http.createServer((req, res) => res.end('ok'));

server.listen(0, '127.0.0.1', () => {
  // Let uvspan attach first.
  setTimeout(() => {
    let answered = 0;
    const conns = 4;
    for (let c = 0; c < conns; c++) {
      const s = net.connect(server.address().port, '127.0.0.1');
      let left = N / conns;
      let got = '';
      const send = () => s.write(`GET /x HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(pipeline));
      s.on('connect', send);
      s.on('data', (d) => {
        got += d;
        let n = 0;
        let at = 0;
        while ((at = got.indexOf('\r\n\r\nok', at)) >= 0) { n++; at += 6; }
        if (n < pipeline) return;
        got = '';
        answered += n;
        left -= n;
        if (answered >= N) {
          fs.writeFileSync(process.env.BENCH_OUT, JSON.stringify({ requests: answered }));
          setTimeout(() => process.exit(0), 2000);
        } else if (left > 0) {
          send();
        }
      });
    }
  }, Number(process.env.WARMUP_MS || 1500));
});
