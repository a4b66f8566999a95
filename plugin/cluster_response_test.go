package plugin

import (
	"fmt"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// doCharged runs one request with limitd answering its calls, the upstream
// answering status with the headers hs, then limitd answering the charge
// call the response sends.
func (l *limitd) doCharged(status string, hs [][2]string, headers ...string) int {
	e := l.e
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
	l.serve(id)
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		e.host.CompleteHttpContext(id)
		return int(lr.StatusCode)
	}
	if a := e.host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		e.t.Fatalf("request neither answered nor continued: %v", a)
	}
	e.host.CallOnResponseHeaders(id, append([][2]string{{":status", status}}, hs...), true)
	l.serve(id)
	e.host.CompleteHttpContext(id)
	return 200
}

func TestClusterResponseCost(t *testing.T) {
	for _, sync := range []string{"per_request", "lease"} {
		t.Run(sync, func(t *testing.T) {
			e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
			 "rules": [{"name": "fleet", "scope": "cluster", "sync": "`+sync+`", "limit_keys": ["header:k"],
			   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
			   "cost_source": "response_header:x-usage"}}]}`)
			l := newLimitd(t, e)
			var statuses []int
			for i := 0; i < 6; i++ {
				statuses = append(statuses, l.doCharged("200", [][2]string{{"x-usage", "30"}}, "k", "a"))
			}
			// Leases too: the lease in hand takes the charge, and what it
			// cannot cover goes to the global bucket.
			if got, want := fmt.Sprint(statuses), "[200 200 200 200 429 429]"; got != want {
				t.Fatalf("statuses %s, want %s", got, want)
			}
			if n := e.counter("service_errors"); n != 0 {
				t.Fatalf("service_errors = %d", n)
			}
		})
	}
}

func TestClusterChargeOnRefunds(t *testing.T) {
	// charge_on ["401"] on a cluster rule: 200s give their reservation back
	// through the charge call, 401s keep it.
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "logins", "scope": "cluster", "charge_on": ["401"], "limit_keys": ["header:u"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`)
	l := newLimitd(t, e)
	for i := 0; i < 10; i++ {
		if s := l.doCharged("200", nil, "u", "alice"); s != 200 {
			t.Fatalf("200 number %d answered %d", i, s)
		}
	}
	for i := 0; i < 3; i++ {
		if s := l.doCharged("401", nil, "u", "alice"); s != 200 {
			t.Fatalf("401 number %d rejected", i)
		}
	}
	if s := l.doCharged("200", nil, "u", "alice"); s != 429 {
		t.Fatalf("after 3 401s: %d, want 429", s)
	}
}

// TestNoChargeCallOfZero: a cluster rule whose cost the response does not
// report (or reports equal to the reservation) sends no charge call.
func TestNoChargeCallOfZero(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100,
	   "cost_source": "response_header:x-usage", "default_cost": 5}}]}`)
	l := newLimitd(t, e)
	l.doCharged("200", nil, "k", "a")
	l.doCharged("200", [][2]string{{"x-usage", "5"}}, "k", "a")
	if n := e.counter("charge_calls"); n != 0 {
		t.Fatalf("%d charge calls for nothing to charge", n)
	}
}

// TestClusterChargeClamped: a charge far above what can change a bucket is
// sent clamped to twice the burst (limitd refuses amounts above 10^9: the
// debt would be lost whole).
func TestClusterChargeClamped(t *testing.T) {
	e := start(t, `{"service": {"cluster": "limitd", "timeout_ms": 30},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:k"],
	   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 100,
	   "cost_source": "response_header:x-usage"}}]}`)
	l := newLimitd(t, e)
	l.doCharged("200", [][2]string{{"x-usage", "2e9"}}, "k", "a")
	if n := e.counter("service_errors"); n != 0 {
		t.Fatalf("the charge call failed (%d service errors): the debt was lost", n)
	}
	if st := l.doCharged("200", nil, "k", "a"); st != 429 {
		t.Fatalf("after a charge of 2e9 against a burst of 100: %d, want 429", st)
	}
}
