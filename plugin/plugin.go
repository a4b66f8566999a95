// Package plugin is the proxy-wasm side of the rate limiter: a VM context, a
// plugin context that parses the configuration in OnPluginStart and keeps the
// compiled rules, and an HTTP context per request that decides and answers.
//
// One request, file by file in the order it happens: its values and
// bucket identities are read from the host at most once each (request.go);
// the rules are walked once into a plan of takes, the buckets it asks of
// each rule (plan.go); local shadow rules are decided alone and the enforced
// local rules as one atomic stack in shared data (local.go); then the leased
// cluster rules (lease.go) and the per-request ones, in one callout
// (cluster.go). Every step and every answer goes on through one function,
// and the request ends in one place (http.go: next and end), which gives
// back what the request took, once, when it is rejected, and answers it by
// continuing it or by one local reply (reply.go). The response settles
// costs known from it (response.go, sse.go). A take's held flag is the one
// record of what was taken, so a refund can only give back what was taken.
//
// Host facilities sit behind small seams: buckets go through store.Table
// over shared data (sharedData), the clock is a func. Configuration errors
// fail OnPluginStart after a critical log (Envoy refuses the plugin); errors
// on a request fail open and are counted per rule in /stats; every log line
// a request can trigger is rate-limited (at most one a second per kind and
// per worker).
//
// Cost: an allowed request makes 10 host calls (one header read, one
// shared-data read and one write, one counter, one clock read, five response
// headers) and no allocation of its own: HTTP contexts are reused
// (OnHttpStreamDone) and the Go collector runs on the plugin's 1 s tick, not
// inside requests, unless GOGC is set for the VM.
package plugin

import (
	"cmp"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/jsonpath"
	"github.com/ratelimit-wasm/tokenbucket/internal/slots"
	"github.com/ratelimit-wasm/tokenbucket/lease"
	"github.com/ratelimit-wasm/tokenbucket/store"
)

// Name prefixes the plugin's shared-data keys, metrics and logs.
const Name = "tokenbucket"

// seedKey holds the placement seed of the bucket and lease tables: one per
// Envoy process, shared by every worker and configuration (store.LoadSeed).
const seedKey = Name + ":seed"

// NewVMContext returns the VM context to hand to proxywasm.SetVMContext.
func NewVMContext() types.VMContext { return &vmContext{now: wallClock, sd: sharedData{}} }

type vmContext struct {
	types.DefaultVMContext
	now func() int64 // the clock, Unix ns
	sd  slots.SharedData
	// bodyBudget overrides maxBodyHeld when not 0 (tests).
	bodyBudget int
}

// OnVMStart implements types.VMContext: it takes garbage collection off the
// request path (see collectOnTick).
func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	// Natively (tests) the process's collector is left alone; in a VM,
	// vm_config's environment_variables decide when they set GOGC.
	if runtime.GOOS == "wasip1" && os.Getenv("GOGC") == "" {
		collectOnTicks = true
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(gcMemoryLimit)
	}
	return types.OnVMStartStatusOK
}

// Garbage collection. A collection inside a request callback stops that
// request for the whole mark phase, so a VM collects on its 1 s tick
// instead (collectOnTick), once its heap has doubled since the last
// collection (as GOGC=100 would) and holds at least gcMinHeap. Between
// ticks the heap only grows; gcMemoryLimit is the runtime's backstop (a
// soft limit: the collector runs at a request when the VM's memory nears
// it). Setting GOGC in vm_config.environment_variables restores the
// runtime's own pacing.
const (
	gcMinHeap     uint64 = 4 << 20
	gcMemoryLimit        = 64 << 20
)

var (
	collectOnTicks bool        // set by OnVMStart unless GOGC is set
	nextGC         = gcMinHeap // the heap size at which a tick collects
)

// collectOnTick collects when the heap has reached nextGC.
func collectOnTick(heap uint64) {
	if !collectOnTicks || heap < nextGC {
		return
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	nextGC = max(2*ms.HeapAlloc, gcMinHeap)
}

// NewPluginContext implements types.VMContext.
func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{id: contextID, now: v.now, sd: v.sd, bodyBudget: cmp.Or(v.bodyBudget, maxBodyHeld)}
}

