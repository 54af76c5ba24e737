#!/usr/bin/env bash
# Runs a private ClickHouse server for tests and local development: its data,
# logs and config all live in one directory, it listens on 127.0.0.1 only, on
# ports picked free at first start.
#
#   scripts/clickhouse.sh install      install clickhouse-server and -client (apt) if missing
#   scripts/clickhouse.sh config DIR   write DIR/config.xml and DIR/users.xml unless present
#   scripts/clickhouse.sh start DIR    config, start in the background, wait until it answers,
#                                      print CLICKHOUSE_DSN=… lines (also kept in DIR/env);
#                                      a server already running in DIR is used as it is
#   scripts/clickhouse.sh stop DIR     stop the server started in DIR and wait for it to exit
#
# Starting again in the same DIR keeps its data and ports. Works as root: the
# server runs as whoever calls this script and owns DIR.
set -euo pipefail

die() { echo "clickhouse.sh: $*" >&2; exit 1; }

# server_cmd and client_cmd print the command line for this machine: Debian's
# 18.16 ships clickhouse-server and clickhouse-client, current releases ship
# one clickhouse binary with subcommands.
server_cmd() {
	if command -v clickhouse-server >/dev/null; then echo clickhouse-server
	elif command -v clickhouse >/dev/null; then echo clickhouse server
	else die "no clickhouse-server binary: run scripts/clickhouse.sh install"; fi
}
client_cmd() {
	if command -v clickhouse-client >/dev/null; then echo clickhouse-client
	elif command -v clickhouse >/dev/null; then echo clickhouse client
	else die "no clickhouse-client binary: run scripts/clickhouse.sh install"; fi
}

install() {
	if (command -v clickhouse-server && command -v clickhouse-client) >/dev/null ||
		command -v clickhouse >/dev/null; then
		return
	fi
	local sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	# The package lists are often fresh enough; update only when they are not.
	$sudo apt-get install -y clickhouse-server clickhouse-client ||
		{ $sudo apt-get update && $sudo apt-get install -y clickhouse-server clickhouse-client; }
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

config() {
	local dir=$1
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ -f "$dir/config.xml" ] && [ -f "$dir/ports" ]; then
		return
	fi
	local tcp http
	# CLICKHOUSE_TCP_PORT asks for a port (make run wants 9000, the default
	# DSN's) when it is free, CLICKHOUSE_HTTP_PORT for the HTTP one;
	# otherwise one is picked.
	if [ -n "${CLICKHOUSE_TCP_PORT:-}" ] && ! port_busy "$CLICKHOUSE_TCP_PORT"; then
		tcp=$CLICKHOUSE_TCP_PORT
	else
		tcp=$(free_port)
	fi
	if [ -n "${CLICKHOUSE_HTTP_PORT:-}" ] && [ "$CLICKHOUSE_HTTP_PORT" != "$tcp" ] && ! port_busy "$CLICKHOUSE_HTTP_PORT"; then
		http=$CLICKHOUSE_HTTP_PORT
	else
		http=$(free_port "$tcp")
	fi
	mkdir -p "$dir/data" "$dir/tmp" "$dir/log" "$dir/user_files" "$dir/format_schemas"
	# <yandex> is the root element 18.16 knows; current releases still accept it.
	cat >"$dir/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>$dir/log/clickhouse-server.log</log>
        <errorlog>$dir/log/clickhouse-server.err.log</errorlog>
        <size>10M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$tcp</tcp_port>
    <http_port>$http</http_port>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <users_config>$dir/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
EOF
	cat >"$dir/users.xml" <<'EOF'
<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <!-- How often an idle connection's handler looks whether the
                 server shuts down: the default of 10s holds a stop that long
                 while any client keeps a connection open. -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default></default>
    </quotas>
</yandex>
EOF
	printf 'CLICKHOUSE_TCP_PORT=%s\nCLICKHOUSE_HTTP_PORT=%s\n' "$tcp" "$http" >"$dir/ports"
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

start() {
	local dir=$1 attempt
	config "$dir"
	dir=$(cd "$dir" && pwd)
	if running_pid "$dir" >/dev/null; then
		# Left running by a start whose caller died (make run killed
		# hard): use it, rather than refuse until someone stops it.
		# shellcheck disable=SC1091
		. "$dir/ports"
		if [ -f "$dir/env" ] && $(client_cmd) --host 127.0.0.1 --port "$CLICKHOUSE_TCP_PORT" -q 'SELECT 1' >/dev/null 2>&1; then
			cat "$dir/env"
			return
		fi
		die "a server already runs in $dir (pid $(cat "$dir/pid")) but does not answer: scripts/clickhouse.sh stop $dir"
	fi
	# Ports are probed free, but another process can bind one before the
	# server does. On a first start new ports are as good as the old ones.
	local fresh=false
	[ -d "$dir/data/metadata" ] || fresh=true
	for attempt in 1 2 3; do
		local status=0
		launch "$dir" || status=$?
		case $status in
		0) return ;;
		1) ($fresh && [ $attempt -lt 3 ]) || die "a port of $dir is taken by another process" ;;
		*)
			tail -n 20 "$dir/log/clickhouse-server.err.log" "$dir/log/stdout.log" >&2 || true
			die "clickhouse-server exited during startup (logs in $dir/log)"
			;;
		esac
		rm -f "$dir/config.xml" "$dir/ports" "$dir/log/"*.log
		config "$dir"
	done
}

# launch starts the server configured in $1 and waits until it answers.
# Fails with 1 when a port is taken, 2 when the server exits for another
# reason.
launch() {
	local dir=$1
	# shellcheck disable=SC1091
	. "$dir/ports"
	local tcp=$CLICKHOUSE_TCP_PORT http=$CLICKHOUSE_HTTP_PORT
	if port_busy "$tcp" || port_busy "$http"; then
		return 1
	fi

	# setsid: the server outlives this script and its terminal; stdin from
	# /dev/null so it never waits on a tty.
	# shellcheck disable=SC2046
	setsid $(server_cmd) --config-file="$dir/config.xml" \
		</dev/null >>"$dir/log/stdout.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$dir/pid"

	local client deadline=$((SECONDS + 60))
	client=$(client_cmd)
	until $client --host 127.0.0.1 --port "$tcp" -q 'SELECT 1' >/dev/null 2>&1; do
		if ! alive "$pid"; then
			rm -f "$dir/pid"
			grep -qs "Address already in use" "$dir/log/"*.log && return 1
			return 2
		fi
		if [ $SECONDS -ge $deadline ]; then
			kill "$pid" 2>/dev/null || true
			die "clickhouse-server did not answer on port $tcp within 60s (logs in $dir/log)"
		fi
		sleep 0.1
	done

	{
		echo "CLICKHOUSE_DSN=clickhouse://127.0.0.1:$tcp/default"
		echo "CLICKHOUSE_PID=$pid"
		echo "CLICKHOUSE_TCP_PORT=$tcp"
		echo "CLICKHOUSE_HTTP_PORT=$http"
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
config) [ $# -eq 2 ] || die "usage: $0 config DIR"; config "$2"; cat "$2/ports" ;;
start) [ $# -eq 2 ] || die "usage: $0 start DIR"; start "$2" ;;
stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
*) die "usage: $0 install | config DIR | start DIR | stop DIR" ;;
esac
