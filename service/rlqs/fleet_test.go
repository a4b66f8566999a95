package rlqs

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// envoyEvery is Envoy 1.40's real report cadence (whatever
// reporting_interval says).
const envoyEvery = 5 * time.Second

// fleetNode is a node of the fleet tests: reporting at its own phase.
type fleetNode struct {
	*node
	next time.Time // its next report
	seen bool      // its bucket was reported once
}

// fleet plays Envoys on one key of the plain limit (100 a second, burst 100:
// the key "other" of quotaYAML) in ticks of 10 ms for d, each asking
// demand[i] a second and reporting every 5 s; at each report event(i) may
// change the node (a reconnect, a lost answer, a vanished Envoy). Every
// request is checked against burst + rate × t, t from the test's start (the
// nodes given are all the fleet has had); it returns what the fleet
// admitted over d.
func fleet(t *testing.T, f *fixture, nodes []*fleetNode, demand []float64, d time.Duration,
	event func(i int, n *fleetNode) *fleetNode,
) (admitted float64) {
	t.Helper()
	id := map[string]string{"other": "fleet"}
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := epoch      // the bound counts from the test's start
	var gone float64 // admitted by Envoys that vanished
	total := func() float64 {
		s := gone
		for _, n := range nodes {
			if n != nil {
				s += float64(n.e.total)
			}
		}
		return s
	}
	from := total()
	for tick := time.Duration(0); tick < d; tick += 10 * time.Millisecond {
		f.clock.Add(10 * time.Millisecond)
		now := f.clock.Now()
		for i, n := range nodes {
			if n == nil {
				n = &fleetNode{node: f.node(id, "")}
				nodes[i] = n
			}
			if rng.Float64() < demand[i]/100 {
				n.e.request(now)
				if !n.seen {
					n.seen, n.next = true, now.Add(envoyEvery)
					n.report()
				}
			}
			if n.seen && !now.Before(n.next) {
				n.next = n.next.Add(envoyEvery)
				if event != nil {
					if nn := event(i, n); nn != n {
						gone += float64(n.e.total)
						nodes[i] = nn
						continue
					}
				}
				n.report()
			}
		}
		el := now.Sub(t0).Seconds()
		if got := total(); got > 100+100*el {
			t.Fatalf("at %.2fs: the fleet admitted %.0f, bound %.0f", el, got, 100+100*el)
		}
	}
	return total() - from
}

// A plain limit of 100 a second (no burst extension), one Envoy asking a
// fifth of it, reporting every 5 s as Envoy 1.40 does: nearly everything is
// admitted (before: 228 of 400 on Envoy, TTLs cut below the cadence); the
// same Envoy asking more than the limit admits nearly all of the rate.
func TestPlainLimit(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{})
	n := []*fleetNode{{node: f.node(map[string]string{"other": "fleet"}, "")}}
	got := fleet(t, f, n, []float64{20}, 20*time.Second, nil)
	asked := float64(n[0].e.total + n[0].e.denied)
	t.Logf("100/s plain, asked 20/s for 20 s: %.0f of %.0f admitted (%.1f%%)", got, asked, 100*got/asked)
	if got < 0.95*asked {
		t.Errorf("admitted %.0f of %.0f, want at least 95%%", got, asked)
	}
	got = fleet(t, f, n, []float64{100}, 60*time.Second, nil)
	t.Logf("100/s plain, asked 100/s for 60 s: %.0f admitted (%.1f%% of the rate)", got, got/60)
	if got < 0.9*100*60 {
		t.Errorf("at full demand: admitted %.0f over 60 s, want at least 90%% of the rate", got)
	}
}

// Three Envoys over the limit on one key of the plain limit, reporting every
// 5 s, their streams reset, their answers lost before their streams end,
// and Envoys vanishing and others coming: the fleet never admits more than
// burst + rate × t, at any request, and still admits most of the rate.
func TestFleetBoundChurn(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{})
	rng := rand.New(rand.NewPCG(3, 9))
	nodes := make([]*fleetNode, 3)
	events := map[string]int{}
	event := func(i int, n *fleetNode) *fleetNode {
		switch rng.IntN(12) {
		case 0: // the stream resets; Envoy keeps its bucket
			events["reset"]++
			n.cancel()
			n.connect()
		case 1: // the answer is computed, never received, and the stream ends
			events["lost"]++
			exchange(t, n.s, "quota", n.e.report(f.clock.Now()))
			n.cancel()
			n.connect()
		case 2: // the Envoy vanishes; another comes
			events["vanished"]++
			n.cancel()
			return nil
		}
		return n
	}
	got := fleet(t, f, nodes, []float64{80, 50, 30}, 5*time.Minute, event)
	t.Logf("5 min, demand 80+50+30 a second over 100: admitted %.0f (%.1f%% of the rate), bound %d; events %v", got, got/300, 100+100*300, events)
	// Every stream's end leaves its commitments counted until they lapse,
	// and its Envoy's next stream starts from what they and the others'
	// fair shares leave: about one event in 40 s per Envoy costs over half
	// the rate (without events: about 90%).
	if got < 0.3*100*300 {
		t.Errorf("admitted %.0f over 5 min, want at least 30%% of the rate under churn", got)
	}
}

