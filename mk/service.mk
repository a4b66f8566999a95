# The cluster-wide limit service (issue 4): service/ (library), cmd/limitd
# (the binary), internal/testing/redistest (real redis-server processes for tests).
# Its benchmark (make bench-service) is in the benchmark lab: bench/mk/bench.mk.
# See service/openapi.yaml.
#
#   make build-service        build/limitd: one static binary (CGO_ENABLED=0), and
#                             build/ratelimit: the same file under the name that
#                             configures it as envoyproxy/ratelimit is, from that
#                             project's environment variables (docs/from-envoy-ratelimit.md)
#   make test-service         unit tests (miniredis) and, when redis-server is
#                             installed, integration tests; -race
#   make test-service-redis   the same with CI=true: a missing redis-server fails
#   make fuzz-service         fuzz the request decoder (package wire) for FUZZTIME
#   make oci-limitd           limitd as a container image, no Docker daemon (cmd/ociimage -exe):
#                             a static linux binary FROM scratch, /etc/passwd with user nonroot
#                             (65532), run as 65532:65532, port 8429, /bin/ratelimit a link
#                             to it (Envoy Gateway's command); written as build/limitd-oci/
#                             (OCI layout) and build/limitd-oci.tar, both read back and verified,
#                             digests in build/limitd-oci.json. Same binary, same digest.
#                             OCI_LIMITD_REF names it; LIMITD_OCI_ARCH picks amd64 or arm64.

.PHONY: build-service test-service test-service-redis fuzz-service oci-limitd

SERVICE_PKGS := ./service/... ./cmd/limitd/... ./internal/testing/redistest/...
# Every file compiled or embedded into cmd/limitd, as go list names them:
# the Go files and //go:embed files (the Lua scripts) of each package of
# this module it imports. Should go list fail, the binary is always rebuilt
# rather than kept stale.
LIMITD_SRC := $(patsubst $(CURDIR)/%,%,$(shell $(GO) list -deps -f \
	'{{if .Module}}{{if .Module.Main}}{{$$d := .Dir}}{{range .GoFiles}}{{$$d}}/{{.}} {{end}}{{range .EmbedFiles}}{{$$d}}/{{.}} {{end}}{{end}}{{end}}' \
	./cmd/limitd 2>/dev/null))
ifeq ($(LIMITD_SRC),)
LIMITD_SRC := FORCE
endif
.PHONY: FORCE

$(BUILD)/limitd: $(LIMITD_SRC) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w $(VERSION_LDFLAG)' -o $@ ./cmd/limitd
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

# build/ratelimit is a hard link to build/limitd: one build, the same bytes,
# the name (argv[0]) picks the mode (cmd/limitd/ratelimit.go). Relinked
# whenever it is not build/limitd's file; a folder there (the peer's former
# home, build/ratelimit/service_cmd, now build/envoy-ratelimit) is removed.
$(BUILD)/ratelimit: $(BUILD)/limitd FORCE
	@if [ "$$(stat -c %i $< 2>/dev/null)" != "$$(stat -c %i $@ 2>/dev/null)" ]; then \
		rm -rf $@ && ln $< $@ && echo "linked $@ to $<"; fi

build-service: $(BUILD)/limitd $(BUILD)/ratelimit

# The tests read build/ratelimit from here, as LIMITD_BIN names build/limitd.
export RATELIMIT_COMPAT_BIN ?= $(abspath $(BUILD)/ratelimit)

test-service:
	$(GO) test -race -count=1 $(SERVICE_PKGS)

test-service-redis:
	CI=true $(GO) test -race -count=1 -run 'Integration|TestStart|TestCluster' ./service/ ./internal/testing/redistest/

fuzz-service:
	$(GO) test -run XXX -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./wire/

# The image's binary: always linux, static, no VCS stamp, so that the same
# commit gives the same bytes (and image digest) from any checkout.
OCI_LIMITD_REF ?= localhost/ratelimit-wasm/limitd:dev
LIMITD_OCI_ARCH ?= $(shell $(GO) env GOARCH)
LIMITD_OCI_BIN := $(BUILD)/limitd-linux-$(LIMITD_OCI_ARCH)

$(LIMITD_OCI_BIN): $(LIMITD_SRC) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(LIMITD_OCI_ARCH) $(GO) build -trimpath -buildvcs=false -ldflags='-s -w $(VERSION_LDFLAG)' -o $@ ./cmd/limitd

oci-limitd: $(LIMITD_OCI_BIN)
	$(GO) run ./cmd/ociimage -exe $(LIMITD_OCI_BIN) -exe-name limitd -exe-alias /bin/ratelimit -exe-port 8429 -exe-cmd '--listen=:8429' \
		-layout $(BUILD)/limitd-oci -archive $(BUILD)/limitd-oci.tar -summary $(BUILD)/limitd-oci.json -ref $(OCI_LIMITD_REF)
