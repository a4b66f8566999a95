// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package bodycost holds a measurement, not a check: TestBodyCallbackCost
// gives the Envoy CPU of the plugin's response body callback on the real
// Envoy (`make bench-body`). It skips unless BODY_COST=1, so `make test`
// builds it without running it.
package bodycost
