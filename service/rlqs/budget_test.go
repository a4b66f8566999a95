package rlqs

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

// node is one simulated Envoy with one bucket, on its stream.
type node struct {
	t      *testing.T
	f      *fixture
	e      *envoy
	s      rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
	token  string
}

func (f *fixture) node(id map[string]string, token string) *node {
	n := &node{t: f.t, f: f, e: newEnvoy(id, f.clock.Now()), token: token}
	n.connect()
	return n
}

// connect opens a new stream (Envoy keeps its bucket and assignment).
func (n *node) connect() { n.s, n.cancel = n.f.open(n.token) }

// report sends the bucket's usage and applies the answer.
func (n *node) report() {
	n.t.Helper()
	now := n.f.clock.Now()
	r := exchange(n.t, n.s, "quota", n.e.report(now))
	for _, a := range r.BucketAction {
		n.e.apply(a, now)
	}
}

// run sends demand requests a second to each node over d (spread evenly),
// every node reporting each interval; check sees the clock after each.
func run(f *fixture, nodes []*node, demand []float64, d, interval time.Duration, check func()) {
	for end := f.clock.Now().Add(d); f.clock.Now().Before(end); {
		from := f.clock.Now()
		for i, n := range nodes {
			k := int(demand[i] * interval.Seconds())
			for j := range k {
				at := from.Add(time.Duration(j) * interval / time.Duration(k))
				if !n.e.has && n.e.total == 0 && n.e.denied == 0 { // a new bucket: the first report at once
					n.e.request(at)
					f.clock.Add(at.Sub(f.clock.Now()))
					n.report()
					continue
				}
				n.e.request(at)
			}
		}
		f.clock.Add(from.Add(interval).Sub(f.clock.Now()))
		for _, n := range nodes {
			n.report()
		}
		check()
	}
}

// Two Envoys sharing one budget of 40 a minute never admit more than
// burst + rate × t together, across reports, demand moving, a stream reset,
// and an Envoy vanishing without a word and another taking its place.
func TestFleetBound(t *testing.T) {
	stores(t, func(t *testing.T, st service.Store, c *clock) {
		f := start(t, quotaYAML, fixtureOpts{store: st, clock: c})
		id := map[string]string{"api_key": "shared"}
		a, b := f.node(id, ""), f.node(id, "")
		nodes := []*node{a, b}
		t0, real0 := c.Now(), time.Now()
		var olds uint64 // admitted by Envoys that are gone
		total := func() uint64 {
			s := olds
			for _, n := range nodes {
				s += n.e.total
			}
			return s
		}
		margin := 1e9
		check := func() {
			el := c.Now().Sub(t0)
			if _, ok := st.(*service.RedisStore); ok { // its bucket refills on its own clock
				el = time.Since(real0) + time.Second
			}
			bound := 40 + 40.0/60*el.Seconds()
			got := float64(total())
			if got > bound {
				t.Fatalf("at %v: the fleet admitted %v, bound %.1f", el, got, bound)
			}
			margin = min(margin, bound-got)
		}
		run(f, nodes, []float64{5, 5}, 60*time.Second, time.Second, check)
		t.Logf("after 60 s of 5/s each: a %d, b %d", a.e.total, b.e.total)
		run(f, nodes, []float64{10, 0}, 30*time.Second, time.Second, check)
		b.cancel()
		b.connect()
		run(f, nodes, []float64{10, 2}, 30*time.Second, time.Second, check)
		a.cancel() // vanished without a word; another Envoy comes
		olds += a.e.total
		nodes[0] = f.node(id, "")
		run(f, nodes, []float64{5, 5}, 120*time.Second, time.Second, check)
		el := c.Now().Sub(t0)
		t.Logf("over %v: admitted %d of a bound %.1f (closest to it: %.1f under)", el, total(), 40+40.0/60*el.Seconds(), margin)
		if _, ok := st.(*service.MemoryStore); ok && float64(total()) < 0.5*40.0/60*el.Seconds() {
			t.Errorf("admitted %d over %v: under half the rate", total(), el)
		}
	})
}
