package rlqs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Metrics are the quota service's Prometheus series.
type Metrics struct {
	streams    prometheus.Gauge
	reports    prometheus.Counter
	refused    *prometheus.CounterVec
	storeCalls prometheus.Counter
	storeErrs  prometheus.Counter
	leased     prometheus.Counter
	returned   prometheus.Counter
	abandoned  prometheus.Counter
}

// NewMetrics registers the quota service's series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "limitd_rlqs_streams",
			Help: "Rate limit quota streams open."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_reports_total",
			Help: "Usage reports received."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_rlqs_refused_streams_total",
			Help: "Streams ended by a status beyond the bounds or the rules, by gRPC code."}, []string{"code"}),
		storeCalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_store_calls_total",
			Help: "Lease calls made to the store for quota assignments and returns."}),
		storeErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_store_errors_total",
			Help: "Lease calls that failed (the assignment in force stands until its TTL)."}),
		leased: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_leased_tokens_total",
			Help: "Tokens leased from global buckets for quota assignments."}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_returned_tokens_total",
			Help: "Tokens given back to global buckets (after the ledger's clamps)."}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_abandoned_buckets_total",
			Help: "Buckets abandoned after being reported idle."}),
	}
	for _, c := range []prometheus.Collector{m.streams, m.reports, m.refused, m.storeCalls, m.storeErrs, m.leased, m.returned, m.abandoned} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rlqs: metrics: %w", err)
		}
	}
	// The codes a stream can end with (Server.StreamRateLimitQuotas),
	// shown at 0 from the start.
	for _, c := range []codes.Code{codes.InvalidArgument, codes.ResourceExhausted, codes.Unauthenticated, codes.Unavailable} {
		m.refused.WithLabelValues(c.String())
	}
	return m, nil
}

// refuse counts a stream ended by err's status and returns err.
func (m *Metrics) refuse(err error) error {
	if m != nil && err != nil {
		m.refused.WithLabelValues(status.Code(err).String()).Inc()
	}
	return err
}
