#!/usr/bin/env node
// The uvspan benchmark harness (run it through scripts/bench.sh).
//
//   node bench/run.js --uvspan PATH --node PATH [--quick] [--out DIR]
//
// 1. overhead:   app CPU per request and p99 latency: (a) bare, (b) under
//                uvspan -> OTLP, (c) OpenTelemetry JS SDK -> OTLP; interleaved;
//                paced load, then saturated (closed loop, `--only saturated`).
// 2. statloop:   fs.statSync ns/op, bare vs under uvspan, same process.
// 2b. sampler:   the stack sampler's cost with no slow iteration: a loop of
//                short pure-JS iterations, stacks on vs off, same process.
// 3. throughput: uvspan CPU per span, RSS and loss at increasing op rates.
// 4. attach:     time from `uvspan --pid` start to "tracing" (warm; cold page
//                cache with and without the symbol cache), and the wall time
//                `uvspan -- node -e 0` adds, start to exit.
// Writes results.json and results.md into --out (default bench/results).
'use strict';
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const http = require('http');

const BENCH = __dirname;
const ROOT = path.resolve(BENCH, '..');

// ---------------------------------------------------------------- options
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const QUICK = argv.includes('--quick');
const UVSPAN = opt('--uvspan', path.join(ROOT, 'target/release/uvspan'));
const NODE = opt('--node', process.execPath);
const OUT = opt('--out', path.join(BENCH, 'results', QUICK ? 'quick' : ''));
const ONLY = (opt('--only', '') || '').split(',').filter(Boolean); // e.g. --only overhead,attach
// Analysis knobs for the throughput part: where uvspan sends spans (otlp: the
// sink; console: stdout to /dev/null; down: an OTLP endpoint nobody listens
// on), the op rates, and `perf record` of uvspan during each step.
const DEST = opt('--dest', 'otlp');
const RATES = opt('--rates', null);
const PERF = argv.includes('--perf');
const env = (k, d) => (process.env[k] !== undefined && process.env[k] !== '' ? Number(process.env[k]) : d);

const CFG = QUICK
  ? {
      overhead: { rounds: 1, warm_s: 1, measure_s: 2, rate: 1000, conns: 10 },
      statloop: { rounds: 1, ops: 100000, warm_ops: 50000 },
      sampler: { rounds: 1, window_ms: 1000 },
      throughput: { rates: [10000, 50000], seconds: 1.5 },
      attach: { trials: 2, wall_trials: 3 },
    }
  : {
      overhead: {
        rounds: env('BENCH_ROUNDS', 5),
        warm_s: 2,
        measure_s: env('BENCH_SECONDS', 6),
        rate: env('BENCH_RATE', 1000),
        conns: 10,
      },
      statloop: { rounds: env('BENCH_ROUNDS', 5), ops: 300000, warm_ops: 300000 },
      sampler: { rounds: env('BENCH_SAMPLER_ROUNDS', 9), window_ms: 3000 },
      throughput: { rates: [10000, 25000, 50000, 100000, 150000, 200000, 300000, 0], seconds: env('BENCH_TP_SECONDS', 5) },
      attach: { trials: 7, wall_trials: 21 },
    };
if (RATES) CFG.throughput.rates = RATES.split(',').map(Number);
const want = (part) => ONLY.length === 0 || ONLY.includes(part);

// ---------------------------------------------------------------- helpers
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
const round = (x, d = 3) => (x === null || x === undefined || !Number.isFinite(x) ? null : Number(x.toFixed(d)));
const log = (...a) => process.stderr.write(`bench: ${a.join(' ')}\n`);

/** Line reader over a child's stream: next(pred, timeoutMs) resolves with the first matching line. */
function lines(stream, keep) {
  const queue = [];
  const waiters = [];
  let buf = '';
  stream.setEncoding('utf8');
  stream.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (keep) keep.push(l);
      const w = waiters.findIndex((x) => x.pred(l));
      if (w >= 0) {
        const [x] = waiters.splice(w, 1);
        clearTimeout(x.timer);
        x.resolve(l);
      } else queue.push(l);
    }
  });
  return {
    next(pred = () => true, timeoutMs = 30000, what = 'a line') {
      const i = queue.findIndex(pred);
      if (i >= 0) return Promise.resolve(queue.splice(i, 1)[0]);
      return new Promise((resolve, reject) => {
        const x = { pred, resolve };
        x.timer = setTimeout(() => {
          waiters.splice(waiters.indexOf(x), 1);
          reject(new Error(`timed out waiting for ${what}`));
        }, timeoutMs);
        waiters.push(x);
      });
    },
  };
}
const json = (l) => { try { return JSON.parse(l); } catch { return null; } };
const exited = (child) =>
  child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve(child.exitCode)
    : new Promise((r) => child.once('exit', (c) => r(c)));

/** Start a node script that prints a JSON line when ready. */
async function startNode(args, extraEnv = {}, withStdin = false) {
  const child = spawn(NODE, args, {
    cwd: BENCH,
    env: { ...process.env, ...extraEnv },
    stdio: [withStdin ? 'pipe' : 'ignore', 'pipe', 'inherit'],
  });
  const out = lines(child.stdout);
  const first = json(await out.next((l) => json(l) !== null, 30000, `${args.join(' ')} to start`));
  return { child, out, info: first, pid: first.pid || child.pid };
}

async function stop(child, sig = 'SIGTERM', graceMs = 10000) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill(sig);
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited(child);
  clearTimeout(t);
}

// ---- /proc
function procCpu(pid) {
  // utime+stime (clock ticks) of the whole process, and the exact on-CPU time
  // (ns) summed over its threads' schedstat.
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(f[11]) + Number(f[12]);
  let ns = 0;
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    try { ns += Number(fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]); } catch {}
  }
  return { ticks, ns };
}
const HZ = 100;
function procMem(pid) {
  const m = {};
  for (const l of fs.readFileSync(`/proc/${pid}/status`, 'utf8').split('\n')) {
    const r = /^(VmRSS|VmHWM|RssAnon|RssFile|RssShmem):\s+(\d+) kB/.exec(l);
    if (r) m[r[1]] = Number(r[2]) * 1024;
  }
  return m;
}
// Proportional set size (smaps_rollup), and the RSS of the BPF maps mapped
// into the process (smaps). The kernel maps a ring buffer's data pages twice
// in a row (a record that wraps its end reads as one piece), so RSS counts
// them twice and PSS once.
function procPss(pid) {
  const m = { Pss: 0, BpfMapRss: 0 };
  const r = /^Pss:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
  if (r) m.Pss = Number(r[1]) * 1024;
  let bpf = false;
  for (const l of fs.readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(l)) bpf = l.endsWith('anon_inode:bpf-map');
    else if (bpf && l.startsWith('Rss:')) m.BpfMapRss += Number(l.split(/\s+/)[1]) * 1024;
  }
  return m;
}

// ---- sink
let SINK;
async function startSink() {
  const s = await startNode([path.join(BENCH, 'sink.js')]);
  SINK = { ...s, grpc: s.info.grpc, http: s.info.http, pid: s.child.pid };
  return SINK;
}
function sinkStats() {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port: SINK.http, path: '/stats' }, (res) => {
        let b = '';
        res.on('data', (d) => (b += d));
        res.on('end', () => {
          const s = JSON.parse(b);
          s.spans = s.grpc.spans + s.http.spans;
          s.bytes = s.grpc.bytes + s.http.bytes;
          s.requests = s.grpc.requests + s.http.requests;
          resolve(s);
        });
      })
      .on('error', reject);
  });
}
async function sinkQuiet(quietMs = 1500, maxMs = 15000) {
  // Waits until the sink's span count has not moved for quietMs.
  const t0 = Date.now();
  let last = (await sinkStats()).spans, since = Date.now();
  while (Date.now() - t0 < maxMs) {
    await sleep(250);
    const n = (await sinkStats()).spans;
    if (n !== last) { last = n; since = Date.now(); }
    else if (Date.now() - since >= quietMs) break;
  }
  return last;
}

// ---- uvspan
const OTLP_PROTOCOL = process.env.BENCH_OTLP_PROTOCOL || 'grpc';
function endpoint() {
  return OTLP_PROTOCOL === 'grpc' ? `http://127.0.0.1:${SINK.grpc}` : `http://127.0.0.1:${SINK.http}`;
}
const COST_RE = /^uvspan: the probes' cost .*?: pid \d+: ([-+\d.]+)% while live .*?, ([\d.]+)% of its work seen live: ([-+\d.]+)%/;
const SUMMARY_RE =
  /spans: (\d+) exported, (\d+) dropped[^,]*, (\d+) failed to export, (\d+) not flushed; (\d+) records lost in the kernel[^,]*, (\d+) undecodable/;
