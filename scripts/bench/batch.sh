#!/usr/bin/env bash
# Batch jobs through a fresh gateway, as a client runs them (create, upload,
# start, poll, download):
#   1. BATCH_LINES (default 1,000,000) generated lines of about 40 tokens on
#      the lexical engine: wall time, lines per second, peak RSS;
#   2. BATCH_LLM_LINES (default 100,000) lines through the llm engine against
#      the fake upstream answering after 50 ms.
# make bench runs it after the proxy benchmarks; it also runs on its own.
set -euo pipefail
cd "$(dirname "$0")/../.."

LINES="${BATCH_LINES:-1000000}"
LLM_LINES="${BATCH_LLM_LINES:-100000}"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

go build -o "$work/tollgate" ./cmd/tollgate
go build -o "$work/upstream" ./cmd/tollgate-upstream

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); gw_port=$(free_port); store_port=$(free_port)

"$work/upstream" -addr "127.0.0.1:$up_port" -first-byte-delay 50ms >"$work/upstream.log" 2>&1 &
pids+=($!)
TOLLGATE_LISTEN="127.0.0.1:$gw_port" TOLLGATE_DATA_DIR="$work/data" TOLLGATE_ADMIN_TOKEN=bench-admin-token \
TOLLGATE_NATS_LISTEN=127.0.0.1:0 TOLLGATE_CONSUME_IN_SERVE=false TOLLGATE_STORAGE_LISTEN="127.0.0.1:$store_port" \
UPSTREAM_BASE_URL="http://127.0.0.1:$up_port/v1" "$work/tollgate" serve >"$work/gateway.log" 2>&1 &
gw_pid=$!
pids+=("$gw_pid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$gw_port/healthz" >/dev/null && break; sleep 0.1; done

admin() { "$work/tollgate" "$@" -url "http://127.0.0.1:$gw_port" -token bench-admin-token; }
admin accounts create bench -credit 1000000 >/dev/null
key=$(admin keys create bench -name bench | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
api="http://127.0.0.1:$gw_port/v1"

# gen N FILE: N lines of about 40 tokens (30 words of support tickets).
gen() {
	python3 - "$1" "$2" <<'PY'
import json, random, sys
n, path = int(sys.argv[1]), sys.argv[2]
words = ("invoice refund charged twice payment card subscription plan cancel upgrade app crash error bug "
         "button export login password reset account email settings delivery order late tracking parcel "
         "please thanks help urgent since yesterday again still not working when I try to open the page "
         "my your we our it this that with for on in at and but").split()
rnd = random.Random(1)
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"text": " ".join(rnd.choice(words) for _ in range(30))}) + "\n")
PY
}

# job NAME BODY FILE: runs one job end to end; prints a result row.
job() {
	local name=$1 body=$2 file=$3
	local created job_id t0 t1 t2 status
	created=$(curl -sf "$api/batch" -H "Authorization: Bearer $key" -d "$body")
	job_id=$(jq -r .job_id <<<"$created")
	t0=$(date +%s.%N)
	# shellcheck disable=SC2046
	curl -sf -o /dev/null $(jq -r '.upload_fields | to_entries[] | "--form-string", "\(.key)=\(.value)"' <<<"$created") \
		-F "file=@$file" "$(jq -r .upload_url <<<"$created")"
	t1=$(date +%s.%N)
	curl -sf -X POST "$api/batch/$job_id/start" -H "Authorization: Bearer $key" >/dev/null
	until status=$(curl -sf "$api/batch/$job_id" -H "Authorization: Bearer $key") &&
		jq -e '.status == "completed" or .status == "failed"' <<<"$status" >/dev/null; do sleep 0.2; done
	t2=$(date +%s.%N)
	curl -sf -o "$work/results.ndjson" "$(curl -sf "$api/batch/$job_id/results" -H "Authorization: Bearer $key" | jq -r .download_url)"
	python3 - "$name" "$t0" "$t1" "$t2" "$status" "$(wc -l <"$work/results.ndjson")" "$(stat -c %s "$file")" <<'PY'
import json, sys
name, t0, t1, t2, status, results, size = sys.argv[1], *map(float, sys.argv[2:5]), json.loads(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
run = t2 - t1
n = status["requests_total"]
print(f"{name:34}{n:>10}{size/2**20:>9.0f}{t1-t0:>9.1f}{run:>9.1f}{n/run:>11.0f}"
      f"{status['actual_tokens'] or 0:>13}{status['estimated_tokens']:>13}  {status['status']}, {results} result lines")
PY
}

echo "batch jobs: $(nproc) cores; gateway, upstream and client on this machine"
idle=$(awk '/VmRSS/ {print $2}' "/proc/$gw_pid/status")
gen "$LINES" "$work/lexical.ndjson"
gen "$LLM_LINES" "$work/llm.ndjson"
printf '%-34s%10s%9s%9s%9s%11s%13s%13s\n' "" lines MiB "upload s" "run s" "lines/s" "tokens" "estimated"
job "lexical engine" '{"labels": ["billing", "bug", "account", "shipping", "other"], "model": "lexical"}' "$work/lexical.ndjson"
rss=$(awk '/VmHWM/ {print $2}' "/proc/$gw_pid/status")
job "llm engine, upstream 50 ms" '{"labels": ["billing", "bug", "account", "shipping", "other"], "model": "llm"}' "$work/llm.ndjson"
echo "gateway RSS: $((idle / 1024)) MiB idle, $((rss / 1024)) MiB at its peak through the lexical job (its input: $(($(stat -c %s "$work/lexical.ndjson") / 1048576)) MiB)"
