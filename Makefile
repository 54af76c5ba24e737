# Tollgate. `make run` starts the gateway on its embedded defaults; `make test`
# installs and starts what the tests need, then runs them.
GO      ?= go
BIN     := bin/tollgate

.PHONY: all build run test bench eval lint fuzz demo-upstream clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/tollgate

# Starts a local ClickHouse under ./data/clickhouse (installing Debian's
# package if missing), then the gateway with embedded NATS on ./data.
run: build
	scripts/run.sh

# A fake OpenAI-compatible upstream on ADDR, 127.0.0.1:8000 by default (the
# default UPSTREAM_BASE_URL), for trying the gateway without a GPU.
ADDR ?= 127.0.0.1:8000
demo-upstream:
	$(GO) run ./cmd/tollgate-upstream -addr $(ADDR) -chunk-delay 30ms

test:
	scripts/test.sh

bench:
	scripts/bench.sh

# Measures a classification engine (ENGINE, default semantic) on the dev and
# dev2 parts of classifiers/testdata/eval (tuned on), on dev3 (classify
# only, for choosing between engines) and on the test part (written before
# any tuning, never tuned on), one table each (tune with
# `make eval PARTS=dev,dev2`): classify asked in two label orders with
# ties as misses, score pairs ordered right, match MRR, NDCG@5 and traps
# ranked below the answer.
ENGINE ?= semantic
PARTS ?= dev,dev2,dev3,test
eval:
	scripts/vectors.sh install
	$(GO) run ./cmd/tollgate-eval -engine $(ENGINE) -parts $(PARTS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Runs each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./proxy -run '^$$' -fuzz FuzzSSEReader -fuzztime $(FUZZTIME)
	$(GO) test ./proxy -run '^$$' -fuzz FuzzRewriteRequest -fuzztime $(FUZZTIME)
	$(GO) test ./proxy -run '^$$' -fuzz FuzzUpstreamResponse -fuzztime $(FUZZTIME)
	$(GO) test ./config -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)

clean:
	rm -rf bin
