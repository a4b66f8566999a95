// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package delay measures what holding requests (algorithm_config
// max_delay_ms) costs, on real Envoy with each build: how late a held
// request goes on, the plugin's memory per held request, and an idle
// plugin's CPU once nothing is held (make bench-delay; its test runs only
// with DELAY_COST=1 and prints the figures).
package delay
