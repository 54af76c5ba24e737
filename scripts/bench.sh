#!/usr/bin/env bash
# make bench: the hop side by side, then the micro-benchmarks.
#
# 1. The same wrk load (Debian's wrk, BENCH_CONNECTIONS keep-alive
#    connections, one wrk thread so the generator takes little CPU) against
#    the fake upstream directly, through nginx (Debian's package, one worker,
#    keep-alive upstream pool, proxy_buffering off) and through
#    `tollgate serve` on the repository's gateway.yaml (auth, budgets and
#    metering on), once as it starts by default (GOMAXPROCS = the cores)
#    and once on one core (GOMAXPROCS=1), as nginx runs one worker; and
#    through the two reference hops of cmd/tollgate-floor, which relay
#    bytes and do nothing else: fasthttp alone (the platform Tollgate is
#    built on) and one thread's own epoll loop (what a loop of its own
#    could reach).
#    Non-streamed and streamed (20 chunks), targets
#    interleaved and rotated each round, BENCH_ROUNDS rounds; the table shows
#    medians and each target's ratio to direct. Then one connection at a
#    time, for the latency a single request pays for the hop.
# 2. BENCH_SOAK=10m: Tollgate alone under mixed load for that long, its RSS,
#    threads and goroutines sampled every 10 s.
# 3. Unless BENCH_ONLY=sbs: Go micro-benchmarks, pool failover under load,
#    metering into ClickHouse, the classifiers, batch jobs.
#
# Everything shares this machine's cores over loopback: read the ratios,
# not the absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${BENCH_ROUNDS:-3}"
DURATION="${BENCH_DURATION:-10s}"
CONNS="${BENCH_CONNECTIONS:-16}"
SINGLE_DURATION="${BENCH_SINGLE_DURATION:-5s}"
ONLY="${BENCH_ONLY:-}"
SOAK="${BENCH_SOAK:-}"

if ! command -v wrk >/dev/null || ! [ -x /usr/sbin/nginx ]; then
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y nginx-light wrk || { $sudo apt-get update && $sudo apt-get install -y nginx-light wrk; }
	# Debian starts its own nginx on port 80 after installing; it is not ours.
	$sudo systemctl stop nginx 2>/dev/null || $sudo /usr/sbin/nginx -s quit 2>/dev/null || true
fi

scripts/vectors.sh install

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

go build -o "$work/tollgate" ./cmd/tollgate
go build -o "$work/upstream" ./cmd/tollgate-upstream
go build -o "$work/floor" ./cmd/tollgate-floor

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); ngx_port=$(free_port); gw_port=$(free_port); dbg_port=$(free_port); storage_port=$(free_port)
gw1_port=$(free_port); storage1_port=$(free_port)
fasthttp_port=$(free_port); epoll_port=$(free_port)

"$work/upstream" -addr "127.0.0.1:$up_port" -chunks 20 >"$work/upstream.log" 2>&1 &
pids+=($!)

for mode in fasthttp epoll; do
	port_var="${mode}_port"
	"$work/floor" -mode "$mode" -addr "127.0.0.1:${!port_var}" -upstream "127.0.0.1:$up_port" >"$work/floor-$mode.log" 2>&1 &
	pids+=($!)
done

mkdir -p "$work/nginx-body" "$work/nginx-proxy"
sed -e "s|@UPSTREAM@|127.0.0.1:$up_port|" -e "s|@LISTEN@|127.0.0.1:$ngx_port|" -e "s|@WORK@|$work|g" \
	scripts/bench/nginx.conf.in >"$work/nginx.conf"
/usr/sbin/nginx -e "$work/nginx-error.log" -p "$work" -c "$work/nginx.conf" &
pids+=($!)

# The consumer into ClickHouse runs in its own process in production; here
# it is off so the gateway is measured alone (its events wait in JetStream).
TOLLGATE_LISTEN="127.0.0.1:$gw_port" TOLLGATE_DATA_DIR="$work/data" TOLLGATE_ADMIN_TOKEN=bench-admin-token \
TOLLGATE_NATS_LISTEN=127.0.0.1:0 TOLLGATE_CONSUME_IN_SERVE=false TOLLGATE_DEBUG_LISTEN="127.0.0.1:$dbg_port" TOLLGATE_STORAGE_LISTEN="127.0.0.1:$storage_port" \
UPSTREAM_BASE_URL="http://127.0.0.1:$up_port/v1" "$work/tollgate" serve >"$work/gateway.log" 2>&1 &
gw_pid=$!
pids+=("$gw_pid")
GOMAXPROCS=1 TOLLGATE_LISTEN="127.0.0.1:$gw1_port" TOLLGATE_DATA_DIR="$work/data1" TOLLGATE_ADMIN_TOKEN=bench-admin-token \
TOLLGATE_NATS_LISTEN=127.0.0.1:0 TOLLGATE_CONSUME_IN_SERVE=false TOLLGATE_STORAGE_LISTEN="127.0.0.1:$storage1_port" \
UPSTREAM_BASE_URL="http://127.0.0.1:$up_port/v1" "$work/tollgate" serve >"$work/gateway1.log" 2>&1 &
pids+=($!)
for port in "$gw_port" "$gw1_port" "$ngx_port" "$up_port" "$fasthttp_port" "$epoll_port"; do
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done
curl -sf "http://127.0.0.1:$gw_port/healthz" >/dev/null || { cat "$work/gateway.log"; exit 1; }
curl -sf "http://127.0.0.1:$gw1_port/healthz" >/dev/null || { cat "$work/gateway1.log"; exit 1; }

