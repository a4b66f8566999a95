// Package engine is the rate limiter's engine: it parses a configuration,
// decides each request against its rules (local buckets in shared data,
// leases and the limit service for cluster rules), answers it, and settles
// costs known from the response. It sees its host only through two small
// interfaces, Host (the plugin's: clock, shared data, metrics, logs,
// callouts it owns) and Stream (one request's: headers, body, reply,
// resume, callouts it owns), and imports no host SDK: package plugin adapts
// it to proxy-wasm (the Wasm plugin), package native/filter to Envoy's
// dynamic modules (the native module), and a test drives it with a fake
// host. A host says what it cannot do in Options; Parse refuses what it
// would silently get wrong there.
//
// One request, file by file in the order it happens: its values and bucket
// identities are read from the host at most once each (values.go); the
// rules are walked once into a plan of takes, the buckets it asks of each
// rule (plan.go); local shadow rules are decided alone and the enforced
// local rules as one atomic stack in shared data (local.go; a concurrency
// rule's slot is such a take, given back at Done: concurrency.go, and a
// request waiting for one holds a ticket of its key's line in shared data,
// first come first served across workers: concurrency_line.go); then the
// leased cluster rules (lease.go) and the per-request ones, in one callout
// (cluster.go). Every step and every answer goes on through one function,
// and the request ends in one place (request.go: next and end), which gives
// back what the request took, once, when it is rejected, and answers it by
// continuing it or by one local reply (reply.go). The response settles
// costs known from it (response.go, sse.go). A take's held flag is the one
// record of what was taken, so a refund can only give back what was taken.
//
// # Concurrency
//
// A Plugin and its Requests are called from one thread at a time, as a
// proxy-wasm VM calls them (each Envoy worker has its own VM and its own
// Plugin; they share state only through the host's shared data, whose
// compare-and-swap makes every decision exact across workers). A Request
// keeps everything it needs on itself: nothing is shared through the Plugin
// between calls except plugin-wide state (held leases, log throttles, the
// body budget). A host that calls from several threads at once gives each
// thread its own Plugin over the same shared data, or serializes calls to
// one.
//
// Configuration errors fail New (the host refuses the plugin); errors on a
// request fail open and are counted per rule; every log line a request can
// trigger is rate-limited (at most one a second per kind and per Plugin).
package engine

import (
	"math"
	"runtime"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/engine/jsonpath"
	"github.com/ratelimit-wasm/tokenbucket/engine/lease"
	"github.com/ratelimit-wasm/tokenbucket/engine/store"
)

// Name prefixes the plugin's shared-data keys, metrics and logs.
const Name = "tokenbucket"

// SeedKey holds the placement seed of the bucket and lease tables: one per
// Envoy process, shared by every worker and configuration (slots.LoadSeed).
const SeedKey = Name + ":seed"

// Plugin is one configuration's compiled rules over a Host. Build it with
// New.
type Plugin struct {
	host Host

	cfg    *config.Config
	rules  []*rule
	table  *store.Table
	leases *lease.Table
	held   heldLeases // leases this worker called for (returnExpired)
	// leaseLine is, per lease with requests held on it in this worker
	// (leasewait.go), the moment after the last one's turn; the tick drops
	// the moments that have passed.
	leaseLine map[uint64]int64
	metrics   globalMetrics
	// One rate limit per kind of log line a request can trigger.
	failLog, serviceLog, replyLog, headerLog throttle

	// bodyHeld is the state of this VM's in-flight body scans, in bytes,
	// within bodyBudget (see maxBodyHeld in response.go).
	bodyHeld, bodyBudget int
	// keyed: the rules' identities are keyed (keyIdentities).
	keyed bool
	// readsBody: a rule takes its cost from the response body (only then
	// does a request ask for an identity encoding).
	readsBody bool
	// bodyPaths are the request_json paths of the configuration
	// (requestbody.go); none: no request body is read.
	bodyPaths []*jsonpath.Path
	// memory: what this Plugin's Go runtime reported so far (Tick).
	memory *MemoryReport
	// slotsOwed are slots whose release could not be written (shared
	// data contended or failing), retried by Tick (concurrency.go).
	slotsOwed []store.Request
	// cslots: the cluster slots of this Plugin's requests
	// (concurrency_cluster.go).
	cslots clusterSlots
	// slotLine is, per slot table entry, the requests of this Plugin
	// waiting for a slot, in ticket order, for waking (concurrency.go).
	slotLine map[uint64][]*Request
	// lines: the lines for slots in shared data (concurrency_line.go).
	lines *slotLines
}

