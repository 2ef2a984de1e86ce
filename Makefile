# orderworker developer tasks. `make help` lists them.
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOVULNCHECK ?= golang.org/x/vuln/cmd/govulncheck@v1.9.0
GOLANGCI    ?= github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
BENCHTIME   ?= 2s
REDOCLY     ?= @redocly/cli@2.77.0

.PHONY: help test lint lint-api clients vuln fmt bench bench-replicas bench-cluster stress stress-short stress-cluster stress-sentinel stress-lag stress-cluster-lag demo fuzz image container-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

test: ## the test suite, exactly as the README and CI run it
	$(GO) test -race -count=1 ./...

lint: ## gofmt, go vet, staticcheck, and golangci-lint with .golangci.yml (the import rules, among others)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(GOLANGCI) run ./...

lint-api: ## Redocly CLI's lint of api/openapi.yaml, with the rules of api/redocly.yaml (npm registry)
	npx --yes $(REDOCLY) lint --config api/redocly.yaml api/openapi.yaml

clients: ## the Go and TypeScript clients generated from api/openapi.yaml, against a real intake and worker (examples/intakeclient; npm registry)
	cd examples/intakeclient/ts && npm ci --no-audit --no-fund && npm run build
	cd examples/intakeclient && $(GO) vet ./... && INTAKECLIENT_TS=1 $(GO) test -race -count=1 ./...

vuln: ## known vulnerabilities in the code's call graph (govulncheck; needs https://vuln.go.dev)
	$(GO) run $(GOVULNCHECK) ./...

fmt: ## rewrite files with gofmt
	gofmt -w $$(git ls-files '*.go')

bench: ## the benchmarks (not part of test), then tools/bench's side-by-side tables, acceptance cost and targets (about 4 minutes)
	$(GO) test -run '^$$' -bench . -skip Handoff -benchtime $(BENCHTIME) ./...
	$(GO) test -run '^$$' -bench Handoff -benchtime 200x ./worker/keyorder
	$(GO) run ./tools/bench -json bench.json

bench-replicas: ## throughput with 1, 2 and 4 worker processes
	$(GO) run ./tools/bench -replicas 1,2,4 -replicas-only -json bench-replicas.json

bench-cluster: ## a local 3-master Cluster with 1, then 3 queue shards: commands and Redis CPU per task on each master, and the 40 % target (under a minute)
	$(GO) run ./tools/bench -cluster -json bench-cluster.json

stress: ## reliability suite on real binaries: SIGKILLs, a Redis restart (about 3-5 minutes)
	$(GO) run ./tools/stress

stress-short: ## the CI configuration of the reliability suite (about 2.5 minutes)
	$(GO) run ./tools/stress -short

stress-cluster: ## the reliability suite's short configuration on a local 3-master Cluster with 3 queue shards, a graceful failover and a master SIGKILLed (about 1.5 minutes)
	$(GO) run ./tools/stress -short -redis cluster

stress-sentinel: ## the reliability suite's short configuration on a local Sentinel group, failed over twice (about 1.5 minutes)
	$(GO) run ./tools/stress -short -redis sentinel

stress-lag: ## the short configuration on a Sentinel group whose switches lose a second of replication lag and promote a clock 30 s behind, with the HTTP order store and WAIT_REPLICAS=1 on the producer and the workers (CI runs it; about 2.5 minutes)
	$(GO) run ./tools/stress -short -redis sentinel -store http -lag 1s -behind 30s -wait-replicas 1

stress-cluster-lag: ## the short configuration on a local 3-master Cluster whose two switches (on two shards) each SIGKILL a master after its replica's link was cut for a second, with the HTTP order store and WAIT_REPLICAS=1 on the producer and the workers, and no hot-order kills, so that the hot orders' waits after a promotion are bounded (CI runs it; about 2 minutes)
	$(GO) run ./tools/stress -short -redis cluster -store http -lag 1s -wait-replicas 1 -hot-kills 0 -hot-freezes 0

demo: ## the scenario on an embedded Redis
	$(GO) run ./cmd/demo

IMAGE ?=
image: ## the container image of the four binaries (podman, else docker; nothing pulled): IMAGE=name:tag, default orderworker:<git describe>
	GO=$(GO) deploy/container/build.sh $(IMAGE)

container-test: ## the image's end-to-end test: Redis, the intake, two workers and the dashboard as containers, a worker stopped mid-run (podman; about 2 minutes)
	deploy/container/e2e.sh

FUZZTIME ?= 60s
fuzz: ## run every fuzz target for FUZZTIME each
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done
