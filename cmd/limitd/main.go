// Command limitd is the cluster-wide limit service: an HTTP API (package
// service) over token buckets kept in Redis, a Redis Sentinel group or a Redis
// Cluster, so every gateway shares one limit. Without --redis it keeps the
// buckets in memory, limiting per process, and says so at start. With
// --redis it serves at once and waits for Redis, retrying with a backoff of
// 100 ms doubling up to 5 s; /readyz answers 503 until Redis has answered
// (and loaded the decision script) once, then whenever Redis does not answer.
//
//	limitd --listen 127.0.0.1:8429 --redis redis://127.0.0.1:6379/0
//	limitd --redis 10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379      (Redis Cluster)
//	limitd --redis 10.0.0.1:26379,10.0.0.2:26379 --redis-master mymaster   (Sentinel)
//	limitd --version   (prints "limitd <version>": package internal/version)
//
// It serves HTTP/1.1 and, on the same port, HTTP/2 over cleartext (h2c with
// prior knowledge), so a gateway can multiplex its callouts over a few
// connections. It binds loopback by default. Bound to any other address it
// refuses to start without a bearer token (--token-file, or the environment
// variable LIMITD_TOKEN), which every /v1 request must then carry, and so
// must a scrape of /metrics (its labels carry request values), unless
// --metrics-listen serves /metrics alone on a listener of its own. SIGTERM or SIGINT
// stops it gracefully: no new connections, requests in flight are answered.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/internal/gcheadroom"
	"github.com/ratelimit-wasm/tokenbucket/internal/version"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Invoked as "ratelimit" (build/ratelimit, the image's /bin/ratelimit),
	// limitd is configured as envoyproxy/ratelimit is: ratelimit.go.
	name, start := "limitd", run
	if isRatelimitName(os.Args[0]) {
		name, start = ratelimitName, runRatelimit
	}
	if err := start(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// versionOut is where --version prints.
var versionOut io.Writer = os.Stdout

// options are the command-line flags.
type options struct {
	rls                 rlsOptions // the rate limit service's (rls.go)
	listen              string
	metricsListen       string
	redis               string
	redisMaster         string
	redisCluster        bool
	redisPoolSize       int
	keyPrefix           string
	tokenFile           string
	identityHeader      string
	batchMax            int
	batchWindow         time.Duration
	batchWorkers        int
	timeout             time.Duration
	shutdownTimeout     time.Duration
	limits              wire.Limits
	memoryMaxKeys       int
	logLevel            string
	ledgerWindow        time.Duration
	maxConns            int
	unauthIdle          time.Duration
	connGrace           time.Duration
	logFormat           string
	grpcMaxConnAge      time.Duration
	grpcMaxConnAgeGrace time.Duration
	gcHeadroomMiB       int
	version             bool
	// mode is set when limitd runs as envoyproxy/ratelimit (ratelimit.go):
	// what its environment asks beyond the flags.
	mode *ratelimitMode
}

// name is how an error names the flag f ("listen": "--listen"): in the
// ratelimit mode, the environment variables it came from.
func (o *options) name(f string) string {
	if o.mode != nil {
		if v, ok := o.mode.byFlag[f]; ok {
			return v + " (--" + f + ")"
		}
	}
	return "--" + f
}

// listen opens the TCP listener of flag f on addr; its error names f (or
// the variables it came from).
func (o *options) listenTCP(f, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(f), err)
	}
	return ln, nil
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return o, nil
}

