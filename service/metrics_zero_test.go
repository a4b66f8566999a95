package service

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLabelledCountersStartAtZero: every labelled counter shows each label
// value it can take from the start, at 0, so that a rate or an alert on it
// has a series before its first count.
func TestLabelledCountersStartAtZero(t *testing.T) {
	_, reg := callerServer(t)
	if _, err := NewConnGuard(ConnOptions{MaxConns: 10, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	assertZeroSeries(t, reg, map[string][]string{
		"limitd_invalid_requests_total":   {"400", "401", "405", "413"},
		"limitd_connections_closed_total": {"cap", "evicted", "idle", "refused"},
		"limitd_authorized_calls_total":   {"edge", "gw-a", "gw-b", "gw-c"},
		"limitd_decisions_delayed_total":  {"enforced", "shadow"},
	})
}

// assertZeroSeries checks that each family of want has exactly the series
// of its one label's values, each at 0.
func assertZeroSeries(t *testing.T, reg prometheus.Gatherer, want map[string][]string) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, f := range fams {
		if _, ok := want[f.GetName()]; !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 {
				t.Errorf("%s: labels %v, want one", f.GetName(), m.GetLabel())
				continue
			}
			v := m.GetLabel()[0].GetValue()
			got[f.GetName()] = append(got[f.GetName()], v)
			if n := m.GetCounter().GetValue(); n != 0 {
				t.Errorf("%s{%s} = %v at start, want 0", f.GetName(), v, n)
			}
		}
	}
	for name, values := range want {
		slices.Sort(got[name])
		if !slices.Equal(got[name], values) {
			t.Errorf("%s at start: %q, want %q", name, got[name], values)
		}
	}
}
