// Package footprint holds the reference modules of
// bench/footprint.md (hello, floor, deps) and the attribution module
// (ops); `make bench-start` measures their start cost with `bench start`
// (bench/cmd/bench/start.go).
package footprint
