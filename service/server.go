package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Config configures a Server. Store is required; zero fields of the others
// mean their defaults.
type Config struct {
	// Store takes the decisions.
	Store Store
	// StoreName labels the store in metrics and logs ("redis", "memory").
	StoreName string
	// Token, when set, is the bearer token every /v1 request must carry
	// (a Token named "default").
	Token string
	// Tokens are bearer tokens, one per gateway: a /v1 request must carry
	// one of them (or Token). Their names, distinct, label
	// limitd_authorized_calls_total, and revoking one gateway is removing
	// its token. A token's name is its caller's (WithCaller): a refund or a
	// return gives back only what the same caller reserved or was granted.
	Tokens []Token
	// Identities name the callers a trusted front proxy authenticates
	// (mTLS) and forwards: a call carrying a FrontProxy token is the call of
	// the identity named by its IdentityHeader, which must be one of these
	// (else 401). Their names share the namespace of the tokens'.
	Identities []Identity
	// IdentityHeader is the request header in which a front proxy forwards
	// its client's verified identity (required with a FrontProxy token).
	// It is read only on calls carrying a FrontProxy token.
	IdentityHeader string
	// Limits bound request bodies, keys and bucket counts.
	Limits wire.Limits
	// Timeout bounds each decision, Redis round trip included (default 1s).
	Timeout time.Duration
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default a new registry, served alone).
	Registry *prometheus.Registry
	// Metrics says who may read GET /metrics (default MetricsOpen).
	Metrics MetricsAccess
	// ReadyEvery is how long /readyz answers from the store's last Ping
	// before asking again (default DefaultReadyEvery): however often it is
	// asked, unauthenticated, the store is pinged at most once per period.
	ReadyEvery time.Duration
	// Now is the clock of the /readyz cache (default time.Now).
	Now func() time.Time
}

// MetricsAccess says who may read GET /metrics. Its labels carry request
// values (a detailed metric's descriptor values: API keys, user ids), so
// the metrics are as private as the calls.
type MetricsAccess uint8

const (
	// MetricsOpen serves /metrics to whoever reaches the listener: for a
	// listener bound to loopback.
	MetricsOpen MetricsAccess = iota
	// MetricsBearer serves /metrics to a call that /v1 would accept (one of
	// the Tokens; a front proxy's with a listed identity), 401 otherwise; a
	// scrape is not counted as the caller's call. Without tokens it is
	// MetricsOpen.
	MetricsBearer
	// MetricsElsewhere serves /metrics on a listener of its own
	// (Server.MetricsHandler); the Server answers it 404.
	MetricsElsewhere
)

// DefaultReadyEvery is the default Config.ReadyEvery.
const DefaultReadyEvery = time.Second

// Token is one caller's bearer token. A FrontProxy token is a front
// proxy's: its calls are those of the identity it forwards (Identities), not
// its own.
type Token struct {
	Name       string
	Value      string
	FrontProxy bool
}

// Identity is one caller known by the identity a front proxy forwards: the
// whole value of Config.IdentityHeader, compared exactly (say, the URI SAN
// of the client's certificate).
type Identity struct {
	Name  string
	Value string
}

// DefaultTimeout is the default bound of one decision.
const DefaultTimeout = time.Second

// Server is the HTTP API:
//
//	POST /v1/decide   take a decision (JSON in and out; see openapi.yaml)
//	POST /v1/lease    lease tokens for a gateway to spend locally
//	POST /v1/charge   charge costs known from responses (into debt, or refunds)
//	POST /v1/slots/*  concurrency slots, when the store holds them (slotsapi.go)
//	GET  /healthz     200 while the process runs
//	GET  /readyz      200 when the store answered its last Redis PING (at
//	                  most one per Config.ReadyEvery), else 503
//	GET  /metrics     Prometheus metrics (Config.Metrics says to whom)
//
// Errors are JSON {"error": "<field>: <message>"}: 400 for an invalid
// request, 401 without the bearer token, 405 for a wrong method, 413 for a
// body over the limit, 503 when the store fails or times out.
type Server struct {
	store   Store
	callers *Callers
	calls   []prometheus.Counter // calls[i] counts callers.Names()[i]'s
	limits  wire.Limits
	timeout time.Duration
	log     *slog.Logger
	metrics *metrics
	promh   http.Handler // the metrics, as /metrics serves them
	errLog  LogThrottle
	mux     *http.ServeMux

	now        func() time.Time
	readyEvery time.Duration
	readyMu    sync.Mutex // held while pinging: one Ping at a time
	readyAt    time.Time  // when the last Ping ended; zero: never
	readyErr   error      // what it returned
}

