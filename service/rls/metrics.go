package rls

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// MaxSeries bounds the (domain, descriptor) label pairs of the per-limit
// counters: descriptors named with the request's values (detailed_metric,
// value_to_metric, a limit override) would otherwise grow them without
// bound. Past it, hits are counted under descriptor OverflowDescriptor.
const MaxSeries = 10000

// OverflowDescriptor is the descriptor label of the hits of limits beyond
// MaxSeries.
const OverflowDescriptor = "_overflow"

// Metrics are the rate limit service's Prometheus series.
type Metrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec

	invalid      prometheus.Counter
	storeErrors  prometheus.Counter
	shadowErrors prometheus.Counter
	configLoads  *prometheus.CounterVec
	errLog       service.LogThrottle

	mu     sync.RWMutex
	series map[seriesKey]*series

	peer *PeerSeries // nil: not served
}

type seriesKey struct{ domain, descriptor string }

// series are one limit's counters.
type series struct {
	total, over, near, within, shadow prometheus.Counter
}

// NewMetrics registers the rate limit service's series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"domain", "descriptor"})
	}
	m := &Metrics{
		totalHits:   vec("limitd_rls_total_hits_total", "Hits (hits_addend) of rate limit service descriptors that matched a limit, by domain and descriptor (envoyproxy/ratelimit's total_hits)."),
		overLimit:   vec("limitd_rls_over_limit_total", "Hits over the limit (shadow mode included), by domain and descriptor (envoyproxy/ratelimit's over_limit)."),
		nearLimit:   vec("limitd_rls_near_limit_total", "Hits past 80% of the limit and within it, by domain and descriptor (envoyproxy/ratelimit's near_limit)."),
		withinLimit: vec("limitd_rls_within_limit_total", "Hits within the limit, by domain and descriptor (envoyproxy/ratelimit's within_limit)."),
		shadowMode:  vec("limitd_rls_shadow_mode_total", "Hits over the limit of shadow_mode descriptors, answered OK, by domain and descriptor (envoyproxy/ratelimit's shadow_mode)."),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rls_invalid_requests_total",
			Help: "ShouldRateLimit calls refused as InvalidArgument (no domain, no descriptors, beyond the bounds)."}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rls_store_errors_total",
			Help: "ShouldRateLimit calls that failed in the store (answered Unavailable)."}),
		shadowErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rls_shadow_errors_total",
			Help: "Shadow and quota-mode token buckets whose own decision failed in the store (answered OK)."}),
		configLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_rls_config_loads_total",
			Help: "Rate limit service configuration loads, by result: success, or error (the file refused; the previous configuration keeps serving)."}, []string{"result"}),
		series: map[seriesKey]*series{},
	}
	for _, c := range []prometheus.Collector{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode,
		m.invalid, m.storeErrors, m.shadowErrors, m.configLoads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: metrics: %w", err)
		}
	}
	m.configLoads.WithLabelValues("success")
	m.configLoads.WithLabelValues("error")
	return m, nil
}

// WithPeerSeries makes m count envoyproxy/ratelimit's series in p too,
// and returns m. Call it before m's Server serves.
func (m *Metrics) WithPeerSeries(p *PeerSeries) *Metrics {
	m.peer = p
	return m
}

// ConfigLoaded counts a configuration load: ok, or refused.
func (m *Metrics) ConfigLoaded(ok bool) {
	if m.peer != nil {
		m.peer.loaded(ok)
	}
	if ok {
		m.configLoads.WithLabelValues("success").Inc()
	} else {
		m.configLoads.WithLabelValues("error").Inc()
	}
}

// of returns the counters of a limit whose statistics key is key.
func (m *Metrics) of(domain, key string) *series {
	desc := strings.TrimPrefix(key, domain+".")
	k := seriesKey{validLabel(domain), validLabel(desc)}
	m.mu.RLock()
	s := m.series[k]
	m.mu.RUnlock()
	if s != nil {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.series[k]; s != nil {
		return s
	}
	if len(m.series) >= MaxSeries {
		k.descriptor = OverflowDescriptor
		if s := m.series[k]; s != nil {
			return s
		}
	}
	s = &series{
		total:  m.totalHits.WithLabelValues(k.domain, k.descriptor),
		over:   m.overLimit.WithLabelValues(k.domain, k.descriptor),
		near:   m.nearLimit.WithLabelValues(k.domain, k.descriptor),
		within: m.withinLimit.WithLabelValues(k.domain, k.descriptor),
		shadow: m.shadowMode.WithLabelValues(k.domain, k.descriptor),
	}
	m.series[k] = s
	return s
}

// validLabel is s with invalid UTF-8 replaced (Prometheus refuses such label
// values). The handler's decoder already puts a request's invalid strings in
// a valid form (decode.go); this keeps a caller of ShouldRateLimit that
// skips it from failing the call.
func validLabel(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// record counts a descriptor's hits with envoyproxy/ratelimit's meanings,
// nearRatio its NEAR_LIMIT_RATIO (the near threshold is
// floor(float32(limit) × nearRatio), in float32 as there). A fixed window's
// counts are its: of the hits that took the counter past the limit, those
// past it are over the limit and those between the threshold and it near
// the limit. A token bucket's are the same said of the tokens
// used from a full bucket (capacity minus the whole tokens left): a
// descriptor that alone had the tokens is within the limit (near when its
// take left less than 20% of the capacity), one that had not is over the
// limit with all its hits.
func (m *Metrics) record(domain string, d *descriptor, nearRatio float32) {
	c := countsOf(d, nearRatio)
	s := m.of(domain, d.limit.Key)
	s.total.Add(c.total)
	s.over.Add(c.over)
	s.near.Add(c.near)
	s.within.Add(c.within)
	s.shadow.Add(c.shadow)
	if p := m.peer; p != nil {
		p.add(d.limit.Key, c)
	}
}

// counts are what a descriptor's hits add to its statistics.
type counts struct{ total, over, near, within, shadow float64 }

// countsOf is what d's hits count, as record says.
func countsOf(d *descriptor, nearRatio float32) counts {
	hits := float64(d.hits)
	c := counts{total: hits}
	var limit, before, after uint64
	if d.algo == rlsconfig.FixedWindow {
		limit, before, after = uint64(d.limit.RequestsPerUnit), d.before, d.after
	} else {
		limit = uint64(d.limit.Capacity())
		if d.over {
			before, after = limit, limit+d.hits // all the hits over
		} else {
			after = limit - min(limit, d.remaining)
			before = after - min(after, d.hits)
		}
	}
	near := uint64(math.Floor(float64(float32(limit) * nearRatio)))
	if after > limit {
		if before >= limit {
			c.over = hits
		} else {
			c.over = float64(after - limit)
			c.near = float64(limit - max(near, before))
		}
		if d.limit.ShadowMode {
			c.shadow = c.over
		}
		return c
	}
	if after > near {
		if before >= near {
			c.near = hits
		} else {
			c.near = float64(after - near)
		}
	}
	c.within = hits
	return c
}