// pluginContext holds one configuration's compiled rules.
type pluginContext struct {
	types.DefaultPluginContext
	id  uint32
	now func() int64
	sd  slots.SharedData

	cfg     *config.Config
	rules   []*rule
	table   *store.Table
	leases  *lease.Table
	held    heldLeases // leases this worker called for (returnExpired)
	metrics globalMetrics
	// One rate limit per kind of log line a request can trigger.
	failLog, serviceLog, replyLog, headerLog throttle

	free []*httpContext // contexts of finished streams, zeroed, for reuse

	// bodyHeld is the state of this VM's in-flight body scans, in bytes,
	// within bodyBudget (see maxBodyHeld in response.go).
	bodyHeld, bodyBudget int
}

// rule is a config.Rule with what the request path needs precomputed.
type rule struct {
	*config.Rule
	limit      bucket.Limit
	policy     string       // RateLimit-Policy value
	quotedName string       // the name as a structured-field string: "name"
	burst      string       // RateLimit-Limit value
	identity   hasher       // hash of the rule name and its limit-key sources
	lease      lease.Policy // sync "lease"
	allowed    counter
	rejected   counter
	failedOpen counter
	shadowRej  counter
	shadowLog  throttle
	// charges: the rule settles with the response (cost_source
	// response_header or response_json, or charge_on); costMissing counts
	// responses whose cost could not be read (defined only for rules whose
	// cost comes from the response).
	charges     bool
	costMissing counter
	// response_json: the compiled path, and costTruncated counts responses
	// charged truncated_cost (cut short, or encoded).
	costPath      *jsonpath.Path
	costTruncated counter
}

type globalMetrics struct {
	evictions, retries, refunds, serviceErrors, longValues, gcCycles, leaseCalls, chargeCalls counter
	heapBytes, sysBytes                                                                       gauge
}

// OnPluginStart implements types.PluginContext.
func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCritical(Name + ": reading the plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	rootID := ""
	if v, err := proxywasm.GetProperty([]string{"plugin_root_id"}); err == nil {
		rootID = string(v)
	}
	if err := p.configure(data, rootID); err != nil {
		proxywasm.LogCritical((&RefusalError{Err: err}).Error())
		return types.OnPluginStartStatusFailed
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(1000); err != nil {
		proxywasm.LogWarn(Name + ": no ticks, memory gauges stay at 0: " + err.Error())
	}
	proxywasm.LogInfo(Name + ": started with " + strconv.Itoa(len(p.rules)) + " rules, max_keys " + strconv.Itoa(p.cfg.MaxKeys))
	return types.OnPluginStartStatusOK
}

// RefusalError is a configuration the plugin refuses: OnPluginStart logs
// its text as a critical line and fails, so Envoy refuses the plugin.
type RefusalError struct{ Err error }

func (e *RefusalError) Error() string {
	return Name + ": invalid configuration, refusing to start: " + e.Err.Error()
}

func (e *RefusalError) Unwrap() error { return e.Err }

// CheckConfiguration returns the *RefusalError OnPluginStart logs for data
// as the plugin's configuration, or nil when the plugin would start with
// it. It runs configure's validation (config.Parse, the only validator)
// and needs no host, so a command can check a configuration without Envoy
// (cmd/checkconfig).
func CheckConfiguration(data []byte) error {
	if _, err := parseConfiguration(data); err != nil {
		return &RefusalError{Err: err}
	}
	return nil
}

// parseConfiguration is the validation of configure and of
// CheckConfiguration.
func parseConfiguration(data []byte) (*config.Config, error) { return config.Parse(data) }

// OnTick implements types.PluginContext: it reports the Go runtime's memory
// figures. Every worker's VM adds the change since its own last report, so
// the gauges are sums over Envoy's workers and gc_cycles counts all their
// collections.
func (p *pluginContext) OnTick() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.metrics.heapBytes.Add(int64(ms.HeapAlloc) - int64(reported.heap))
	p.metrics.sysBytes.Add(int64(ms.Sys) - int64(reported.sys))
	if gc := uint64(ms.NumGC); gc > reported.gc {
		p.metrics.gcCycles.Increment(gc - reported.gc)
	}
	reported.heap, reported.sys, reported.gc = ms.HeapAlloc, ms.Sys, uint64(ms.NumGC)
	collectOnTick(ms.HeapAlloc) // after the report: its collection shows at the next tick
	if len(p.held.list) > 0 {
		p.returnExpired()
	}
}

// reported is what this VM has added to the memory metrics so far. It is
// per VM, not per plugin context, so a reconfiguration carries on from it.
var reported struct{ heap, sys, gc uint64 }

