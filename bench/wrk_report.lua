-- wrk reporting script: after wrk's usual text report, prints one line
--   WRKJSON {...}
-- with the exact figures (latency in microseconds), which bench/bench.py parses.
-- Only done() is defined, so wrk keeps its fast static-request path.

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d," ..
    "\"errors\":{\"connect\":%d,\"read\":%d,\"write\":%d,\"status\":%d,\"timeout\":%d}," ..
    "\"latency_us\":{\"min\":%d,\"max\":%d,\"mean\":%.2f,\"stdev\":%.2f," ..
    "\"p50\":%d,\"p75\":%d,\"p90\":%d,\"p99\":%d,\"p999\":%d}}\n",
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev,
    latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
