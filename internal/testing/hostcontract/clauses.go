package hostcontract

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Clause is one thing every host must do for the engine. Its host side
// runs in the Driver, on the host under test, within one request; its
// check reads what the client saw (Outcome). A clause whose check is nil
// is judged on the host side: the verdict comes back in HeaderVerdict.
type Clause struct {
	Name string // the subtest's name under "contract/"
	host func(x *exec) engine.Action
	// check judges the outcome; nil means the host side's verdict.
	check func(o Outcome) error
	// suite, when set, runs the clause itself (several requests).
	suite func(tg Target, run string) error
}

// Clauses are the contract, in the order Run runs them.
var Clauses = []Clause{
	// Shared data: Envoy's proxy-wasm semantics (proxy-wasm-cpp-host's
	// SharedData), which package slots relies on.
	{Name: "shared-data/missing-key-not-found", host: missingKey},
	{Name: "shared-data/get-returns-value-and-cas", host: getReturnsValueAndCAS},
	{Name: "shared-data/stale-cas-refused", host: staleCASRefused},
	{Name: "shared-data/cas-zero-overwrites", host: casZeroOverwrites},
	{Name: "shared-data/set-on-missing-key-ignores-cas", host: setOnMissingKey},
	{Name: "shared-data/cas-unique-across-keys", host: casUniqueAcrossKeys},
	{Name: "shared-data/set-copies-key-and-value", host: setCopies},
	{Name: "shared-data/concurrent-writers-one-wins", host: oneWriterWins},
	{Name: "shared-data/no-lost-updates-across-workers", host: counterOp, suite: noLostUpdates},
	// Callouts: answered or failed exactly once, from the request
	// (Stream.Callout) or the plugin (Host.Callout, then Stream.Run).
	{Name: "callout/missing-cluster-fails-once", host: calloutClause(false, missingCluster)},
	{Name: "callout/plugin-missing-cluster-fails-once", host: calloutClause(true, missingCluster)},
	{Name: "callout/timeout-fails-once", host: calloutClause(false, timeout)},
	{Name: "callout/plugin-timeout-fails-once", host: calloutClause(true, timeout)},
	{Name: "callout/answer-arrives-once", host: calloutClause(false, echo)},
	{Name: "callout/plugin-answer-arrives-once", host: calloutClause(true, echo)},
	{Name: "callout/body-over-max-is-too-large", host: calloutClause(false, tooLarge)},
	// Replies: what the engine sends is what the client gets.
	{Name: "reply/status-headers-body", host: reply, check: checkReply(418, "teapot", "short and stout")},
	{Name: "reply/from-callout-answer", host: replyFromAnswer(false), check: checkReply(409, "request", "late")},
	{Name: "reply/from-plugin-callout-answer", host: replyFromAnswer(true), check: checkReply(409, "plugin", "late")},
	// Resumes: a paused request goes on once, with what the engine changed.
	{Name: "resume/after-callout-answer", host: resume(false), check: checkResumed},
	{Name: "resume/after-plugin-callout-answer", host: resume(true), check: checkResumed},
	// Timers: a request held with Stream.After goes on once, not before
	// its delay (max_delay_ms).
	{Name: "timer/resume-after-delay-once", host: resumeAfterDelay, check: checkResumedAfterDelay},
	// Request bodies: handed whole, in order, before the decision
	// (request_json), whatever the chunks.
	{Name: requestBodyClause, host: bodyMissing, suite: requestBody},
	// Clocks: the wall clock in Unix ns, monotone within a request and
	// advancing across a call.
	{Name: "clock/monotone", host: monotone},
	{Name: "clock/advances-across-a-callout", host: advances},
	{Name: "clock/is-wall-time", host: wallTime, check: checkWallTime},
}

