#!/usr/bin/env node
// V8 garbage collections: allocates short-lived objects (scavenges, with a
// slowly growing retained set: mark-compacts and incremental marking) for
// BENCH_SECONDS (default 3), counting the collections Node itself reports
// (perf_hooks 'gc' entries), then writes {"gcs":N,"minor":…,…} to the file
// BENCH_OUT and stays idle BENCH_LINGER_MS (default 2000) so the programs'
// counters can be read while they are still loaded. Starts after
// BENCH_DELAY_MS (default 1500), time for uvspan to attach with --pid.
'use strict';
const fs = require('fs');
const { PerformanceObserver, constants } = require('perf_hooks');
const secs = Number(process.env.BENCH_SECONDS || 3);
const linger = Number(process.env.BENCH_LINGER_MS || 2000);
const delay = Number(process.env.BENCH_DELAY_MS || 1500);
const kinds = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};
const counts = { gcs: 0, minor: 0, major: 0, incremental: 0, weakcb: 0 };
let counting = false;
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    if (!counting) continue;
    counts.gcs++;
    counts[kinds[e.detail.kind]]++;
  }
}).observe({ entryTypes: ['gc'] });
const t = setInterval(() => {}, 1000);
let kept = [];
function chunk(end) {
  // 50 ms of allocation per loop iteration.
  const stop = Math.min(end, Date.now() + 50);
  while (Date.now() < stop) {
    const batch = [];
    for (let i = 0; i < 1000; i++) batch.push({ i, s: 'x' + i });
    kept.push(batch);
    if (kept.length > 3000) kept = kept.slice(1500);
  }
  if (Date.now() < end) return setImmediate(() => chunk(end));
  // The observer's entries of the last collections arrive on a later tick.
  setTimeout(() => {
    counting = false;
    fs.writeFileSync(process.env.BENCH_OUT || '/dev/stdout', JSON.stringify(counts) + '\n');
    setTimeout(() => clearInterval(t), linger);
  }, 100);
}
setTimeout(() => {
  counting = true;
  chunk(Date.now() + secs * 1000);
}, delay);