// configure parses and compiles a configuration (config.Parse is the only
// validator). Buckets live in shared data under a prefix of the root id, so
// a new configuration (or another worker) finds the same buckets for rules
// whose name and limit keys are unchanged.
func (p *pluginContext) configure(data []byte, rootID string) error {
	cfg, err := parseConfiguration(data)
	if err != nil {
		return err
	}
	table, err := store.New(p.sd, Name+":v2:"+rootID+":", cfg.MaxKeys)
	if err != nil {
		return err
	}
	table.WithSeed(seedKey)
	leases, err := lease.New(p.sd, Name+":lease:v2:"+rootID+":", cfg.MaxKeys)
	if err != nil {
		return err
	}
	leases.WithSeed(seedKey)
	p.cfg, p.table, p.leases, p.held = cfg, table, leases, heldLeases{}
	p.rules = make([]*rule, len(cfg.Rules))
	for i := range cfg.Rules {
		p.rules[i] = compile(&cfg.Rules[i])
	}
	p.metrics = globalMetrics{
		evictions: defineCounter(Name + ".evictions"),
		retries:   defineCounter(Name + ".cas_retries"),
		refunds:   defineCounter(Name + ".refunds"),
		// calls to the limit service that failed: timeout, connection, status, body
		serviceErrors: defineCounter(Name + ".service_errors"),
		// values longer than a regex condition reads (config.RegexBudget)
		longValues: defineCounter(Name + ".regex_value_too_long"),
		heapBytes:  defineGauge(Name + ".memory.heap_bytes"),
		sysBytes:   defineGauge(Name + ".memory.sys_bytes"),
		gcCycles:   defineCounter(Name + ".memory.gc_cycles"),
		// lease calls sent: a request waiting, a refill, a return
		leaseCalls: defineCounter(Name + ".lease_calls"),
		// charge calls sent to the limit service (costs known from the
		// response, charge_on refunds of cluster rules)
		chargeCalls: defineCounter(Name + ".charge_calls"),
	}
	return nil
}

func compile(cr *config.Rule) *rule {
	r := &rule{Rule: cr, limit: bucket.Limit{Rate: cr.Limit.TokensPerSecond, Burst: cr.Limit.Burst}}
	h := newHasher().field(cr.Name)
	for _, k := range cr.LimitKeys {
		h = h.uvarint(int(k.Kind)).field(k.Name)
	}
	r.identity = h
	if cr.Sync == config.SyncLease {
		r.lease = leasePolicy(cr)
	}
	if cr.Action == config.ActionLimit {
		window := int64(math.Ceil(cr.Limit.Burst / cr.Limit.TokensPerSecond))
		r.quotedName = `"` + cr.Name + `"`
		r.burst = formatNumber(cr.Limit.Burst)
		r.policy = r.quotedName + ";q=" + r.burst + ";w=" + strconv.FormatInt(window, 10)
	}
	m := Name + ".rule." + cr.Name + "."
	r.allowed = defineCounter(m + "allowed")
	r.rejected = defineCounter(m + "rejected")
	r.failedOpen = defineCounter(m + "failed_open")
	r.shadowRej = defineCounter(m + "shadow_rejected")
	if cr.Cost.FromResponse() {
		r.costMissing = defineCounter(m + "cost_missing")
	}
	if cr.Cost.Source.Kind == config.SourceResponseJSON {
		r.costPath = jsonpath.NewPath(cr.Cost.Source.Name)
		r.costTruncated = defineCounter(m + "cost_truncated")
	}
	r.charges = cr.Cost.FromResponse() || cr.ChargeOn.Listed
	return r
}

// formatNumber prints an integral float without a fraction.
func formatNumber(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// NewHttpContext implements types.PluginContext. It reuses a context whose
// stream is done (see OnHttpStreamDone), so a request allocates none.
func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		c.plugin, c.id = p, contextID
		return c
	}
	return &httpContext{plugin: p, id: contextID}
}

// count adds what a shared-data decision did besides deciding.
func (p *pluginContext) count(o store.Outcome) {
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
func (p *pluginContext) warn(t *throttle, msg string) {
	if n, ok := t.allow(p.now()); ok {
		if n > 0 {
			msg += " (" + strconv.Itoa(n) + " similar lines suppressed)"
		}
		proxywasm.LogWarn(Name + ": " + msg)
	}
}
