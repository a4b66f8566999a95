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
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// rlsFeatures are the flags of what envoyproxy/ratelimit adds to its
// answers and statistics on request (its NEAR_LIMIT_RATIO and the like).
type rlsFeatures struct {
	nearLimitRatio float32
	promListen     string
	promPath       string
	headers        bool
	headerNames    string
	metadata       bool
	checkOnly      bool
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
	fs.StringVar(&o.promListen, "prometheus-listen", "", "address to serve the rate limit service's statistics on as envoyproxy/ratelimit's Prometheus sink names them (its USE_PROMETHEUS, PROMETHEUS_ADDR), alone and to whoever reaches it; empty = off")
	fs.StringVar(&o.promPath, "prometheus-path", "/metrics", "path of those statistics on --prometheus-listen (envoyproxy/ratelimit's PROMETHEUS_PATH)")
	fs.BoolVar(&o.headers, "rls-response-headers", false, "add to the rate limit service's answers the limit closest to refusing as three headers for the client (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.BoolVar(&o.checkOnly, "check", false, "check the configuration at --rls-config (a file or a folder) as the rate limit service would load it, print each file's errors (file:line: field path: reason) or a one-line summary, and exit: non-zero on an error; nothing is started")
	fs.BoolVar(&o.metadata, "rls-response-metadata", false, "add to the rate limit service's answers the request as decided, as dynamic metadata (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA)")
	d := rls.DefaultResponseHeaders
	fs.StringVar(&o.headerNames, "rls-response-header-names", d.Limit+","+d.Remaining+","+d.Reset, "names of those headers: limit,remaining,reset (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER)")
}

// responseHeaders parses --rls-response-header-names.
func (o *rlsFeatures) responseHeaders() (*rls.ResponseHeaders, error) {
	names := strings.Split(o.headerNames, ",")
	if len(names) != 3 {
		return nil, fmt.Errorf("--rls-response-header-names: want three names, limit,remaining,reset; got %q", o.headerNames)
	}
	for i, n := range names {
		names[i] = strings.TrimSpace(n)
		if !validHeaderName(names[i]) {
			return nil, fmt.Errorf("--rls-response-header-names: %q is not a header name", names[i])
		}
	}
	return &rls.ResponseHeaders{Limit: names[0], Remaining: names[1], Reset: names[2]}, nil
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110's
// token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// check validates the flags before anything starts.
// grpcListen is --grpc-listen: the features are the rate limit service's.
func (o *rlsFeatures) check(grpcListen string) error {
	if o.promListen != "" {
		if grpcListen == "" {
			return errors.New("--prometheus-listen: needs --grpc-listen")
		}
		_, port, err := net.SplitHostPort(o.promListen)
		if err != nil {
			return fmt.Errorf("--prometheus-listen: %w", err)
		}
		if o.promListen == grpcListen && port != "0" {
			return fmt.Errorf("--prometheus-listen %s: the address of --grpc-listen", o.promListen)
		}
		if !strings.HasPrefix(o.promPath, "/") {
			return fmt.Errorf("--prometheus-path: must start with /, got %q", o.promPath)
		}
	}
	if grpcListen == "" {
		return nil
	}
	if r := o.nearLimitRatio; !(r > 0 && r <= 1) {
		return fmt.Errorf("--rls-near-limit-ratio: want within (0, 1], got %v", r)
	}
	_, err := o.responseHeaders()
	return err
}

// apply sets the server's options of o.
func (o *rlsFeatures) apply(opts *rls.Options) {
	opts.NearLimitRatio = o.nearLimitRatio
	opts.Metadata = o.metadata
	if o.headers {
		opts.Headers, _ = o.responseHeaders() // checked by check
	}
}

// servePeerSeries serves the envoyproxy/ratelimit series of m, and the Go
// runtime's and the process's, on
// --prometheus-listen, at --prometheus-path only, until ctx ends: a
// registry and a listener of their own, each connection bounded as on
// --metrics-listen. Nothing when the flag is empty.
func (o *rlsFeatures) servePeerSeries(ctx context.Context, m *rls.Metrics, log *slog.Logger) error {
	if o.promListen == "" {
		return nil
	}
	peer := rls.NewPeerSeries()
	// The peer serves its default registry, which holds the Go runtime's
	// and the process's series too: Envoy Gateway's dashboard reads
	// process_*_memory_bytes there (and go_memstats_gc_cpu_fraction, which
	// neither client library's default Go collector has served since Go
	// 1.17).
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{peer, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("--prometheus-listen: %w", err)
		}
	}
	m.WithPeerSeries(peer)
	mux := http.NewServeMux()
	mux.Handle(o.promPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	srv, guard, err := openServer(maxMetricsConns, mux, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.promListen)
	if err != nil {
		return fmt.Errorf("--prometheus-listen: %w", err)
	}
	go func() {
		if err := srv.Serve(guard.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("prometheus listener failed", "addr", o.promListen, "err", err)
		}
	}()
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case now := <-tick.C:
				guard.Sweep(now)
			case <-ctx.Done():
				_ = srv.Close()
				return
			}
		}
	}()
	log.Info("rate limit service's prometheus series listening", "addr", ln.Addr().String(), "path", o.promPath)
	return nil
}

// checkOut is where --check prints.
var checkOut io.Writer = os.Stdout

// checkConfig checks the configuration at path (--rls-config) as the rate
// limit service would load it, without starting it: every file on its own
// (so each refused file is reported, with its first error), then a domain
// named in two files. It prints to w each error, one a line
// ("rlsconfig: <file>:<line>: <field path>: <reason>"), or a one-line
// summary, and returns an error when any file was refused.
func checkConfig(w io.Writer, path string) error {
	if path == "" {
		return errors.New("--check: needs --rls-config")
	}
	files, skipped, err := rlsconfig.ReadFiles(path)
	if err != nil {
		fmt.Fprintln(w, err)
		return fmt.Errorf("--check: %s: not read", path)
	}
	for _, s := range skipped {
		fmt.Fprintf(w, "rlsconfig: %s: skipped: not a regular file\n", s)
	}
	var good []rlsconfig.File
	first := map[string]rlsconfig.File{} // by domain
	refused := 0
	for _, f := range files {
		c, err := rlsconfig.Parse([]rlsconfig.File{f})
		if err == nil && len(c.Domains()) == 1 {
			d := c.Domains()[0]
			if prev, dup := first[d]; dup {
				_, err = rlsconfig.Parse([]rlsconfig.File{prev, f})
			} else {
				first[d] = f
			}
		}
		if err != nil {
			fmt.Fprintln(w, err)
			refused++
			continue
		}
		good = append(good, f)
	}
	if refused > 0 {
		return fmt.Errorf("--check: %s: %d of %d files refused", path, refused, len(files))
	}
	c, err := rlsconfig.Parse(good)
	if err != nil { // not expected: each file and the domains were checked
		fmt.Fprintln(w, err)
		return fmt.Errorf("--check: %s: refused", path)
	}
	descriptors, limits := c.Count()
	fmt.Fprintf(w, "%s: ok: %s, %s, %s (%d with a limit)\n", path, count(len(files), "file"), count(len(c.Domains()), "domain"),
		count(descriptors, "descriptor"), limits)
	return nil
}

// count is "1 <noun>" or "<n> <noun>s".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
