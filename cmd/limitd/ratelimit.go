package main

// The ratelimit mode: limitd invoked as "ratelimit" (build/ratelimit, the
// image's /bin/ratelimit) is configured only by envoyproxy/ratelimit's
// environment variables, with their defaults and meanings, so that the
// deployments that run that service (Istio's sample, Envoy Gateway) run
// limitd by changing only the image. fromEnv (ratelimitenv.go) turns the
// environment into limitd's flags; every variable the peer reads is in its
// table, honoured or, set to a value limitd does not support, refused at
// start naming the variable. Beside limitd's own listeners it serves the
// peer's HTTP listener (HOST:PORT: /healthcheck, /json) and debug listener
// (DEBUG_HOST:DEBUG_PORT).
//
// Authentication: the peer authenticates nobody, and its deployments set
// no token. With no LIMITD_TOKEN or LIMITD_TOKEN_FILE and no client CA
// (GRPC_CLIENT_TLS_CACERT), the gRPC listener serves every caller, with a
// warning in the log at start: the network policy is the guard. With a
// token, every call must carry it.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimit-wasm/tokenbucket/internal/version"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

// ratelimitName is the name (argv[0]'s base) that starts the ratelimit
// mode.
const ratelimitName = "ratelimit"

// isRatelimitName reports whether argv0 starts the ratelimit mode.
func isRatelimitName(argv0 string) bool { return filepath.Base(argv0) == ratelimitName }

// ratelimitMode is what the environment asks beyond limitd's flags.
type ratelimitMode struct {
	byFlag            map[string]string // a flag: the variables that set it
	httpAddr          string            // HOST:PORT
	debugAddr         string            // DEBUG_HOST:DEBUG_PORT
	clientCA          bool              // GRPC_CLIENT_TLS_CACERT: clients are verified
	healthNeedsConfig bool              // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	redisActive       bool              // REDIS_HEALTH_CHECK_ACTIVE_CONNECTION
	refuseDotFiles    string            // RUNTIME_IGNOREDOTFILES=false: the folder
	mapper            string            // PROMETHEUS_MAPPER_YAML
	redisUser         string
	redisPass         string
	sentinelPass      string
	redisTLS          *tls.Config
	redisUnix         bool
	log               *slog.Logger

	// addrs are the listeners' addresses once bound (tests read them).
	addrs atomic.Pointer[modeAddrs]
}

// modeAddrs are the addresses the mode's listeners bound.
type modeAddrs struct{ HTTP, Debug, GRPC, API string }

// maxModeConns bounds each of the mode's HTTP listeners.
const maxModeConns = 256

// maxJSONBytes bounds a /json request body.
const maxJSONBytes = 64 << 10

// runRatelimit is main for the name "ratelimit": the environment only. A
// flag is refused (the peer takes none): run limitd for flags.
func runRatelimit(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(addr string)) error {
	if len(args) > 0 {
		return fmt.Errorf("arguments %q: ratelimit is configured by envoyproxy/ratelimit's environment variables only (docs/from-envoy-ratelimit.md); run limitd for flags", args)
	}
	return runMode(ctx, getenv, stderr, ready, nil)
}

// runMode is runRatelimit, with m, when set, told the mode (tests read
// its addresses).
func runMode(ctx context.Context, getenv func(string) string, stderr io.Writer, ready func(addr string), seen func(*ratelimitMode)) error {
	args, m, err := fromEnv(getenv)
	if err != nil {
		return err
	}
	if seen != nil {
		seen(m)
	}
	o := &options{}
	fs := newFlagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("the environment's flags: %w", err)
	}
	o.mode = m
	if m.unixRedis(o.redis) {
		m.redisUnix = true
	}
	if err := checkDotFiles(m.refuseDotFiles); err != nil {
		return err
	}
	return serve(ctx, o, getenv, stderr, ready)
}

func (m *ratelimitMode) unixRedis(redisFlag string) bool {
	return strings.HasPrefix(redisFlag, "unix://")
}

