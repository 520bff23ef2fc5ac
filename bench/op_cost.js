#!/usr/bin/env node
// Async fs.stat calls, one after another (each callback starts the next):
// every one is a submit and a completion probe hit, in a task (the first
// callback of a timer). Prints {"ops":N} after BENCH_SECONDS (default 3) to
// the file BENCH_OUT, then stays idle BENCH_LINGER_MS (default 2000) so the
// programs' counters can be read while they are still loaded. Starts after
// BENCH_DELAY_MS (default 1500), time for uvspan to attach with --pid.
'use strict';
const fs = require('fs');
const secs = Number(process.env.BENCH_SECONDS || 3);
const linger = Number(process.env.BENCH_LINGER_MS || 2000);
const delay = Number(process.env.BENCH_DELAY_MS || 1500);
let n = 0;
let end = 0;
function next() {
  if (Date.now() < end) {
    fs.stat(__filename, () => { n++; next(); });
  } else {
    fs.writeFileSync(process.env.BENCH_OUT || '/dev/stdout', JSON.stringify({ ops: n }) + '\n');
    setTimeout(() => {}, linger);
  }
}
setTimeout(() => { end = Date.now() + secs * 1000; next(); }, delay);