async function startUvspan(args, { otlp = true, env = {}, bin = UVSPAN } = {}) {
  const full = [...args];
  if (otlp) full.unshift('--otlp-endpoint', endpoint(), '--otlp-protocol', OTLP_PROTOCOL);
  const t0 = process.hrtime.bigint();
  const errLines = [];
  const child = spawn(bin, full, {
    env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: '', ...env },
    stdio: ['ignore', otlp ? 'ignore' : 'pipe', 'pipe'],
  });
  if (!otlp) child.stdout.resume();
  const err = lines(child.stderr, errLines);
  const exitP = exited(child);
  const line = await Promise.race([
    err.next((l) => /^uvspan: tracing /.test(l), 30000, 'uvspan to attach'),
    exitP.then((c) => { throw new Error(`uvspan exited (${c}) before tracing: ${errLines.join(' | ')}`); }),
  ]);
  const ready_ms = Number(process.hrtime.bigint() - t0) / 1e6;
  // "N/M probes attached in X ms" or "N probes live X ms after it was found"
  const m = /attached in ([\d.]+) ms/.exec(line) || /live ([\d.]+) ms/.exec(line);
  const probes = /(\d+)\/(\d+) probes/.exec(line) || /(\d+) probes live/.exec(line);
  return {
    child,
    pid: child.pid,
    ready_ms,
    attach_ms_internal: m ? Number(m[1]) : null,
    probes: probes ? (probes[2] ? `${probes[1]}/${probes[2]}` : probes[1]) : null,
    errLines,
    async done(sig) {
      if (sig) await stop(child, sig, 20000);
      else await exitP;
      await sleep(50); // let stderr drain
      const s = errLines.map((l) => SUMMARY_RE.exec(l)).find(Boolean);
      // --max-overhead / --sample-time: the CPU uvspan estimates its probes
      // add at the share in force, in % of the app's own (the first process).
      const cost = errLines.map((l) => COST_RE.exec(l)).find(Boolean);
      return s
        ? { exported: +s[1], dropped: +s[2], failed: +s[3], unflushed: +s[4], lost_kernel: +s[5], undecodable: +s[6],
            ...(cost ? { cost_live_pct: +cost[1], cost_share_pct: +cost[2], cost_added_pct: +cost[3] } : {}) }
        : { error: `no summary line: ${errLines.slice(-3).join(' | ')}` };
    },
  };
}

// The bare run of a round (run first in each round's configurations).
function bareOfRound(runs, round) {
  return runs.find((y) => y.round === round && y.config === 'bare') || { cpu_us_per_req: NaN };
}