# bench_key port: an account and a key on the gateway at port.
bench_key() {
	"$work/tollgate" accounts create bench -credit 1000000 -url "http://127.0.0.1:$1" -token bench-admin-token >/dev/null
	"$work/tollgate" keys create bench -name bench -url "http://127.0.0.1:$1" -token bench-admin-token |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])'
}
key=$(bench_key "$gw_port")
key1=$(bench_key "$gw1_port")

# target -> url, model, key
declare -A url=([direct]="http://127.0.0.1:$up_port" [nginx]="http://127.0.0.1:$ngx_port" [tollgate]="http://127.0.0.1:$gw_port" [tollgate-1cpu]="http://127.0.0.1:$gw1_port"
	[bare-fasthttp]="http://127.0.0.1:$fasthttp_port" [epoll-loop]="http://127.0.0.1:$epoll_port")
declare -A model=([direct]=proxytest-small [nginx]=proxytest-small [tollgate]=qwen2.5-14b-instruct-1m [tollgate-1cpu]=qwen2.5-14b-instruct-1m
	[bare-fasthttp]=proxytest-small [epoll-loop]=proxytest-small)
declare -A bearer=([direct]="" [nginx]="" [tollgate]="$key" [tollgate-1cpu]="$key1" [bare-fasthttp]="" [epoll-loop]="")

# wrk_run target stream connections duration: prints "rps p50 p99 errors requests".
wrk_run() {
	local out
	out=$(MODEL="${model[$1]}" KEY="${bearer[$1]}" STREAM="$2" \
		wrk -t1 -c"$3" -d"$4" --timeout 10s -s scripts/bench/post.lua "${url[$1]}/v1/chat/completions")
	grep '^RESULT' <<<"$out" | cut -d' ' -f2-
}