// NewServer returns a Server for cfg.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("service: config: store: required")
	}
	if cfg.StoreName == "" {
		cfg.StoreName = "store"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.ReadyEvery <= 0 {
		cfg.ReadyEvery = DefaultReadyEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registry, cfg.StoreName)
	if err != nil {
		return nil, err
	}
	s := &Server{
		store:   cfg.Store,
		limits:  cfg.Limits.WithDefaults(),
		timeout: cfg.Timeout,
		log:     cfg.Logger,
		metrics: m,
		mux:     http.NewServeMux(),

		now:        cfg.Now,
		readyEvery: cfg.ReadyEvery,
	}
	toks := cfg.Tokens
	if cfg.Token != "" {
		toks = append([]Token{{Name: "default", Value: cfg.Token}}, toks...)
	}
	callers, err := NewCallers(toks, cfg.Identities, cfg.IdentityHeader)
	if err != nil {
		return nil, err
	}
	s.callers = callers
	for _, name := range callers.Names() {
		s.calls = append(s.calls, m.authorized.WithLabelValues(name))
	}
	s.mux.HandleFunc("/v1/decide", s.serve(s.decide, m.latency))
	s.mux.HandleFunc("/v1/lease", s.serve(s.lease, m.leaseLatency))
	s.mux.HandleFunc("/v1/charge", s.serve(s.charge, m.chargeLatency))
	if st, ok := cfg.Store.(SlotStore); ok {
		if err := s.handleSlots(st, cfg.Registry, cfg.StoreName); err != nil {
			return nil, err
		}
	}
	s.mux.HandleFunc("/healthz", s.healthz)
	s.mux.HandleFunc("/readyz", s.readyz)
	s.promh = promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{})
	switch cfg.Metrics {
	case MetricsOpen:
		s.mux.Handle("/metrics", s.promh)
	case MetricsBearer:
		s.mux.HandleFunc("/metrics", s.scrape)
	case MetricsElsewhere:
	default:
		return nil, fmt.Errorf("service: config: metrics: unknown access %d", cfg.Metrics)
	}
	return s, nil
}

// MetricsHandler serves the metrics to whoever reaches it: for a listener
// of their own (Config.Metrics MetricsElsewhere).
func (s *Server) MetricsHandler() http.Handler { return s.promh }

// scrape serves /metrics to a call carrying a caller's credentials
// (MetricsBearer), as /v1 checks them, without counting it as a call.
func (s *Server) scrape(w http.ResponseWriter, r *http.Request) {
	if _, _, why := s.caller(r); why != "" {
		s.refuse(w, r, why)
		return
	}
	MarkRequest(r.Context(), ConnAuthenticated)
	s.promh.ServeHTTP(w, r)
}

// ServeHTTP implements http.Handler. Behind a ConnGuard, it marks the
// request's connection as having carried a request (its grace is over).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	MarkRequest(r.Context(), ConnRequest)
	s.mux.ServeHTTP(w, r)
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// endpoint is one /v1 call: it decodes body, takes the call, and appends
// the answer to out. Errors that are not a *wire.FieldError are the store's.
type endpoint func(ctx context.Context, body, out []byte) ([]byte, error)

func (s *Server) decide(ctx context.Context, body, out []byte) ([]byte, error) {
	req, err := wire.DecodeRequest(body, s.limits)
	if err == nil {
		err = nearClock(s.now(), len(req.Buckets), func(i int) wire.Period { return req.Buckets[i].Period })
	}
	if err != nil {
		return nil, err
	}
	d, shadowErrs, err := Decide(ctx, s.store, req)
	if err != nil {
		return nil, err
	}
	if shadowErrs > 0 {
		s.metrics.shadowErrors.Add(float64(shadowErrs))
	}
	s.metrics.decisions.Inc()
	if !d.Allowed {
		s.metrics.rejections.Inc()
	}
	s.metrics.countDelays(req, &d)
	return wire.AppendAnswer(out, &d), nil
}

func (s *Server) lease(ctx context.Context, body, out []byte) ([]byte, error) {
	req, err := wire.DecodeLeaseRequest(body, s.limits)
	if err == nil {
		err = nearClock(s.now(), len(req.Buckets), func(i int) wire.Period { return req.Buckets[i].Period })
	}
	if err != nil {
		return nil, err
	}
	a, err := s.store.Lease(ctx, req)
	if err != nil {
		return nil, err
	}
	s.metrics.leases.Inc()
	for i := range a.Buckets {
		s.metrics.leased.Add(a.Buckets[i].Tokens)
		s.metrics.returned.Add(a.Buckets[i].Returned)
	}
	return wire.AppendLeaseAnswer(out, &a), nil
}

