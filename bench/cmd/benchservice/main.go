// Command benchservice measures the limit service against a real Redis and
// prints a markdown table: decisions per second and p50/p99 latency of the
// HTTP API (in-process, on loopback, closed-loop load over keep-alive
// connections) with and without batching, beside redis-benchmark running
// the same script with EVALSHA against the same server in the same run (the
// ceiling a service could reach if HTTP cost nothing), and the in-memory
// store (the ceiling of the HTTP layer alone).
//
// Every run is bounded: -duration per service run, -n requests per
// redis-benchmark run. Everything shares this machine's CPUs: the load
// generator, the service and redis-server compete, so compare the ratios
// more than the absolute numbers.
//
//	go run ./cmd/benchservice -duration 2s -c 50 -rounds 3
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

type config struct {
	duration time.Duration
	warmup   time.Duration
	conc     int
	keys     int
	n        int
	batchMax int
	workers  int
	rounds   int
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 2*time.Second, "measured time of each service run")
	flag.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unmeasured time before each service run")
	flag.IntVar(&cfg.conc, "c", 50, "concurrent clients (service runs and redis-benchmark)")
	flag.IntVar(&cfg.keys, "keys", 1000, "distinct bucket keys")
	flag.IntVar(&cfg.n, "n", 100000, "requests per redis-benchmark run")
	flag.IntVar(&cfg.batchMax, "batch-max", 64, "batch size of the batched run")
	flag.IntVar(&cfg.workers, "batch-workers", 4, "pipelines in flight in the batched run")
	flag.IntVar(&cfg.rounds, "rounds", 3, "interleaved rounds of every run; each row reports the median")
	flag.Parse()
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchservice:", err)
		os.Exit(1)
	}
}

// result is one row of the table.
type result struct {
	name      string
	rps       float64
	p50, p99  time.Duration
	note      string
	isCeiling bool
}

func run(cfg config, out io.Writer) error {
	if cfg.conc < 1 || cfg.keys < 1 || cfg.n < 1 || cfg.duration <= 0 || cfg.rounds < 1 {
		return errors.New("-c, -keys, -n, -rounds and -duration must be positive")
	}
	srv, err := redistest.StartServer(redistest.Options{})
	if err != nil {
		return err
	}
	defer srv.Stop()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 2 * cfg.conc})
	defer client.Close()

	// Rate and burst large enough that every decision admits and writes.
	const rate, burst = 1e6, 1e6
	var results []result

	shaOut, err := exec.Command("redis-cli", "-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()),
		"SCRIPT", "LOAD", service.DecideScript()).Output()
	if err != nil {
		return fmt.Errorf("redis-cli SCRIPT LOAD: %w", err)
	}
	sha := strings.TrimSpace(string(shaOut))

	// Rounds interleave the runs, so a burst of load from elsewhere on the
	// machine hits all of them alike; each row reports its median round.
	const numRuns = 7
	rounds := make([][]result, numRuns)
	for round := range cfg.rounds {
		for i := range numRuns {
			r, err := runOne(i, cfg, client, srv.Port(), sha, rate, burst)
			if err != nil {
				return fmt.Errorf("round %d: %w", round+1, err)
			}
			rounds[i] = append(rounds[i], r)
		}
	}
	for _, rs := range rounds {
		slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.rps, b.rps) })
		med := rs[len(rs)/2]
		if len(rs) > 1 {
			med.note += fmt.Sprintf("; median of %d rounds (%.0f–%.0f/s)", len(rs), rs[0].rps, rs[len(rs)-1].rps)
		}
		results = append(results, med)
	}
	printTable(out, cfg, results)
	return nil
}

