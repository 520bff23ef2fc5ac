#!/usr/bin/env node
// Loop iterations. BENCH_MODE=saturated (default): as many as the loop can
// make, a setImmediate chain (every iteration polls with timeout 0 and runs
// its phases); BENCH_MODE=paced: a 1 ms timer chain (every iteration sleeps
// in a blocking epoll wait and wakes up). Prints {"iterations":N} after
// BENCH_SECONDS (default 3) to the file BENCH_OUT, then stays idle
// BENCH_LINGER_MS (default 2000) so the programs' counters can be read while
// they are still loaded. Starts after BENCH_DELAY_MS (default 1500), time for
// uvspan to attach with --pid.
'use strict';
const fs = require('fs');
const secs = Number(process.env.BENCH_SECONDS || 3);
const linger = Number(process.env.BENCH_LINGER_MS || 2000);
const delay = Number(process.env.BENCH_DELAY_MS || 1500);
let n = 0;
let end = 0;
const t = setInterval(() => {}, 1000);
const paced = process.env.BENCH_MODE === 'paced';
function tick() {
  n++;
  if (Date.now() < end) {
    if (paced) setTimeout(tick, 1);
    else setImmediate(tick);
  }
  else {
    fs.writeFileSync(process.env.BENCH_OUT || '/dev/stdout', JSON.stringify({ iterations: n }) + '\n');
    setTimeout(() => clearInterval(t), linger);
  }
}
setTimeout(() => {
  end = Date.now() + secs * 1000;
  setImmediate(tick);
}, delay);
