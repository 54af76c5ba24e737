#!/usr/bin/env bash
# make test: install what the tests need (ClickHouse and chromium from Debian, MinIO built
# from source), then run every test. Tests start their own servers (embedded
# NATS, private ClickHouse and MinIO instances on free loopback ports) and
# stop them after.
set -euo pipefail
cd "$(dirname "$0")/.."
# The outbox's full-disk tests mount a tmpfs, which needs root; said here,
# not as a failure in meter's tests after the installs.
[ "$(id -u)" = 0 ] || { echo "make test runs as root (apt-get, and the full-disk and power-loss tests mount a tmpfs and a loop device)" >&2; exit 1; }

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
# e2fsprogs (mkfs.ext4) for the power-loss tests of the files made at
# first start, which crash a loop-mounted ext4 (testutil.CrashableDisk).
if ! command -v mkfs.ext4 >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y e2fsprogs || { apt-get update && apt-get install -y e2fsprogs; }
fi
# mount -o loop needs the loop devices; say so here rather than as three
# failed tests.
[ -e /dev/loop-control ] || echo "warning: no /dev/loop-control: the power-loss tests (CrashableDisk) will fail" >&2
make lint
go test -count=1 -timeout 25m ./...
# The race detector over the packages where goroutines meet.
go test -count=1 -race -timeout 20m ./proxy/... ./admin ./accounts ./config ./meter ./billing/... ./broker ./storage