// Options tune a Plugin beyond its configuration, and say what its host
// cannot do.
type Options struct {
	// BodyBudget bounds the bytes of in-flight body scans (0: maxBodyHeld).
	BodyBudget int
	// Memory is what the Plugin's Go runtime has reported to the memory
	// metrics so far (see MemoryReport); nil: the Plugin's own.
	Memory *MemoryReport
	// FlatMetadata: the host reads dynamic metadata one level deep
	// (namespace, key) and only as a string, number or bool, as Envoy's
	// dynamic-module SDK does, so it cannot read the claims jwt_authn writes
	// as a structure: a configuration with a jwt: source needs
	// trust_unverified_jwt (Parse refuses it otherwise).
	FlatMetadata bool
}

// New parses and compiles a configuration for host, under the shared-data
// prefix of rootID: Parse, then NewPlugin. A configuration the plugin
// refuses is a *RefusalError, whose text is the line the host should log.
func New(host Host, data []byte, rootID string, o Options) (*Plugin, error) {
	c, err := Parse(data, o)
	if err != nil {
		return nil, err
	}
	return NewPlugin(host, c, rootID, o)
}

// NewPlugin compiles a parsed configuration for host, under the shared-data
// prefix of rootID. Any number of Plugins may share c.
func NewPlugin(host Host, c *Configuration, rootID string, o Options) (*Plugin, error) {
	p := &Plugin{host: host, bodyBudget: o.BodyBudget, memory: o.Memory}
	if p.bodyBudget <= 0 {
		p.bodyBudget = maxBodyHeld
	}
	if p.memory == nil {
		p.memory = &MemoryReport{}
	}
	if err := p.configure(c.cfg, rootID); err != nil {
		return nil, &RefusalError{Err: err}
	}
	return p, nil
}

// Rules is the number of rules the plugin runs, and MaxKeys its table's size.
func (p *Plugin) Rules() int   { return len(p.rules) }
func (p *Plugin) MaxKeys() int { return p.cfg.MaxKeys }

// rule is a config.Rule with what the request path needs precomputed.
type rule struct {
	*config.Rule
	// limit and policy are a quota's for its current period (limitAt).
	limit      bucket.Limit
	policy     string // RateLimit-Policy value
	quotedName string // the name as a structured-field string: "name"
	burst      string // RateLimit-Limit value: the burst rounded down (wholeNumber)
	// identity is the keyed hash (hash.go) of the rule name and its
	// limit-key sources, to which a request's values are added;
	// clusterName the same, unkeyed, for a cluster bucket's name.
	identity    idHash
	clusterName hasher
	lease       lease.Policy // sync "lease"
	allowed     Counter
	rejected    Counter
	failedOpen  Counter
	shadowRej   Counter
	shadowLog   throttle
	// Holding requests (max_delay_ms, delay.go): maxWait in ns (0: the
	// rule refuses at once); waiting is how many requests this Plugin
	// holds for the rule now; claimed how many hold a place of its
	// max_waiting (held, or decided with a wait and not yet held or
	// refused: claimed >= waiting); the counters are defined only for
	// rules that hold.
	maxWait       int64
	waiting       int
	claimed       int
	delayed       Counter // requests held, then gone on
	delayRefused  Counter // refused: the wait would pass max_delay_ms
	waitingFull   Counter // refused: max_waiting requests held already
	delayMs       Counter // milliseconds held, summed
	delayAbandon  Counter // held requests that ended before going on
	waitingGauge  Gauge   // waiting, summed over the Plugins that share it
	shadowDelayed Counter // shadow: requests the rule would have held
	// charges: the rule settles with the response (cost_source
	// response_header or response_json, or charge_on); costMissing counts
	// responses whose cost could not be read (defined only for rules whose
	// cost comes from the response).
	charges     bool
	costMissing Counter
	// response_json: the compiled path, and costTruncated counts responses
	// charged truncated_cost (cut short, or encoded).
	costPath      *jsonpath.Path
	costTruncated Counter
	// slots: a concurrency rule (concurrency.go); inFlight counts the
	// slots its requests hold, summed over the Plugins that share it.
	slots    bool
	inFlight Gauge
	// A price table (Cost.Money, money.go): the terms' compiled paths, and
	// priceMissing counts requests whose model has no price and the table
	// no "*" (they keep their reservation).
	termPaths    []*jsonpath.Path
	priceMissing Counter
}