// ---- wrk
function runWrk(port, seconds, rate, conns) {
  const delay = rate > 0 ? Math.max(0, Math.round((conns * 1000) / rate)) : 0;
  return new Promise((resolve, reject) => {
    const child = spawn('wrk', ['-t1', `-c${conns}`, `-d${seconds}s`, '--timeout', '5s', '-s', path.join(BENCH, 'pace.lua'), `http://127.0.0.1:${port}/`], {
      env: { ...process.env, BENCH_DELAY_MS: String(delay) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.on('exit', () => {
      const m = /WRKJSON (\{.*\})/.exec(out);
      if (!m) return reject(new Error(`wrk: no summary: ${out}`));
      resolve(JSON.parse(m[1]));
    });
  });
}

// ---- bpf
function bpftool(args) {
  try { return JSON.parse(execFileSync('bpftool', [...args, '--json'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })); }
  catch { return null; }
}
function foreignUprobes(exclude = []) {
  const list = bpftool(['perf', 'list']) || [];
  const ours = new Set(exclude);
  const up = list.filter((p) => /uprobe/.test(p.fd_type || '') && !ours.has(p.pid));
  const byFile = {};
  for (const p of up) byFile[p.filename] = (byFile[p.filename] || 0) + 1;
  return { count: up.length, owners: [...new Set(up.map((p) => p.pid))], by_file: byFile };
}
function progStatsOf(ownerPid) {
  // uvspan's own programs: the BPF program fds it holds (/proc/PID/fdinfo has
  // prog_id, run_cnt, run_time_ns); names from bpftool.
  const names = {};
  for (const p of bpftool(['prog', 'show']) || []) names[p.id] = p.name;
  const out = {};
  for (const fd of fs.readdirSync(`/proc/${ownerPid}/fdinfo`)) {
    let info;
    try { info = fs.readFileSync(`/proc/${ownerPid}/fdinfo/${fd}`, 'utf8'); } catch { continue; }
    if (!/^prog_type:/m.test(info)) continue;
    const num = (k) => Number((new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(info) || [])[1] || 0);
    const id = num('prog_id');
    const name = names[id] || `prog_${id}`;
    out[name] = { run_cnt: num('run_cnt'), run_time_ns: num('run_time_ns') };
  }
  return out;
}
function sysctl(name, value) {
  const f = `/proc/sys/${name.replace(/\./g, '/')}`;
  try {
    const old = fs.readFileSync(f, 'utf8').trim();
    if (value !== undefined) fs.writeFileSync(f, String(value));
    return old;
  } catch { return null; }
}

// ---------------------------------------------------------------- machine
function machine() {
  const cpuinfo = fs.readFileSync('/proc/cpuinfo', 'utf8');
  const model = (/model name\s*:\s*(.*)/.exec(cpuinfo) || [])[1] || null;
  const mhz = (/cpu MHz\s*:\s*(.*)/.exec(cpuinfo) || [])[1] || null;
  const sh = (cmd, args) => { try { return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim(); } catch (e) { return (e.stdout || e.stderr || '').toString().trim() || null; } };
  const git = sh('git', ['-C', ROOT, 'rev-parse', '--short', 'HEAD']);
  const dirty = sh('git', ['-C', ROOT, 'status', '--porcelain', '--', 'src', 'bpf', 'Cargo.toml', 'Cargo.lock', 'build.rs']);
  return {
    nproc: os.cpus().length,
    model_name: model,
    cpu_mhz: mhz ? Number(mhz) : null,
    mem_total_mib: Math.round(os.totalmem() / 1048576),
    kernel: os.release(),
    os: (sh('sh', ['-c', '. /etc/os-release && echo "$PRETTY_NAME"']) || '').trim(),
    node: sh(NODE, ['--version']),
    node_binary: NODE,
    wrk: (sh('wrk', ['--version']) || '').split('\n')[0].replace(/ Copyright.*/, ''),
    uvspan_commit: git ? `${git}${dirty ? ' (+ uncommitted changes in src/bpf)' : ''}` : null,
    uvspan_binary: UVSPAN,
    otlp_protocol: OTLP_PROTOCOL,
    loadavg_start: os.loadavg().map((x) => round(x, 2)),
    hw_counters: 'none (VM): CPU times from /proc',
  };
}

// The kernel's uprobe traps alone (configuration kernel_traps): counting perf
// uprobes (perf_uprobes.py: the uprobe PMU, no BPF program, no tracefs) at
// every point of uvspan's plan for the app. done() detaches them and gives
// the hits they counted.
async function startPerfUprobes(pid) {
  const plan = execFileSync(UVSPAN, ['probes', '--pid', String(pid), '--json'], { encoding: 'utf8' });
  const child = spawn('python3', [path.join(BENCH, 'perf_uprobes.py'), String(pid)], { stdio: ['pipe', 'pipe', 'pipe'] });
  const errLines = [];
  lines(child.stderr, errLines);
  const out = lines(child.stdout);
  child.stdin.end(plan);
  const exitP = exited(child);
  await Promise.race([
    out.next((l) => /^attached \d+/.test(l), 30000, 'perf uprobes to attach'),
    exitP.then((c) => { throw new Error(`perf_uprobes.py exited (${c}): ${errLines.join(' | ')}`); }),
  ]);
  return {
    async done() {
      child.kill('SIGINT');
      const l = await out.next((x) => /^hits \d+/.test(x), 10000, 'perf uprobe counts');
      await exitP;
      return Number(l.split(' ')[1]);
    },
  };
}

// ---------------------------------------------------------------- 1. overhead
// uvspan: the default probe set (with request context); uvspan_noreq: --requests off;
// uvspan_all: with --detail all (threadpool split, loop phases);
// uvspan_trap: the default probes with programs that return at once (the uprobe mechanism alone);
// uvspan_sample10: the default probes live 10% of the time (--sample-time 10%).
const UVSPAN_CONFIGS = {
  uvspan: { args: [] },
  uvspan_noreq: { args: ['--requests', 'off'] },
  uvspan_all: { args: ['--detail', 'all'] },
  uvspan_trap: { args: [], env: { UVSPAN_BENCH_TRAP_ONLY: '1' } },
  // The trap floor plus 1 µs of BPF time per hit spent in a compact loop
  // (about what an unsampled hit's program takes here: the anatomy's ns/run
  // of uvspan_metrics_only): BPF time without the real programs' memory
  // traffic, so that metrics only over it is what their maps, scratch and
  // code cost the app beyond their run time.
  uvspan_trap_spin: { args: [], env: { UVSPAN_BENCH_TRAP_ONLY: '1', UVSPAN_BENCH_TRAP_SPIN_NS: '1000' } },
  uvspan_sample10: { args: ['--sample-time', '10%'] },
  // A budget: uvspan sets the live share so that the CPU its probes add
  // stays within it, and says at exit what it estimates they add.
  uvspan_budget5: { args: ['--max-overhead', '5%'] },
  uvspan_budget10: { args: ['--max-overhead', '10%'] },
  uvspan_nostacks: { args: ['--stacks', 'off'] },
  // The standard sampler at 10% (decided in the kernel: the work of the
  // 90% dropped sends no record), and metrics alone (no trace sampled).
  uvspan_ratio10: { args: [], env: { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' } },
  uvspan_metrics_only: { args: [], env: { OTEL_TRACES_SAMPLER: 'always_off' } },
  // Analysis (BENCH_CONFIGS): windows shorter than a detach, so the uprobes are
  // hardly ever live: what is left is the epoll path and the window edges.
  uvspan_sample1: { args: ['--sample-time', '1%'] },
  uvspan_sample1_nostacks: { args: ['--sample-time', '1%', '--stacks', 'off'] },
  // Analysis: uvspan stopped (SIGSTOP) once attached: probes and BPF programs
  // run, the ring buffer fills and records are dropped. Separates what the
  // kernel side costs the app from what uvspan's own work next to it does.
  uvspan_stopped: { args: [], stopAfterAttach: true },
  // Analysis: another uvspan build (BENCH_UVSPAN_BASE=PATH), default probes,
  // interleaved with this one: a before/after in one run.
  uvspan_base: { args: [], bin: process.env.BENCH_UVSPAN_BASE },
  uvspan_base_trap: { args: [], env: { UVSPAN_BENCH_TRAP_ONLY: '1' }, bin: process.env.BENCH_UVSPAN_BASE },
};
const MODES = {
  // ~1000 req/s offered on 10 connections: the app has idle time.
  paced: { configs: ['bare', 'uvspan', 'uvspan_nostacks', 'uvspan_noreq', 'uvspan_all', 'uvspan_trap', 'uvspan_sample10', 'uvspan_budget5', 'uvspan_budget10', 'otel_sdk'], conns: 10, rate: null },
  // Closed loop (no pacing) on 16 connections: the machine is saturated.
  saturated: {
    configs: ['bare', 'uvspan', 'uvspan_trap', 'uvspan_trap_spin', 'kernel_traps', 'uvspan_sample10', 'uvspan_budget5', 'uvspan_budget10', 'uvspan_ratio10', 'uvspan_metrics_only', 'otel_sdk', 'otel_sdk_ratio10'],
    conns: 16,
    rate: 0,
  },
};
async function overhead(mode = 'paced') {
  const c = { ...CFG.overhead, conns: MODES[mode].conns, rate: MODES[mode].rate ?? CFG.overhead.rate };
  // BENCH_CONFIGS=bare,uvspan_sample1,... picks the configurations (analysis runs).
  const configs = process.env.BENCH_CONFIGS ? process.env.BENCH_CONFIGS.split(',') : MODES[mode].configs;
  const runs = [];
  log(`overhead (${mode}): ${c.rounds} round(s) of ${configs.join('/')}, ${c.rate ? `~${c.rate} req/s paced` : 'closed loop'} on ${c.conns} connections, ${c.measure_s}s each`);
  for (let r = 0; r < c.rounds; r++) {
    for (const cfg of configs) {
      // otel_sdk_ratio10: the SDK with the same sampler as uvspan_ratio10.
      const sdk = cfg.startsWith('otel_sdk');
      const args = sdk ? ['-r', path.join(BENCH, 'otel.js'), path.join(BENCH, 'app.js')] : [path.join(BENCH, 'app.js')];
      const envx = sdk
        ? {
            OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${SINK.grpc}`, OTEL_METRICS_EXPORTER: 'none', OTEL_LOGS_EXPORTER: 'none', OTEL_SERVICE_NAME: 'bench-app',
            ...(cfg === 'otel_sdk_ratio10' ? { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' } : {}),
          }
        : {};
      const sink0 = await sinkStats();
      const app = await startNode(args, envx);
      const u = UVSPAN_CONFIGS[cfg];
      if (u && 'bin' in u && !u.bin) throw new Error(`${cfg} needs BENCH_UVSPAN_BASE=PATH (the other uvspan build)`);
      const uv = u ? await startUvspan(['--pid', String(app.pid), ...u.args], { env: u.env || {}, bin: u.bin || UVSPAN }) : null;
      if (u && u.stopAfterAttach) uv.child.kill('SIGSTOP');
      const traps = cfg === 'kernel_traps' ? await startPerfUprobes(app.pid) : null;
      const warm = await runWrk(app.info.port, c.warm_s, c.rate, c.conns);
      const a0 = procCpu(app.pid);
      const u0 = uv ? procCpu(uv.pid) : null;
      const s0 = await sinkStats();
      const w = await runWrk(app.info.port, c.measure_s, c.rate, c.conns);
      const a1 = procCpu(app.pid);
      const u1 = uv ? procCpu(uv.pid) : null;
      const s1 = await sinkStats();
      const trapHits = traps ? await traps.done() : null;
      await stop(app.child, 'SIGTERM');
      if (u && u.stopAfterAttach) uv.child.kill('SIGCONT');
      const sum = uv ? await uv.done() : null;
      const sink1 = await sinkStats();
      const total_req = w.requests; // measured window only
      const run = {
        round: r + 1,
        config: cfg,
        requests: w.requests,
        warm_requests: warm.requests,
        req_per_s: round(w.requests / (w.duration_us / 1e6), 1),
        errors: w.errors,
        cpu_us_per_req: round((a1.ns - a0.ns) / 1e3 / total_req, 2),
        cpu_us_per_req_ticks: round(((a1.ticks - a0.ticks) * 1e6) / HZ / total_req, 2),
        p50_ms: round(w.p50_us / 1e3), p90_ms: round(w.p90_us / 1e3), p99_ms: round(w.p99_us / 1e3),
        sink_spans_in_window: s1.spans - s0.spans,
        sink_spans_total: sink1.spans - sink0.spans,
        sink_cpu_us_per_req: round((s1.cpu_us - s0.cpu_us) / total_req, 2),
      };
      // Counted from attach to detach: the warm-up's requests too.
      if (traps) run.uprobe_hits_per_req = round(trapHits / Math.max(1, w.requests + warm.requests), 2);
      if (uv) {
        run.uvspan_cpu_us_per_req = round((u1.ns - u0.ns) / 1e3 / total_req, 2);
        run.uvspan_summary = sum;
        if (sum.cost_added_pct !== undefined) {
          // What uvspan said it adds, beside what this round measured.
          run.uvspan_estimated_added_pct = sum.cost_added_pct;
          run.measured_added_pct = round((run.cpu_us_per_req / bareOfRound(runs, r + 1).cpu_us_per_req - 1) * 100, 2);
        }
      }
      runs.push(run);
      log(`  round ${r + 1} ${cfg.padEnd(8)} ${run.req_per_s} req/s  cpu ${run.cpu_us_per_req} us/req  p99 ${run.p99_ms} ms` + (uv ? `  uvspan ${run.uvspan_cpu_us_per_req} us/req` : ''));
    }
  }
  const med = {};
  for (const cfg of configs) {
    const rs = runs.filter((x) => x.config === cfg);
    const m = (k) => median(rs.map((x) => x[k]));
    med[cfg] = {
      cpu_us_per_req: round(m('cpu_us_per_req'), 2),
      cpu_us_per_req_ticks: round(m('cpu_us_per_req_ticks'), 2),
      p50_ms: round(m('p50_ms')), p99_ms: round(m('p99_ms')),
      req_per_s: round(m('req_per_s'), 1),
      spans_per_req: round(median(rs.map((x) => x.sink_spans_total / Math.max(1, x.requests + x.warm_requests))), 2),
      sink_cpu_us_per_req: round(m('sink_cpu_us_per_req'), 2),
    };
    if (cfg.startsWith('uvspan')) med[cfg].uvspan_cpu_us_per_req = round(m('uvspan_cpu_us_per_req'), 2);
    if (rs.some((x) => x.uvspan_estimated_added_pct !== undefined)) {
      med[cfg].uvspan_estimated_added_pct = round(m('uvspan_estimated_added_pct'), 2);
      med[cfg].measured_added_pct = round(m('measured_added_pct'), 2);
    }
    if (cfg === 'kernel_traps') med[cfg].uprobe_hits_per_req = round(m('uprobe_hits_per_req'), 2);
  }
  // Ratios per round (paired: the same round's bare run), then median.
  const bareOf = (x) => runs.find((y) => y.round === x.round && y.config === 'bare');
  const ratio = (cfg, k) => median(runs.filter((x) => x.config === cfg).map((x) => x[k] / bareOf(x)[k]));
  const added = (cfg) => median(runs.filter((x) => x.config === cfg).map((x) => x.cpu_us_per_req - bareOf(x).cpu_us_per_req));
  // The app's added CPU plus uvspan's own, per request.
  const addedWithSidecar = (cfg) =>
    median(runs.filter((x) => x.config === cfg).map((x) => x.cpu_us_per_req - bareOf(x).cpu_us_per_req + (x.uvspan_cpu_us_per_req || 0)));
  const ratios = {};
  const addSdk = added('otel_sdk');
  for (const cfg of configs.filter((x) => x !== 'bare')) {
    ratios[`${cfg}_cpu`] = round(ratio(cfg, 'cpu_us_per_req'));
    ratios[`${cfg}_p99`] = round(ratio(cfg, 'p99_ms'));
    ratios[`${cfg}_added_us_per_req`] = round(added(cfg), 2);
    if (UVSPAN_CONFIGS[cfg]) ratios[`${cfg}_with_sidecar_over_sdk_added`] = round(addedWithSidecar(cfg) / addSdk);
  }
  // Sampled at 10% on both sides: uvspan's added CPU (app + its own) over the SDK's.
  if (configs.includes('uvspan_ratio10') && configs.includes('otel_sdk_ratio10')) {
    ratios.uvspan_ratio10_with_sidecar_over_sdk_ratio10_added = round(addedWithSidecar('uvspan_ratio10') / added('otel_sdk_ratio10'));
  }
  ratios.uvspan_added_over_sdk_added = round(added('uvspan') / addSdk);
  // One configuration over another, paired: per round, the difference of the
  // two runs' CPU over that round's bare run, then the median (the rounds'
  // drift in the bare run's CPU cancels).
  const over = (cfg, base) => {
    const baseOf = (x) => runs.find((y) => y.round === x.round && y.config === base);
    return round(median(runs.filter((x) => x.config === cfg)
      .map((x) => (x.cpu_us_per_req - baseOf(x).cpu_us_per_req) / bareOf(x).cpu_us_per_req)));
  };
  // Metrics only over the trap floor; with the compact spin, what BPF time
  // alone adds and what metrics only adds beyond it.
  if (configs.includes('uvspan_metrics_only') && configs.includes('uvspan_trap')) {
    ratios.uvspan_metrics_only_over_trap = over('uvspan_metrics_only', 'uvspan_trap');
    if (configs.includes('uvspan_trap_spin')) {
      ratios.uvspan_trap_spin_over_trap = over('uvspan_trap_spin', 'uvspan_trap');
      ratios.uvspan_metrics_only_over_trap_spin = over('uvspan_metrics_only', 'uvspan_trap_spin');
    }
  }
  const anatomy = await hitAnatomy(c, configs);
  return {
    mode,
    anatomy,
    config: { ...c, load: c.rate ? 'wrk -t1, paced per connection (pace.lua)' : 'wrk -t1, closed loop', app: 'bench/app.js: fs.readFile + dns.lookup(localhost) per request', cpu: 'sum of /proc/PID/task/*/schedstat on-CPU ns (utime+stime ticks also recorded)' },
    configs,
    runs,
    median: med,
    ratios,
  };
}

// Probe hits per request and BPF ns per program run, per traced configuration:
// one more run each after the interleaved rounds (kernel.bpf_stats_enabled=1,
// which adds ~20-40 ns per program run, is off during those), and for the
// default configuration one with UVSPAN_BENCH_COUNT_HITS=1: every uprobe hit
// counted by probe point (uvspan prints the counts at exit; the count adds a
// map update per hit, so that run's ns are not used), with
// UVSPAN_BENCH_TIME_HITS=1: the ns inside uvspan's program per hit at each
// point (entries; with one program's entry and exit). Hits are divided by
// every request from attach to exit (warm-up and measured window).
async function hitAnatomy(c, configs) {
  const old = sysctl('kernel.bpf_stats_enabled');
  if (old === null || bpftool(['prog', 'show']) === null) return null;
  const out = {};
  const traced = configs.filter((cfg) => UVSPAN_CONFIGS[cfg] && !UVSPAN_CONFIGS[cfg].stopAfterAttach && !('bin' in UVSPAN_CONFIGS[cfg]));
  const runs = traced.map((cfg) => ({ cfg, count: false }));
  // Counted by probe point: the default, and where this part runs them, the
  // unsampled (always_off) and the trap-floor configurations: what a hit
  // costs in BPF at each point when its request is sampled, when it is not,
  // and when the program returns at once.
  for (const cfg of ['uvspan', 'uvspan_metrics_only', 'uvspan_trap'])
    if (traced.includes(cfg)) runs.push({ cfg, count: true });
  for (const { cfg, count } of runs) {
    const u = UVSPAN_CONFIGS[cfg];
    const app = await startNode([path.join(BENCH, 'app.js')]);
    const env = { ...(u.env || {}), ...(count ? { UVSPAN_BENCH_COUNT_HITS: '1', UVSPAN_BENCH_TIME_HITS: '1' } : {}) };
    const uv = await startUvspan(['--pid', String(app.pid), ...u.args], { env });
    sysctl('kernel.bpf_stats_enabled', 1);
    const warm = await runWrk(app.info.port, c.warm_s, c.rate, c.conns);
    const before = progStatsOf(uv.pid);
    const w = await runWrk(app.info.port, c.measure_s, c.rate, c.conns);
    const after = progStatsOf(uv.pid);
    sysctl('kernel.bpf_stats_enabled', old);
    await stop(app.child, 'SIGTERM');
    await uv.done('SIGINT');
    const all = warm.requests + w.requests;
    if (count) {
      const points = {}, pointNs = {};
      let hits = 0;
      for (const l of uv.errLines) {
        const t = /^uvspan: hit-ns (\d+) \d+ \d+ \d+ (.*)$/.exec(l);
        if (t) pointNs[t[2]] = Number(t[1]);
        const m = /^uvspan: hits (\d+) (.*)$/.exec(l);
        if (!m) continue;
        points[m[2]] = round(Number(m[1]) / all, 3);
        hits += Number(m[1]);
      }
      out[cfg].points = points;
      out[cfg].point_ns = pointNs;
      out[cfg].uprobe_hits_per_req = round(hits / all, 2);
      continue;
    }
    const progs = {};
    let runsN = 0, ns = 0;
    for (const [name, a] of Object.entries(after)) {
      const b = before[name] || { run_cnt: 0, run_time_ns: 0 };
      const cnt = a.run_cnt - b.run_cnt;
      if (!cnt) continue;
      progs[name] = { runs_per_req: round(cnt / w.requests, 2), ns_per_run: round((a.run_time_ns - b.run_time_ns) / cnt, 0) };
      runsN += cnt; ns += a.run_time_ns - b.run_time_ns;
    }
    out[cfg] = { requests: w.requests, runs_per_req: round(runsN / w.requests, 2), bpf_ns_per_run: round(ns / Math.max(1, runsN), 0), bpf_ns_per_req: round(ns / w.requests, 0), programs: progs };
    log(`  anatomy ${cfg}: ${out[cfg].runs_per_req} BPF program runs/req, ${out[cfg].bpf_ns_per_run} ns/run`);
  }
  return out;
}

// ---------------------------------------------------------------- 2. statloop
async function statloop() {
  const c = CFG.statloop;
  log(`statloop: ${c.rounds} round(s) of ${c.ops} fs.statSync, bare vs uvspan (same process)`);
  const p = await startNode([path.join(BENCH, 'statloop.js')], {}, true);
  const cmd = async (line) => {
    p.child.stdin.write(line + '\n');
    return json(await p.out.next((l) => json(l)?.n !== undefined, 120000, 'statloop'));
  };
  await cmd(`run ${c.warm_ops}`);
  const rounds = [];
  for (let r = 0; r < c.rounds; r++) {
    const bare = await cmd(`run ${c.ops}`);
    const uv = await startUvspan(['--pid', String(p.pid)]);
    const traced = await cmd(`run ${c.ops}`);
    const sum = await uv.done('SIGINT');
    // The same probes with programs that return at once: the kernel's uprobe mechanism alone.
    const uvt = await startUvspan(['--pid', String(p.pid)], { env: { UVSPAN_BENCH_TRAP_ONLY: '1' } });
    const trapOnly = await cmd(`run ${c.ops}`);
    await uvt.done('SIGINT');
    // --stacks all-ops: the user-stack walk at each submit, on top of the default.
    const uva = await startUvspan(['--pid', String(p.pid), '--stacks', 'all-ops']);
    const allOps = await cmd(`run ${c.ops}`);
    await uva.done('SIGINT');
    rounds.push({
      round: r + 1,
      all_ops_cpu_ns: round(allOps.cpu_ns_per_op, 1),
      all_ops_over_default_ns: round(allOps.cpu_ns_per_op - traced.cpu_ns_per_op, 1),
      trap_only_cpu_ns: round(trapOnly.cpu_ns_per_op, 1),
      added_trap_only_cpu_ns: round(trapOnly.cpu_ns_per_op - bare.cpu_ns_per_op, 1),
      bare_cpu_ns: round(bare.cpu_ns_per_op, 1), traced_cpu_ns: round(traced.cpu_ns_per_op, 1),
      bare_wall_ns: round(bare.wall_ns_per_op, 1), traced_wall_ns: round(traced.wall_ns_per_op, 1),
      added_cpu_ns: round(traced.cpu_ns_per_op - bare.cpu_ns_per_op, 1),
      added_wall_ns: round(traced.wall_ns_per_op - bare.wall_ns_per_op, 1),
      uvspan_summary: sum,
    });
    log(`  round ${r + 1}: bare ${rounds[r].bare_cpu_ns} ns/op, traced ${rounds[r].traced_cpu_ns} ns/op (cpu), added ${rounds[r].added_cpu_ns}, probes that record nothing: added ${rounds[r].added_trap_only_cpu_ns}`);
  }
  // Anatomy: one more traced run with kernel.bpf_stats_enabled, for probe hits per op and in-BPF time.
  let anatomy = null;
  const old = sysctl('kernel.bpf_stats_enabled');
  if (old !== null && bpftool(['prog', 'show']) !== null) {
    const uv = await startUvspan(['--pid', String(p.pid)]);
    sysctl('kernel.bpf_stats_enabled', 1);
    const before = progStatsOf(uv.pid);
    const traced = await cmd(`run ${c.ops}`);
    const after = progStatsOf(uv.pid);
    sysctl('kernel.bpf_stats_enabled', old);
    await uv.done('SIGINT');
    const progs = {};
    let hits = 0, bpfNs = 0;
    for (const [name, a] of Object.entries(after)) {
      const b = before[name] || { run_cnt: 0, run_time_ns: 0 };
      const cnt = a.run_cnt - b.run_cnt;
      if (!cnt) continue;
      progs[name] = { hits_per_op: round(cnt / c.ops, 3), ns_per_hit: round((a.run_time_ns - b.run_time_ns) / cnt, 1) };
      hits += cnt; bpfNs += a.run_time_ns - b.run_time_ns;
    }
    anatomy = {
      note: 'one extra traced run with kernel.bpf_stats_enabled=1 (adds ~20-40 ns per program run)',
      traced_cpu_ns: round(traced.cpu_ns_per_op, 1),
      probe_hits_per_op: round(hits / c.ops, 3),
      bpf_ns_per_op: round(bpfNs / c.ops, 1),
      outside_bpf_ns_per_hit: null,
      programs: progs,
    };
  }
  p.child.stdin.end();
  await stop(p.child);
  const m = (k) => round(median(rounds.map((x) => x[k])), 1);
  if (anatomy && anatomy.probe_hits_per_op > 0) {
    // Added time not spent inside BPF programs, per probe hit: the uprobe mechanism itself.
    anatomy.outside_bpf_ns_per_hit = round((m('added_cpu_ns') - anatomy.bpf_ns_per_op) / anatomy.probe_hits_per_op, 0);
  }
  return {
    config: c,
    rounds,
    median: {
      bare_cpu_ns: m('bare_cpu_ns'), traced_cpu_ns: m('traced_cpu_ns'), added_cpu_ns: m('added_cpu_ns'),
      bare_wall_ns: m('bare_wall_ns'), traced_wall_ns: m('traced_wall_ns'), added_wall_ns: m('added_wall_ns'),
      trap_only_cpu_ns: m('trap_only_cpu_ns'), added_trap_only_cpu_ns: m('added_trap_only_cpu_ns'),
      all_ops_cpu_ns: m('all_ops_cpu_ns'), all_ops_over_default_ns: m('all_ops_over_default_ns'),
    },
    anatomy,
  };
}

// ---------------------------------------------------------------- 2b. sampler
// The stack sampler's cost when no iteration is slow, apart from the uprobes:
// a loop of ~0.4 ms iterations of pure JS (bench/sampler_loop.js; its one
// probe hit per iteration is its epoll wait, the same in both
// configurations), one process, windows of the same work bare, under uvspan
// (stacks on, the default) and under uvspan --stacks off, uvspan attached
// anew for each; the order turns each round. Per round: (on - off) / off of
// the app's CPU per iteration; the median over the rounds.
async function samplerCost() {
  const c = CFG.sampler;
  log(`sampler: ${c.rounds} round(s) of ${c.window_ms} ms windows, bare / stacks on / --stacks off (same process)`);
  const p = await startNode([path.join(BENCH, 'sampler_loop.js')], {}, true);
  const cmd = async (ms) => {
    p.child.stdin.write(`run ${ms}\n`);
    return json(await p.out.next((l) => json(l)?.chunks !== undefined, ms + 60000, 'sampler_loop'));
  };
  await cmd(c.window_ms); // warm: the JIT settles
  const configs = { bare: null, on: [], off: ['--stacks', 'off'] };
  const names = Object.keys(configs);
  const rounds = [];
  for (let r = 0; r < c.rounds; r++) {
    const got = {};
    for (let k = 0; k < names.length; k++) {
      const name = names[(k + r) % names.length];
      const uv = configs[name] ? await startUvspan(['--pid', String(p.pid), ...configs[name]]) : null;
      got[name] = await cmd(c.window_ms);
      if (uv) await uv.done('SIGINT');
    }
    const x = {
      round: r + 1,
      bare_cpu_ns: round(got.bare.cpu_ns_per_chunk, 0),
      on_cpu_ns: round(got.on.cpu_ns_per_chunk, 0),
      off_cpu_ns: round(got.off.cpu_ns_per_chunk, 0),
      share_pct: round(((got.on.cpu_ns_per_chunk - got.off.cpu_ns_per_chunk) / got.off.cpu_ns_per_chunk) * 100, 2),
      iterations_per_s: round((got.on.chunks * 1000) / got.on.wall_ms, 0),
    };
    rounds.push(x);
    log(`  round ${r + 1}: bare ${x.bare_cpu_ns} ns/iteration, stacks on ${x.on_cpu_ns}, off ${x.off_cpu_ns}: ${x.share_pct}%`);
  }
  p.child.stdin.end();
  await stop(p.child);
  const shares = rounds.map((x) => x.share_pct).sort((a, b) => a - b);
  const q = (f) => shares[Math.min(shares.length - 1, Math.floor(f * shares.length))];
  return {
    config: c,
    rounds,
    median: {
      share_pct: round(median(shares), 2),
      share_iqr_pct: [q(0.25), q(0.75)],
      on_over_bare: round(median(rounds.map((x) => x.on_cpu_ns / x.bare_cpu_ns)), 4),
      off_over_bare: round(median(rounds.map((x) => x.off_cpu_ns / x.bare_cpu_ns)), 4),
    },
  };
}

// ---------------------------------------------------------------- 3. throughput
async function throughput() {
  const c = CFG.throughput;
  log(`throughput: fs.statSync at ${c.rates.map((r) => r || 'max').join(', ')} ops/s, ${c.seconds}s each, until loss`);
  const steps = [];
  let appBound = false;
  for (const rate of c.rates) {
    if (appBound) break;
    const d = await startNode([path.join(BENCH, 'driver.js')], {}, true);
    const uv = DEST === 'otlp'
      ? await startUvspan(['--pid', String(d.pid)])
      : DEST === 'console'
        ? await startUvspan(['--pid', String(d.pid)], { otlp: false })
        : await startUvspan(['--pid', String(d.pid), '--otlp-endpoint', 'http://127.0.0.1:9', '--flush-timeout', '1s'], { otlp: false });
    const sink0 = await sinkStats();
    const perf = PERF
      ? spawn('perf', ['record', '-q', '-F', process.env.BENCH_PERF_FREQ || '999', '-e', 'cpu-clock', ...(process.env.BENCH_PERF_CALLGRAPH ? ['--call-graph', process.env.BENCH_PERF_CALLGRAPH] : ['-g']), '-p', String(uv.pid), '-o', path.join(OUT, `perf-${DEST}-${rate || 'max'}.data`)], { stdio: 'ignore' })
      : null;
    const u0 = procCpu(uv.pid);
    const samples = [];
    const sampler = setInterval(() => { try { samples.push({ t: Date.now(), ...procMem(uv.pid) }); } catch {} }, 200);
    const tStart = Date.now();
    d.child.stdin.write(`go ${rate} ${c.seconds}\n`);
    const res = json(await d.out.next((l) => json(l)?.ops !== undefined, (c.seconds + 60) * 1000, 'driver'));
    const tLoadEnd = Date.now();
    if (perf) { perf.kill('SIGINT'); await exited(perf); }
    if (DEST === 'otlp') await sinkQuiet(1500, 20000);
    else await sleep(1500);
    clearInterval(sampler);
    const u1 = procCpu(uv.pid);
    const memEnd = { ...procMem(uv.pid), ...procPss(uv.pid) };
    const sink1 = await sinkStats();
    d.child.stdin.write('exit\n');
    await exited(d.child);
    const sum = await uv.done();
    const sinkFinal = await sinkStats();
    const cpuS = (u1.ns - u0.ns) / 1e9;
    const exported = DEST === 'down' ? res.ops : sum.exported ?? sink1.spans - sink0.spans; // down: spans built and encoded, then failed
    // Steady RSS: the largest VmRSS seen in the second half of the load.
    const half = tStart + (tLoadEnd - tStart) / 2;
    const steady = samples.filter((s) => s.t >= half && s.t <= tLoadEnd).map((s) => s.VmRSS);
    const step = {
      target_rate: rate || 'max',
      ops: res.ops,
      ops_per_s: round(res.rate, 0),
      spans_exported: exported,
      sink_spans: sinkFinal.spans - sink0.spans,
      spans_per_s: round(exported / res.seconds, 0),
      uvspan_cpu_s: round(cpuS, 3),
      uvspan_cpu_ns_per_span: round((cpuS * 1e9) / Math.max(1, exported), 0),
      spans_per_core_s: round(exported / Math.max(1e-9, cpuS), 0),
      uvspan_cpu_share_of_core: round(cpuS / res.seconds, 3),
      rss_steady_mib: steady.length ? round(Math.max(...steady) / 1048576, 1) : null,
      rss_end_mib: round(memEnd.VmRSS / 1048576, 1),
      rss_anon_end_mib: round(memEnd.RssAnon / 1048576, 1),
      rss_file_end_mib: round(memEnd.RssFile / 1048576, 1),
      rss_shmem_end_mib: round(memEnd.RssShmem / 1048576, 1),
      rss_bpf_maps_end_mib: round(memEnd.BpfMapRss / 1048576, 1),
      pss_end_mib: round(memEnd.Pss / 1048576, 1),
      hwm_mib: round(memEnd.VmHWM / 1048576, 1),
      lost_kernel: sum.lost_kernel,
      dropped_queue: sum.dropped,
      failed_export: sum.failed,
      unflushed: sum.unflushed,
      sink_bytes_per_span: round((sinkFinal.bytes - sink0.bytes) / Math.max(1, sinkFinal.spans - sink0.spans), 0),
    };
    // The driver could not issue the target rate (the traced app itself is the limit):
    // higher targets would only repeat this step.
    step.app_bound = rate > 0 && res.rate < 0.9 * rate;
    if (step.app_bound || rate === 0) appBound = true;
    steps.push(step);
    log(`  ${String(step.target_rate).padStart(6)} ops/s -> ${step.ops_per_s} ops/s, ${step.spans_per_s} spans/s, ${step.uvspan_cpu_ns_per_span} ns/span, ${step.spans_per_core_s} spans/core-s, RSS ${step.rss_steady_mib} MiB, lost ${step.lost_kernel}, dropped ${step.dropped_queue}`);
    if (step.lost_kernel > 0 || step.dropped_queue > 0) break; // loss started
  }
  return { config: { ...c, op: 'fs.statSync (sync: 1 span per op)', dest: DEST }, steps };
}

// ---------------------------------------------------------------- 4. attach
// Page cache dropped (as after a reboot or on a fresh node of a cluster).
function dropCaches() {
  execFileSync('sync');
  fs.writeFileSync('/proc/sys/vm/drop_caches', '3');
}

async function attach() {
  const c = CFG.attach;
  log(`attach: ${c.trials} trial(s) each: uvspan --pid on a fresh node process (warm, cold page cache with and without the symbol cache); uvspan -- node -e 0 wall time`);
  const cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'uvspan-bench-symbols-'));
  const pidTrial = async (mode, i) => {
    const app = await startNode([path.join(BENCH, 'app.js')]);
    await sleep(200);
    if (mode !== 'warm') dropCaches();
    if (mode === 'cold_no_symbol_cache') fs.rmSync(path.join(cacheDir, 'symbols'), { recursive: true, force: true });
    const uv = await startUvspan(['--pid', String(app.pid), '--symbol-cache', cacheDir]);
    await stop(app.child);
    await uv.done();
    return { trial: i + 1, ready_ms: round(uv.ready_ms, 1), attach_ms_internal: uv.attach_ms_internal, probes: uv.probes };
  };
  const modes = ['warm', 'cold_symbol_cache', 'cold_no_symbol_cache'];
  const pid = Object.fromEntries(modes.map((m) => [m, []]));
  for (let i = 0; i < c.trials; i++) for (const m of modes) pid[m].push(await pidTrial(m, i));
  fs.rmSync(cacheDir, { recursive: true, force: true });

  // `uvspan -- node -e 0`, start to exit, interleaved with plain `node -e 0`
  // (console output: no collector round trip in the figure).
  const wall = async (cmd, args) => {
    const t0 = process.hrtime.bigint();
    const ch = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'ignore'], env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: '' } });
    const code = await exited(ch);
    if (code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${code}`);
    return Number(process.hrtime.bigint() - t0) / 1e6;
  };
  const cmdMode = [];
  for (let i = 0; i < c.wall_trials; i++) {
    const bare = await wall(NODE, ['-e', '0']);
    const traced = await wall(UVSPAN, ['--status-interval', '0', '--', NODE, '-e', '0']);
    cmdMode.push({ trial: i + 1, bare_ms: round(bare, 1), uvspan_ms: round(traced, 1), added_ms: round(traced - bare, 1) });
  }
  const med = (xs, k) => round(median(xs.map((t) => t[k])), 1);
  return {
    config: c,
    pid_mode: pid,
    command_mode: cmdMode,
    median: {
      pid_ready_ms: med(pid.warm, 'ready_ms'),
      pid_attach_ms_internal: med(pid.warm, 'attach_ms_internal'),
      cold_symbol_cache_ms_internal: med(pid.cold_symbol_cache, 'attach_ms_internal'),
      cold_no_symbol_cache_ms_internal: med(pid.cold_no_symbol_cache, 'attach_ms_internal'),
      command_bare_ms: med(cmdMode, 'bare_ms'),
      command_uvspan_ms: med(cmdMode, 'uvspan_ms'),
      command_added_ms: med(cmdMode, 'added_ms'),
    },
  };
}

// ---------------------------------------------------------------- report
function targets(R) {
  const t = [];
  const add = (name, target, value, pass, note = '') => t.push({ name, target, value, pass, note });
  if (R.overhead) {
    const o = R.overhead.ratios;
    add('paced: app CPU/request under uvspan', '<= 1.10x bare', o.uvspan_cpu, o.uvspan_cpu !== null && o.uvspan_cpu <= 1.10,
      `added ${o.uvspan_added_us_per_req} vs SDK ${o.otel_sdk_added_us_per_req} us/req`);
  }
  if (R.sampler) {
    // Apart from the uprobes (2b), paired per round; the paced pairs below
    // are too noisy to resolve 1% on a shared host.
    const m = R.sampler.median;
    add('stack sampler (no slow iteration): app CPU', '<= 1%', `${m.share_pct}%`, m.share_pct !== null && m.share_pct <= 1,
      `stacks on vs --stacks off, one process iterating every ~0.4 ms, ${R.sampler.rounds.length} rounds paired; middle half ${m.share_iqr_pct[0]}% to ${m.share_iqr_pct[1]}%`);
  } else if (R.overhead && R.overhead.ratios.uvspan_nostacks_cpu) {
    // Paired per round: default (stacks on) vs --stacks off, as a share of the app's CPU.
    const runs = R.overhead.runs;
    const shares = runs.filter((x) => x.config === 'uvspan').map((x) => {
      const y = runs.find((z) => z.round === x.round && z.config === 'uvspan_nostacks');
      return y ? (x.cpu_us_per_req - y.cpu_us_per_req) / y.cpu_us_per_req : null;
    });
    const v = round(median(shares) * 100, 2);
    add('stack sampler (no slow iteration): app CPU', '<= 1%', v === null ? null : `${v}%`, v !== null && v <= 1, 'default vs --stacks off, paced, paired per round');
  }
  if (R.saturated) {
    const o = R.saturated.ratios;
    // (an analysis run, BENCH_CONFIGS, may lack some configurations)
    const f = (x) => (x == null ? '–' : x);
    add('saturated: app CPU/request under uvspan', '<= 1.30x bare', o.uvspan_cpu, o.uvspan_cpu != null ? o.uvspan_cpu <= 1.30 : null,
      `trap-only floor ${f(o.uvspan_trap_cpu)}x; SDK ${f(o.otel_sdk_cpu)}x`);
    add('saturated: (app added + uvspan own CPU) / SDK added', '<= 0.25', o.uvspan_with_sidecar_over_sdk_added,
      o.uvspan_with_sidecar_over_sdk_added != null ? o.uvspan_with_sidecar_over_sdk_added <= 0.25 : null,
      `app added ${f(o.uvspan_added_us_per_req)} + uvspan ${f(R.saturated.median.uvspan?.uvspan_cpu_us_per_req)} vs SDK added ${f(o.otel_sdk_added_us_per_req)} us/req`);
    add('saturated: app CPU/request, --sample-time 10%', '<= 1.06x bare', o.uvspan_sample10_cpu, o.uvspan_sample10_cpu != null ? o.uvspan_sample10_cpu <= 1.06 : null);
    // Production volume: the kernel's sampler and metrics.
    const a = R.saturated.anatomy || {};
    const runsPerReq = a.uvspan ? a.uvspan.runs_per_req : null;
    add('saturated: BPF program runs per request (default)', '<= 8', runsPerReq, runsPerReq != null ? runsPerReq <= 8 : null,
      a.uvspan_trap ? `trap floor ${a.uvspan_trap.runs_per_req}` : '');
    add('saturated: app CPU/request at full tracing, metrics on', '<= 1.20x bare', o.uvspan_cpu, o.uvspan_cpu != null ? o.uvspan_cpu <= 1.2 : null,
      `trap floor ${f(o.uvspan_trap_cpu)}x`);
    const r10 = o.uvspan_ratio10_with_sidecar_over_sdk_ratio10_added;
    add('saturated, parentbased_traceidratio 0.1 on both: (app added + uvspan own CPU) / SDK added', '<= 0.30', r10, r10 != null ? r10 <= 0.3 : null,
      `uvspan ${f(o.uvspan_ratio10_cpu)}x, SDK ${f(o.otel_sdk_ratio10_cpu)}x bare`);
    const mo = o.uvspan_metrics_only_over_trap;
    add('saturated: metrics only (always_off) over the trap floor', '<= 0.03x bare', mo, mo != null ? mo <= 0.03 : null,
      `paired per round; metrics only ${f(o.uvspan_metrics_only_cpu)}x, trap floor ${f(o.uvspan_trap_cpu)}x`);
  }
  if (R.statloop) {
    const v = R.statloop.median.added_cpu_ns;
    add('added per traced op (statSync)', '<= 800 ns', v, v !== null && v <= 800, `bare ${R.statloop.median.bare_cpu_ns} ns/op`);
  }
  if (R.throughput) {
    const steps = R.throughput.steps;
    const lossless = steps.filter((s) => !s.lost_kernel && !s.dropped_queue);
    const best = lossless.length ? lossless.reduce((a, b) => (b.spans_per_s > a.spans_per_s ? b : a)) : null;
    const v = best ? best.spans_per_core_s : null;
    add('spans/s per sidecar core (OTLP)', '>= 300000', v, v !== null && v >= 300000, best ? `at ${best.spans_per_s} spans/s (highest lossless step)` : 'no lossless step');
    const ns = best ? best.uvspan_cpu_ns_per_span : null;
    add('sidecar CPU per exported span', '<= 1000 ns', ns, ns !== null && ns <= 1000, best ? `at ${best.spans_per_s} spans/s` : 'no lossless step');
    const s100 = steps.find((s) => s.target_rate === 100000);
    const top = steps.reduce((a, b) => (b.ops_per_s > a.ops_per_s ? b : a), steps[0]);
    add('no lost events at 100k ops/s', '0 lost, 0 dropped',
      s100 && !s100.app_bound ? `${s100.lost_kernel} lost, ${s100.dropped_queue} dropped` : `not reached: the traced driver peaks at ${top.ops_per_s} ops/s (${top.lost_kernel} lost, ${top.dropped_queue} dropped there)`,
      s100 && !s100.app_bound ? s100.lost_kernel === 0 && s100.dropped_queue === 0 : null);
    const s50 = steps.find((s) => s.target_rate === 50000) || top;
    add('RSS steady at 50k spans/s', '<= 32 MiB', s50 ? s50.rss_steady_mib : 'not run', s50 ? s50.rss_steady_mib <= 32 : null,
      s50 ? `at ${s50.spans_per_s} spans/s; at end anon ${s50.rss_anon_end_mib}, file ${s50.rss_file_end_mib} (of it BPF maps ${s50.rss_bpf_maps_end_mib ?? '?'}: the ring buffer's pages count twice), shmem ${s50.rss_shmem_end_mib} MiB; PSS ${s50.pss_end_mib ?? '?'} MiB` : '');
  }
  if (R.attach) {
    const a = R.attach.median;
    add('attach latency (uvspan --pid start -> "tracing")', '<= 100 ms', a.pid_ready_ms, a.pid_ready_ms !== null && a.pid_ready_ms <= 100, `uvspan's own "found -> probes live": ${a.pid_attach_ms_internal} ms`);
    add('cold page cache: found -> probes live', '<= 100 ms', a.cold_symbol_cache_ms_internal, a.cold_symbol_cache_ms_internal !== null && a.cold_symbol_cache_ms_internal <= 100,
      `with the symbol cache of an earlier start; without it ${a.cold_no_symbol_cache_ms_internal} ms`);
    add('uvspan -- node -e 0: added wall time', '<= 150 ms', a.command_added_ms, a.command_added_ms !== null && a.command_added_ms <= 150, `${a.command_uvspan_ms} vs ${a.command_bare_ms} ms bare`);
  }
  return t;
}

function markdown(R) {
  const M = R.machine;
  const L = [];
  const row = (...c) => L.push(`| ${c.map((x) => (x === null || x === undefined ? '–' : String(x))).join(' | ')} |`);
  L.push(`# uvspan benchmark results${QUICK ? ' (quick smoke — not a measurement)' : ''}`, '');
  L.push(`${R.finished_at} · ${M.nproc} × ${M.model_name} · ${M.mem_total_mib} MiB · Linux ${M.kernel} · ${M.os} · node ${M.node} · ${M.wrk} · uvspan ${M.uvspan_commit} · OTLP ${M.otlp_protocol} to bench/sink.js`);
  L.push(`load average at start ${M.loadavg_start.join(' ')}, at end ${M.loadavg_end.join(' ')}; other processes' uprobes on the machine at start: ${M.foreign_uprobes.count}. No hardware counters: CPU time from /proc; medians of interleaved rounds.`, '');
  L.push('## Targets', '');
  row('target', 'goal', 'measured', 'pass', 'note');
  row('---', '---', '---', '---', '---');
  for (const t of R.targets) row(t.name, t.target, t.value, t.pass === null ? '–' : t.pass ? 'yes' : '**no**', t.note);
  const LABELS = {
    bare: '(a) bare',
    uvspan: '(b) uvspan → OTLP (default probes)',
    uvspan_noreq: '(b−) uvspan --requests off → OTLP',
    uvspan_all: '(b+) uvspan --detail all → OTLP',
    uvspan_trap: '(b0) default probes, programs return at once',
    uvspan_trap_spin: '(b0s) the same, each hit spinning 1 µs of BPF time in a compact loop',
    kernel_traps: "(bk) plain uprobes at uvspan's points, no BPF program (the kernel's traps alone)",
    uvspan_sample10: '(b10) uvspan --sample-time 10% → OTLP',
    uvspan_budget5: '(bb5) uvspan --max-overhead 5% → OTLP',
    uvspan_budget10: '(bb10) uvspan --max-overhead 10% → OTLP',
    uvspan_nostacks: '(bs) uvspan --stacks off → OTLP (b minus the stack sampler)',
    uvspan_sample1: '(b1) uvspan --sample-time 1% → OTLP (uprobes hardly ever live)',
    uvspan_sample1_nostacks: '(b1s) the same with --stacks off',
    uvspan_ratio10: '(br) uvspan, parentbased_traceidratio 0.1 (decided in the kernel) → OTLP',
    uvspan_metrics_only: '(bm) uvspan, always_off: metrics only → OTLP',
    otel_sdk: '(c) OTel JS SDK → OTLP',
    otel_sdk_ratio10: '(cr) OTel JS SDK, parentbased_traceidratio 0.1 → OTLP',
  };
  for (const [o, title] of [[R.overhead, '1. Overhead on the app, paced'], [R.saturated, '1b. Overhead on the app, saturated']]) {
    if (!o) continue;
    const load = o.config.rate ? `~${o.config.rate} req/s paced on ${o.config.conns} connections` : `closed loop (wrk -c${o.config.conns}, no pacing)`;
    L.push('', `## ${title} (${o.config.rounds} interleaved rounds, ${load}, ${o.config.measure_s} s each)`, '');
    row('config', 'app CPU µs/req', 'ratio', 'p50 ms', 'p99 ms', 'p99 ratio', 'req/s', 'spans/req', 'uvspan CPU µs/req', '(app added + uvspan) / SDK added');
    row('---', '---', '---', '---', '---', '---', '---', '---', '---', '---');
    for (const cfg of o.configs) {
      const m = o.median[cfg];
      const r = (k) => (cfg === 'bare' ? '1.00' : o.ratios[`${cfg}_${k}`]);
      row(LABELS[cfg], m.cpu_us_per_req, r('cpu'), m.p50_ms, m.p99_ms, r('p99'), m.req_per_s, m.spans_per_req,
        cfg.startsWith('otel_sdk') ? '(in-process)' : cfg === 'kernel_traps' ? '(none)' : m.uvspan_cpu_us_per_req,
        cfg === 'uvspan_ratio10' && o.ratios.uvspan_ratio10_with_sidecar_over_sdk_ratio10_added !== undefined
          ? `${o.ratios.uvspan_ratio10_with_sidecar_over_sdk_ratio10_added} (of cr)`
          : o.ratios[`${cfg}_with_sidecar_over_sdk_added`]);
    }
    if (o.anatomy) {
      L.push('', `BPF program runs per request and ns per run (one more run per configuration with kernel.bpf_stats_enabled=1; the programs that ran):`, '');
      row('config', 'runs/req', 'BPF ns/run', 'BPF µs/req', 'by program (runs/req × ns/run)');
      row('---', '---', '---', '---', '---');
      for (const [cfg, a] of Object.entries(o.anatomy))
        row(LABELS[cfg], a.runs_per_req, a.bpf_ns_per_run, round(a.bpf_ns_per_req / 1e3, 2), Object.entries(a.programs).map(([n, p]) => `${n} ${p.runs_per_req} × ${p.ns_per_run}`).join(', '));
      const d = o.anatomy.uvspan;
      if (d && d.points) {
        // Unsampled (bm) and trap-floor (b0) columns where this part ran them.
        const more = [['uvspan_metrics_only', 'BPF ns/hit, unsampled (always_off)'], ['uvspan_trap', 'BPF ns/hit, program returns at once']]
          .filter(([cfg]) => o.anatomy[cfg] && o.anatomy[cfg].point_ns);
        L.push('', `Uprobe hits per request by probe point, default configuration (UVSPAN_BENCH_COUNT_HITS=1): ${d.uprobe_hits_per_req} in all; ns inside uvspan's program per hit there (UVSPAN_BENCH_TIME_HITS=1, with one program's entry and exit; a session probe's returns not timed)${more.length ? ', also with every request unsampled (bm: counted in the metrics, no record) and with the programs returning at once (b0: the timing\'s own floor)' : ''}.`, '');
        row('probe point', 'hits/req', 'BPF ns/hit', ...more.map(([, t]) => t));
        row('---', '---', '---', ...more.map(() => '---'));
        const ns = d.point_ns || {};
        for (const [pt, n] of Object.entries(d.points))
          row(`\`${pt.replaceAll("|", "\\|")}\``, n, pt in ns ? ns[pt] : '-', ...more.map(([cfg]) => o.anatomy[cfg].point_ns[pt] ?? '-'));
        const perReq = (cfg) => {
          const a = o.anatomy[cfg], pts = a && a.points, ns2 = a && a.point_ns;
          if (!pts || !ns2) return null;
          return round(Object.entries(pts).reduce((t, [pt, n]) => t + (pt in ns2 ? n * ns2[pt] : 0), 0), 0);
        };
        const sums = [['uvspan', 'sampled'], ...more.map(([cfg]) => [cfg, cfg === 'uvspan_trap' ? 'returning at once' : 'unsampled'])]
          .map(([cfg, t]) => [t, perReq(cfg)]).filter(([, v]) => v !== null);
        if (sums.length > 1) L.push('', `Timed BPF ns per request (hits/request × ns/hit, summed over the points): ${sums.map(([t, v]) => `${t} ${v}`).join(', ')}.`);
      }
    }
    L.push('', `Added app CPU per request: uvspan ${o.ratios.uvspan_added_us_per_req ?? '–'} µs, OTel SDK ${o.ratios.otel_sdk_added_us_per_req ?? '–'} µs (ratio ${o.ratios.uvspan_added_over_sdk_added ?? '–'}); the same probes doing nothing (b0: UVSPAN_BENCH_TRAP_ONLY=1, the kernel's uprobe mechanism alone) add ${o.ratios.uvspan_trap_added_us_per_req ?? '–'} µs; with --sample-time 10% ${o.ratios.uvspan_sample10_added_us_per_req ?? '–'} µs. Ratios are medians of per-round ratios to that round's bare run.`);
    const budgets = o.configs.filter((cfg) => o.median[cfg] && o.median[cfg].uvspan_estimated_added_pct !== undefined);
    if (budgets.length) {
      L.push('', 'The CPU the probes add to the app, as uvspan estimated it at exit (its summary\'s cost line, at the share in force) and as measured here (app CPU per request over the same round\'s bare run, −1), medians over the rounds:', '');
      row('config', 'uvspan\'s estimate, % added', 'measured, % added');
      row('---', '---', '---');
      for (const cfg of budgets) row(LABELS[cfg], o.median[cfg].uvspan_estimated_added_pct, o.median[cfg].measured_added_pct);
    }
    if (o.ratios.uvspan_metrics_only_over_trap !== undefined)
      L.push('', `Metrics only (bm) over the trap floor (b0), paired per round (the two runs' CPU difference over that round's bare run, median): ${o.ratios.uvspan_metrics_only_over_trap}× bare.`);
    if (o.ratios.uvspan_trap_spin_over_trap !== undefined) {
      const a = o.anatomy || {};
      const us = (cfg) => (a[cfg] ? round(a[cfg].bpf_ns_per_req / 1e3, 2) : '–');
      L.push('', `BPF time against the rest, paired the same way: the trap floor with each hit spinning 1 µs in a compact loop (b0s: ${us('uvspan_trap_spin')} µs of BPF per request, bpf_stats) adds ${o.ratios.uvspan_trap_spin_over_trap}× bare over the floor; metrics only (${us('uvspan_metrics_only')} µs of BPF per request) adds ${o.ratios.uvspan_metrics_only_over_trap_spin}× bare over that: what its programs' maps, scratch and code cost the app beyond their run time.`);
    }
    const k = o.median.kernel_traps;
    if (k && k.uprobe_hits_per_req)
      L.push('', `Plain uprobes at the same points with no BPF program (bk: counting perf events on the uprobe PMU) add ${o.ratios.kernel_traps_added_us_per_req} µs per request at ${k.uprobe_hits_per_req} hits per request (counted): ${round(o.ratios.kernel_traps_added_us_per_req / k.uprobe_hits_per_req, 2)} µs of app CPU per hit, the kernel's cost of a hit here whatever the tracer.`);
  }
  if (R.statloop) {
    const s = R.statloop;
    L.push('', `## 2. Per-operation cost (fs.statSync, ${s.config.ops} ops × ${s.config.rounds} rounds, same process attached/detached)`, '');
    row('', 'bare ns/op', 'uvspan ns/op', 'added ns/op');
    row('---', '---', '---', '---');
    row('CPU time', s.median.bare_cpu_ns, s.median.traced_cpu_ns, s.median.added_cpu_ns);
    row('wall time', s.median.bare_wall_ns, s.median.traced_wall_ns, s.median.added_wall_ns);
    L.push('', `With --stacks all-ops (the JS stack read at each submit): ${s.median.all_ops_cpu_ns} ns/op, ${s.median.all_ops_over_default_ns} ns/op over the default.`);
    L.push('', `The same probes with programs that return at once (UVSPAN_BENCH_TRAP_ONLY=1): ${s.median.trap_only_cpu_ns} ns/op, added ${s.median.added_trap_only_cpu_ns} ns/op — the kernel's uprobe mechanism alone (int3 trap, emulated instruction, return), the floor for any uprobe-based tracer at these probe points on this machine.`);
    if (s.anatomy) {
      L.push('', `Probe anatomy (bpf_stats run): ${s.anatomy.probe_hits_per_op} probe hits per op, ${s.anatomy.bpf_ns_per_op} ns/op inside BPF programs; the other ${s.anatomy.outside_bpf_ns_per_hit} ns per hit is the uprobe mechanism (int3 trap, then the probed instruction emulated or single-stepped out of line).`, '');
      row('program', 'hits/op', 'ns/hit in BPF');
      row('---', '---', '---');
      for (const [n, p] of Object.entries(s.anatomy.programs)) row(n, p.hits_per_op, p.ns_per_hit);
    }
  }
  if (R.sampler) {
    const s = R.sampler;
    L.push('', `## 2b. Stack sampler, no slow iteration (${s.config.rounds} rounds of ${s.config.window_ms} ms windows, one process iterating every ~0.4 ms, uvspan attached anew per window)`, '');
    row('round', 'bare ns/iteration', 'stacks on', '--stacks off', 'on vs off', 'iterations/s');
    row('---', '---', '---', '---', '---', '---');
    for (const x of s.rounds) row(x.round, x.bare_cpu_ns, x.on_cpu_ns, x.off_cpu_ns, `${x.share_pct}%`, x.iterations_per_s);
    L.push('', `Median of the paired rounds: ${s.median.share_pct}% (middle half ${s.median.share_iqr_pct[0]}% to ${s.median.share_iqr_pct[1]}%); stacks on ${s.median.on_over_bare}x bare, --stacks off ${s.median.off_over_bare}x bare (the iteration's epoll wait, a probe hit in both).`);
  }
  if (R.throughput) {
    L.push('', `## 3. Sidecar throughput (fs.statSync driver, ${R.throughput.config.seconds} s per step, ${DEST === 'otlp' ? 'OTLP to the sink' : DEST === 'console' ? 'console output to /dev/null' : 'OTLP to an endpoint that is down'})`, '');
    row('target ops/s', 'reached ops/s', 'spans/s exported', 'uvspan CPU ns/span', 'spans/s per core', 'uvspan core share', 'RSS steady MiB', 'RSS anon/file/shmem MiB', 'of it BPF maps MiB', 'PSS MiB', 'lost (kernel)', 'dropped (queue)');
    row('---', '---', '---', '---', '---', '---', '---', '---', '---', '---', '---', '---');
    for (const s of R.throughput.steps)
      row(s.target_rate, s.app_bound ? `${s.ops_per_s} (app-bound)` : s.ops_per_s, s.spans_per_s, s.uvspan_cpu_ns_per_span, s.spans_per_core_s, s.uvspan_cpu_share_of_core, s.rss_steady_mib, `${s.rss_anon_end_mib}/${s.rss_file_end_mib}/${s.rss_shmem_end_mib}`, s.rss_bpf_maps_end_mib ?? '–', s.pss_end_mib ?? '–', s.lost_kernel, s.dropped_queue);
  }
  if (R.attach) {
    const a = R.attach;
    L.push('', `## 4. Attach latency and wall time (${a.config.trials} trials per mode, fresh node process each; ${a.config.wall_trials} interleaved pairs for the wall time)`, '');
    row('measure', 'median ms', 'all trials');
    row('---', '---', '---');
    const p = a.pid_mode;
    row('`uvspan --pid` start → "tracing" line (external, warm)', a.median.pid_ready_ms, p.warm.map((t) => t.ready_ms).join(', '));
    row('found → probes live, warm page cache', a.median.pid_attach_ms_internal, p.warm.map((t) => t.attach_ms_internal).join(', '));
    row('found → probes live, cold page cache, symbol cache from an earlier start', a.median.cold_symbol_cache_ms_internal, p.cold_symbol_cache.map((t) => t.attach_ms_internal).join(', '));
    row('found → probes live, cold page cache, no symbol cache', a.median.cold_no_symbol_cache_ms_internal, p.cold_no_symbol_cache.map((t) => t.attach_ms_internal).join(', '));
    row('`node -e 0`, start to exit', a.median.command_bare_ms, a.command_mode.map((t) => t.bare_ms).join(', '));
    row('`uvspan -- node -e 0`, start to exit', a.median.command_uvspan_ms, a.command_mode.map((t) => t.uvspan_ms).join(', '));
    row('added wall time (per interleaved pair)', a.median.command_added_ms, a.command_mode.map((t) => t.added_ms).join(', '));
  }
  L.push('', 'Raw numbers, every round: `results.json`. Reproduce: `sudo ./scripts/bench.sh`.', '');
  return L.join('\n');
}

// ---------------------------------------------------------------- main
async function main() {
  if (process.getuid && process.getuid() !== 0) throw new Error('run as root (uvspan loads eBPF)');
  fs.mkdirSync(OUT, { recursive: true });
  const R = { quick: QUICK, started_at: new Date().toISOString(), machine: machine() };
  R.machine.foreign_uprobes = foreignUprobes([]);
  if (R.machine.foreign_uprobes.count) log(`note: ${R.machine.foreign_uprobes.count} uprobes of other processes are attached (${Object.keys(R.machine.foreign_uprobes.by_file).join(', ')})`);
  await startSink();
  const cleanup = () => { try { SINK.child.kill('SIGKILL'); } catch {} };
  process.on('exit', cleanup);
  const t0 = Date.now();
  try {
    if (want('overhead')) R.overhead = await overhead('paced');
    if (want('saturated')) R.saturated = await overhead('saturated');
    if (want('statloop')) R.statloop = await statloop();
    if (want('sampler')) R.sampler = await samplerCost();
    if (want('throughput')) R.throughput = await throughput();
    if (want('attach')) R.attach = await attach();
  } finally {
    const s = await sinkStats().catch(() => null);
    R.sink = s ? { spans: s.spans, requests: s.requests, bytes: s.bytes, errors: s.errors, cpu_s: round(s.cpu_us / 1e6, 2) } : null;
    await stop(SINK.child);
  }
  R.finished_at = new Date().toISOString();
  R.elapsed_s = round((Date.now() - t0) / 1000, 1);
  R.machine.loadavg_end = os.loadavg().map((x) => round(x, 2));
  R.targets = targets(R);
  fs.writeFileSync(path.join(OUT, 'results.json'), JSON.stringify(R, null, 2) + '\n');
  const md = markdown(R);
  fs.writeFileSync(path.join(OUT, 'results.md'), md);
  process.stdout.write(md);
  log(`done in ${R.elapsed_s} s: ${path.relative(process.cwd(), path.join(OUT, 'results.md'))}, results.json`);
  if (QUICK) {
    // Smoke: every part must have produced numbers and spans must have arrived.
    const bad = [];
    if (R.overhead && !(R.overhead.median.uvspan.spans_per_req > 0)) bad.push('no uvspan spans reached the sink in the overhead run');
    if (R.overhead && !(R.overhead.median.otel_sdk.spans_per_req > 0)) bad.push('no OTel SDK spans reached the sink');
    if (R.overhead && !(R.overhead.median.uvspan_all.spans_per_req > 0)) bad.push('no uvspan --detail all spans reached the sink');
    if (R.overhead && !(R.overhead.median.uvspan_noreq.spans_per_req > 0)) bad.push('no uvspan --requests off spans reached the sink');
    if (R.overhead && R.overhead.median.uvspan_trap.spans_per_req !== 0) bad.push('UVSPAN_BENCH_TRAP_ONLY=1 still exported spans');
    if (R.overhead && !(R.overhead.median.uvspan_sample10.spans_per_req > 0)) bad.push('no uvspan --sample-time 10% spans reached the sink');
    if (R.saturated && !(R.saturated.median.uvspan.spans_per_req > 0)) bad.push('no uvspan spans reached the sink in the saturated run');
    if (R.saturated && !(R.saturated.median.bare.req_per_s > 0)) bad.push('saturated run served no requests');
    const kt = R.saturated && R.saturated.median.kernel_traps;
    if (kt && !(kt.uprobe_hits_per_req >= 1)) bad.push('the plain uprobes (kernel_traps) counted no hits');
    if (R.statloop && !(R.statloop.median.traced_cpu_ns > 0)) bad.push('statloop produced no numbers');
    if (R.sampler && !(R.sampler.median.share_pct !== null && R.sampler.rounds.length)) bad.push('sampler produced no numbers');
    if (R.throughput && !R.throughput.steps.every((s) => s.spans_exported > 0)) bad.push('throughput step exported nothing');
    if (R.attach && !(R.attach.median.pid_ready_ms > 0)) bad.push('attach not measured');
    if (R.attach && !(R.attach.median.cold_no_symbol_cache_ms_internal > 0)) bad.push('cold attach not measured');
    if (R.attach && !(R.attach.median.command_added_ms !== null)) bad.push('command wall time not measured');
    if (bad.length) throw new Error(`smoke failed: ${bad.join('; ')}`);
  }
}

main().catch((e) => {
  log(`error: ${e.stack || e}`);
  try { SINK && SINK.child.kill('SIGKILL'); } catch {}
  process.exit(1);
});
