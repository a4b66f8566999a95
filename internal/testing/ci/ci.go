// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package ci holds the project's one rule for tests whose tools are missing:
// skip locally, fail under CI=true.
package ci

import (
	"os"
	"strconv"
	"testing"
)

// Enabled reports whether the environment variable CI holds a true value.
func Enabled() bool {
	on, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && on
}

// Skip skips the test, or fails it when CI is true: there, a missing tool
// (Envoy, redis-server, the built plugin, wat2wasm) is an error.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if Enabled() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
