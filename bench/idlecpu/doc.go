// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package idlecpu measures an idle Envoy's CPU after many listener updates,
// with the native module and with the Wasm plugin side by side (make
// bench-idle; its test runs only with IDLE_CPU=1).
package idlecpu