// newFlagSet is limitd's flags, bound to o.
func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("limitd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.rls.register(fs)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8429", "address to serve HTTP on; a non-loopback address requires a token")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address to serve /metrics on, alone and to whoever reaches it (bind it where only the scraper does); empty = on --listen, where a non-loopback address asks for a caller's bearer token")
	fs.StringVar(&o.redis, "redis", "", "Redis: a URL (redis://[user:pass@]host:port/db, rediss://...), or host:port[,host:port...] (several = Redis Cluster, or Sentinels with --redis-master); empty = in-memory store")
	fs.StringVar(&o.redisMaster, "redis-master", "", "Sentinel master name: --redis lists the Sentinels")
	fs.BoolVar(&o.redisCluster, "redis-cluster", false, "treat a single --redis address as a Redis Cluster seed")
	fs.IntVar(&o.redisPoolSize, "redis-pool-size", 0, "connections per Redis node (0 = go-redis default, 10 per CPU)")
	fs.StringVar(&o.keyPrefix, "key-prefix", service.DefaultKeyPrefix, "prefix of every Redis key")
	fs.StringVar(&o.tokenFile, "token-file", "", "file of the callers and their credentials, one per line: \"<name> <token>\" (a gateway's bearer token), \"<name> <token> front-proxy\" (a front proxy's, whose calls are the forwarded identity's), \"<name> identity <value>\" (a caller known by the identity a front proxy forwards) or a bare token (else env LIMITD_TOKEN)")
	fs.StringVar(&o.identityHeader, "identity-header", "", "header in which a front proxy (a \"front-proxy\" line of --token-file) forwards its client's verified identity, such as the URI SAN of its mTLS certificate")
	fs.IntVar(&o.batchMax, "batch-max", 64, "most decisions per Redis pipeline; 0 or 1 = no batching")
	fs.DurationVar(&o.batchWindow, "batch-window", 0, "how long to wait for more decisions before sending a pipeline (0 = send what is queued)")
	fs.IntVar(&o.batchWorkers, "batch-workers", 4, "pipelines in flight at once")
	fs.DurationVar(&o.timeout, "timeout", service.DefaultTimeout, "bound of one decision, Redis included")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown waits for requests in flight")
	fs.Int64Var(&o.limits.MaxBodyBytes, "max-body-bytes", wire.DefaultMaxBodyBytes, "largest request body")
	fs.IntVar(&o.limits.MaxKeyBytes, "max-key-bytes", wire.MaxKeyBytes, "longest key or hash tag, in bytes")
	fs.IntVar(&o.limits.MaxBuckets, "max-buckets", wire.MaxBuckets, "most buckets per request")
	fs.DurationVar(&o.limits.MaxFill, "max-fill", wire.MaxFill, "longest refill time (burst / tokens_per_second) accepted; bounds key lifetime")
	fs.IntVar(&o.memoryMaxKeys, "memory-max-keys", service.DefaultMemoryMaxKeys, "most buckets the in-memory store holds")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "json (one JSON object a line) or text (key=value)")
	fs.DurationVar(&o.ledgerWindow, "ledger-window", service.DefaultLedgerWindow, "how long tokens a lease grants or a decision reserves can be given back (by a return or a refund): at least one window, at most two")
	fs.IntVar(&o.maxConns, "max-conns", service.DefaultMaxConns, "most HTTP connections open at once; keep it below the open-file limit minus the Redis connections")
	fs.DurationVar(&o.unauthIdle, "unauthenticated-idle", service.DefaultUnauthenticatedIdle, "how long a connection that never carried an authenticated call may stay idle (both doors)")
	fs.DurationVar(&o.grpcMaxConnAge, "grpc-max-connection-age", 0, "end a gRPC connection this old with a GOAWAY (±10% jitter); 0 = never")
	fs.DurationVar(&o.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", 0, "close a gRPC connection this long after --grpc-max-connection-age's GOAWAY; 0 = never")
	fs.DurationVar(&o.connGrace, "conn-grace", service.DefaultConnGrace, "how long a new connection with no request read yet is kept from eviction at --max-conns (and --grpc-max-conns)")
	fs.IntVar(&o.gcHeadroomMiB, "gc-headroom-mib", gcheadroom.DefaultHeadroom>>20, "MiB the heap may grow past what is live between collections, when that is more than Go's default allows (a small live heap, as over Redis); 0 = Go's default; not applied when GOGC is set")
	fs.BoolVar(&o.version, "version", false, "print limitd's version (\"dev\" unless the build stamped one: make release) and exit")
	return fs
}

// run starts the service and blocks until ctx is done (then shuts down
// gracefully) or serving fails. ready, when set, is told the address bound.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(addr string)) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.version {
		_, err := fmt.Fprintln(versionOut, "limitd "+version.Version)
		return err
	}
	if o.rls.feat.checkOnly { // --check: the rate limit service's configuration, nothing started (rlsfeat.go)
		return checkConfig(checkOut, o.rls.config)
	}
	return serve(ctx, o, getenv, stderr, ready)
}

// newLogger is the log of --log-level and --log-format.
func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("%s: %w", o.name("log-level"), err)
	}
	ho := &slog.HandlerOptions{Level: level}
	switch o.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("%s: want json or text, got %q", o.name("log-format"), o.logFormat)
}