// checkDotFiles refuses a configuration folder holding a dot file the
// peer, with RUNTIME_IGNOREDOTFILES=false, would read and limitd does not.
// Kubernetes' own entries of a mounted ConfigMap (..data and its
// timestamped folder, both dot entries but not files) are not files.
func checkDotFiles(dir string) error {
	if dir == "" {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // the configuration's own reading says what is wrong
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, e.Name())); err == nil && fi.Mode().IsRegular() {
			return fmt.Errorf("RUNTIME_IGNOREDOTFILES=false: %s holds the dot file %s, which envoyproxy/ratelimit would read and limitd does not: set RUNTIME_IGNOREDOTFILES=true or remove it",
				dir, e.Name())
		}
	}
	return nil
}

// openBusyBound is how long a connection of the open gRPC door may stay
// busy without a break: long, since its calls are served (a quota
// stream lasts as long as its Envoy); the cap's eviction bounds the rest.
const openBusyBound = 24 * time.Hour

// openBusy is the gRPC door's UnauthenticatedBusy: its default (0) unless
// the door is open.
func openBusy(open bool) time.Duration {
	if open {
		return openBusyBound
	}
	return 0
}

// openGRPC reports whether the gRPC listener serves every caller: no token
// and no client certificate, as the peer.
func (m *ratelimitMode) openGRPC(tokens int) bool { return tokens == 0 && !m.clientCA }

// redis applies REDIS_AUTH, REDIS_SENTINEL_AUTH, REDIS_TLS and a socket's
// path to the client's options.
func (m *ratelimitMode) redis(u *redis.UniversalOptions) {
	if m.redisUser != "" || m.redisPass != "" {
		u.Username, u.Password = m.redisUser, m.redisPass
	}
	if m.sentinelPass != "" {
		u.SentinelPassword = m.sentinelPass
	}
	if m.redisTLS != nil {
		u.TLSConfig = m.redisTLS
	}
	if m.redisUnix {
		d := &net.Dialer{Timeout: u.DialTimeout}
		u.Dialer = func(ctx context.Context, _, addr string) (net.Conn, error) { return d.DialContext(ctx, "unix", addr) }
	}
}

// modeServers are the mode's listeners at work.
type modeServers struct {
	servers []*http.Server
	guards  []*service.ConnGuard
	served  chan error
	ready   func(apiAddr string)
	// stopping fails /healthcheck (the peer's on SIGTERM).
	stopping atomic.Bool
}

func (s *modeServers) close() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
}

// shutdown fails /healthcheck, then stops the listeners gracefully.
func (s *modeServers) shutdown(ctx context.Context) {
	s.stopping.Store(true)
	for _, srv := range s.servers {
		_ = srv.Shutdown(ctx)
	}
}

// serve opens the peer's HTTP and debug listeners.
func (m *ratelimitMode) serve(o *options, door *rlsDoor, store service.Store, tokens bool, log *slog.Logger) (*modeServers, error) {
	m.log = log
	if door == nil {
		return nil, errors.New("the ratelimit mode needs the rate limit service (GRPC_HOST, GRPC_PORT)")
	}
	if m.openGRPC(0) && !tokens { // no token, no client CA
		log.Warn("the gRPC listener serves every caller, unauthenticated, as envoyproxy/ratelimit does: only the network policy keeps others out; set LIMITD_TOKEN or LIMITD_TOKEN_FILE, or GRPC_SERVER_USE_TLS with a client CA (GRPC_CLIENT_TLS_CACERT)",
			"addr", door.addr)
	}
	if m.mapper != "" {
		log.Info("PROMETHEUS_MAPPER_YAML is not applied: limitd serves the series of Envoy Gateway's mapping", "file", m.mapper)
	}
	s := &modeServers{served: make(chan error, 2)}
	h := &health{m: m, door: door, store: store, stopping: &s.stopping}
	mux := http.NewServeMux()
	mux.Handle("/healthcheck", h)
	mux.Handle("/json", &jsonHandler{door: door, tokens: tokens, log: log})
	addr, err := m.listen(o, s, "HOST/PORT", m.httpAddr, mux, log)
	if err != nil {
		s.close()
		return nil, err
	}
	debug := http.NewServeMux()
	debug.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.Error(w, "limitd serves no "+r.URL.Path+" here: no pprof and no /stats; its metrics are Prometheus (USE_PROMETHEUS, LIMITD_METRICS_LISTEN)", http.StatusNotFound)
			return
		}
		_, _ = io.WriteString(w, "/rlconfig: the configuration loaded, one line per limit (limitd "+version.Version+")\n")
	})
	debug.HandleFunc("/rlconfig", func(w http.ResponseWriter, r *http.Request) { writeRLConfig(w, door) })
	daddr, err := m.listen(o, s, "DEBUG_HOST/DEBUG_PORT", m.debugAddr, debug, log)
	if err != nil {
		s.close()
		return nil, err
	}
	s.ready = func(api string) {
		m.addrs.Store(&modeAddrs{HTTP: addr, Debug: daddr, GRPC: door.addr, API: api})
	}
	return s, nil
}

