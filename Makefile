# Allot: `make run` starts everything with demo data; `make test` runs every test.
GO ?= go
export CGO_CFLAGS := -Wno-deprecated-declarations

.PHONY: run test generate check-generate vet build bench sim clean

## run: the whole system on :8080 with demo data (finds or starts PostgreSQL)
run:
	$(GO) run ./cmd/allot dev

## test: checks, then all tests on the PostgreSQL `allot dev` would use;
## browser tests save their screenshots under $(ARTIFACTS)/screenshots
ARTIFACTS ?= $(CURDIR)/.allot/test-artifacts
test: check-generate vet
	@mkdir -p $(ARTIFACTS)/screenshots
	ALLOT_SCREENSHOTS=$(ARTIFACTS)/screenshots $(GO) run ./cmd/allot test-env -- $(GO) test -count=1 -timeout 20m ./...

## generate: regenerate templ output (committed)
generate:
	$(GO) tool templ generate -path views

## check-generate: fail if committed generated code is stale
check-generate: generate
	@if [ -d .git ] && [ -n "$$(git status --porcelain -- 'views/*_templ.go')" ]; then \
		echo "generated code is stale: run 'make generate' and commit views/"; git status --porcelain -- 'views/*_templ.go'; exit 1; fi

## vet: gofmt and go vet
vet:
	@out="$$(gofmt -l cmd internal web views static migrations)"; if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

build:
	$(GO) build -o bin/allot ./cmd/allot

## bench: scheduler and simulator benchmarks
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/scheduler/...

## sim: replay the loaded Philly window with all four policies
sim:
	$(GO) run ./cmd/allot sim --trace ../shared/traces/philly.csv --teams ../shared/traces/philly-vcs.csv \
		--window 3456000:4665600 --time-scale 19 --walltime-factor 2

clean:
	rm -rf bin