// serve runs the service o describes until ctx is done or serving fails.
func serve(ctx context.Context, o *options, getenv func(string) string, stderr io.Writer, ready func(addr string)) error {
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	if o.gcHeadroomMiB < 0 {
		return fmt.Errorf("%s: want 0 or more MiB, got %d", o.name("gc-headroom-mib"), o.gcHeadroomMiB)
	}
	if getenv("GOGC") == "" { // the operator's GOGC wins
		gcCtx, stopGC := context.WithCancel(ctx)
		defer stopGC()
		gcheadroom.Start(gcCtx, uint64(o.gcHeadroomMiB)<<20)
	}
	tokens, identities, err := loadTokens(o.tokenFile, getenv)
	if err != nil {
		return err
	}
	// Without --listen (the ratelimit mode's default), no HTTP API.
	api := o.listen != "" || o.mode == nil
	if api {
		loopback, err := isLoopback(o.listen)
		if err != nil {
			return err
		}
		if !loopback && len(tokens) == 0 {
			return fmt.Errorf("%s %s: not a loopback address, so a bearer token is required (--token-file or LIMITD_TOKEN)", o.name("listen"), o.listen)
		}
	}
	open := o.mode != nil && o.mode.openGRPC(len(tokens))
	if err := o.rls.check(len(tokens), open); err != nil {
		return err
	}
	metrics := service.MetricsElsewhere
	if api {
		if metrics, err = metricsAccess(o.listen, o.metricsListen); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var store service.Store
	var client redis.UniversalClient
	storeName := "memory"
	if o.redis == "" {
		store = service.NewMemoryStore(service.MemoryOptions{MaxKeys: o.memoryMaxKeys, LedgerWindow: o.ledgerWindow})
		log.Warn("no --redis: buckets are kept in memory, so limits hold per limitd process, not cluster-wide",
			"store", "memory", "max_keys", o.memoryMaxKeys)
	} else {
		uopts, err := redisOptions(o, getenv)
		if err != nil {
			return err
		}
		if o.mode != nil {
			o.mode.redis(uopts)
		}
		redis.SetLogger(&redisLogger{log: log})
		client = redis.NewUniversalClient(uopts)
		defer client.Close()
		rs, err := service.NewRedisStore(client, service.RedisOptions{
			KeyPrefix:    o.keyPrefix,
			Registerer:   reg,
			LedgerWindow: o.ledgerWindow,
			Batch: service.BatchOptions{
				MaxSize: o.batchMax, Window: o.batchWindow, Workers: o.batchWorkers, Timeout: o.timeout,
			},
		})
		if err != nil {
			return err
		}
		gate := newReadyGate(rs)
		store, storeName = gate, "redis"
		kind := fmt.Sprintf("%T", client)
		wctx, stopWaiting := context.WithCancel(ctx)
		waited := make(chan struct{})
		defer func() { stopWaiting(); <-waited }() // before the client closes
		go func() {
			defer close(waited)
			sha, attempts, err := waitForRedis(wctx, rs.Load, redisBackoff, log)
			if err != nil {
				return // limitd is stopping
			}
			gate.ready.Store(true)
			log.Info("redis store ready", "client", kind, "addrs", uopts.Addrs, "script_sha", sha,
				"batching", rs.Batching(), "batch_max", o.batchMax, "attempts", attempts)
		}()
	}
	defer store.Close()

	// The rate limit service (gRPC), the second front door on the store.
	rlsCtx, stopRLS := context.WithCancel(ctx)
	defer stopRLS()
	o.rls.maxKeyBytes = o.limits.MaxKeyBytes // RLS names past it are hashed
	o.rls.listenTCP = func(addr string) (net.Listener, error) { return o.listenTCP("grpc-listen", addr) }
	o.rls.nameFlag = o.name
	door, err := startRLS(rlsCtx, &o.rls, store, grpcdoor.Options{Tokens: tokens, Identities: identities,
		IdentityHeader: o.identityHeader, UnauthenticatedIdle: o.unauthIdle, Grace: o.connGrace,
		MaxConnectionAge: o.grpcMaxConnAge, MaxConnectionAgeGrace: o.grpcMaxConnAgeGrace,
		EvictOpen: open, UnauthenticatedBusy: openBusy(open)}, o.timeout, reg, log)
	if err != nil {
		return err
	}
	var rlsServed chan error // nil (never ready) without the rate limit service
	if door != nil {
		rlsServed = door.served
		defer door.grpc.Stop() // whatever else ends run; a no-op after GracefulStop
	}

	srv, err := service.NewServer(service.Config{
		Store: store, StoreName: storeName, Tokens: tokens, Identities: identities, IdentityHeader: o.identityHeader, Limits: o.limits,
		Timeout: o.timeout, Logger: log, Registry: reg, Metrics: metrics,
	})
	if err != nil {
		return err
	}
	var metricsSrv *http.Server
	var metricsGuard *service.ConnGuard
	metricsServed := make(chan error, 1)
	if metrics == service.MetricsElsewhere && o.metricsListen != "" {
		if metricsSrv, metricsGuard, err = serveMetrics(o, o.metricsListen, srv.MetricsHandler(), metricsServed, log); err != nil {
			return err
		}
		defer metricsSrv.Close() // whatever else ends run; a no-op after Shutdown
	}
	guards := []*service.ConnGuard{metricsGuard}
	// The ratelimit mode's listeners (HOST/PORT, DEBUG_HOST/DEBUG_PORT).
	var modeSrv *modeServers
	if o.mode != nil {
		if modeSrv, err = o.mode.serve(o, door, store, len(tokens) > 0, log); err != nil {
			return err
		}
		defer modeSrv.close()
		guards = append(guards, modeSrv.guards...)
	}
	// HTTP/1.1 and h2c on the one port, each connection bounded (see
	// service.NewHTTPServer).
	var httpSrv *http.Server
	var served chan error // nil (never ready) without the HTTP API
	apiAddr := ""
	if api {
		guard, err := service.NewConnGuard(service.ConnOptions{MaxConns: o.maxConns, UnauthenticatedIdle: o.unauthIdle, Grace: o.connGrace, Registerer: reg})
		if err != nil {
			return err
		}
		ln, err := o.listenTCP("listen", o.listen)
		if err != nil {
			return err
		}
		guards = append(guards, guard)
		httpSrv = service.NewHTTPServer(srv, guard, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
		served = make(chan error, 1)
		go func() { served <- httpSrv.Serve(guard.Listener(ln)) }()
		apiAddr = ln.Addr().String()
		log.Info("limitd listening", "version", version.Version, "addr", apiAddr, "store", storeName, "auth", len(tokens) > 0, "callers", len(tokens))
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case now := <-tick.C:
				for _, g := range guards {
					if g != nil {
						g.Sweep(now)
					}
				}
			case <-sweepCtx.Done():
				return
			}
		}
	}()
	var modeServed chan error
	if modeSrv != nil {
		modeServed = modeSrv.served
		modeSrv.ready(apiAddr)
	}
	if ready != nil {
		ready(apiAddr)
	}

	select {
	case err := <-served:
		return err
	case err := <-rlsServed:
		return fmt.Errorf("%s: %w", o.name("grpc-listen"), err)
	case err := <-metricsServed:
		return fmt.Errorf("%s: %w", o.name("metrics-listen"), err)
	case err := <-modeServed:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight", "timeout", o.shutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if door != nil {
		door.quota.Shutdown(o.rls.quota.shutdown == "abandon") // the quota streams end, or GracefulStop waits for them
		door.grpc.GracefulStop(sctx)
	}
	if metricsSrv != nil {
		_ = metricsSrv.Shutdown(sctx)
	}
	if modeSrv != nil {
		modeSrv.shutdown(sctx)
	}
	if httpSrv == nil {
		log.Info("stopped")
		return nil
	}
	if err := httpSrv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}

