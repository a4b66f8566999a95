// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package repotest holds tests of the repository as a whole: the build is
// reproducible (the same sources build a byte-identical build/plugin.wasm,
// and so the same `make oci` image digest, from any checkout path), the
// license is the one the source files name, the changelog keeps its form,
// and the `make lint` command README.md gives passes on the bootstrap it
// gives and refuses what the plugin would. It has no code of its own.
// Its tests that run make run side by side (t.Parallel): each in a copy of
// the checkout or a build folder of its own, sharing the Go build cache.
package repotest