type globalMetrics struct {
	evictions, retries, refunds, serviceErrors, longValues, gcCycles, leaseCalls, chargeCalls Counter
	slotsLost                                                                                 Counter
	heapBytes, sysBytes                                                                       Gauge
}

// RefusalError is a configuration the plugin refuses: OnPluginStart logs
// its text as a critical line and fails, so Envoy refuses the plugin.
type RefusalError struct{ Err error }

func (e *RefusalError) Error() string {
	return Name + ": invalid configuration, refusing to start: " + e.Err.Error()
}

func (e *RefusalError) Unwrap() error { return e.Err }

// Tick is the plugin's once-a-second work: it reports the Go runtime's
// memory figures (ms, read by the host) and hands back expired leases. It
// adds the change since the last report of its Options.Memory, so the
// gauges are sums over the Go runtimes that report (a Wasm VM per Envoy
// worker; one process for the native module) and gc_cycles counts all
// their collections.
func (p *Plugin) Tick(ms *runtime.MemStats) {
	m := p.memory
	p.metrics.heapBytes.Add(int64(ms.HeapAlloc) - int64(m.heap))
	p.metrics.sysBytes.Add(int64(ms.Sys) - int64(m.sys))
	if gc := uint64(ms.NumGC); gc > m.gc {
		p.metrics.gcCycles.Increment(gc - m.gc)
	}
	m.heap, m.sys, m.gc = ms.HeapAlloc, ms.Sys, uint64(ms.NumGC)
	if len(p.held.list) > 0 {
		p.returnExpired()
	}
	if len(p.leaseLine) > 0 {
		p.dropPassedTurns()
	}
	if len(p.slotsOwed) > 0 {
		p.payOwedSlots()
	}
	if len(p.cslots.open) > 0 {
		p.renewSlots()
	}
}

// MemoryReport is what one Go runtime has added to a configuration's
// memory metrics so far (Plugin.Tick). The host keeps one for each Go
// runtime and set of metrics, and gives it to every Plugin it builds for
// them (Options.Memory), so that a reconfiguration, or another worker's
// Plugin reporting the same runtime, carries on from it. The zero value has
// reported nothing. A MemoryReport is used by one Plugin's Tick at a time.
type MemoryReport struct{ heap, sys, gc uint64 }