// runOne runs measurement i: the two redis-benchmark runs, then the
// service with the in-memory store, with Redis unbatched, and batched.
func runOne(i int, cfg config, client *redis.Client, port int, sha string, rate, burst float64) (result, error) {
	if i < 2 {
		return redisBenchmark(port, sha, cfg, []int{1, 16}[i], rate, burst)
	}
	mode := []struct {
		name   string
		batch  int
		mem    bool
		noHTTP bool
	}{
		{"service, in-memory store (HTTP ceiling)", 0, true, false},
		{"service → Redis, no batching", 0, false, false},
		{"service → Redis, batching", cfg.batchMax, false, false},
		{"store only (no HTTP) → Redis, no batching", 0, false, true},
		{"store only (no HTTP) → Redis, batching", cfg.batchMax, false, true},
	}[i-2]
	reg := prometheus.NewRegistry()
	var store service.Store
	if mode.mem {
		store = service.NewMemoryStore(service.MemoryOptions{})
	} else {
		rs, err := service.NewRedisStore(client, service.RedisOptions{
			KeyPrefix: "rl:", Registerer: reg,
			Batch: service.BatchOptions{MaxSize: mode.batch, Workers: cfg.workers},
		})
		if err != nil {
			return result{}, err
		}
		store = rs
	}
	var r result
	var err error
	if mode.noHTTP {
		r, err = loadStore(cfg, store, reg, rate, burst)
	} else {
		r, err = loadService(cfg, store, reg, rate, burst)
	}
	store.Close()
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", mode.name, err)
	}
	r.name = mode.name
	return r, nil
}

// redisBenchmark runs redis-benchmark with EVALSHA of the decision script on
// random keys, pipe requests per round trip.
func redisBenchmark(port int, sha string, cfg config, pipe int, rate, burst float64) (result, error) {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-n", strconv.Itoa(cfg.n),
		"-c", strconv.Itoa(cfg.conc), "-r", strconv.Itoa(cfg.keys), "-P", strconv.Itoa(pipe), "--csv",
		"evalsha", sha, "1", "rl:{__rand_int__}:bench",
		strconv.FormatFloat(rate, 'g', -1, 64), strconv.FormatFloat(burst, 'g', -1, 64), "1", "0", "0", // cost 1, not refundable, no max delay
		"0", "0", // no period (a token bucket)
		service.DefaultCaller, strconv.FormatInt(service.DefaultLedgerWindow.Microseconds(), 10)} // the caller, the ledger window
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raw, err := exec.CommandContext(ctx, "redis-benchmark", args...).Output()
	if err != nil {
		return result{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	recs, err := csv.NewReader(bytes.NewReader(raw)).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[1]) < 7 {
		return result{}, fmt.Errorf("redis-benchmark: unexpected output %q", raw)
	}
	num := func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }
	ms := func(s string) time.Duration { return time.Duration(num(s) * float64(time.Millisecond)) }
	name := "redis-benchmark EVALSHA (ceiling)"
	if pipe > 1 {
		name = fmt.Sprintf("redis-benchmark EVALSHA -P %d (pipelined)", pipe)
	}
	return result{name: name, rps: num(recs[1][1]), p50: ms(recs[1][4]), p99: ms(recs[1][6]),
		note: fmt.Sprintf("-c %d -n %d", cfg.conc, cfg.n), isCeiling: pipe == 1}, nil
}