// byName is the clause named name, or nil.
func byName(name string) *Clause {
	for i := range Clauses {
		if Clauses[i].Name == name {
			return &Clauses[i]
		}
	}
	return nil
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// --- shared data

func missingKey(x *exec) engine.Action {
	v, cas, err := x.h.SharedData().Get(x.key("never-set"))
	if !errors.Is(err, engine.ErrNotFound) {
		return x.sync(errorf("Get of a key never set: value %q, cas %d, error %v; want engine.ErrNotFound", v, cas, err))
	}
	return x.sync(nil)
}

func getReturnsValueAndCAS(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("k")
	if err := sd.Set(k, []byte("v1"), 0); err != nil {
		return x.sync(errorf("Set: %v", err))
	}
	v, cas, err := sd.Get(k)
	if err != nil || string(v) != "v1" || cas == 0 {
		return x.sync(errorf("Get after Set(v1): value %q, cas %d, error %v; want v1, a cas other than 0, no error", v, cas, err))
	}
	return x.sync(nil)
}

func staleCASRefused(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("k")
	if err := sd.Set(k, []byte("v1"), 0); err != nil {
		return x.sync(errorf("Set(v1): %v", err))
	}
	_, cas1, err := sd.Get(k)
	if err != nil {
		return x.sync(errorf("Get: %v", err))
	}
	if err := sd.Set(k, []byte("v2"), cas1); err != nil {
		return x.sync(errorf("Set(v2) with the current cas %d: %v, want success", cas1, err))
	}
	if err := sd.Set(k, []byte("v3"), cas1); !errors.Is(err, engine.ErrCASMismatch) {
		return x.sync(errorf("Set(v3) with the stale cas %d: error %v, want engine.ErrCASMismatch", cas1, err))
	}
	if v, _, err := sd.Get(k); err != nil || string(v) != "v2" {
		return x.sync(errorf("Get after the refused Set: %q, %v; want v2", v, err))
	}
	return x.sync(nil)
}

func casZeroOverwrites(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("k")
	if err := sd.Set(k, []byte("v1"), 0); err != nil {
		return x.sync(errorf("Set(v1): %v", err))
	}
	_, cas1, _ := sd.Get(k)
	if err := sd.Set(k, []byte("v2"), 0); err != nil {
		return x.sync(errorf("Set(v2) with cas 0 on an existing key: %v, want success", err))
	}
	v, cas2, err := sd.Get(k)
	if err != nil || string(v) != "v2" || cas2 == 0 || cas2 == cas1 {
		return x.sync(errorf("Get after Set(v2, cas 0): %q, cas %d (was %d), %v; want v2 and a new cas", v, cas2, cas1, err))
	}
	return x.sync(nil)
}

func setOnMissingKey(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("k")
	if err := sd.Set(k, []byte("v"), 12345); err != nil {
		return x.sync(errorf("Set on a missing key with cas 12345: %v; want success (Envoy ignores the cas of a key it does not have)", err))
	}
	if v, _, err := sd.Get(k); err != nil || string(v) != "v" {
		return x.sync(errorf("Get: %q, %v; want v", v, err))
	}
	return x.sync(nil)
}

// casUniqueAcrossKeys: CAS values come from one counter for every key, so
// a CAS read from one key is never the CAS of a key created later (slots
// creates a key without overwriting another worker's on that).
func casUniqueAcrossKeys(x *exec) engine.Action {
	sd, a, b := x.h.SharedData(), x.key("a"), x.key("b")
	if err := sd.Set(a, []byte("a"), 0); err != nil {
		return x.sync(errorf("Set(a): %v", err))
	}
	_, casA, _ := sd.Get(a)
	if err := sd.Set(b, []byte("b"), 0); err != nil {
		return x.sync(errorf("Set(b): %v", err))
	}
	_, casB, _ := sd.Get(b)
	if casA == casB {
		return x.sync(errorf("keys a and b, created one after the other, have the same cas %d", casA))
	}
	if err := sd.Set(b, []byte("b2"), casA); !errors.Is(err, engine.ErrCASMismatch) {
		return x.sync(errorf("Set(b) with a's cas: %v, want engine.ErrCASMismatch", err))
	}
	return x.sync(nil)
}

// setCopies: the host keeps copies of the key and value it is given (slots
// passes keys that alias a buffer it rewrites), and Get returns a copy.
func setCopies(x *exec) engine.Action {
	sd := x.h.SharedData()
	nameA, nameB := x.key("alias-a"), x.key("alias-b")
	buf := []byte(nameA)
	val := []byte("one")
	if err := sd.Set(unsafe.String(&buf[0], len(buf)), val, 0); err != nil {
		return x.sync(errorf("Set: %v", err))
	}
	copy(buf, nameB)
	val[0] = 'X'
	v, _, err := sd.Get(nameA)
	if err != nil || string(v) != "one" {
		return x.sync(errorf("Get after the caller reused the key's and the value's memory: %q, %v; want one", v, err))
	}
	if _, _, err := sd.Get(nameB); !errors.Is(err, engine.ErrNotFound) {
		return x.sync(errorf("the key's memory, rewritten by the caller, names a key: Get(%s) = %v", nameB, err))
	}
	v[0] = 'Y'
	if v, _, _ := sd.Get(nameA); string(v) != "one" {
		return x.sync(errorf("changing what Get returned changed the stored value: %q", v))
	}
	return x.sync(nil)
}

// oneWriterWins: writers that read the same cas write in turn: the first
// wins, every other is refused.
func oneWriterWins(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("k")
	if err := sd.Set(k, []byte("start"), 0); err != nil {
		return x.sync(errorf("Set: %v", err))
	}
	const writers = 4
	var cas [writers]uint32
	for i := range cas {
		_, cas[i], _ = sd.Get(k)
	}
	won := -1
	for i := range cas {
		err := sd.Set(k, []byte("writer "+strconv.Itoa(i)), cas[i])
		switch {
		case err == nil && won >= 0:
			return x.sync(errorf("writers %d and %d both won with the cas they read together", won, i))
		case err == nil:
			won = i
		case !errors.Is(err, engine.ErrCASMismatch):
			return x.sync(errorf("writer %d: %v, want success or engine.ErrCASMismatch", i, err))
		}
	}
	if won != 0 {
		return x.sync(errorf("winner %d, want the first writer (0)", won))
	}
	if v, _, _ := sd.Get(k); string(v) != "writer 0" {
		return x.sync(errorf("value %q, want the winner's", v))
	}
	return x.sync(nil)
}

// counterOp is the host side of no-lost-updates: op "init" creates the
// run's counter (a creation is not under CAS: it comes first, alone); op
// "add" adds 1 to it under CAS (at most maxAttempts tries) and reports in
// HeaderValue whether it did; op "read" reports the counter. The counter
// is a '#' and a '+' per add.
func counterOp(x *exec) engine.Action {
	sd, k := x.h.SharedData(), x.key("counter")
	switch x.op {
	case "init":
		return x.sync(sd.Set(k, []byte("#"), 0))
	case "read":
		v, _, err := sd.Get(k)
		if err != nil {
			return x.sync(errorf("Get: %v", err))
		}
		return x.value(strconv.Itoa(len(v) - 1))
	}
	const maxAttempts = 64
	for range maxAttempts {
		v, cas, err := sd.Get(k)
		if err != nil && !errors.Is(err, engine.ErrNotFound) {
			return x.sync(errorf("Get: %v", err))
		}
		if errors.Is(err, engine.ErrNotFound) {
			return x.sync(errorf("no counter: op init creates it first"))
		}
		err = sd.Set(k, append(v, '+'), cas)
		if err == nil {
			return x.value("1")
		}
		if !errors.Is(err, engine.ErrCASMismatch) {
			return x.sync(errorf("Set: %v", err))
		}
	}
	return x.value("0")
}

// value answers with a pass verdict and v in HeaderValue.
func (x *exec) value(v string) engine.Action {
	_ = x.s.SendReply(200, [][2]string{{HeaderVerdict, "pass"}, {HeaderValue, v}}, nil)
	return engine.Pause
}

// --- callouts

// callSpec is one callout clause: the call and the judgement of what came
// back (refused: the host refused to send it; answers: every answer).
type callSpec func(x *exec) (*engine.Call, func(refused error, answers []*engine.Answer) error)

func calloutClause(viaHost bool, spec callSpec) func(*exec) engine.Action {
	return func(x *exec) engine.Action {
		c, judge := spec(x)
		var answers []*engine.Answer
		err := x.send(viaHost, c, func(a *engine.Answer) {
			answers = append(answers, a)
			if len(answers) == 1 {
				x.fence(viaHost, func() { x.verdict(judge(nil, answers)) })
			}
		})
		if err != nil {
			x.fence(viaHost, func() { x.verdict(judge(err, answers)) })
		}
		return engine.Pause
	}
}

// failsOnce: either the host refuses the call and never answers it, or it
// takes it and answers once, failed.
func failsOnce(refused error, answers []*engine.Answer) error {
	switch {
	case refused != nil && len(answers) == 0:
		return nil
	case refused != nil:
		return errorf("the call was refused (%v) and answered %d times", refused, len(answers))
	case len(answers) != 1:
		return errorf("answered %d times, want once", len(answers))
	case !answers[0].Failed:
		return errorf("answered %+v, want a failed answer", *answers[0])
	}
	return nil
}

func missingCluster(x *exec) (*engine.Call, func(error, []*engine.Answer) error) {
	return x.call("hostcontract_missing", "/echo", "", calloutTimeoutMS, 1024), failsOnce
}

// timeout: a call the upstream never answers ends once its timeout is up,
// as a failure: Failed, or Envoy's own answer to a timed-out call (status
// 504, which the engine takes as a failed call as any status but 200).
func timeout(x *exec) (*engine.Call, func(error, []*engine.Answer) error) {
	return x.call(UpstreamCluster, "/silent", "", 300, 1024), func(refused error, answers []*engine.Answer) error {
		switch {
		case refused != nil:
			return errorf("a call to a cluster that exists was refused: %v", refused)
		case len(answers) != 1:
			return errorf("answered %d times, want once", len(answers))
		case !answers[0].Failed && answers[0].Status != "504":
			return errorf("answered %+v (body %q), want a failed answer or status 504", *answers[0], answers[0].Body)
		}
		return nil
	}
}

func echo(x *exec) (*engine.Call, func(error, []*engine.Answer) error) {
	want := EchoBody("probe-"+x.run, "ping")
	return x.call(UpstreamCluster, "/echo", "ping", calloutTimeoutMS, 1024), func(refused error, answers []*engine.Answer) error {
		switch {
		case refused != nil:
			return errorf("refused: %v", refused)
		case len(answers) != 1:
			return errorf("answered %d times, want once", len(answers))
		}
		a := answers[0]
		if a.Failed || a.TooLarge || a.Err != nil || a.Status != strconv.Itoa(EchoStatus) || !bytes.Equal(a.Body, want) {
			return errorf("answer %+v (body %q); want status %d and body %q", *a, a.Body, EchoStatus, want)
		}
		return nil
	}
}

func tooLarge(x *exec) (*engine.Call, func(error, []*engine.Answer) error) {
	return x.call(UpstreamCluster, "/big", "", calloutTimeoutMS, BigBody/2), func(refused error, answers []*engine.Answer) error {
		switch {
		case refused != nil:
			return errorf("refused: %v", refused)
		case len(answers) != 1:
			return errorf("answered %d times, want once", len(answers))
		case !answers[0].TooLarge || answers[0].Failed:
			return errorf("a %d-byte answer to a call bounded at %d: %+v, want TooLarge", BigBody, BigBody/2, *answers[0])
		}
		return nil
	}
}

// --- replies and resumes

func reply(x *exec) engine.Action {
	_ = x.s.SendReply(418, [][2]string{{"x-contract-from", "teapot"}, {"x-contract-two", "2"}}, []byte("short and stout"))
	return engine.Pause
}

func replyFromAnswer(viaHost bool) func(*exec) engine.Action {
	from := "request"
	if viaHost {
		from = "plugin"
	}
	return func(x *exec) engine.Action {
		err := x.send(viaHost, x.call(UpstreamCluster, "/echo", "", calloutTimeoutMS, 1024), func(*engine.Answer) {
			_ = x.s.SendReply(409, [][2]string{{"x-contract-from", from}, {"x-contract-two", "2"}}, []byte("late"))
		})
		if err != nil {
			return x.sync(errorf("callout: %v", err))
		}
		return engine.Pause
	}
}

func checkReply(status int, from, body string) func(Outcome) error {
	return func(o Outcome) error {
		if o.Status != status || o.Header.Get("x-contract-from") != from || o.Header.Get("x-contract-two") != "2" || o.Body != body {
			return errorf("got %d %q (x-contract-from %q, x-contract-two %q), want %d %q with x-contract-from %q, x-contract-two 2",
				o.Status, o.Body, o.Header.Get("x-contract-from"), o.Header.Get("x-contract-two"), status, body, from)
		}
		return nil
	}
}

// resume pauses the request on a call; the answer changes a request header
// and resumes it; the response gets a header.
func resume(viaHost bool) func(*exec) engine.Action {
	return func(x *exec) engine.Action {
		err := x.send(viaHost, x.call(UpstreamCluster, "/echo", "", calloutTimeoutMS, 1024), func(*engine.Answer) {
			if err := x.s.ReplaceRequestHeader(HeaderReplaced, "yes"); err != nil {
				x.verdict(errorf("ReplaceRequestHeader: %v", err))
				return
			}
			if err := x.s.Resume(); err != nil {
				x.verdict(errorf("Resume: %v", err))
			}
		})
		if err != nil {
			return x.sync(errorf("callout: %v", err))
		}
		x.onResponse = func() {
			got, _ := x.s.ResponseHeader(HeaderUpstreamCount)
			_ = x.s.AddResponseHeader(HeaderResponse, "seen count "+got)
		}
		return engine.Pause
	}
}

func checkResumed(o Outcome) error {
	switch {
	case o.Status != 200 || o.Body != UpstreamBody || o.Header.Get(HeaderVerdict) != "":
		return errorf("got %d %q (verdict %q), want the upstream's answer", o.Status, o.Body, o.Header.Get(HeaderVerdict))
	case o.Header.Get(HeaderUpstreamCount) != "1":
		return errorf("the upstream saw the request %q times, want 1", o.Header.Get(HeaderUpstreamCount))
	case o.Header.Get(HeaderUpstreamReplaced) != "yes":
		return errorf("the upstream saw %s %q, want the engine's yes", HeaderReplaced, o.Header.Get(HeaderUpstreamReplaced))
	case o.Header.Get(HeaderResponse) != "seen count 1":
		return errorf("response header %s %q, want \"seen count 1\" (added at the response's headers, having read them)", HeaderResponse, o.Header.Get(HeaderResponse))
	}
	return nil
}

// timerDelay is the delay of the timer clause: long enough to tell early
// from on time on any host's clock, short enough for every run.
const timerDelay = 50_000_000

// resumeAfterDelay holds the request with Stream.After and resumes it from
// the timer: the timer must run once (the upstream sees one request, the
// response counts one run), on the host's clock no sooner than the delay.
func resumeAfterDelay(x *exec) engine.Action {
	t0 := x.h.Now()
	runs := 0
	err := x.s.After(timerDelay, func() {
		runs++
		if t1 := x.h.Now(); t1-t0 < timerDelay {
			x.verdict(errorf("the timer ran %d ns after After(%d): before its delay", t1-t0, timerDelay))
			return
		}
		if runs > 1 {
			return // counted: the response says how many times it ran
		}
		if err := x.s.ReplaceRequestHeader(HeaderReplaced, "yes"); err != nil {
			x.verdict(errorf("ReplaceRequestHeader: %v", err))
			return
		}
		if err := x.s.Resume(); err != nil {
			x.verdict(errorf("Resume: %v", err))
		}
	})
	if err != nil {
		return x.sync(errorf("After: %v", err))
	}
	x.onResponse = func() {
		got, _ := x.s.ResponseHeader(HeaderUpstreamCount)
		_ = x.s.AddResponseHeader(HeaderResponse, "seen count "+got+", timer runs "+strconv.Itoa(runs))
	}
	return engine.Pause
}

func checkResumedAfterDelay(o Outcome) error {
	switch {
	case o.Status != 200 || o.Body != UpstreamBody || o.Header.Get(HeaderVerdict) != "":
		return errorf("got %d %q (verdict %q), want the upstream's answer", o.Status, o.Body, o.Header.Get(HeaderVerdict))
	case o.Header.Get(HeaderUpstreamReplaced) != "yes":
		return errorf("the upstream saw %s %q, want the timer's yes", HeaderReplaced, o.Header.Get(HeaderUpstreamReplaced))
	case o.Header.Get(HeaderResponse) != "seen count 1, timer runs 1":
		return errorf("response header %s %q, want \"seen count 1, timer runs 1\"", HeaderResponse, o.Header.Get(HeaderResponse))
	}
	return nil
}

// --- clocks

func monotone(x *exec) engine.Action {
	last := x.h.Now()
	for i := range 1000 {
		now := x.h.Now()
		if now < last {
			return x.sync(errorf("read %d: %d after %d: the clock went back", i, now, last))
		}
		last = now
	}
	return x.sync(nil)
}

func advances(x *exec) engine.Action {
	t0 := x.h.Now()
	err := x.s.Callout(x.call(UpstreamCluster, "/echo", "", calloutTimeoutMS, 1024), func(*engine.Answer) {
		if t1 := x.h.Now(); t1 <= t0 {
			x.verdict(errorf("Now %d before a call, %d at its answer: want later", t0, t1))
			return
		}
		x.verdict(nil)
	})
	if err != nil {
		return x.sync(errorf("callout: %v", err))
	}
	return engine.Pause
}

func wallTime(x *exec) engine.Action {
	return x.value(strconv.FormatInt(x.h.Now(), 10))
}

func checkWallTime(o Outcome) error {
	now, err := strconv.ParseInt(o.Header.Get(HeaderValue), 10, 64)
	if err != nil {
		return errorf("no clock reading: %v", err)
	}
	if now < o.Sent-wallSlack || now > o.Received+wallSlack {
		return errorf("Now %d, the request ran from %d to %d", now, o.Sent, o.Received)
	}
	return nil
}

// --- request bodies

const requestBodyClause = "request-body/whole-before-the-decision"

// requestBodyBytes is the body the clause sends: several of Envoy's chunks.
const requestBodyBytes = 300_000

func requestBody(tg Target, run string) error {
	o, err := tg.Do(PathPrefix+requestBodyClause, map[string]string{HeaderRun: run, HeaderBodyBytes: strconv.Itoa(requestBodyBytes)})
	if err != nil {
		return err
	}
	return passed(o)
}

// bodyMissing: the host called OnRequestHeaders, as for a request without
// a body.
func bodyMissing(x *exec) engine.Action {
	return x.sync(errorf("the host said no body follows the headers (OnRequestHeaders, not OnRequestHeadersWithBody)"))
}
