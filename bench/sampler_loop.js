#!/usr/bin/env node
// The stack sampler's cost when no iteration is slow: a loop that iterates
// every ~0.5 ms, each iteration a fixed chunk of pure JS work (no fs, DNS or
// sockets: the only probe hit per iteration is the loop's own epoll wait,
// the same with the sampler on or off). Reads commands on stdin so one
// process can be measured with and without the sampler alternately (uvspan
// attaches with --pid and detaches between windows), with the same JIT state:
//   "run MS" -> {"chunks":N,"cpu_ns_per_chunk":..,"wall_ms":..}
'use strict';
const readline = require('readline');

const CHUNK = Number(process.env.BENCH_CHUNK || 300000);
let sink = 0;

// One chunk: integer arithmetic V8 cannot fold away (the result is kept).
function chunk() {
  let x = sink | 0;
  for (let i = 0; i < CHUNK; i++) x = (Math.imul(x ^ i, 2654435761) + 0x9e3779b9) | 0;
  sink = x;
}

function run(ms, done) {
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const end = t0 + BigInt(ms) * 1000000n;
  let n = 0;
  const step = () => {
    chunk();
    n++;
    if (process.hrtime.bigint() < end) setImmediate(step);
    else {
      const c1 = process.cpuUsage(c0);
      done({ chunks: n, cpu_ns_per_chunk: ((c1.user + c1.system) * 1000) / n, wall_ms: Number(process.hrtime.bigint() - t0) / 1e6 });
    }
  };
  setImmediate(step);
}

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'run') run(Number(arg), (r) => process.stdout.write(JSON.stringify(r) + '\n'));
  else if (cmd === 'exit') process.exit(0);
});
rl.on('close', () => process.exit(0));
process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');