// listen serves h on addr, bounded as limitd's other listeners are; an
// error names the variables of the address.
func (m *ratelimitMode) listen(o *options, s *modeServers, vars, addr string, h http.Handler, log *slog.Logger) (string, error) {
	srv, guard, err := openServer(maxModeConns, h, log)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s: %w", vars, err)
	}
	go func() {
		if err := srv.Serve(guard.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.served <- fmt.Errorf("%s: %w", vars, err)
		}
	}()
	s.servers = append(s.servers, srv)
	s.guards = append(s.guards, guard)
	log.Info("listening as envoyproxy/ratelimit", "listener", vars, "addr", ln.Addr().String())
	return ln.Addr().String(), nil
}

// health answers /healthcheck as the peer's health checker does: 200 "OK"
// when healthy, else 500 with no body. Healthy: Redis answered (once at
// start; always, with REDIS_HEALTH_CHECK_ACTIVE_CONNECTION), the
// configuration loaded has a domain (with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED), and limitd is not stopping.
type health struct {
	m        *ratelimitMode
	door     *rlsDoor
	store    service.Store
	stopping *atomic.Bool
}

// ServeHTTP implements http.Handler.
func (h *health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.healthy(r.Context()) {
		_, _ = w.Write([]byte("OK"))
		return
	}
	w.WriteHeader(http.StatusInternalServerError)
}

func (h *health) healthy(ctx context.Context) bool {
	if h.stopping.Load() {
		return false
	}
	if h.m.healthNeedsConfig {
		if c := h.door.rls.Config(); c == nil || len(c.Domains()) == 0 {
			return false // the peer's too: a configuration without a domain is not one
		}
	}
	if g, ok := h.store.(*readyGate); ok {
		if !g.ready.Load() {
			return false
		}
		if h.m.redisActive {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return g.Ping(ctx) == nil
		}
	}
	return true
}

// jsonHandler is the peer's /json: a RateLimitRequest in protobuf's JSON,
// answered with the RateLimitResponse in protobuf's JSON; 429 when over
// the limit, 500 when the code is UNKNOWN, 400 (the body "Bad Request")
// when the request cannot be read or decided. With tokens, /json is
// refused: it would bypass them.
type jsonHandler struct {
	door   *rlsDoor
	tokens bool
	log    *slog.Logger
}

// ServeHTTP implements http.Handler.
func (j *jsonHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if j.tokens {
		http.Error(w, "/json is not served with LIMITD_TOKEN or LIMITD_TOKEN_FILE set: it authenticates no one; call the gRPC service", http.StatusForbidden)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBytes))
	if err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	resp, err := j.door.rls.ShouldRateLimit(service.WithCaller(r.Context(), service.DefaultCaller), &req)
	if err != nil {
		j.log.Debug("/json: refused", "err", err)
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch resp.OverallCode {
	case pb.RateLimitResponse_UNKNOWN:
		w.WriteHeader(http.StatusInternalServerError)
	case pb.RateLimitResponse_OVER_LIMIT:
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// writeRLConfig writes the configuration loaded as the peer's /rlconfig
// does: one line per limit, "<key>: unit=MINUTE requests_per_unit=40,
// shadow_mode: false, quota_mode: false" (an unlimited one's unit UNKNOWN,
// its requests 0), sorted by key; nothing before a configuration is
// loaded.
func writeRLConfig(w io.Writer, door *rlsDoor) {
	c := door.rls.Config()
	if c == nil {
		return
	}
	for _, d := range c.Domains() {
		for _, p := range c.Limits(d) {
			l := p.Limit
			unit, n := strings.ToUpper(l.Unit.String()), l.RequestsPerUnit
			if l.Unlimited {
				unit, n = "UNKNOWN", 0
			}
			fmt.Fprintf(w, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t\n", l.Key, unit, n, l.ShadowMode, l.QuotaMode)
		}
	}
}