func (s *Server) charge(ctx context.Context, body, out []byte) ([]byte, error) {
	req, err := wire.DecodeChargeRequest(body, s.limits)
	if err == nil {
		err = nearClock(s.now(), len(req.Buckets), func(i int) wire.Period { return req.Buckets[i].Period })
	}
	if err != nil {
		return nil, err
	}
	a, err := s.store.Charge(ctx, req)
	if err != nil {
		return nil, err
	}
	s.metrics.charges.Inc()
	for i := range a.Buckets {
		if amt := a.Buckets[i].Applied; amt > 0 {
			s.metrics.charged.Add(amt)
		} else {
			s.metrics.refunded.Add(-amt)
		}
	}
	return wire.AppendChargeAnswer(out, &a), nil
}

// nearClock refuses, as a *wire.FieldError, a quota's period (of n
// buckets, bucket i's period(i)) that starts more than quotaMargin after
// now or ended more than quotaMargin before it: a gateway sends the period
// that holds its clock, so only a clock off by more than the margin, or a
// hostile caller, sends one. Far ahead, it would start the quota's next
// period early and keep the record's time there, so that no gateway's
// current period could start it again until then.
func nearClock(now time.Time, n int, period func(i int) wire.Period) error {
	for i := range n {
		p := period(i)
		if !p.IsQuota() {
			continue
		}
		at := "buckets[" + strconv.Itoa(i) + "]."
		switch lo, hi := now.Add(-quotaMargin).UnixMilli(), now.Add(quotaMargin).UnixMilli(); {
		case p.PeriodStartMs > hi:
			return &wire.FieldError{Field: at + "period_start_ms", Msg: "more than " + quotaMargin.String() + " after limitd's clock (" + strconv.FormatInt(now.UnixMilli(), 10) + ")"}
		case p.PeriodEndMs < lo:
			return &wire.FieldError{Field: at + "period_end_ms", Msg: "more than " + quotaMargin.String() + " before limitd's clock (" + strconv.FormatInt(now.UnixMilli(), 10) + ")"}
		}
	}
	return nil
}

// serve runs one /v1 endpoint: method, bearer token and body checks, then
// the call under the server's timeout, answering JSON.
func (s *Server) serve(call endpoint, latency prometheus.Observer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		caller, why := s.authorized(r)
		if why != "" {
			s.refuse(w, r, why)
			return
		}
		MarkRequest(r.Context(), ConnAuthenticated)
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			s.fail(w, http.StatusMethodNotAllowed, "method: must be POST")
			return
		}
		buf := bodyPool.Get().(*bytes.Buffer)
		defer func() {
			if buf.Cap() <= int(s.limits.MaxBodyBytes)+bytes.MinRead {
				buf.Reset()
				bodyPool.Put(buf)
			}
		}()
		buf.Reset()
		_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.limits.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				s.fail(w, http.StatusRequestEntityTooLarge, "body: larger than "+strconv.FormatInt(tooBig.Limit, 10)+" bytes")
				return
			}
			s.fail(w, http.StatusBadRequest, "body: "+err.Error())
			return
		}
		ctx, cancel := context.WithTimeout(WithCaller(r.Context(), caller), s.timeout)
		out, err := call(ctx, buf.Bytes(), buf.AvailableBuffer())
		cancel()
		if err != nil {
			var verr *wire.FieldError
			if errors.As(err, &verr) {
				s.failInvalid(w, err)
				return
			}
			s.metrics.storeErrors.Inc()
			if n, ok := s.errLog.Allow(time.Now()); ok {
				s.log.Warn("call failed", "path", r.URL.Path, "err", err, "suppressed", n)
			}
			s.fail(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
		latency.Observe(time.Since(start).Seconds())
	}
}

