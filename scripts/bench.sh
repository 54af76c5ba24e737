#!/usr/bin/env bash
# make bench: the same load against the fake upstream directly and through
# the gateway (non-streaming, and streaming with 20 chunks), with the
# gateway's peak RSS; then the micro-benchmarks. Everything runs on this
# machine over loopback: the load generator, the gateway and the upstream
# share its cores, so read the difference, not the absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${BENCH_DURATION:-10s}"
CONC="${BENCH_CONCURRENCY:-32}"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

go build -o "$work/tollgate" ./cmd/tollgate
go build -o "$work/upstream" ./cmd/tollgate-upstream
go build -o "$work/load" ./cmd/tollgate-load

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); gw_port=$(free_port)

"$work/upstream" -addr "127.0.0.1:$up_port" -chunks 20 >"$work/upstream.log" 2>&1 &
pids+=($!)
TOLLGATE_LISTEN="127.0.0.1:$gw_port" TOLLGATE_DATA_DIR="$work/data" TOLLGATE_ADMIN_TOKEN=bench-admin \
TOLLGATE_NATS_LISTEN=127.0.0.1:0 TOLLGATE_CONSUME_IN_SERVE=false \
UPSTREAM_BASE_URL="http://127.0.0.1:$up_port/v1" "$work/tollgate" serve >"$work/gateway.log" 2>&1 &
gw_pid=$!
pids+=("$gw_pid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$gw_port/healthz" >/dev/null && break; sleep 0.1; done

admin() { "$work/tollgate" "$@" -url "http://127.0.0.1:$gw_port" -token bench-admin; }
admin accounts create bench -credit 1000000 >/dev/null
key=$(admin keys create bench -name bench | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
model=qwen2.5-14b-instruct-1m

run() { # name url model key stream
	"$work/load" -json -url "$2" -model "$3" -key "$4" -stream="$5" -c "$CONC" -d "$DURATION"
}
echo "load: $CONC concurrent connections for $DURATION each; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
declare -A res
for mode in false true; do
	res[direct,$mode]=$(run direct "http://127.0.0.1:$up_port/v1" proxytest-small "" "$mode")
	res[gateway,$mode]=$(run gateway "http://127.0.0.1:$gw_port/v1" "$model" "$key" "$mode")
done
rss=$(awk '/VmHWM/ {print $2}' "/proc/$gw_pid/status")
python3 - "$rss" "${res[direct,false]}" "${res[gateway,false]}" "${res[direct,true]}" "${res[gateway,true]}" <<'PY'
import json, sys
rss = int(sys.argv[1])
rows = [json.loads(a) for a in sys.argv[2:]]
def ms(v): return f"{v:.2f}"
print(f"{'':38}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
for label, (d, g) in (("non-streaming", rows[0:2]), ("streaming, 20 chunks", rows[2:4])):
    for name, r in (("direct", d), ("through gateway", g)):
        print(f"{label+' '+name:38}{r['rps']:>10.0f}{ms(r['p50_ms']):>10}{ms(r['p99_ms']):>10}{r['errors']:>8}")
    print(f"{label+' difference':38}{(g['rps']/d['rps']-1)*100:>9.1f}%{ms(g['p50_ms']-d['p50_ms']):>10}{ms(g['p99_ms']-d['p99_ms']):>10}")
print(f"gateway peak RSS: {rss/1024:.1f} MiB")
PY

echo
echo "micro-benchmarks:"
go test -run '^$' -bench . -benchtime 2s ./proxy ./accounts ./classifiers 2>&1 | grep -E '^(Benchmark|ok|FAIL)'

echo
echo "metering: Record -> outbox -> JetStream PubAck; JetStream -> ClickHouse 18.16 with balances; raw inserts:"
go test -run '^$' -bench 'Publisher' -benchtime 100000x ./meter 2>&1 | grep -E '^Benchmark'
go test -run '^$' -bench 'BillingThroughput|ClickHouseInsert' -benchtime 3x ./meter 2>&1 | grep -E '^(Benchmark|ok|FAIL)'

echo
echo "classifiers, lexical engine on the evaluation texts (latency per call, throughput):"
go run ./cmd/tollgate-eval -bench

echo
scripts/bench-batch.sh