// readyGate is the Redis store as the server sees it: /readyz (Ping) fails
// until waitForRedis has loaded the decision script once, then asks Redis.
// Decisions go to Redis from the start (EVALSHA falls back to EVAL).
type readyGate struct {
	service.Store
	service.SlotStore // the store's concurrency slots (service/slots.go)
	ready             atomic.Bool
}

// slotStore is a Store that holds concurrency slots, as RedisStore does.
type slotStore interface {
	service.Store
	service.SlotStore
}

// newReadyGate gates st, keeping its slots: behind a gate without them the
// server would have no /v1/slots endpoints.
func newReadyGate(st slotStore) *readyGate { return &readyGate{Store: st, SlotStore: st} }

// errWaitingForRedis is what /readyz reports before Redis first answered.
var errWaitingForRedis = errors.New("waiting for redis: the decision script is not loaded yet")

// Ping implements service.Store.
func (g *readyGate) Ping(ctx context.Context) error {
	if !g.ready.Load() {
		return errWaitingForRedis
	}
	return g.Store.Ping(ctx)
}

// backoff is a bounded exponential delay: First, doubled after every failed
// attempt, never more than Max.
type backoff struct {
	First, Max time.Duration
	// Attempt bounds one attempt.
	Attempt time.Duration
}

// redisBackoff is how limitd waits for Redis at start: 100 ms, 200 ms, ...
// up to one attempt every 5 s, each attempt bounded by 2 s.
var redisBackoff = backoff{First: 100 * time.Millisecond, Max: 5 * time.Second, Attempt: 2 * time.Second}

