-- wrk script for make bench: every request is one chat completion POST.
-- MODEL, KEY (empty: no Authorization) and STREAM (true|false) come from the
-- environment so one script serves direct, nginx and Tollgate alike.
local model = os.getenv("MODEL") or "proxytest-small"
local key = os.getenv("KEY") or ""
local stream = os.getenv("STREAM") or "false"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if key ~= "" then
	wrk.headers["Authorization"] = "Bearer " .. key
end
wrk.body = '{"model":"' .. model .. '","stream":' .. stream ..
	',"max_tokens":64,"messages":[{"role":"user","content":"Say hello in one short sentence."}]}'

-- One machine-readable line: req/s, p50 ms, p99 ms, errors, requests.
-- Errors count failed connections, reads, writes, timeouts and any status
-- of 400 or above, so a gateway refusing requests cannot look fast.
done = function(summary, latency, requests)
	local e = summary.errors
	local errors = e.connect + e.read + e.write + e.timeout + e.status
	io.write(string.format("RESULT %.1f %.3f %.3f %d %d\n",
		summary.requests / (summary.duration / 1e6),
		latency:percentile(50) / 1000, latency:percentile(99) / 1000,
		errors, summary.requests))
end