// refuse answers 401 to a request without a valid bearer token, before
// and without reading its body: a client that sends headers and never
// finishes its body is answered at once, and holds nothing. The body's
// read deadline is set to now, so net/http does not drain it either; an
// HTTP/1.1 connection is then closed (its unread body is in the way of any
// next request), and so is an HTTP/2 connection that never carried an
// authenticated request (GOAWAY), while an authenticated HTTP/2 connection
// only loses the refused stream, which net/http resets.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, why string) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	if r.ProtoMajor < 2 || !MarkRequest(r.Context(), ConnRequest) {
		MarkRequest(r.Context(), ConnRefused)
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="limitd"`)
	s.fail(w, http.StatusUnauthorized, why)
}

// authorized returns the caller of r (Callers.Authenticate, from its
// Authorization and identity headers), DefaultCaller when no token is
// needed, and counts the call under the caller's name; otherwise it returns
// why r is refused.
func (s *Server) authorized(r *http.Request) (caller, why string) {
	caller, calls, why := s.caller(r)
	if calls != nil {
		calls.Inc()
	}
	return caller, why
}

// caller is authorized without counting: the caller of r and its calls'
// counter (nil when no token is needed), or why r is refused.
func (s *Server) caller(r *http.Request) (string, prometheus.Counter, string) {
	if s.callers.Open() {
		return DefaultCaller, nil, ""
	}
	var identity []string
	if h := s.callers.IdentityHeader(); h != "" {
		identity = r.Header[h]
	}
	i, why := s.callers.Authenticate(r.Header.Get("Authorization"), identity)
	if i < 0 {
		return "", nil, why
	}
	return s.callers.Names()[i], s.calls[i], ""
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i]|0x20, b[i]|0x20
		if x != y {
			return false
		}
	}
	return true
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.ready(r.Context()); err != nil {
		s.fail(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ready\n")
}

// ready is the store's readiness: the result of its last Ping when younger
// than readyEvery, else of a new one. Callers that arrive while a Ping is
// in flight wait for it (bounded by the server's timeout) instead of
// sending their own.
func (s *Server) ready(ctx context.Context) error {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if now := s.now(); !s.readyAt.IsZero() && now.Sub(s.readyAt) < s.readyEvery && !now.Before(s.readyAt) {
		return s.readyErr
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	s.readyErr = s.store.Ping(ctx)
	s.readyAt = s.now()
	return s.readyErr
}

// failInvalid answers 400 for a *wire.FieldError (or any other error).
func (s *Server) failInvalid(w http.ResponseWriter, err error) {
	msg := err.Error()
	var verr *wire.FieldError
	if errors.As(err, &verr) {
		msg = verr.Detail()
	}
	s.fail(w, http.StatusBadRequest, msg)
}

// refusedCodes are the statuses below 500 that fail answers with.
var refusedCodes = []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge}

// fail answers {"error": msg} with status.
func (s *Server) fail(w http.ResponseWriter, status int, msg string) {
	if status < 500 {
		s.metrics.refused.WithLabelValues(strconv.Itoa(status)).Inc()
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body) // ends the value with a newline
	enc.SetEscapeHTML(false)
	_ = enc.Encode(struct {
		Error string `json:"error"`
	}{msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body.Bytes())
}

// metrics are the Prometheus series of a Server.
type metrics struct {
	decisions   prometheus.Counter
	rejections  prometheus.Counter
	storeErrors prometheus.Counter
	// shadowErrors counts shadow buckets whose own decision failed.
	shadowErrors prometheus.Counter
	leases       prometheus.Counter
	leased       prometheus.Counter
	returned     prometheus.Counter
	refused      *prometheus.CounterVec
	// authorized counts authorized /v1 calls by the caller's token name.
	authorized *prometheus.CounterVec
	latency    prometheus.Histogram
	// leaseLatency is latency's for POST /v1/lease.
	leaseLatency prometheus.Histogram
	// charges, charged, refunded and chargeLatency are POST /v1/charge's.
	charges, charged, refunded prometheus.Counter
	chargeLatency              prometheus.Histogram
	// delayed counts decisions answered with a wait (mode "enforced") and
	// shadow buckets that would have waited ("shadow"); pastDelay the
	// decisions refused because a bucket that may hold its request would
	// have had to wait longer than its max_delay_ms; wait the waits answered.
	delayed   *prometheus.CounterVec
	pastDelay prometheus.Counter
	wait      prometheus.Histogram
}

// delayModes are the values of limitd_decisions_delayed_total's mode.
var delayModes = []string{"enforced", "shadow"}

// waitBuckets are the bounds of limitd_decision_wait_seconds, up to
// wire.MaxDelayMs.
var waitBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// countDelays counts what a decision's delays did: a decision admitted with
// a wait, each shadow bucket that would have waited, and a refusal because
// an enforced bucket with a max_delay_ms would have waited past it.
func (m *metrics) countDelays(req *wire.Request, d *wire.Answer) {
	if d.Allowed && d.WaitMs > 0 {
		m.delayed.WithLabelValues("enforced").Inc()
		m.wait.Observe(float64(d.WaitMs) / 1000)
	}
	past := false
	for i := range d.Buckets {
		b := &req.Buckets[i]
		switch {
		case b.Shadow && d.Buckets[i].WaitMs > 0:
			m.delayed.WithLabelValues("shadow").Inc()
		case !b.Shadow && !d.Buckets[i].Allowed && b.MaxDelayMs > 0:
			past = true
		}
	}
	if past {
		m.pastDelay.Inc()
	}
}

var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// newMetrics registers a Server's series with reg; it fails when reg already
// has them (one registry per Server).
func newMetrics(reg prometheus.Registerer, store string) (*metrics, error) {
	labels := prometheus.Labels{"store": store}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, ConstLabels: labels, Help: help})
	}
	histogram := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, ConstLabels: labels, Help: help, Buckets: latencyBuckets})
	}
	m := &metrics{
		decisions:    counter("limitd_decisions_total", "Decisions answered (admitted or refused)."),
		rejections:   counter("limitd_rejections_total", "Decisions that refused the request."),
		storeErrors:  counter("limitd_store_errors_total", "Calls (decisions, lease calls, charge calls) that failed in the store (Redis errors and timeouts, a full memory store); answered 503."),
		shadowErrors: counter("limitd_shadow_errors_total", "Shadow buckets whose own decision failed in the store; the request's enforced decision stands, and the shadow bucket is answered allowed."),
		leases:       counter("limitd_leases_total", "Lease calls answered (granted or refused)."),
		leased:       counter("limitd_leased_tokens_total", "Tokens granted by lease calls."),
		returned:     counter("limitd_returned_tokens_total", "Tokens lease calls' returns put back into their buckets (after the clamps to the grants outstanding and to the burst)."),
		authorized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limitd_authorized_calls_total",
			Help: "/v1 calls that carried a valid bearer token, by the token's name (one per gateway when --token-file names them).",
		}, []string{"caller"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limitd_invalid_requests_total",
			Help: "Requests refused before a decision, by HTTP status (400, 401, 405, 413).",
		}, []string{"code"}),
		latency:       histogram("limitd_decide_duration_seconds", "Time to answer POST /v1/decide with a decision, from request to response."),
		leaseLatency:  histogram("limitd_lease_duration_seconds", "Time to answer POST /v1/lease, from request to response."),
		charges:       counter("limitd_charges_total", "Charge calls answered (costs known from responses)."),
		charged:       counter("limitd_charged_tokens_total", "Tokens charge calls took from their buckets beyond the reservations (after the clamps to 2 × burst and to the debt of -burst)."),
		refunded:      counter("limitd_refunded_tokens_total", "Tokens charge calls' refunds put back into their buckets (after the clamps to the reservations outstanding and to the burst)."),
		chargeLatency: histogram("limitd_charge_duration_seconds", "Time to answer POST /v1/charge, from request to response."),
		delayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limitd_decisions_delayed_total",
			Help: "Decisions admitted with a wait (wait_ms > 0: the caller holds the request), by mode: enforced (the decision's wait), shadow (a shadow bucket that would have waited; it holds nothing).",
		}, []string{"mode"}),
		pastDelay: counter("limitd_decisions_past_delay_total", "Decisions refused because a bucket with a max_delay_ms would have had to wait longer than it (refused at once, nothing taken)."),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "limitd_decision_wait_seconds", ConstLabels: labels,
			Help: "The wait answered to decisions admitted with one (wait_ms), in seconds; its _sum is the time held.", Buckets: waitBuckets}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.rejections, m.storeErrors, m.shadowErrors, m.leases, m.leased, m.returned, m.refused, m.authorized, m.latency, m.leaseLatency,
		m.charges, m.charged, m.refunded, m.chargeLatency, m.delayed, m.pastDelay, m.wait} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("service: config: registry: %w", err)
		}
	}
	// Every status fail counts, shown at 0 from the start (the callers'
	// series are created with their tokens: NewServer).
	for _, code := range refusedCodes {
		m.refused.WithLabelValues(strconv.Itoa(code))
	}
	for _, mode := range delayModes {
		m.delayed.WithLabelValues(mode)
	}
	return m, nil
}

// LogThrottle lets one event through per second and counts the others, so
// that a failure repeated at every call logs a line a second. The zero
// value is ready; it is safe for concurrent use.
type LogThrottle struct {
	last       atomic.Int64
	suppressed atomic.Int64
}

// Allow reports whether an event at now may be logged, and how many were
// suppressed since the last one that was.
func (t *LogThrottle) Allow(now time.Time) (int64, bool) {
	ns := now.UnixNano()
	last := t.last.Load()
	if ns-last < int64(time.Second) || !t.last.CompareAndSwap(last, ns) {
		t.suppressed.Add(1)
		return 0, false
	}
	return t.suppressed.Swap(0), true
}
