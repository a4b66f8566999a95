package rlqs

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
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
// every node reporting each interval; check sees the time of each request
// and, after the reports, the clock.
func run(f *fixture, nodes []*node, demand []float64, d, interval time.Duration, check func(time.Time)) {
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
					check(at)
					continue
				}
				n.e.request(at)
				check(at)
			}
		}
		f.clock.Add(from.Add(interval).Sub(f.clock.Now()))
		for _, n := range nodes {
			n.report()
		}
		check(f.clock.Now())
	}
}

// Two Envoys sharing one budget of 40 a minute never admit more than
// burst + rate × t together, across reports, demand moving, a stream reset,
// and an Envoy vanishing without a word and another taking its place.
func TestFleetBound(t *testing.T) {
	func() {
		c := &clock{t: epoch}
		st := memoryStore(c)
		f := start(t, quotaYAML, fixtureOpts{store: st, clock: c})
		id := map[string]string{"api_key": "shared"}
		a, b := f.node(id, ""), f.node(id, "")
		nodes := []*node{a, b}
		t0 := c.Now()
		var olds uint64 // admitted by Envoys that are gone
		total := func() uint64 {
			s := olds
			for _, n := range nodes {
				s += n.e.total
			}
			return s
		}
		margin := 1e9
		check := func(at time.Time) {
			el := at.Sub(t0)
			bound := 40 + 40.0/60*el.Seconds()
			got := float64(total())
			if got > bound {
				t.Fatalf("at %v: the fleet admitted %v, bound %.1f", el, got, bound)
			}
			margin = min(margin, bound-got)
		}
		phase := func(name string, demand []float64, d time.Duration) {
			from := total()
			run(f, nodes, demand, d, time.Second, check)
			t.Logf("%s (%v, demand %v/s): admitted %d, the rate over it %.1f", name, d, demand, total()-from, 40.0/60*d.Seconds())
		}
		phase("both busy", []float64{5, 5}, 60*time.Second)
		phase("demand moved to a", []float64{10, 0}, 30*time.Second)
		b.cancel()
		b.connect()
		phase("b's stream reset", []float64{10, 2}, 30*time.Second)
		a.cancel() // vanished without a word; another Envoy comes
		olds += a.e.total
		nodes[0] = f.node(id, "")
		phase("a vanished, a new Envoy", []float64{5, 5}, 120*time.Second)
		el := c.Now().Sub(t0)
		t.Logf("over %v: admitted %d of a bound %.1f (closest to it: %.1f under)", el, total(), 40+40.0/60*el.Seconds(), margin)
		if float64(total()) < 0.5*40.0/60*el.Seconds() {
			t.Errorf("admitted %d over %v: under half the rate", total(), el)
		}
	}()
}

// assigned is the most the node's current assignment lets it admit a
// minute: its max_tokens plus its rate over a minute (0 without one).
func (n *node) assigned() float64 {
	if !n.e.has || n.e.tb == nil {
		return 0
	}
	return float64(n.e.tb.MaxTokens) + float64(n.e.tb.TokensPerFill.GetValue())/n.e.tb.FillInterval.AsDuration().Seconds()*60
}

// rateOf is the rate of the node's current assignment, a second (0
// without a token bucket).
func (n *node) rateOf() float64 {
	if !n.e.has || n.e.tb == nil {
		return 0
	}
	return float64(n.e.tb.TokensPerFill.GetValue()) / n.e.tb.FillInterval.AsDuration().Seconds()
}

// Shares follow demand: the busy Envoy is assigned more than the idle one;
// a new Envoy, on a rate the others' assignments hold whole, has a token
// bucket once their larger assignments have lapsed (TTL and grace: 11
// reports of a second) and its demand within three more; the shares swap
// within as many reports of the demand swapping.
func TestSharesFollowDemand(t *testing.T) {
	c := &clock{t: epoch}
	f := start(t, quotaYAML, fixtureOpts{store: memoryStore(c), clock: c})
	id := map[string]string{"team": "moving"}
	a, b := f.node(id, ""), f.node(id, "")
	nodes := []*node{a, b}
	nop := func(time.Time) {}
	run(f, nodes, []float64{6, 1}, 20*time.Second, time.Second, nop)
	if a.rateOf() <= 2*b.rateOf() || a.rateOf() < 6 {
		t.Fatalf("a at 6/s, b at 1/s: a assigned %.2f/s, b %.2f/s", a.rateOf(), b.rateOf())
	}
	t.Logf("a at 6/s, b at 1/s: a assigned %.2f/s, b %.2f/s", a.rateOf(), b.rateOf())
	lapse := int((DefaultTTL+DefaultGrace)/time.Second) + 3
	cn := f.node(id, "")
	nodes = append(nodes, cn)
	reports := 0
	for cn.rateOf() < 3 {
		if reports++; reports > lapse {
			t.Fatalf("a new Envoy asking 3/s, %d reports later: %.2f/s", lapse, cn.rateOf())
		}
		run(f, nodes, []float64{6, 1, 3}, time.Second, time.Second, nop)
	}
	t.Logf("a new Envoy asking 3/s is assigned %.2f/s after %d reports", cn.rateOf(), reports)
	// Swapped, the three ask 2, 12 and 6 a second with room to grow: over
	// the 10 of the limit, so b and the new one are held to the max-min
	// fair level, and a to its 2.
	reports = 0
	for b.rateOf() < 1.5*a.rateOf() || b.rateOf() < 3.5 {
		if reports++; reports > lapse {
			t.Fatalf("demand swapped, %d reports later: a %.2f/s, b %.2f/s", lapse, a.rateOf(), b.rateOf())
		}
		run(f, nodes, []float64{1, 6, 3}, time.Second, time.Second, nop)
	}
	t.Logf("demand swapped: b at its fair share after %d reports (a %.2f/s, b %.2f/s, the new one %.2f/s)", reports, a.rateOf(), b.rateOf(), cn.rateOf())
}
