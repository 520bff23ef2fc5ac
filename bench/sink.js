#!/usr/bin/env node
// A tiny OTLP trace receiver for the benchmark: accepts OTLP/gRPC (h2c, the
// TraceService/Export method) and OTLP/HTTP protobuf (POST /v1/traces), answers
// success, and counts requests, bytes and spans. No dependencies.
//
// Spans are counted by walking the protobuf just deep enough:
//   ExportTraceServiceRequest.resource_spans(1) -> ResourceSpans.scope_spans(2)
//   -> ScopeSpans.spans(2)        (opentelemetry-proto trace/v1)
// Each span is skipped by its length, so the cost is per span, not per byte.
//
// Prints one JSON line on stdout once listening: {"grpc":PORT,"http":PORT}.
// GET /stats on the HTTP port returns the counters (JSON); the process's own
// CPU time is in them too, so the harness can report what the receiver cost.
'use strict';
const http = require('http');
const http2 = require('http2');
const zlib = require('zlib');

const stats = {
  grpc: { requests: 0, bytes: 0, spans: 0 },
  http: { requests: 0, bytes: 0, spans: 0 },
  errors: 0,
  other_requests: 0, // gRPC exports that are not traces (metrics)
};

function varint(buf, pos) {
  let v = 0, mul = 1, b;
  do {
    if (pos >= buf.length) throw new Error('truncated varint');
    b = buf[pos++];
    v += (b & 0x7f) * mul;
    mul *= 128;
  } while (b & 0x80);
  return [v, pos];
}

// Calls fn(field, start, end) for each length-delimited field of buf[start,end).
function eachLen(buf, start, end, fn) {
  let pos = start;
  while (pos < end) {
    let key;
    [key, pos] = varint(buf, pos);
    const field = Math.floor(key / 8), wt = key & 7;
    if (wt === 0) { [, pos] = varint(buf, pos); }
    else if (wt === 1) pos += 8;
    else if (wt === 5) pos += 4;
    else if (wt === 2) {
      let len;
      [len, pos] = varint(buf, pos);
      fn(field, pos, pos + len);
      pos += len;
    } else throw new Error(`wire type ${wt}`);
  }
}

function countSpans(buf) {
  let n = 0;
  eachLen(buf, 0, buf.length, (f, s, e) => {
    if (f !== 1) return; // ResourceSpans
    eachLen(buf, s, e, (f2, s2, e2) => {
      if (f2 !== 2) return; // ScopeSpans
      eachLen(buf, s2, e2, (f3) => { if (f3 === 2) n++; });
    });
  });
  return n;
}

function account(kind, body) {
  const st = stats[kind];
  st.requests++;
  st.bytes += body.length;
  try { st.spans += countSpans(body); } catch { stats.errors++; }
}

// ---- OTLP/gRPC over h2c ----
const grpcServer = http2.createServer();
grpcServer.on('stream', (stream, headers) => {
  // Only trace exports count; uvspan's own health metrics (MetricsService/Export)
  // have the same field numbers and would otherwise be counted as spans.
  const traces = String(headers[':path'] || '').endsWith('TraceService/Export');
  const chunks = [];
  stream.on('data', (c) => chunks.push(c));
  stream.on('end', () => {
    const raw = Buffer.concat(chunks);
    let off = 0;
    while (off + 5 <= raw.length) {
      const compressed = raw[off];
      const len = raw.readUInt32BE(off + 1);
      let msg = raw.subarray(off + 5, off + 5 + len);
      off += 5 + len;
      if (compressed) {
        try { msg = zlib.gunzipSync(msg); } catch { stats.errors++; continue; }
      }
      if (traces) account('grpc', msg);
      else stats.other_requests++;
    }
    if (!stream.destroyed) {
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
      stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
      stream.end(Buffer.alloc(5)); // an empty ExportTraceServiceResponse
    }
  });
  stream.on('error', () => { stats.errors++; });
});
grpcServer.on('sessionError', () => { stats.errors++; });

// ---- OTLP/HTTP protobuf, and /stats ----
const httpServer = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/stats') {
    const u = process.cpuUsage();
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ ...stats, cpu_us: u.user + u.system, rss: process.memoryUsage().rss }));
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let body = Buffer.concat(chunks);
    if (req.headers['content-encoding'] === 'gzip') {
      try { body = zlib.gunzipSync(body); } catch { stats.errors++; }
    }
    if (req.method === 'POST' && req.url.startsWith('/v1/traces')) {
      account('http', body);
      res.writeHead(200, { 'content-type': 'application/x-protobuf' });
      res.end();
    } else {
      res.writeHead(404);
      res.end();
    }
  });
});
httpServer.keepAliveTimeout = 60000;

grpcServer.listen(Number(process.env.SINK_GRPC_PORT || 0), '127.0.0.1', () => {
  httpServer.listen(Number(process.env.SINK_HTTP_PORT || 0), '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ grpc: grpcServer.address().port, http: httpServer.address().port }) + '\n');
  });
});
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
