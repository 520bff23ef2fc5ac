#!/usr/bin/env node
// The app under test: an HTTP server whose handler reads a file
// (fs.readFile: open, fstat, read, close on the threadpool) and resolves
// localhost (dns.lookup: getaddrinfo on the threadpool) per request.
// Prints {"port":N} on stdout once listening.
'use strict';
const http = require('http');
const fs = require('fs');
const dns = require('dns');

const FILE = process.env.BENCH_FILE || __filename;

const server = http.createServer((req, res) => {
  fs.readFile(FILE, (err, data) => {
    if (err) { res.statusCode = 500; res.end(String(err)); return; }
    dns.lookup('localhost', (err2, address) => {
      if (err2) { res.statusCode = 500; res.end(String(err2)); return; }
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ bytes: data.length, address }));
    });
  });
});
server.keepAliveTimeout = 60000;
server.listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port, pid: process.pid }) + '\n');
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
process.on('SIGINT', () => process.exit(0));
