// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package reprotest holds the test that the build is reproducible: the same
// sources build a byte-identical build/plugin.wasm, and so the same `make
// oci` image digest, from any checkout path. It has no code of its own.
package reprotest
