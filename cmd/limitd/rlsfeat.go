package main

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/service/rls"
)

// rlsFeatures are the flags of what envoyproxy/ratelimit adds to its
// answers and statistics on request (its NEAR_LIMIT_RATIO and the like).
type rlsFeatures struct {
	nearLimitRatio float32
}

// float32Flag is a flag.Value of a float32, parsed as envoyproxy/ratelimit
// parses NEAR_LIMIT_RATIO (strconv.ParseFloat at 32 bits).
type float32Flag struct{ p *float32 }

func (f float32Flag) String() string {
	if f.p == nil {
		return ""
	}
	return strconv.FormatFloat(float64(*f.p), 'g', -1, 32)
}

func (f float32Flag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return err
	}
	*f.p = float32(v)
	return nil
}

func (o *rlsFeatures) register(fs *flag.FlagSet) {
	o.nearLimitRatio = rls.NearLimitRatio
	fs.Var(float32Flag{&o.nearLimitRatio}, "rls-near-limit-ratio", "share of a limit past which the rate limit service counts hits as near it (envoyproxy/ratelimit's NEAR_LIMIT_RATIO; float32; within (0, 1])")
}

// check validates the flags before anything starts.
func (o *rlsFeatures) check() error {
	if r := o.nearLimitRatio; !(r > 0 && r <= 1) {
		return fmt.Errorf("--rls-near-limit-ratio: want within (0, 1], got %v", r)
	}
	return nil
}

// apply sets the server's options of o.
func (o *rlsFeatures) apply(opts *rls.Options) {
	opts.NearLimitRatio = o.nearLimitRatio
}
