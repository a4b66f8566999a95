package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
	"github.com/ratelimit-wasm/tokenbucket/service/rlqs"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// rlsOptions are the flags of the rate limit service's front door.
type rlsOptions struct {
	grpcListen   string
	config       string
	algorithm    string
	poll         time.Duration
	windowPrefix string
	grpcMaxConns int
	maxStreams   uint
	maxRecvBytes int
	maxKeyBytes  int // --max-key-bytes, the HTTP door's flag
	// listenTCP opens --grpc-listen's listener (options.listenTCP).
	listenTCP func(addr string) (net.Listener, error)
	// flagName names a flag in errors (options.name); nil: "--" and its name.
	nameFlag func(flag string) string
	quota    rlqsOptions
	tls      grpcTLSOptions
	feat     rlsFeatures // rlsfeat.go
	xds      xdsOptions  // --rls-xds-*: the configuration over xDS instead
}

func (o *rlsOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.grpcListen, "grpc-listen", "", "address to serve Envoy's rate limit service (gRPC) on; empty = off; a non-loopback address requires a token")
	fs.StringVar(&o.config, "rls-config", "", "the rate limit service's configuration: a YAML file or a folder of them, in envoyproxy/ratelimit's format (required with --grpc-listen)")
	fs.StringVar(&o.algorithm, "rls-algorithm", "token_bucket", "how the rate limit service counts limits that name no algorithm: token_bucket or fixed_window")
	fs.DurationVar(&o.poll, "rls-config-poll", rls.DefaultPoll, "how often the rate limit service's configuration files are read again")
	fs.StringVar(&o.windowPrefix, "rls-window-key-prefix", "", "prefix of the rate limit service's fixed-window counters (envoyproxy/ratelimit's CACHE_KEY_PREFIX)")
	fs.IntVar(&o.grpcMaxConns, "grpc-max-conns", grpcdoor.DefaultMaxConns, "most gRPC connections open at once; at the cap a new one evicts one that never carried an authenticated call, or is closed")
	fs.UintVar(&o.maxStreams, "grpc-max-streams", grpcdoor.DefaultMaxStreams, "most gRPC calls in flight per connection")
	fs.IntVar(&o.maxRecvBytes, "grpc-max-recv-bytes", grpcdoor.DefaultMaxRecvBytes, "largest gRPC request message")
	o.quota.register(fs)
	o.tls.register(fs)
	o.feat.register(fs)
	o.xds.register(fs)
}

// check validates the flags before anything starts. open: serve a
// non-loopback address without tokens (the ratelimit mode, as
// envoyproxy/ratelimit does: ratelimit.go).
func (o *rlsOptions) check(tokens int, open bool) error {
	if err := o.tls.check(o.grpcListen); err != nil {
		return err
	}
	if err := o.feat.check(o.grpcListen); err != nil {
		return err
	}
	if err := o.xds.check(); err != nil {
		return err
	}
	if o.grpcListen == "" {
		if o.config != "" {
			return fmt.Errorf("--rls-config: needs --grpc-listen")
		}
		if o.xds.server != "" {
			return fmt.Errorf("--rls-xds-server: needs --grpc-listen")
		}
		return nil
	}
	if (o.config == "") == (o.xds.server == "") {
		return fmt.Errorf("--grpc-listen: needs --rls-config or --rls-xds-server (one of them)")
	}
	if _, err := rlsconfig.ParseAlgorithm(o.algorithm); err != nil {
		return fmt.Errorf("--rls-algorithm: want token_bucket or fixed_window, got %q", o.algorithm)
	}
	if o.poll <= 0 {
		return fmt.Errorf("--rls-config-poll: must be > 0, got %v", o.poll)
	}
	if err := o.quota.check(); err != nil {
		return err
	}

	loopback, err := isLoopback(o.grpcListen)
	if err != nil {
		return fmt.Errorf("--grpc-listen: %w", err)
	}
	if !loopback && tokens == 0 && !open && !o.tls.mutual() {
		return fmt.Errorf("%s %s: not a loopback address, so a bearer token is required (--token-file or LIMITD_TOKEN), or client certificates (--grpc-tls-client-ca)", o.flagName("grpc-listen"), o.grpcListen)
	}
	return nil
}

// rlsDoor is the running rate limit service.
type rlsDoor struct {
	grpc   *grpcdoor.Host // the gRPC door: listener, guard, authentication
	quota  *rlqs.Server   // the rate limit quota service, on grpc
	rls    *rls.Server    // the rate limit service, on grpc
	served chan error
	addr   string
}

// startRLS loads the configuration (a refused file stops limitd from
// starting) and serves the rate limit service on the store; nil when
// --grpc-listen is empty. Its goroutines end with ctx.
// door holds the callers and the guard's times; o adds the door's bounds.
func startRLS(ctx context.Context, o *rlsOptions, store service.Store, door grpcdoor.Options, timeout time.Duration,
	reg prometheus.Registerer, log *slog.Logger,
) (*rlsDoor, error) {
	if o.grpcListen == "" {
		return nil, nil
	}
	algo, _ := rlsconfig.ParseAlgorithm(o.algorithm)
	m, err := rls.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	sopts := rls.Options{Store: store, Algorithm: algo, WindowKeyPrefix: o.windowPrefix,
		MaxKeyBytes: o.maxKeyBytes, Timeout: timeout, Logger: log, Metrics: m}
	o.feat.apply(&sopts)
	srv, err := rls.NewServer(sopts)
	if err != nil {
		return nil, err
	}
	if err := o.feat.servePeerSeries(ctx, m, log); err != nil {
		return nil, err
	}
	var w *rls.Watcher
	if o.config != "" {
		if w, err = rls.NewWatcher(o.config, srv, log); err != nil {
			return nil, fmt.Errorf("%s: %w", o.flagName("rls-config"), err)
		}
	} else if err := startXDS(ctx, &o.xds, srv, m, log); err != nil {
		return nil, err
	}
	door.MaxConns, door.MaxStreams, door.MaxRecvBytes = o.grpcMaxConns, uint32(min(o.maxStreams, 1<<31)), o.maxRecvBytes
	door.Registerer, door.Codec = reg, rlqs.Codec{}
	door.TLS, door.Logger = o.tls.files(), log
	g, err := grpcdoor.New(door)
	if err != nil {
		return nil, tlsFlagError(err)
	}
	srv.Register(g.Server())
	o.quota.algorithm = algo
	q, err := startRLQS(&o.quota, srv, g, store, timeout, reg, log)
	if err != nil {
		return nil, err
	}
	listen := o.listenTCP
	if listen == nil {
		listen = func(addr string) (net.Listener, error) { return (&options{}).listenTCP("grpc-listen", addr) }
	}
	ln, err := listen(o.grpcListen)
	if err != nil {
		return nil, err
	}
	if w != nil {
		go w.Run(ctx, o.poll)
	}
	go g.WatchStore(ctx, store, time.Second)
	d := &rlsDoor{grpc: g, quota: q, rls: srv, served: make(chan error, 1), addr: ln.Addr().String()}
	go func() { d.served <- g.Serve(ln) }()
	log.Info("rate limit service listening", "addr", d.addr, "config", o.config, "xds", o.xds.server, "algorithm", algo.String(), "auth", len(door.Tokens) > 0, "tls", door.TLS != nil, "mutual_tls", o.tls.mutual())
	return d, nil
}

// flagName is how an error names the flag f.
func (o *rlsOptions) flagName(f string) string {
	if o.nameFlag == nil {
		return "--" + f
	}
	return o.nameFlag(f)
}
