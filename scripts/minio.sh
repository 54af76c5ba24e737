#!/usr/bin/env bash
# Runs a private MinIO server (S3-compatible object storage) for tests and
# local development: its data lives in one directory, it listens on
# 127.0.0.1 only, on ports picked free at first start.
#
#   scripts/minio.sh install      build the pinned MinIO into $(go env GOPATH)/bin unless it is there
#   scripts/minio.sh path         print the path of the binary install puts there
#   scripts/minio.sh start DIR    start a server with its data in DIR, wait until it is ready, print
#                                 S3_ENDPOINT=… S3_ACCESS_KEY=… S3_SECRET_KEY=… (also kept in DIR/env)
#   scripts/minio.sh stop DIR     stop the server started in DIR and wait for it to exit
#
# Starting again in the same DIR keeps its data, ports and keys.
set -euo pipefail

# MinIO ships no Go module releases: the Go module proxy serves none of its
# RELEASE.* tags, only commits as pseudo-versions. This one is the last
# commit of github.com/minio/minio (2026-02-12, after
# RELEASE.2025-10-15T17-29-55Z); it builds with Go 1.26 from the proxy
# alone, in about 3.5 minutes on 2 cores. internal/miniotest runs the same
# binary.
MINIO_MODULE=github.com/minio/minio
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

die() { echo "minio.sh: $*" >&2; exit 1; }

binary() { echo "$(go env GOPATH)/bin/minio"; }

install() {
	local bin
	bin=$(binary)
	if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null |
		grep -Eq "^[[:space:]]+mod[[:space:]]+$MINIO_MODULE[[:space:]]+$MINIO_VERSION[[:space:]]"; then
		return
	fi
	echo "minio.sh: building $MINIO_MODULE@$MINIO_VERSION into $bin (takes a few minutes, once)" >&2
	local began=$SECONDS
	# Outside any module, so this repository's go.mod plays no part.
	(cd / && GOBIN=$(dirname "$bin") GOFLAGS=-buildvcs=false go install "$MINIO_MODULE@$MINIO_VERSION")
	echo "minio.sh: built in $((SECONDS - began))s" >&2
}

# port_busy succeeds when something accepts connections on 127.0.0.1:$1.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port prints a port nothing listens on, below the kernel's ephemeral
# range so outgoing connections do not take it between the probe and the bind.
free_port() {
	local port taken=" $* " i
	for i in $(seq 1 200); do
		port=$((20000 + RANDOM % 12000))
		case $taken in *" $port "*) continue ;; esac
		port_busy "$port" || { echo "$port"; return; }
	done
	die "no free port found in 20000-31999"
}

# ready succeeds when the server on port $1 answers its readiness probe.
ready() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf 'GET /minio/health/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
		head -n 1 <&3 | grep -q ' 200 '
	) 2>/dev/null
}

# alive succeeds while process $1 runs; a zombie nobody reaps (no init in a
# container) counts as gone.
alive() {
	kill -0 "$1" 2>/dev/null || return 1
	local state
	state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 0
	[ "$state" != Z ]
}

running_pid() {
	local dir=$1 pid
	[ -f "$dir/pid" ] || return 1
	pid=$(cat "$dir/pid")
	alive "$pid" && echo "$pid"
}

config() {
	local dir=$1
	[ -f "$dir/ports" ] && return
	local api console
	api=$(free_port)
	console=$(free_port "$api")
	{
		echo "MINIO_API_PORT=$api"
		echo "MINIO_CONSOLE_PORT=$console"
		echo "MINIO_USER=tollgate"
		echo "MINIO_PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
	} >"$dir/ports"
}

start() {
	local dir=$1
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	running_pid "$dir" >/dev/null && die "a server already runs in $dir (pid $(cat "$dir/pid"))"
	local bin
	bin=$(binary)
	[ -x "$bin" ] || die "$bin is missing: run scripts/minio.sh install"
	config "$dir"
	# shellcheck disable=SC1091
	. "$dir/ports"
	if port_busy "$MINIO_API_PORT" || port_busy "$MINIO_CONSOLE_PORT"; then
		[ -d "$dir/data" ] && die "a port of $dir is taken by another process"
		rm -f "$dir/ports"
		config "$dir"
		# shellcheck disable=SC1091
		. "$dir/ports"
	fi
	mkdir -p "$dir/data"
	# setsid: the server outlives this script and its terminal.
	MINIO_ROOT_USER=$MINIO_USER MINIO_ROOT_PASSWORD=$MINIO_PASSWORD \
		MINIO_BROWSER=off MINIO_UPDATE=off \
		setsid "$bin" server --quiet --address "127.0.0.1:$MINIO_API_PORT" \
		--console-address "127.0.0.1:$MINIO_CONSOLE_PORT" "$dir/data" \
		</dev/null >>"$dir/minio.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$dir/pid"
	local deadline=$((SECONDS + 60))
	until ready "$MINIO_API_PORT"; do
		if ! alive "$pid"; then
			rm -f "$dir/pid"
			tail -n 20 "$dir/minio.log" >&2 || true
			die "minio exited during startup (log: $dir/minio.log)"
		fi
		if [ $SECONDS -ge $deadline ]; then
			kill "$pid" 2>/dev/null || true
			die "minio was not ready on port $MINIO_API_PORT within 60s (log: $dir/minio.log)"
		fi
		sleep 0.1
	done
	{
		echo "S3_ENDPOINT=127.0.0.1:$MINIO_API_PORT"
		echo "S3_ACCESS_KEY=$MINIO_USER"
		echo "S3_SECRET_KEY=$MINIO_PASSWORD"
		echo "S3_REGION=us-east-1"
		echo "S3_USE_SSL=false"
		echo "MINIO_PID=$pid"
	} | tee "$dir/env"
}

stop() {
	local dir=$1 pid
	pid=$(running_pid "$dir") || { rm -f "$dir/pid"; return 0; }
	kill -TERM "$pid"
	local deadline=$((SECONDS + 30))
	while alive "$pid"; do
		if [ $SECONDS -ge $deadline ]; then
			kill -KILL "$pid" 2>/dev/null || true
			break
		fi
		sleep 0.05
	done
	rm -f "$dir/pid"
}

case ${1:-} in
install) install ;;
path) binary ;;
start) [ $# -eq 2 ] || die "usage: $0 start DIR"; start "$2" ;;
stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
*) die "usage: $0 install | path | start DIR | stop DIR" ;;
esac
