// Package hostcontract is the host contract: what any host must do for the
// engine (engine.Host, engine.Stream), as one suite every host runs. Shared
// data with Envoy's compare-and-swap rules, callouts answered or failed
// exactly once, replies as sent, paused requests resumed once, a monotone
// wall clock: each a Clause, run as one request and named in the test's
// output as contract/<clause> (contract/shared-data/stale-cas-refused), so
// a host that breaks one fails it by name.
//
// A clause's host side runs in the Driver, which a host runs where it runs
// the engine: the engine's fake host (package fakehost) in process, the
// Wasm adapter (package plugin) compiled into a guest module in Envoy, the
// native adapter (package native/filter) compiled into a dynamic module in
// Envoy; the adapters' test builds (tag hostcontract, testdata/) run the
// Driver in place of the engine, through the same host code. Run sends the
// requests through a Target and checks what the client saw.
//
// The calls go to the cluster UpstreamCluster, served by Upstream (an
// http.Handler: a real server for Envoy, called in process by a fake).
package hostcontract

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// PathPrefix starts the path of a clause's request: PathPrefix+Name.
	PathPrefix = "/contract/"
	// UpstreamCluster is the cluster the clauses call and the requests
	// they resume go to; the host must have it, served by Upstream.
	UpstreamCluster = "upstream"

	HeaderRun              = "x-contract-run"               // the suite's run (keys, counts)
	HeaderOp               = "x-contract-op"                // a step of a clause of several requests
	HeaderVerdict          = "x-contract-verdict"           // "pass" or "fail" (the body says why)
	HeaderValue            = "x-contract-value"             // a value the host side reports
	HeaderProbe            = "x-contract-probe"             // a header of every call
	HeaderBodyBytes        = "x-contract-body-bytes"        // the client sends a request body of that many bytes (Body)
	HeaderReplaced         = "x-contract-replaced"          // a request header the Driver replaces before resuming
	HeaderUpstreamCount    = "x-contract-upstream-count"    // the upstream's count of a run's request
	HeaderUpstreamReplaced = "x-contract-upstream-replaced" // HeaderReplaced as the upstream saw it
	HeaderResponse         = "x-contract-response"          // a response header the Driver adds

	// EchoStatus is the status of /echo; its body is EchoBody.
	EchoStatus = 201
	// BigBody is the size of /big's body.
	BigBody = 4096
	// UpstreamBody is the body of a resumed request's answer.
	UpstreamBody = "upstream\n"

	// calloutTimeoutMS bounds the calls that should be answered: generous,
	// for a loaded machine.
	calloutTimeoutMS = 10_000
	// wallSlack is how far a host's clock may be from the client's.
	wallSlack = int64(time.Second)
	// holdSilent bounds how long /silent holds a call.
	holdSilent = 30 * time.Second
)

// EchoBody is /echo's body for a call with HeaderProbe probe and body body.
func EchoBody(probe, body string) []byte { return []byte("probe=" + probe + ";body=" + body) }

// Outcome is what the client saw of one request, and when it was sent and
// received on the host's clock (Unix ns).
type Outcome struct {
	Status         int
	Header         http.Header
	Body           string
	Sent, Received int64
}

// Target sends a request to a host running the Driver. Do must be safe for
// concurrent use (no-lost-updates sends requests at once).
type Target interface {
	Do(path string, header map[string]string) (Outcome, error)
}

var runs atomic.Int64

// Run runs every clause on tg, each as the subtest contract/<clause>.
func Run(t *testing.T, tg Target) {
	prefix := "r" + strconv.FormatInt(runs.Add(1), 10)
	for i := range Clauses {
		c := &Clauses[i]
		t.Run("contract/"+c.Name, func(t *testing.T) {
			run := prefix + "-" + strings.ReplaceAll(c.Name, "/", ".")
			if err := c.Check(tg, run); err != nil {
				t.Error(err)
			}
		})
	}
}

// Check runs the clause on tg as run (a name no other run of tg uses) and
// returns why the host broke it, or nil.
func (c *Clause) Check(tg Target, run string) error {
	if c.suite != nil {
		return c.suite(tg, run)
	}
	o, err := tg.Do(PathPrefix+c.Name, map[string]string{HeaderRun: run})
	if err != nil {
		return err
	}
	if c.check != nil {
		return c.check(o)
	}
	return passed(o)
}

// passed reads the host side's verdict.
func passed(o Outcome) error {
	switch o.Header.Get(HeaderVerdict) {
	case "pass":
		return nil
	case "fail":
		return errors.New(o.Body)
	}
	return fmt.Errorf("no verdict: the client got %d %q", o.Status, o.Body)
}

// noLostUpdates: requests on every worker add to one counter under CAS at
// once; the counter ends at the number of adds that succeeded.
func noLostUpdates(tg Target, run string) error {
	const path = PathPrefix + "shared-data/no-lost-updates-across-workers"
	op := func(op string) (Outcome, error) {
		o, err := tg.Do(path, map[string]string{HeaderRun: run, HeaderOp: op})
		if err == nil {
			err = passed(o)
		}
		return o, err
	}
	if _, err := op("init"); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	const senders, each = 8, 16
	var added atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for range senders {
		wg.Go(func() {
			for range each {
				o, err := op("add")
				if err != nil {
					errs <- fmt.Errorf("add: %w", err)
					return
				}
				n, _ := strconv.Atoi(o.Header.Get(HeaderValue))
				added.Add(int64(n))
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	o, err := op("read")
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if got := o.Header.Get(HeaderValue); got != strconv.FormatInt(added.Load(), 10) || added.Load() == 0 {
		return fmt.Errorf("the counter reads %s after %d successful adds of %d", got, added.Load(), senders*each)
	}
	return nil
}

// Upstream serves UpstreamCluster: /echo answers EchoStatus and EchoBody;
// /fence answers at once; /silent holds the call until the caller gives up
// (at most holdSilent); /big answers BigBody bytes; a resumed clause request
// (PathPrefix...) answers UpstreamBody with the times it saw the run's
// request and the HeaderReplaced it saw. Safe for concurrent use.
type Upstream struct {
	mu   sync.Mutex
	seen map[string]int
}

// NewUpstream returns an Upstream.
func NewUpstream() *Upstream { return &Upstream{seen: map[string]int{}} }

// ServeHTTP implements http.Handler.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<10))
	switch p := r.URL.Path; {
	case p == "/echo":
		w.WriteHeader(EchoStatus)
		w.Write(EchoBody(r.Header.Get(HeaderProbe), string(body)))
	case p == "/fence":
		io.WriteString(w, "fence")
	case p == "/silent":
		select {
		case <-r.Context().Done():
		case <-time.After(holdSilent):
		}
	case p == "/big":
		w.Write([]byte(strings.Repeat("b", BigBody)))
	case strings.HasPrefix(p, PathPrefix):
		u.mu.Lock()
		k := r.Header.Get(HeaderRun) + " " + p
		u.seen[k]++
		n := u.seen[k]
		u.mu.Unlock()
		w.Header().Set(HeaderUpstreamCount, strconv.Itoa(n))
		w.Header().Set(HeaderUpstreamReplaced, r.Header.Get(HeaderReplaced))
		io.WriteString(w, UpstreamBody)
	default:
		http.NotFound(w, r)
	}
}

// Body is the request body of n bytes a Target sends for HeaderBodyBytes:
// no two neighbouring pieces alike, so a piece read from the wrong offset
// shows.
func Body(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i/7%26)
	}
	return b
}
