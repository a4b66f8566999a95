package rlqs

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRefusedCodesStartAtZero: limitd_rlqs_refused_streams_total shows each
// code a stream can end with from the start, at 0.
func TestRefusedCodesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, f := range fams {
		if f.GetName() != "limitd_rlqs_refused_streams_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			codes = append(codes, m.GetLabel()[0].GetValue())
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("code %s: %v at start, want 0", m.GetLabel()[0].GetValue(), v)
			}
		}
	}
	slices.Sort(codes)
	if want := []string{"InvalidArgument", "ResourceExhausted", "Unauthenticated", "Unavailable"}; !slices.Equal(codes, want) {
		t.Errorf("codes at start %q, want %q", codes, want)
	}
}
