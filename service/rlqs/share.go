package rlqs

import (
	"math"
	"sort"
	"sync"
	"time"
)

// shares divides each global bucket's rate between the callers (token
// names) whose streams report it, by their reported demand: max-min fair
// (no caller is given more than an equal split while another asks for
// more), then the rest of the rate (but Headroom of it) in proportion to
// demand; a caller's part is divided between its streams the same way, all
// of it. A
// caller that names a demand far above the others', or opens many streams,
// so gets no more than an equal split of the rate.
type shares struct {
	mu   sync.Mutex
	keys map[string]map[uint64]demand // bucket key -> stream id -> demand
}

// demand is one stream's last reported demand of a bucket, in requests per
// second, and when it was reported.
type demand struct {
	caller string
	rate   float64
	at     time.Time
}

func newShares() *shares { return &shares{keys: map[string]map[uint64]demand{}} }

// set records stream's demand of key at now and returns its fraction of
// the key's rate limit (0 to 1) and its caller's, counting only the demands
// reported within stale.
func (s *shares) set(key string, stream uint64, caller string, rate, limit float64, now time.Time, stale time.Duration) (frac, callerFrac float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.keys[key]
	if m == nil {
		m = map[uint64]demand{}
		s.keys[key] = m
	}
	if math.IsNaN(rate) || rate < 0 {
		rate = 0
	}
	m[stream] = demand{caller: caller, rate: math.Min(rate, 1e12), at: now}
	byCaller := map[string]float64{}
	for id, d := range m {
		if now.Sub(d.at) > stale {
			delete(m, id)
			continue
		}
		byCaller[d.caller] += d.rate
	}
	names := make([]string, 0, len(byCaller))
	for c := range byCaller {
		names = append(names, c)
	}
	sort.Strings(names)
	ds := make([]float64, len(names))
	mine := 0
	for i, c := range names {
		ds[i] = byCaller[c]
		if c == caller {
			mine = i
		}
	}
	callerFrac = fairShares(ds, limit)[mine]
	// Within the caller: the same division of the caller's part.
	var own []float64
	me := 0
	for _, id := range sortedIDs(m) {
		if d := m[id]; d.caller == caller {
			if id == stream {
				me = len(own)
			}
			own = append(own, d.rate)
		}
	}
	within, sum := fairShares(own, callerFrac*limit), 0.0
	for _, w := range within {
		sum += w
	}
	return callerFrac * within[me] / sum, callerFrac
}

func sortedIDs(m map[uint64]demand) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// drop forgets stream's demand of key.
func (s *shares) drop(key string, stream uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.keys[key]; m != nil {
		delete(m, stream)
		if len(m) == 0 {
			delete(s.keys, key)
		}
	}
}

// Headroom is the part of a rate that the demands leave unasked which is
// not spread over them: a new Envoy finds it uncommitted at its first
// report.
const Headroom = 0.5

// fairShares returns the fractions (summing to at most 1) of a rate that
// streams demanding ds (requests per second) receive. Each demand is first
// doubled (room to grow between two reports) and raised by a floor of a
// twentieth of an equal split (an idle stream keeps a little, a new one
// starts with some). When the doubled demands fit in the rate, each gets
// its own and, in proportion, the rest but Headroom of it; when they do
// not, they are capped at
// the max-min fair level L (sum(min(c, L)) = rate): nobody gets more than
// L while another wants more, so a stream claiming an absurd demand gets at
// most what the others leave, and each honest one at least min(its demand,
// an equal split).
func fairShares(ds []float64, rate float64) []float64 {
	n := len(ds)
	out := make([]float64, n)
	if n == 0 {
		return out
	}
	if rate <= 0 {
		rate = 1
	}
	c := make([]float64, n)
	sum := 0.0
	for i, d := range ds {
		if d < 0 || math.IsNaN(d) {
			d = 0
		}
		c[i] = 2*math.Min(d, 1e12) + rate/float64(n)/20
		sum += c[i]
	}
	if sum > rate {
		sorted := append([]float64(nil), c...)
		sort.Float64s(sorted)
		level, acc := math.Inf(1), 0.0
		for i, v := range sorted {
			rest := float64(n - i)
			if acc+v*rest >= rate {
				level = (rate - acc) / rest
				break
			}
			acc += v
		}
		sum = 0
		for i := range c {
			c[i] = math.Min(c[i], level)
			sum += c[i]
		}
	}
	spread := 1.0 // of the rest of the rate, when the demands leave some
	if sum < rate {
		spread = 1 - Headroom
	}
	for i := range c {
		out[i] = (c[i] + (rate-sum)*spread*c[i]/sum) / rate
	}
	return out
}