// delay returns the wait after the n-th failed attempt (n >= 1).
func (b backoff) delay(n int) time.Duration {
	d := b.First
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// waitForRedis calls load until it succeeds or ctx is done, waiting
// b.delay(n) after the n-th failure and logging each one. It returns what
// load returned and the number of attempts, or ctx's error.
func waitForRedis(ctx context.Context, load func(context.Context) (string, error), b backoff, log *slog.Logger) (string, int, error) {
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, b.Attempt)
		sha, err := load(actx)
		cancel()
		if err == nil {
			return sha, n, nil
		}
		if ctx.Err() != nil {
			return "", n, ctx.Err()
		}
		wait := b.delay(n)
		log.Warn("waiting for redis: /readyz answers 503 until it answers", "attempt", n, "retry_in", wait.String(), "err", err)
		select {
		case <-ctx.Done():
			return "", n, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// loadTokens reads the callers and their credentials: from file, one per
// line, "<name> <token>" (a gateway: its name, the caller whose ledger its
// calls use, and its bearer token), "<name> <token> front-proxy" (a front
// proxy's token: its calls are those of the identity it forwards),
// "<name> identity <value>" (a caller known by the identity a front proxy
// forwards) or a bare token (named "default"), blank lines and lines
// starting with # skipped; without a file, the one token in LIMITD_TOKEN,
// if any.
func loadTokens(file string, getenv func(string) string) ([]service.Token, []service.Identity, error) {
	if file == "" {
		if tok := strings.TrimSpace(getenv("LIMITD_TOKEN")); tok != "" {
			return []service.Token{{Name: service.DefaultCaller, Value: tok}}, nil, nil
		}
		return nil, nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("--token-file: %w", err)
	}
	var toks []service.Token
	var ids []service.Identity
	// A value given twice would make every call carrying it the call of the
	// last line that gives it: the file is refused, naming both lines (not
	// the value, a secret).
	tokenLine := map[string]int{} // a token: the line that gave it
	idLine := map[string]int{}    // an identity: the line that listed it
	once := func(lines map[string]int, v string, n int, what string) error {
		if at, dup := lines[v]; dup {
			return fmt.Errorf("--token-file %s: lines %d and %d give the same %s: one %s names one caller", file, at, n, what, what)
		}
		lines[v] = n
		return nil
	}
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		var err error
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case len(f) == 1:
			toks = append(toks, service.Token{Name: service.DefaultCaller, Value: f[0]})
			err = once(tokenLine, f[0], i+1, "token")
		case len(f) == 2:
			toks = append(toks, service.Token{Name: f[0], Value: f[1]})
			err = once(tokenLine, f[1], i+1, "token")
		case len(f) == 3 && f[2] == "front-proxy" && f[1] != "identity":
			toks = append(toks, service.Token{Name: f[0], Value: f[1], FrontProxy: true})
			err = once(tokenLine, f[1], i+1, "token")
		case len(f) == 3 && f[1] == "identity" && f[2] != "front-proxy":
			ids = append(ids, service.Identity{Name: f[0], Value: f[2]})
			err = once(idLine, f[2], i+1, "identity")
		default:
			err = fmt.Errorf("--token-file %s: line %d: want \"<name> <token>\", \"<name> <token> front-proxy\", \"<name> identity <value>\" or a token, got %d fields", file, i+1, len(f))
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if len(toks) == 0 {
		return nil, nil, fmt.Errorf("--token-file %s: no token", file)
	}
	return toks, ids, nil
}

// metricsAccess is who may read /metrics: its labels carry request values
// (a detailed metric's descriptor values: API keys, user ids). With
// --metrics-listen, whoever reaches that listener, where /metrics is served
// alone; else, on --listen, whoever reaches a loopback address, and on any
// other, a call carrying a caller's bearer token, as /v1 asks.
func metricsAccess(listen, metricsListen string) (service.MetricsAccess, error) {
	if metricsListen != "" {
		if _, port, err := net.SplitHostPort(metricsListen); err != nil {
			return 0, fmt.Errorf("--metrics-listen %q: %w", metricsListen, err)
		} else if metricsListen == listen && port != "0" {
			return 0, fmt.Errorf("--metrics-listen %s: the address of --listen; leave it empty to serve /metrics there", metricsListen)
		}
		return service.MetricsElsewhere, nil
	}
	loopback, err := isLoopback(listen)
	if err != nil {
		return 0, err
	}
	if loopback {
		return service.MetricsOpen, nil
	}
	return service.MetricsBearer, nil
}

// maxMetricsConns bounds the connections of the --metrics-listen listener,
// meant for a scraper or two.
const maxMetricsConns = 16

// serveMetrics serves h at /metrics, and nothing else, on addr: HTTP/1.1
// and h2c, each connection bounded as on --listen, at most maxMetricsConns
// at once (the oldest idle one closed for a new one). served receives
// what Serve returns; the guard is to be swept as --listen's is.
func serveMetrics(o *options, addr string, h http.Handler, served chan<- error, log *slog.Logger) (*http.Server, *service.ConnGuard, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv, guard, err := openServer(maxMetricsConns, mux, log)
	if err != nil {
		return nil, nil, err
	}
	ln, err := o.listenTCP("metrics-listen", addr)
	if err != nil {
		return nil, nil, err
	}
	go func() { served <- srv.Serve(guard.Listener(ln)) }()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return srv, guard, nil
}

// openServer serves h to whoever reaches it, behind a guard of maxConns
// connections: every request counts as one (no caller is asked for). The
// listeners of one open handler (/metrics, the peer's series, the
// ratelimit mode's) are served so.
func openServer(maxConns int, h http.Handler, log *slog.Logger) (*http.Server, *service.ConnGuard, error) {
	guard, err := service.NewConnGuard(service.ConnOptions{MaxConns: maxConns})
	if err != nil {
		return nil, nil, err
	}
	srv := service.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		service.MarkRequest(r.Context(), service.ConnRequest)
		h.ServeHTTP(w, r)
	}), guard, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	return srv, guard, nil
}