targets=(direct nginx tollgate tollgate-1cpu bare-fasthttp epoll-loop)
echo "side by side: $ROUNDS rounds, $CONNS connections x $DURATION per run; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for t in "${targets[@]}"; do for s in false true; do wrk_run "$t" "$s" "$CONNS" 2s >/dev/null; done; done # warm-up
: >"$work/results"
for round in $(seq "$ROUNDS"); do
	for stream in false true; do
		for i in "${!targets[@]}"; do
			t=${targets[$(((i + round) % ${#targets[@]}))]}
			echo "$t $stream $CONNS $(wrk_run "$t" "$stream" "$CONNS" "$DURATION")" >>"$work/results"
		done
	done
	for stream in false true; do
		for i in "${!targets[@]}"; do
			t=${targets[$(((i + round) % ${#targets[@]}))]}
			echo "$t $stream 1 $(wrk_run "$t" "$stream" 1 "$SINGLE_DURATION")" >>"$work/results"
		done
	done
	echo "  round $round of $ROUNDS done"
done
rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$gw_pid/status")
python3 - "$work/results" "$rss_kib" "$CONNS" "${targets[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    t, stream, conns, rps, p50, p99, errors, _ = line.split()
    rows.setdefault((stream, conns, t), []).append((float(rps), float(p50), float(p99), int(errors)))
def med(rs, i): return statistics.median(r[i] for r in rs)
print()
print(f"{'':52}{'req/s':>9}{'ratio':>7}{'p50 ms':>8}{'+p50':>7}{'p99 ms':>8}{'errors':>7}")
for conns, what in ((sys.argv[3], f"{sys.argv[3]} connections"), ("1", "1 connection")):
    for stream, kind in (("false", "non-streamed"), ("true", "streamed 20 chunks")):
        d = rows[(stream, conns, "direct")]
        for t in sys.argv[4:]:
            rs = rows[(stream, conns, t)]
            print(f"{kind+', '+what+', '+t:52}{med(rs,0):>9.0f}{med(rs,0)/med(d,0):>7.2f}"
                  f"{med(rs,1):>8.2f}{med(rs,1)-med(d,1):>7.2f}{med(rs,2):>8.2f}{sum(r[3] for r in rs):>7}")
rss_mib = int(sys.argv[2]) / 1024
print(f"tollgate peak RSS (VmHWM): {rss_mib:.1f} MiB")
# The goals compare Tollgate with nginx in the same run. Each round ran
# both under the same conditions, so the per-round quotient shows the
# spread that one median hides.
def verdict(ok): return "met" if ok else "NOT met"
print()
print("goals (tollgate against nginx, same run):")
for conns, what in ((sys.argv[3], f"{sys.argv[3]} connections"), ("1", "1 connection")):
    for stream, kind in (("false", "non-streamed"), ("true", "streamed")):
        tg, ng = rows[(stream, conns, "tollgate")], rows[(stream, conns, "nginx")]
        q = [a[0] / b[0] for a, b in zip(tg, ng)]
        print(f"  {kind+', '+what:34} throughput {statistics.median(q):.2f} of nginx's "
              f"(rounds {min(q):.2f}-{max(q):.2f}); at least nginx's: {verdict(statistics.median(q) >= 1)}")
for conns, what in ((sys.argv[3], f"{sys.argv[3]} connections"), ("1", "1 connection")):
    added = med(rows[("false", conns, "tollgate")], 1) - med(rows[("false", conns, "direct")], 1)
    print(f"  p50 added, non-streamed, {what}: {added:.2f} ms; at most 0.25 ms: {verdict(added <= 0.25)}")
print(f"  peak RSS {rss_mib:.1f} MiB; at most 100 MiB: {verdict(rss_mib <= 100)}")
PY

if [ -n "$SOAK" ]; then
	echo
	echo "soak: tollgate alone for $SOAK, $((CONNS / 2)) non-streamed + $((CONNS / 2)) streamed connections"
	MODEL="${model[tollgate]}" KEY="$key" STREAM=false wrk -t1 -c$((CONNS / 2)) -d"$SOAK" --timeout 10s \
		-s scripts/bench/post.lua "${url[tollgate]}/v1/chat/completions" >"$work/soak-a" &
	a=$!
	MODEL="${model[tollgate]}" KEY="$key" STREAM=true wrk -t1 -c$((CONNS / 2)) -d"$SOAK" --timeout 10s \
		-s scripts/bench/post.lua "${url[tollgate]}/v1/chat/completions" >"$work/soak-b" &
	b=$!
	printf '%8s %10s %8s %11s\n' elapsed "RSS MiB" threads goroutines
	start=$(date +%s)
	while kill -0 "$a" 2>/dev/null; do
		sleep 10
		kill -0 "$a" 2>/dev/null || break
		rss=$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$gw_pid/status")
		threads=$(awk '/Threads/ {print $2}' "/proc/$gw_pid/status")
		# awk reads the whole profile: a head that closed the pipe early
		# would fail the pipeline (pipefail) and end the bench.
		gor=$(curl -s "http://127.0.0.1:$dbg_port/debug/pprof/goroutine?debug=1" | awk 'NR == 1 {print $NF}')
		printf '%7ss %10s %8s %11s\n' $(($(date +%s) - start)) "$rss" "$threads" "$gor"
	done
	wait "$a" "$b"
	grep -h '^RESULT' "$work/soak-a" "$work/soak-b" | awk '{printf "  %s: %.0f req/s, p99 %.2f ms, %d errors\n", NR==1?"non-streamed":"streamed", $2, $4, $5}'
	echo "tollgate peak RSS (VmHWM) after the soak: $(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$gw_pid/status") MiB"
fi

[ "$ONLY" = sbs ] && exit 0

echo
echo "micro-benchmarks:"
go test -run '^$' -bench . -benchtime 2s ./proxy ./accounts ./classifiers ./tokens 2>&1 | grep -E '^(Benchmark|ok|FAIL)'

echo
echo "pool failover: three upstream processes behind one model, steady load, one SIGKILLed and restarted:"
go test -count=1 -run TestPoolSurvivesUpstreamSIGKILL -v ./e2e 2>&1 | grep -E 'calls|streams|took calls again|^(--- |ok|FAIL)'

echo
scripts/clickhouse.sh install >/dev/null
echo "metering: Record -> outbox -> JetStream PubAck; JetStream -> ClickHouse with balances; raw inserts:"
go test -run '^$' -bench 'Publisher' -benchtime 100000x ./meter 2>&1 | grep -E '^Benchmark'
go test -run '^$' -bench 'BillingThroughput|ClickHouseInsert' -benchtime 3x ./billing 2>&1 | grep -E '^(Benchmark|ok|FAIL)'

echo
echo "classifiers, lexical and semantic engines on the evaluation texts (latency per call, throughput, memory):"
go run ./cmd/tollgate-eval -bench -engine lexical
go run ./cmd/tollgate-eval -bench -engine semantic

echo
scripts/bench/batch.sh