// configure compiles a parsed configuration. Buckets live in shared data
// under a prefix of the root id, so a new configuration (or another worker)
// finds the same buckets for rules whose name and limit keys are unchanged.
func (p *Plugin) configure(cfg *config.Config, rootID string) error {
	table, err := store.New(p.host.SharedData(), Name+":v2:"+rootID+":", cfg.MaxKeys)
	if err != nil {
		return err
	}
	table.WithSeed(SeedKey)
	leases, err := lease.New(p.host.SharedData(), Name+":lease:v3:"+rootID+":", cfg.MaxKeys)
	if err != nil {
		return err
	}
	leases.WithSeed(SeedKey)
	if p.lines, err = newSlotLines(p.host.SharedData(), rootID, cfg.MaxKeys); err != nil {
		return err
	}
	p.cfg, p.table, p.leases, p.held = cfg, table, leases, heldLeases{}
	p.rules = make([]*rule, len(cfg.Rules))
	for i := range cfg.Rules {
		p.rules[i] = p.compile(&cfg.Rules[i])
	}
	p.readsBody = (&Configuration{cfg: cfg}).ReadsResponseBody()
	p.bodyPaths = requestJSONPaths(cfg)
	p.keyed = false
	p.keyIdentities()
	p.metrics = globalMetrics{
		evictions: p.host.Counter(Name + ".evictions"),
		retries:   p.host.Counter(Name + ".cas_retries"),
		refunds:   p.host.Counter(Name + ".refunds"),
		// calls to the limit service that failed: timeout, connection, status, body
		serviceErrors: p.host.Counter(Name + ".service_errors"),
		// values longer than a regex condition reads (config.RegexBudget)
		longValues: p.host.Counter(Name + ".regex_value_too_long"),
		heapBytes:  p.host.Gauge(Name + ".memory.heap_bytes"),
		sysBytes:   p.host.Gauge(Name + ".memory.sys_bytes"),
		gcCycles:   p.host.Counter(Name + ".memory.gc_cycles"),
		// lease calls sent: a request waiting, a refill, a return
		leaseCalls: p.host.Counter(Name + ".lease_calls"),
		// charge calls sent to the limit service (costs known from the
		// response, charge_on refunds of cluster rules)
		chargeCalls: p.host.Counter(Name + ".charge_calls"),
		// releases of concurrency slots dropped: shared data failed
		// past maxSlotsOwed retries waiting (concurrency.go)
		slotsLost: p.host.Counter(Name + ".slots_lost"),
	}
	p.configureClusterSlots()
	return nil
}

// keySecret is the configuration's key_secret: the top-level service's, or
// else the first a rule's own service has ("" when none).
func keySecret(cfg *config.Config) string {
	if cfg.Service != nil && cfg.Service.KeySecret != "" {
		return cfg.Service.KeySecret
	}
	for i := range cfg.Rules {
		if s := cfg.Rules[i].Service; s != nil && s.KeySecret != "" {
			return s.KeySecret
		}
	}
	return ""
}

// keyIdentities keys the rules' identities (hash.go) once the identity
// key can be read: at configuration, or at a later request when shared data
// failed until then (meanwhile the rules that need an identity fail open,
// planRules). It reports whether they are keyed.
func (p *Plugin) keyIdentities() bool {
	if p.keyed {
		return true
	}
	k0, k1, err := identityKey(p.host.SharedData(), keySecret(p.cfg))
	if err != nil {
		p.warn(&p.failLog, "reading the identity key "+IdentityKeyKey+" from shared data: "+err.Error())
		return false
	}
	for _, r := range p.rules {
		r.identity = newIDHash(k0, k1)
		r.identity.field(r.Name)
		for _, k := range r.LimitKeys {
			r.identity.uvarint(int(k.Kind))
			r.identity.field(k.Name)
		}
		if r.slots {
			// Slots are a table of their own per limit (concurrency.go).
			r.identity.field("concurrency")
			r.identity.uvarint(r.Concurrency.MaxInFlight)
		}
	}
	p.keyed = true
	return true
}

