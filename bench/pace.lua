-- wrk script: paced load and a JSON summary.
-- Each connection waits BENCH_DELAY_MS between its requests, so the offered
-- rate is about connections * 1000 / BENCH_DELAY_MS requests/s (a little less
-- by the response time). BENCH_DELAY_MS=0: closed loop, as fast as possible.
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0")

function delay()
  return delay_ms
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
