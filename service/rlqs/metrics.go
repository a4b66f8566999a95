package rlqs

import (
	"fmt"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Metrics are the quota service's Prometheus series.
type Metrics struct {
	streams    prometheus.Gauge
	reports    prometheus.Counter
	responses  prometheus.Counter
	assigned   prometheus.Counter
	refused    *prometheus.CounterVec
	storeCalls prometheus.Counter
	storeErrs  prometheus.Counter
	leased     prometheus.Counter
	returned   prometheus.Counter
	abandoned  prometheus.Counter
	overBudget prometheus.Counter
	untracked  *prometheus.CounterVec
}

// NewMetrics registers the quota service's series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "limitd_rlqs_streams",
			Help: "Rate limit quota streams open."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_reports_total",
			Help: "Usage reports received."}),
		responses: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_responses_total",
			Help: "Responses sent on quota streams."}),
		assigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_assignments_total",
			Help: "Quota assignments sent (token buckets and blanket rules; abandons are counted apart)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_rlqs_refused_streams_total",
			Help: "Streams ended by a status beyond the bounds or the rules, by gRPC code."}, []string{"code"}),
		storeCalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_store_calls_total",
			Help: "Store calls debiting what Envoys reported allowed from the descriptors' buckets."}),
		storeErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_store_errors_total",
			Help: "Store calls that failed (their debits are lost; assignments do not depend on the store)."}),
		leased: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_leased_tokens_total",
			Help: "Requests reported allowed that were debited from the descriptors' buckets."}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_returned_tokens_total",
			Help: "Always 0: the quota service leases nothing up front, so nothing is given back (kept for dashboards)."}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_abandoned_buckets_total",
			Help: "Buckets abandoned: reported idle for the abandon time, idle and not kept, or to make room for a new bucket."}),
		overBudget: prometheus.NewCounter(prometheus.CounterOpts{Name: "limitd_rlqs_reports_over_budget_total",
			Help: "Reports past a stream's report budget: read, their new buckets left unanswered."}),
		untracked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_rlqs_untracked_buckets_total",
			Help: "Bucket usages answered without the bucket being kept, by why: max_buckets (the stream's or the process's bound), utf8, entry_bytes, id_bytes, entries, empty (unreadable: answered as unmatched), over_budget, past_max_usages (not answered)."}, []string{"why"}),
	}
	for _, c := range []prometheus.Collector{m.streams, m.reports, m.responses, m.assigned, m.refused, m.storeCalls, m.storeErrs, m.leased, m.returned, m.abandoned, m.overBudget, m.untracked} {
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

// sent counts a response sent on a stream and the quota assignments in it.
func (m *Metrics) sent(resp *rlqspb.RateLimitQuotaResponse) {
	if m == nil {
		return
	}
	m.responses.Inc()
	for _, a := range resp.BucketAction {
		if a.GetQuotaAssignmentAction() != nil {
			m.assigned.Inc()
		}
	}
}