func (p *Plugin) compile(cr *config.Rule) *rule {
	r := &rule{Rule: cr, limit: bucket.Limit{Rate: cr.Limit.TokensPerSecond, Burst: cr.Limit.Burst}}
	h := newHasher().field(cr.Name)
	for _, k := range cr.LimitKeys {
		h = h.uvarint(int(k.Kind)).field(k.Name)
	}
	r.clusterName = h
	if cr.Sync == config.SyncLease {
		r.lease = leasePolicy(cr)
	}
	if cr.Action == config.ActionLimit && cr.Algorithm == config.AlgorithmConcurrency {
		r.quotedName = `"` + cr.Name + `"`
		r.burst = wholeNumber(cr.Limit.Burst)
		r.policy = slotPolicy(r.quotedName, cr.Concurrency.MaxInFlight)
		r.slots = true
		r.inFlight = p.host.Gauge(Name + ".rule." + cr.Name + ".in_flight")
	} else if cr.Action == config.ActionLimit {
		r.quotedName = `"` + cr.Name + `"`
		r.burst = wholeNumber(cr.Limit.Burst)
		if cr.Limit.Quota() {
			r.limit.PeriodEnd = -1 // not a period: the first limitAt sets it
			r.limitAt(p.now())
		} else {
			window := int64(math.Ceil(cr.Limit.Burst / cr.Limit.TokensPerSecond))
			r.policy = r.quotedName + ";q=" + r.burst + ";w=" + strconv.FormatInt(window, 10)
		}
	}
	m := Name + ".rule." + cr.Name + "."
	r.allowed = p.host.Counter(m + "allowed")
	r.rejected = p.host.Counter(m + "rejected")
	r.failedOpen = p.host.Counter(m + "failed_open")
	r.shadowRej = p.host.Counter(m + "shadow_rejected")
	if cr.Cost.FromResponse() {
		r.costMissing = p.host.Counter(m + "cost_missing")
	}
	if cr.Limit.MaxDelayMS > 0 {
		r.maxWait = int64(cr.Limit.MaxDelayMS) * 1e6
		if cr.Mode == config.ModeShadow {
			r.shadowDelayed = p.host.Counter(m + "shadow_delayed")
		} else {
			r.delayed = p.host.Counter(m + "delayed")
			r.delayRefused = p.host.Counter(m + "delay_refused")
			r.waitingFull = p.host.Counter(m + "waiting_full")
			r.delayMs = p.host.Counter(m + "delay_ms")
			r.delayAbandon = p.host.Counter(m + "delay_abandoned")
			r.waitingGauge = p.host.Gauge(m + "waiting")
		}
	}
	if cr.Cost.Source.Kind == config.SourceResponseJSON {
		r.costTruncated = p.host.Counter(m + "cost_truncated")
		if mo := cr.Cost.Money; mo != nil {
			r.termPaths = make([]*jsonpath.Path, len(mo.Terms))
			for i, t := range mo.Terms {
				r.termPaths[i] = jsonpath.NewPath(t.Source.Name)
			}
			r.priceMissing = p.host.Counter(m + "price_missing")
		} else {
			r.costPath = jsonpath.NewPath(cr.Cost.Source.Name)
		}
	}
	r.charges = cr.Cost.FromResponse() || cr.ChargeOn.Listed
	return r
}

// wholeNumber prints a burst as the quota of RateLimit-Policy's q and
// RateLimit-Limit: rounded down to a whole number, which is what those
// fields hold (a structured-field Integer: a parser refuses "3.5", and
// the whole header with it), and the cost-1 requests a full bucket admits.
// config bounds burst to MaxBurst (1e12), within an int64.
func wholeNumber(burst float64) string {
	return strconv.FormatInt(int64(math.Floor(burst)), 10)
}

// count adds what a shared-data decision did besides deciding.
func (p *Plugin) count(o store.Outcome) {
	if o.Evictions > 0 {
		p.metrics.evictions.Increment(uint64(o.Evictions))
	}
	if o.Retries > 0 {
		p.metrics.retries.Increment(uint64(o.Retries))
	}
	if o.Refunds > 0 {
		p.metrics.refunds.Increment(uint64(o.Refunds))
	}
}

// throttle lets one log line a second through and counts the others, so no
// request, however many arrive, can flood Envoy's log.
type throttle struct {
	last       int64 // Unix ns of the last line let through
	suppressed int
}

// allow reports whether a line may be logged at now, and how many were
// suppressed since the last one.
func (t *throttle) allow(now int64) (suppressed int, ok bool) {
	if t.last != 0 && now-t.last < 1e9 {
		t.suppressed++
		return 0, false
	}
	suppressed, t.last, t.suppressed = t.suppressed, now, 0
	return suppressed, true
}

// warn logs a warning through t: at most one line a second.
func (p *Plugin) warn(t *throttle, msg string) {
	if n, ok := t.allow(p.now()); ok {
		if n > 0 {
			msg += " (" + strconv.Itoa(n) + " similar lines suppressed)"
		}
		p.host.Log(LogWarn, Name+": "+msg)
	}
}

// now is the host's clock, Unix ns.
func (p *Plugin) now() int64 { return p.host.Now() }
