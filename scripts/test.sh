#!/usr/bin/env bash
# make test: install what the tests need (ClickHouse and chromium from Debian, MinIO built
# from source), then run every test. Tests start their own servers (embedded
# NATS, private ClickHouse and MinIO instances on free loopback ports) and
# stop them after.
set -euo pipefail
cd "$(dirname "$0")/.."
# The outbox's full-disk tests mount a tmpfs, which needs root; said here,
# not as a failure in meter's tests after the installs.
[ "$(id -u)" = 0 ] || { echo "make test runs as root (apt-get, and meter's full-disk tests mount a tmpfs)" >&2; exit 1; }

scripts/clickhouse.sh install
# The semantic engine's word vectors; its tests fail without them.
scripts/vectors.sh install
# A pinned MinIO for the s3 storage backend's tests; built once (minutes).
scripts/minio.sh install
# Debian's chromium for the console's browser test (about 25 s to install),
# and curl, which the storage tests upload with exactly as the README does.
if [ ! -x /usr/bin/chromium ] || ! command -v curl >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y chromium curl || { apt-get update && apt-get install -y chromium curl; }
fi
make lint
go test -count=1 -timeout 25m ./...
# The race detector over the packages where goroutines meet.
go test -count=1 -race -timeout 20m ./proxy/... ./admin ./accounts ./config ./meter ./billing/... ./broker ./storage