// isLoopback reports whether a listen address binds only loopback interfaces:
// "localhost" or a loopback IP. An empty host (all interfaces) or any other
// name is not.
func isLoopback(listen string) (bool, error) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false, fmt.Errorf("--listen %q: %w", listen, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// redisOptions turns --redis and its companions into go-redis options: a URL
// is parsed by redis.ParseURL (one node, or a Cluster seed with
// --redis-cluster); a comma-separated list is a Cluster when it has several
// addresses, Sentinels when --redis-master is set, else one node, with the
// password from LIMITD_REDIS_PASSWORD. Retries are off: a script whose reply
// was lost may have consumed tokens, and retrying would consume them twice.
func redisOptions(o *options, getenv func(string) string) (*redis.UniversalOptions, error) {
	u := &redis.UniversalOptions{
		MasterName:            o.redisMaster,
		IsClusterMode:         o.redisCluster,
		PoolSize:              o.redisPoolSize,
		MaxRetries:            -1,
		DialerRetries:         1, // fail fast while Redis is down; the next decision dials again
		DialTimeout:           time.Second,
		ReadTimeout:           o.timeout,
		WriteTimeout:          o.timeout,
		PoolTimeout:           o.timeout,
		ContextTimeoutEnabled: true,
		ClientName:            "limitd",
	}
	if strings.Contains(o.redis, "://") {
		p, err := redis.ParseURL(o.redis)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		u.Addrs = []string{p.Addr}
		u.Username, u.Password, u.DB, u.TLSConfig = p.Username, p.Password, p.DB, p.TLSConfig
		return u, nil
	}
	for _, a := range strings.Split(o.redis, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("--redis: address %q: %w", a, err)
		}
		u.Addrs = append(u.Addrs, a)
	}
	if len(u.Addrs) == 0 {
		return nil, fmt.Errorf("--redis %q: no address", o.redis)
	}
	u.Password = getenv("LIMITD_REDIS_PASSWORD")
	return u, nil
}

// redisLogger passes go-redis's own log lines (failed dials and the like) to
// the structured log, at most one a second, with a count of those dropped.
type redisLogger struct {
	log        *slog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Printf implements go-redis's internal.Logging.
func (l *redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	l.log.WarnContext(ctx, "go-redis", "detail", fmt.Sprintf(format, v...), "suppressed", n)
}