// Two limitd replicas over one store, each told --rlqs-replicas 2, each
// serving Envoys on the same key: each assigns half of the limit, so the
// fleet across both stays within burst + rate × t, and admits most of it.
func TestReplicasDivide(t *testing.T) {
	c := &clock{t: epoch}
	st := memoryStore(c)
	f1 := start(t, quotaYAML, fixtureOpts{store: st, clock: c, replicas: 2})
	f2 := start(t, quotaYAML, fixtureOpts{store: st, clock: c, replicas: 2})
	id := map[string]string{"other": "fleet"}
	nodes := []*fleetNode{{node: f1.node(id, "")}, {node: f1.node(id, "")}, {node: f2.node(id, "")}}
	got := fleet(t, f1, nodes, []float64{80, 40, 80}, 2*time.Minute, nil)
	t.Logf("two replicas, 2 min, demand 80+40 (one) and 80 (the other) over 100: admitted %.0f (%.1f%% of the rate)", got, got/120)
	if got < 0.85*100*120 {
		t.Errorf("admitted %.0f over 2 min, want at least 85%% of the rate", got)
	}
}

// A reload reaches a bucket that keeps reporting on its stream: its next
// assignment follows the new limit (before: the old one for the stream's
// life).
func TestReloadReachesReporting(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{})
	n := f.node(map[string]string{"other": "fleet"}, "")
	run(f, []*node{n}, []float64{50}, 10*time.Second, envoyEvery, func(time.Time) {})
	before := n.rateOf()
	cfg, err := rlsconfig.Parse([]rlsconfig.File{{Name: "config.yaml", Data: []byte(strings.Replace(quotaYAML,
		"  - key: other\n    rate_limit: {unit: second, requests_per_unit: 100}",
		"  - key: other\n    rate_limit: {unit: second, requests_per_unit: 10}", 1))}})
	if err != nil {
		t.Fatal(err)
	}
	f.rls.SetConfig(cfg)
	// The old assignment stays counted until it lapses; then the bucket
	// gets the new limit's.
	run(f, []*node{n}, []float64{50}, 30*time.Second, envoyEvery, func(time.Time) {})
	t.Logf("100/s reloaded to 10/s: assigned %.2f/s, then %.2f/s", before, n.rateOf())
	if before < 50 || n.rateOf() > 10 || n.rateOf() < 5 {
		t.Errorf("100/s reloaded to 10/s: assigned %.2f/s, then %.2f/s; want over 50, then 5 to 10", before, n.rateOf())
	}
}

// Under --rls-algorithm fixed_window, a limit that names no algorithm is a
// fixed window to ShouldRateLimit; the quota service answers it DENY_ALL
// rather than dividing it as a second bucket (before: leased as a token
// bucket, twice the limit on a descriptor both doors serve).
func TestFixedWindowDefault(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{algorithm: rlsconfig.FixedWindow})
	s, _ := f.open("")
	r := exchange(t, s, "quota", usage(map[string]string{"other": "x"}, 0, 1, 0))
	if got := blanket(t, r.BucketAction[0]); got != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("a fixed-window limit (the service's algorithm): %v, want DENY_ALL", got)
	}
	f = start(t, strings.Replace(quotaYAML, "requests_per_unit: 100}\n  - key: counted",
		"requests_per_unit: 100, algorithm: token_bucket}\n  - key: counted", 1), fixtureOpts{algorithm: rlsconfig.FixedWindow})
	s, _ = f.open("")
	tokenBucket(t, exchange(t, s, "quota", usage(map[string]string{"other": "x"}, 0, 1, 0)).BucketAction[0])
}

// A gateway that opens streams on an honest Envoy's key, reports a large
// demand and closes them at once (clean churn, 20 streams a second) cannot
// push the honest Envoy, asking 10 a second, below its fair half of the
// key's 40 a minute: what
// each ended stream was assigned counts against its caller's part until it
// lapses (before: 0.02 a second on Envoy against its fair 0.33).
func TestChurningGateway(t *testing.T) {
	for _, gw := range []string{"hostile-token", "honest-token"} {
		t.Run(gw, func(t *testing.T) { churningGateway(t, gw) })
	}
}

// churningGateway is TestChurningGateway with the gateway's token: another
// caller's, or the honest Envoy's own (its streams then share the caller's
// part with the honest one's).
func churningGateway(t *testing.T, gateway string) {
	f := start(t, quotaYAML, fixtureOpts{tokens: callers})
	id := map[string]string{"api_key": "churned"}
	honest := &fleetNode{node: f.node(id, "honest-token")}
	streams := 0
	t0 := f.clock.Now()
	for range 3 * 60 {
		for range 20 {
			s, cancel := f.open(gateway)
			exchange(t, s, "quota", usage(id, 100, 1000, time.Second))
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err == nil { // the stream's end: the server is done with it
				t.Fatal("a closed stream answered")
			}
			cancel()
			streams++
		}
		// The honest Envoy asks 10 a second, reporting every 5 s.
		for range 10 {
			now := f.clock.Now()
			honest.e.request(now)
			if !honest.seen || !now.Before(honest.next) {
				honest.seen, honest.next = true, now.Add(envoyEvery)
				honest.report()
			}
			f.clock.Add(100 * time.Millisecond)
		}
	}
	el := f.clock.Now().Sub(t0).Seconds()
	fair := 40.0 / 60 / 2 * el
	t.Logf("the honest Envoy against %d churned streams over %.0fs: %d admitted (%.2f a second; fair half %.2f)", streams, el, honest.e.total, float64(honest.e.total)/el, fair/el)
	if float64(honest.e.total) < 0.8*fair {
		t.Errorf("the honest Envoy admitted %d over %.0fs, want at least 80%% of its fair half (%.0f)", honest.e.total, el, fair)
	}
}
