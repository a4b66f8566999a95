package engine

import "github.com/ratelimit-wasm/tokenbucket/internal/version"

// Version is the build's version (package internal/version: "dev" unless
// make release stamped it), for the adapters' start lines: an adapter
// imports only the engine.
func Version() string { return version.Version }
