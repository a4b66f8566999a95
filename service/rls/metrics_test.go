package rls

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// The per-limit series are bounded: past MaxSeries (domain, descriptor)
// pairs, hits are counted under descriptor "_overflow".
func TestSeriesBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxSeries + 5 {
		d := &descriptor{hits: 1, algo: rlsconfig.FixedWindow, after: 1,
			limit: &rlsconfig.RateLimit{RequestsPerUnit: 10, Unit: rlsconfig.Second, Key: "d.k_" + strconv.Itoa(i)}}
		m.record("d", d, NearLimitRatio)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hits := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "limitd_rls_total_hits_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "descriptor" {
					hits[l.GetValue()] = mt.GetCounter().GetValue()
				}
			}
		}
	}
	if len(hits) != MaxSeries+1 || hits[OverflowDescriptor] != 5 || hits["k_0"] != 1 {
		t.Errorf("%d series, overflow %v, k_0 %v; want %d, 5, 1", len(hits), hits[OverflowDescriptor], hits["k_0"], MaxSeries+1)
	}
}