// loadService serves store on a loopback port and drives it with cfg.conc
// closed-loop clients for warmup + duration.
func loadService(cfg config, store service.Store, reg *prometheus.Registry, rate, burst float64) (result, error) {
	api, err := service.NewServer(service.Config{Store: store, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return result{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	hs := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	url := "http://" + ln.Addr().String() + "/v1/decide"

	bodies := make([][]byte, cfg.keys)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"buckets":[{"key":"bench-%d","tokens_per_second":%g,"burst":%g}]}`, i, rate, burst)
	}
	tr := &http.Transport{MaxIdleConns: cfg.conc, MaxIdleConnsPerHost: cfg.conc, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}

	return closedLoop(cfg, reg, func(k int) (bool, error) {
		resp, err := hc.Post(url, "application/json", bytes.NewReader(bodies[k]))
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200, nil // e.g. 503 when a decision outlives its timeout
	})
}

// loadStore drives store.Decide directly (no HTTP) like loadService.
func loadStore(cfg config, store service.Store, reg *prometheus.Registry, rate, burst float64) (result, error) {
	reqs := make([]*wire.Request, cfg.keys)
	for i := range reqs {
		reqs[i] = &wire.Request{Buckets: []wire.Bucket{{Key: "bench-" + strconv.Itoa(i), Rate: rate, Burst: burst, Cost: 1}}}
	}
	return closedLoop(cfg, reg, func(k int) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), service.DefaultTimeout)
		_, err := store.Decide(ctx, reqs[k])
		cancel()
		return err == nil, nil
	})
}

// closedLoop runs cfg.conc workers calling do (with a key index) back to back
// for warmup + duration (internal/loadgen's closed loop) and measures the
// calls made after the warmup. do reports whether the call succeeded; an
// error fails the run.
func closedLoop(cfg config, reg *prometheus.Registry, do func(key int) (bool, error)) (result, error) {
	start := time.Now()
	measureFrom := start.Add(cfg.warmup)
	end := measureFrom.Add(cfg.duration)
	errs := make([]error, cfg.conc)
	keys := make([]int, cfg.conc)
	cs := make([]loadgen.Counts, cfg.conc)
	lats := loadgen.Closed(func(w int, n int64) (int, error) {
		keys[w] = (keys[w]*7 + 1) % cfg.keys
		if n == 0 {
			keys[w] = (w*7 + 1) % cfg.keys
		}
		ok, err := do(keys[w])
		switch {
		case err != nil:
			errs[w] = err
			return 0, loadgen.ErrStop
		case !ok:
			return 500, nil
		}
		return 200, nil
	}, cs, measureFrom, end, nil)
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	all := loadgen.Merge(lats).NS
	if len(all) == 0 {
		return result{}, errors.New("no request completed")
	}
	r := result{
		rps: float64(len(all)) / cfg.duration.Seconds(),
		p50: time.Duration(loadgen.Percentile(all, 0.50)),
		p99: time.Duration(loadgen.Percentile(all, 0.99)),
	}
	r.note = fmt.Sprintf("-c %d, %v", cfg.conc, cfg.duration)
	if n := loadgen.Sum(cs).Other; n > 0 {
		r.note += fmt.Sprintf(", %d failed (not counted)", n)
	}
	if n, sum := batchStats(reg); n > 0 {
		r.note += fmt.Sprintf(", %.1f decisions per pipeline", sum/float64(n))
	}
	return r, nil
}

// batchStats reads the pipeline-size histogram: count and sum.
func batchStats(reg *prometheus.Registry) (uint64, float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "limitd_redis_batch_size" && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

func printTable(out io.Writer, cfg config, rs []result) {
	var ceiling float64
	for _, r := range rs {
		if r.isCeiling {
			ceiling = r.rps
		}
	}
	fmt.Fprintf(out, "\n### limit service vs. EVALSHA ceiling (one decision = one script run; %d keys)\n\n", cfg.keys)
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(out, "%d CPUs (GOMAXPROCS %d), load average at the end: %s; load generator, service and redis-server share them.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "))
	fmt.Fprintln(out, "| run | decisions/s | p50 | p99 | / EVALSHA ceiling | notes |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---|")
	for _, r := range rs {
		ratio := "—"
		if ceiling > 0 {
			ratio = fmt.Sprintf("%.2f", r.rps/ceiling)
		}
		fmt.Fprintf(out, "| %s | %.0f | %s | %s | %s | %s |\n", r.name, r.rps, fmtDur(r.p50), fmtDur(r.p99), ratio, r.note)
	}
	rps := map[string]float64{}
	for _, r := range rs {
		rps[r.name] = r.rps
	}
	direct, batched := rps["service → Redis, no batching"], rps["service → Redis, batching"]
	sDirect, sBatched := rps["store only (no HTTP) → Redis, no batching"], rps["store only (no HTTP) → Redis, batching"]
	if direct > 0 && sDirect > 0 && ceiling > 0 {
		fmt.Fprintf(out, "\nservice throughput / EVALSHA ceiling: without batching %.2f, with batching %.2f (batching ×%.2f)\n",
			direct/ceiling, batched/ceiling, batched/direct)
		fmt.Fprintf(out, "store only / EVALSHA ceiling: without batching %.2f, with batching %.2f (batching ×%.2f)\n",
			sDirect/ceiling, sBatched/ceiling, sBatched/sDirect)
	}
}

func fmtDur(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64) + " ms"
}
