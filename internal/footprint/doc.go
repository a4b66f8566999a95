// Package footprint holds the reference modules of
// docs/benchmarks/footprint.md (hello, floor) and the start-time measurement
// behind `make bench-start` (startcost).
package footprint
