// uvspan demo app: a small HTTP service whose requests read a file and
// resolve a name on the libuv threadpool, with one deliberately slow request
// that blocks the event loop. It drives itself so the demo needs no client.
const http = require('http');
const fs = require('fs');
const dns = require('dns');
const path = require('path');

const dataFile = path.join(__dirname, 'demo-data.json');

const server = http.createServer((req, res) => {
  if (req.url === '/slow') {
    // A synchronous hot spot: blocks the loop for ~120 ms.
    const until = Date.now() + 120;
    while (Date.now() < until) {}
    res.end('slow\n');
    return;
  }
  fs.readFile(dataFile, 'utf8', (err, body) => {
    if (err) { res.statusCode = 500; res.end(err.code); return; }
    dns.lookup('localhost', (err2, address) => {
      fs.stat('/definitely/missing/config.json', () => {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ data: JSON.parse(body), resolved: address || err2.code }));
      });
    });
  });
});

function get(p) {
  return new Promise((resolve) => {
    http.get({ host: '127.0.0.1', port: server.address().port, path: p }, (res) => {
      res.resume();
      res.on('end', resolve);
    });
  });
}

server.listen(0, '127.0.0.1', async () => {
  const rounds = Number(process.argv[2] || 3);
  for (let i = 0; i < rounds; i++) await get('/');
  await get('/slow');
  server.close();
  console.log(`demo: served ${rounds + 1} requests`);
});
