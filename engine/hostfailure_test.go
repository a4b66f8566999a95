package engine_test

import (
	"errors"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

const oneToken = `{"rules": [{"name": "one", "limit_keys": ["header:k"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

const fleet = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "local", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`

const refused = `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`

// TestReplyThatCannotBeSentFailsOpen: the host refuses the 429; the request
// goes on, counted in failed_open, and nothing of it stays consumed.
func TestReplyThatCannotBeSentFailsOpen(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, oneToken)
	if a := p.NewRequest(newStream("k", "a")).OnRequestHeaders(); a != engine.Continue {
		t.Fatalf("first request: %v", a)
	}
	s := newStream("k", "a")
	s.ReplyErr = errors.New("host: no reply")
	if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Continue || s.Replied != 0 {
		t.Fatalf("a rejection the host cannot send: action %v, replied %d; want the request to go on", a, s.Replied)
	}
	if h.Count("rule.one.failed_open") != 1 || h.Count("rule.one.rejected") != 0 {
		t.Fatalf("failed_open %d, rejected %d; want 1 and 0", h.Count("rule.one.failed_open"), h.Count("rule.one.rejected"))
	}
}

// TestReplyThatCannotBeSentResumes: the limit service refuses a paused
// request and the host cannot send the reply: the request is resumed, not
// left hanging, and the local rule's token is given back once.
func TestReplyThatCannotBeSentResumes(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, fleet)
	s := newStream()
	s.ReplyErr = errors.New("host: no reply")
	if a := p.NewRequest(s).OnRequestHeaders(); a != engine.Pause || len(s.Calls) != 1 {
		t.Fatalf("action %v with %d calls; want a pause on one call", a, len(s.Calls))
	}
	s.Calls[0].Answer(&engine.Answer{Status: "200", Body: []byte(refused)})
	if s.Resumed != 1 || s.Replied != 0 || h.Count("refunds") != 1 {
		t.Fatalf("resumed %d, replied %d, refunds %d; want 1, 0, 1", s.Resumed, s.Replied, h.Count("refunds"))
	}
}

// TestCASStormFailsOpen: every write loses its compare-and-swap; after the
// bounded retries the request fails open, counted, with nothing written.
func TestCASStormFailsOpen(t *testing.T) {
	h := fakehost.New()
	h.SD = &fakehost.RefusingData{SD: shareddata.New(), Refuse: -1}
	p := newPlugin(t, h, oneToken)
	for range 3 {
		if a := p.NewRequest(newStream("k", "a")).OnRequestHeaders(); a != engine.Continue {
			t.Fatalf("action %v under a CAS storm, want the request to go on", a)
		}
	}
	if h.Count("rule.one.failed_open") != 3 || h.Count("cas_retries") != 3*slots.MaxAttempts {
		t.Fatalf("failed_open %d, cas_retries %d; want 3 and %d", h.Count("rule.one.failed_open"), h.Count("cas_retries"), 3*slots.MaxAttempts)
	}
}

// TestLateAnswerAfterTheHostAnswered: the host answers a paused request
// itself (a stream timeout) before the limit service's refusal arrives:
// the refusal changes nothing of the request, and the local rule's token
// is not given back.
func TestLateAnswerAfterTheHostAnswered(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, fleet)
	s := newStream()
	r := p.NewRequest(s)
	r.OnRequestHeaders()
	s.Resp[":status"] = "504"
	r.OnResponseHeaders(true)
	s.Calls[0].Answer(&engine.Answer{Status: "200", Body: []byte(refused)})
	if s.Replied != 0 || s.Resumed != 0 || h.Count("refunds") != 0 {
		t.Fatalf("replied %d, resumed %d, refunds %d; want nothing", s.Replied, s.Resumed, h.Count("refunds"))
	}
}

// TestScriptedCalls: a failed call, an unusable answer and an admitting
// answer, each as the host delivers it.
func TestScriptedCalls(t *testing.T) {
	cases := []struct {
		name        string
		answer      *engine.Answer
		wantReplied int
		wantResumed int
	}{
		{"no answer: failure_mode deny", &engine.Answer{Failed: true}, 429, 0},
		{"status 503: deny", &engine.Answer{Status: "503"}, 429, 0},
		{"too large: deny", &engine.Answer{Status: "200", TooLarge: true}, 429, 0},
		{"admitted", &engine.Answer{Status: "200", Body: []byte(`{"allowed":true,"buckets":[{"allowed":true,"remaining":8,"retry_after_ms":0,"reset_ms":1000}]}`)}, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := fakehost.New()
			p := newPlugin(t, h, fleet)
			s := newStream()
			p.NewRequest(s).OnRequestHeaders()
			s.Calls[0].Answer(c.answer)
			if s.Replied != c.wantReplied || s.Resumed != c.wantResumed {
				t.Fatalf("replied %d, resumed %d; want %d, %d", s.Replied, s.Resumed, c.wantReplied, c.wantResumed)
			}
			if c.wantReplied != 0 && h.Count("refunds") != 1 {
				t.Fatalf("refunds %d after a rejection: want the local token back", h.Count("refunds"))
			}
		})
	}
}
