#!/usr/bin/env bash
# make test: install what the tests need (ClickHouse from Debian), then run
# every test. Tests start their own servers (embedded NATS, private
# ClickHouse instances on free loopback ports) and stop them after.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/clickhouse.sh install
make lint
go test -count=1 -timeout 25m ./...
# The race detector over the packages where goroutines meet.
go test -count=1 -race -timeout 20m ./proxy/... ./accounts ./config ./meter ./broker
