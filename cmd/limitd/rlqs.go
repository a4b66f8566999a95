package main

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
	"github.com/ratelimit-wasm/tokenbucket/service/rlqs"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// rlqsOptions are the flags of the rate limit quota service, served on
// --grpc-listen beside the rate limit service.
type rlqsOptions struct {
	unmatched    string
	ttl          time.Duration
	abandonAfter time.Duration
	shutdown     string
	replicas     int
	// algorithm is --rls-algorithm's (set by startRLS): fixed-window limits
	// are DENY_ALL to the quota service.
	algorithm rlsconfig.Algorithm
}

func (o *rlqsOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.unmatched, "rlqs-unmatched", "allow", "what the rate limit quota service assigns a bucket that matches no limit of --rls-config: allow (ALLOW_ALL) or deny (DENY_ALL)")
	fs.DurationVar(&o.ttl, "rlqs-ttl", rlqs.DefaultTTL, "least life of a rate limit quota assignment (whole seconds; raised to three reporting intervals)")
	fs.DurationVar(&o.abandonAfter, "rlqs-abandon-after", rlqs.DefaultAbandonAfter, "how long a quota bucket is reported idle before the service abandons it")
	fs.IntVar(&o.replicas, "rlqs-replicas", 1, "limitd processes serving the rate limit quota service for one --rls-config: each assigns 1/N of every limit's rate and burst")
	fs.StringVar(&o.shutdown, "rlqs-shutdown", "keep", "what limitd tells its quota streams at shutdown: keep (assignments stand until their TTL) or abandon (Envoy falls back to its no_assignment_behavior)")
}

// check validates the flags.
func (o *rlqsOptions) check() error {
	if _, err := rlqs.ParseUnmatched(o.unmatched); err != nil {
		return fmt.Errorf("--rlqs-unmatched: want allow or deny, got %q", o.unmatched)
	}
	if o.ttl < time.Second {
		return fmt.Errorf("--rlqs-ttl: must be >= 1s, got %v", o.ttl)
	}
	if o.replicas < 1 {
		return fmt.Errorf("--rlqs-replicas: must be >= 1, got %d", o.replicas)
	}
	if o.abandonAfter <= 0 {
		return fmt.Errorf("--rlqs-abandon-after: must be > 0, got %v", o.abandonAfter)
	}
	if o.shutdown != "keep" && o.shutdown != "abandon" {
		return fmt.Errorf("--rlqs-shutdown: want keep or abandon, got %q", o.shutdown)
	}
	return nil
}

// startRLQS registers the rate limit quota service on g, the gRPC door,
// reading srv's configuration.
func startRLQS(o *rlqsOptions, srv *rls.Server, g *grpcdoor.Host, store service.Store,
	timeout time.Duration, reg prometheus.Registerer, log *slog.Logger,
) (*rlqs.Server, error) {
	un, _ := rlqs.ParseUnmatched(o.unmatched)
	m, err := rlqs.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	q, err := rlqs.NewServer(rlqs.Options{Store: store, Config: srv.Config, Naming: srv.Naming(), Unmatched: un,
		TTL: o.ttl, Replicas: o.replicas, Algorithm: o.algorithm, AbandonAfter: o.abandonAfter, Timeout: timeout, Logger: log, Metrics: m})
	if err != nil {
		return nil, err
	}
	q.Register(g.Server())
	return q, nil
}
