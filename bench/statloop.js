#!/usr/bin/env node
// Per-operation cost: a tight fs.statSync loop. Reads commands on stdin so one
// process can be measured bare and under uvspan alternately (uvspan attaches
// with --pid and detaches between rounds), with the same JIT state:
//   "run N"  -> {"n":N,"wall_ns_per_op":..,"cpu_ns_per_op":..}
'use strict';
const fs = require('fs');
const readline = require('readline');

const PATH = process.env.BENCH_FILE || __filename;

function run(n) {
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) fs.statSync(PATH);
  const t1 = process.hrtime.bigint();
  const c1 = process.cpuUsage(c0);
  return { n, wall_ns_per_op: Number(t1 - t0) / n, cpu_ns_per_op: ((c1.user + c1.system) * 1000) / n };
}

const rl = readline.createInterface({ input: process.stdin });
rl.on('line', (line) => {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'run') process.stdout.write(JSON.stringify(run(Number(arg))) + '\n');
  else if (cmd === 'exit') process.exit(0);
});
rl.on('close', () => process.exit(0));
process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');
