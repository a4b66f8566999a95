package service

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// slotMetrics are the series of the slot endpoints.
type slotMetrics struct {
	acquires *prometheus.CounterVec // by result: acquired, refused
	renewals *prometheus.CounterVec // slots renewed, by state
	releases *prometheus.CounterVec // slots released, by state
	latency  *prometheus.HistogramVec
}

// newSlotMetrics registers the slot endpoints' series with reg.
func newSlotMetrics(reg prometheus.Registerer, store string) (*slotMetrics, error) {
	labels := prometheus.Labels{"store": store}
	m := &slotMetrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_slot_acquires_total", ConstLabels: labels,
			Help: "Slot acquire calls answered, by result: acquired (a slot in every table) or refused (a table full; nothing taken)."}, []string{"result"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_slot_renewals_total", ConstLabels: labels,
			Help: "Slots renewed, by state: held (lease pushed), restored (found gone and taken again), lost (found gone, its table full)."}, []string{"state"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "limitd_slot_releases_total", ConstLabels: labels,
			Help: "Slots released, by state: held (given back), lost (not held: expired, or released before)."}, []string{"state"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "limitd_slot_call_duration_seconds", ConstLabels: labels,
			Help: "Time to answer a slot call (POST /v1/slots/acquire, renew, release), by call.", Buckets: latencyBuckets}, []string{"call"}),
	}
	for _, c := range []prometheus.Collector{m.acquires, m.renewals, m.releases, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("service: config: registry: %w", err)
		}
	}
	for _, r := range []string{"acquired", "refused"} {
		m.acquires.WithLabelValues(r)
	}
	for _, st := range []wire.SlotState{wire.SlotHeld, wire.SlotRestored, wire.SlotLost} {
		m.renewals.WithLabelValues(st.String())
		if st != wire.SlotRestored {
			m.releases.WithLabelValues(st.String())
		}
	}
	return m, nil
}

// handleSlots adds the slot endpoints to s for st, with their metrics in
// reg:
//
//	POST /v1/slots/acquire   take a slot in each table, or none
//	POST /v1/slots/renew     push the leases of slots held
//	POST /v1/slots/release   give slots back
func (s *Server) handleSlots(st SlotStore, reg prometheus.Registerer, store string) error {
	m, err := newSlotMetrics(reg, store)
	if err != nil {
		return err
	}
	s.mux.HandleFunc("/v1/slots/acquire", s.serve(func(ctx context.Context, body, out []byte) ([]byte, error) {
		req, err := wire.DecodeAcquireRequest(body, s.limits)
		if err != nil {
			return nil, err
		}
		a, err := st.Acquire(ctx, req)
		if err != nil {
			return nil, err
		}
		result := "acquired"
		if !a.Acquired {
			result = "refused"
		}
		m.acquires.WithLabelValues(result).Inc()
		return wire.AppendAcquireAnswer(out, &a), nil
	}, m.latency.WithLabelValues("acquire")))
	for _, call := range []struct {
		name   string
		renew  bool
		count  *prometheus.CounterVec
		method func(context.Context, *wire.SlotsRequest) (wire.SlotsAnswer, error)
	}{{"renew", true, m.renewals, st.Renew}, {"release", false, m.releases, st.Release}} {
		s.mux.HandleFunc("/v1/slots/"+call.name, s.serve(func(ctx context.Context, body, out []byte) ([]byte, error) {
			req, err := wire.DecodeSlotsRequest(body, s.limits, call.renew)
			if err != nil {
				return nil, err
			}
			a, err := call.method(ctx, req)
			if err != nil {
				return nil, err
			}
			for _, x := range a.Slots {
				call.count.WithLabelValues(x.String()).Inc()
			}
			return wire.AppendSlotsAnswer(out, &a), nil
		}, m.latency.WithLabelValues(call.name)))
	}
	return nil
}
