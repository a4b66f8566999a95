//go:build benchfloor

package service

import (
	_ "embed"
	"fmt"
	"os"
)

// takeLua, built with the benchfloor tag, is take_floor.lua: the least a
// token bucket kept in Redis by a script can do for a plain decision. It
// reads the record and the clock, writes a record of the same size and
// admits, with no arithmetic. The benchmark's limitd-floor runs it to
// measure the floor under one script call per decision (docs/benchmarks);
// its decisions are wrong on purpose, so no other build uses the tag.
//
//go:embed take_floor.lua
var takeLua string

func init() {
	fmt.Fprintln(os.Stderr, "limitd: built with the benchfloor tag: every plain decision is admitted (the benchmark's floor; never deploy this build)")
}
