#!/usr/bin/env node
// Sidecar throughput: issues fs.statSync at a fixed rate (one span each).
// Waits for "go RATE SECONDS" on stdin (so uvspan can attach first), paces in
// 1 ms slices without an event loop (Atomics.wait), then prints
//   {"ops":N,"seconds":S,"rate":R}
// and waits for "exit" (or stdin closing). RATE 0 = as fast as possible.
'use strict';
const fs = require('fs');
const readline = require('readline');

const PATH = process.env.BENCH_FILE || __filename;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function drive(rate, seconds) {
  const t0 = process.hrtime.bigint();
  const end = t0 + BigInt(Math.round(seconds * 1e9));
  let ops = 0;
  for (;;) {
    const now = process.hrtime.bigint();
    if (now >= end) break;
    if (rate > 0) {
      const owed = Math.floor((Number(now - t0) / 1e9) * rate) - ops;
      if (owed <= 0) { Atomics.wait(sleeper, 0, 0, 1); continue; }
      for (let i = 0; i < owed; i++) fs.statSync(PATH);
      ops += owed;
    } else {
      for (let i = 0; i < 1000; i++) fs.statSync(PATH);
      ops += 1000;
    }
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  return { ops, seconds: secs, rate: ops / secs };
}

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  const [cmd, a, b] = line.trim().split(/\s+/);
  if (cmd === 'go') process.stdout.write(JSON.stringify(drive(Number(a), Number(b))) + '\n');
  else if (cmd === 'exit') process.exit(0);
});
rl.on('close', () => process.exit(0));
process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');
