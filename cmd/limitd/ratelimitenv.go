package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// envSetting is one environment variable envoyproxy/ratelimit reads
// (its src/settings/settings.go), as limitd reads it in the ratelimit mode.
type envSetting struct {
	Name string
	// Default is envoyproxy/ratelimit's default, the value an unset (or
	// empty) variable has here too.
	Default string
	// Flags are the limitd flags the variable sets, if any.
	Flags []string
	// Does says what limitd does with it: honoured as, or refused because
	// (docs/from-envoy-ratelimit.md's table is checked against it).
	Does string
}

// ratelimitEnv is every variable envoyproxy/ratelimit reads, in the order
// of its settings.go, and what limitd does with each: the one home of
// these facts. fromEnv reads each of them and no other of the peer's
// (TestFromEnvReadsTheTable); a value limitd does not support is refused
// at start with an error naming the variable.
var ratelimitEnv = []envSetting{
	{"HOST", "0.0.0.0", nil, "the HTTP listener's address: `/healthcheck` and `/json`, as the peer serves them"},
	{"PORT", "8080", nil, "the HTTP listener's port"},
	{"DEBUG_HOST", "0.0.0.0", nil, "the debug listener's address: `/rlconfig` as the peer prints it; pprof and `/stats` are not served (limitd's metrics are Prometheus)"},
	{"DEBUG_PORT", "6070", nil, "the debug listener's port"},
	{"GRPC_UDS", "", nil, "refused when set: limitd serves gRPC on TCP only"},
	{"GRPC_HOST", "0.0.0.0", []string{"grpc-listen"}, "the gRPC listener's address (`--grpc-listen`): the rate limit service and the quota service"},
	{"GRPC_PORT", "8081", []string{"grpc-listen"}, "the gRPC listener's port"},
	{"GRPC_MAX_CONNECTION_AGE", "24h", []string{"grpc-max-connection-age"}, "`--grpc-max-connection-age`: a connection that old gets a GOAWAY (±10%)"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", []string{"grpc-max-connection-age-grace"}, "`--grpc-max-connection-age-grace`"},
	{"GRPC_SERVER_USE_TLS", "false", []string{"grpc-tls-cert", "grpc-tls-key"}, "`true`: TLS on the gRPC listener, from `GRPC_SERVER_TLS_CERT` and `GRPC_SERVER_TLS_KEY`"},
	{"GRPC_SERVER_TLS_CERT", "", []string{"grpc-tls-cert"}, "`--grpc-tls-cert` (with `GRPC_SERVER_USE_TLS=true`)"},
	{"GRPC_SERVER_TLS_KEY", "", []string{"grpc-tls-key"}, "`--grpc-tls-key` (with `GRPC_SERVER_USE_TLS=true`)"},
	{"GRPC_CLIENT_TLS_CACERT", "", []string{"grpc-tls-client-ca"}, "`--grpc-tls-client-ca`: clients must present a certificate it verifies, which authenticates them; `GRPC_SERVER_TLS_CA_CERT` (what Envoy Gateway sets) is taken too, and the two, when both set, must agree"},
	{"GRPC_CLIENT_TLS_SAN", "", []string{"grpc-tls-client-san"}, "`--grpc-tls-client-san`: the client certificate's SAN required"},
	{"LOG_LEVEL", "WARN", []string{"log-level"}, "`--log-level`, any case: debug, info, warn (warning), error; trace is taken as debug; fatal and panic are refused (limitd has no quieter level than error)"},
	{"LOG_FORMAT", "text", []string{"log-format"}, "`--log-format`: text or json"},
	{"CONFIG_TYPE", "FILE", []string{"rls-config", "rls-xds-server"}, "`FILE`: the YAML files of `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY` (`--rls-config`); `GRPC_XDS_SOTW`: configuration over xDS (`--rls-xds-server`); anything else refused"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", []string{"rls-start-without-config"}, "`--rls-start-without-config` (xDS); with `FILE`, the folder is read at start either way"},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", []string{"rls-xds-node-id"}, "`--rls-xds-node-id` (xDS)"},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", []string{"rls-xds-node-metadata"}, "`--rls-xds-node-metadata`, from the peer's `k=v,k=v` form (xDS)"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", []string{"rls-xds-server"}, "`--rls-xds-server` (xDS)"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", nil, "limitd's xDS client retries with its own back-off; a value other than the default is refused"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", []string{"rls-xds-headers"}, "`--rls-xds-headers`, from the peer's `k:v,k:v` form (xDS)"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", []string{"rls-xds-tls-ca"}, "`true`: TLS to the xDS server, with the files below (xDS)"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", []string{"rls-xds-tls-cert"}, "`--rls-xds-tls-cert` (with `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`)"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", []string{"rls-xds-tls-key"}, "`--rls-xds-tls-key` (idem)"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", []string{"rls-xds-tls-ca"}, "`--rls-xds-tls-ca` (idem)"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", []string{"rls-xds-tls-san"}, "`--rls-xds-tls-san` (idem)"},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", []string{"rls-xds-backoff"}, "`--rls-xds-backoff`: the first wait after a failed xDS stream, doubled after each further failure (xDS)"},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", []string{"rls-xds-backoff-max"}, "`--rls-xds-backoff-max`: the longest wait (xDS)"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", nil, "limitd's xDS client jitters each wait by its own factor; a value other than the default is refused"},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", nil, "idem"},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", []string{"rls-xds-max-recv-bytes"}, "`--rls-xds-max-recv-bytes`: the largest xDS response (limitd's default 4 MiB when unset) (xDS)"},
	{"USE_DOG_STATSD", "false", nil, "`true` refused: limitd sends no statsd; its metrics are Prometheus (`USE_PROMETHEUS`)"},
	{"USE_DOG_STATSD_MOGRIFIERS", "", nil, "read by the peer only with `USE_DOG_STATSD=true`, which is refused"},
	{"USE_STATSD", "true", nil, "must be `false` (Istio's sample and Envoy Gateway set it so): limitd sends no statsd, so the peer's default `true` is refused; its metrics are Prometheus (`USE_PROMETHEUS`)"},
	{"STATSD_HOST", "localhost", nil, "read by the peer only with `USE_STATSD=true`, which is refused"},
	{"STATSD_PORT", "8125", nil, "idem"},
	{"EXTRA_TAGS", "", nil, "refused when set: limitd adds no tags to its series"},
	{"STATS_FLUSH_INTERVAL", "10s", nil, "taken, nothing to do: limitd's series are read live at each scrape, never staler than a flush"},
	{"DISABLE_STATS", "false", nil, "`true`: no Prometheus listener, whatever `USE_PROMETHEUS` says"},
	{"USE_PROMETHEUS", "false", []string{"prometheus-listen"}, "`true`: Envoy Gateway's `ratelimit_service_rate_limit_*` series on `PROMETHEUS_ADDR` (`--prometheus-listen`)"},
	{"PROMETHEUS_ADDR", ":9090", []string{"prometheus-listen"}, "`--prometheus-listen` (with `USE_PROMETHEUS=true`)"},
	{"PROMETHEUS_PATH", "/metrics", []string{"prometheus-path"}, "`--prometheus-path` (idem)"},
	{"PROMETHEUS_MAPPER_YAML", "", nil, "the file must exist; limitd serves the series of Envoy Gateway's mapping whatever the file maps, and says so in its log"},
	{"RUNTIME_ROOT", "/srv/runtime_data/current", []string{"rls-config"}, "with `RUNTIME_SUBDIRECTORY` and `RUNTIME_APPDIRECTORY`, the folder of YAML files (`--rls-config`), read again every `--rls-config-poll` (Kubernetes' `..data` swaps included)"},
	{"RUNTIME_SUBDIRECTORY", "", []string{"rls-config"}, "idem"},
	{"RUNTIME_APPDIRECTORY", "config", []string{"rls-config"}, "idem"},
	{"RUNTIME_IGNOREDOTFILES", "false", nil, "limitd never reads dot files; with `false`, a dot file in the folder is refused at start (the peer would read it)"},
	{"RUNTIME_WATCH_ROOT", "true", nil, "taken, nothing to do: limitd polls the folder either way"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", nil, "refused when set: a fixed window's key expires at the window's end, without jitter"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", nil, "only 0: limitd keeps no local cache of keys over their limit"},
	{"NEAR_LIMIT_RATIO", "0.8", []string{"rls-near-limit-ratio"}, "`--rls-near-limit-ratio`"},
	{"CACHE_KEY_PREFIX", "", []string{"rls-window-key-prefix"}, "`--rls-window-key-prefix`: the prefix of the fixed windows' Redis keys"},
	{"BACKEND_TYPE", "redis", nil, "only `redis`: `memcache` is refused"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", nil, "`true` refused: limitd counts every hit of a window"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", []string{"rls-response-headers"}, "`--rls-response-headers`"},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", []string{"rls-response-header-names"}, "the first of `--rls-response-header-names` (with `LIMIT_RESPONSE_HEADERS_ENABLED=true`)"},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", []string{"rls-response-header-names"}, "the second (idem)"},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", []string{"rls-response-header-names"}, "the third (idem)"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", nil, "`true`: `/healthcheck` fails while the configuration loaded has no domain"},
	{"REDIS_SOCKET_TYPE", "unix", []string{"redis"}, "`tcp` or `unix` (`--redis`)"},
	{"REDIS_TYPE", "SINGLE", []string{"redis", "redis-master", "redis-cluster"}, "`SINGLE`, `SENTINEL` (`REDIS_URL` is the master's name, then the Sentinels: `--redis-master`) or `CLUSTER` (`--redis-cluster`), any case"},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", []string{"redis", "redis-master"}, "`--redis`: host:port, a socket's path, or a comma list as `REDIS_TYPE` asks"},
	{"REDIS_POOL_SIZE", "10", []string{"redis-pool-size"}, "`--redis-pool-size`"},
	{"REDIS_AUTH", "", nil, "`user:password` or `password`, as the peer splits it"},
	{"REDIS_TLS", "false", nil, "`true`: TLS to Redis, with the files below"},
	{"REDIS_TLS_CLIENT_CERT", "", nil, "the client certificate shown to Redis (with `REDIS_TLS_CLIENT_KEY`)"},
	{"REDIS_TLS_CLIENT_KEY", "", nil, "its key"},
	{"REDIS_TLS_CACERT", "", nil, "the CA that verifies Redis (else the system's)"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", nil, "`true`: the chain is verified, not the name"},
	{"REDIS_PIPELINE_WINDOW", "0", []string{"batch-window"}, "`--batch-window`: how long decisions wait to share a Redis pipeline"},
	{"REDIS_PIPELINE_LIMIT", "0", nil, "taken, nothing to do: unused by the peer too (deprecated there)"},
	{"REDIS_PERSECOND", "false", nil, "`true` refused: limitd keeps every limit in one Redis"},
	{"REDIS_PERSECOND_SOCKET_TYPE", "unix", nil, "read by the peer only with `REDIS_PERSECOND=true`, which is refused"},
	{"REDIS_PERSECOND_TYPE", "SINGLE", nil, "idem"},
	{"REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", nil, "idem"},
	{"REDIS_PERSECOND_POOL_SIZE", "10", nil, "idem"},
	{"REDIS_PERSECOND_AUTH", "", nil, "idem"},
	{"REDIS_PERSECOND_TLS", "false", nil, "idem"},
	{"REDIS_SENTINEL_AUTH", "", nil, "the Sentinels' password (`REDIS_TYPE=SENTINEL`)"},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "", nil, "read by the peer only with `REDIS_PERSECOND=true`, which is refused"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0", nil, "idem"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "0", nil, "idem"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", nil, "`true`: `/healthcheck` fails while Redis does not answer (always: until Redis first answered)"},
	{"REDIS_TIMEOUT", "10s", []string{"timeout"}, "`--timeout`: the bound of a decision, Redis included"},
	{"REDIS_PERSECOND_TIMEOUT", "10s", nil, "read by the peer only with `REDIS_PERSECOND=true`, which is refused"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", nil, "only `WAIT` (a decision waits for a connection, within `REDIS_TIMEOUT`); the peer refuses the others too"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", nil, "read by the peer only with `REDIS_PERSECOND=true`, which is refused"},
	{"MEMCACHE_HOST_PORT", "", nil, "read by the peer only with `BACKEND_TYPE=memcache`, which is refused"},
	{"MEMCACHE_MAX_IDLE_CONNS", "2", nil, "idem"},
	{"MEMCACHE_SRV", "", nil, "idem"},
	{"MEMCACHE_SRV_REFRESH", "0", nil, "idem"},
	{"MEMCACHE_TLS", "false", nil, "idem"},
	{"MEMCACHE_TLS_CLIENT_CERT", "", nil, "idem"},
	{"MEMCACHE_TLS_CLIENT_KEY", "", nil, "idem"},
	{"MEMCACHE_TLS_CACERT", "", nil, "idem"},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", nil, "idem"},
	{"SHADOW_MODE", "false", nil, "`true` refused: limitd has no global shadow mode (set `shadow_mode: true` on the limits)"},
	{"QUOTA_MODE", "false", nil, "`true` refused: limitd has no global quota mode (set `quota_mode: true` on the limits)"},
	{"RESPONSE_DYNAMIC_METADATA", "false", []string{"rls-response-metadata"}, "`--rls-response-metadata`"},
	{"MERGE_DOMAIN_CONFIG", "false", nil, "`true` refused: a domain in two files is refused, as the peer's default does"},
	{"TRACING_ENABLED", "false", nil, "`true` refused: limitd exports no traces"},
	{"TRACING_SERVICE_NAME", "RateLimit", nil, "read by the peer only with `TRACING_ENABLED=true`, which is refused"},
	{"TRACING_SERVICE_NAMESPACE", "", nil, "idem"},
	{"TRACING_SERVICE_INSTANCE_ID", "", nil, "idem"},
	{"TRACING_EXPORTER_PROTOCOL", "http", nil, "idem"},
	{"TRACING_SAMPLING_RATE", "1", nil, "idem"},
}

// limitdEnv are limitd's own choices in the ratelimit mode.
var limitdEnv = []envSetting{
	{"LIMITD_ALGORITHM", "token_bucket", []string{"rls-algorithm"}, "`--rls-algorithm`: how limits that name no algorithm count, `token_bucket` or `fixed_window` (envoyproxy/ratelimit's answers, counters and Redis keys)"},
	{"LIMITD_TOKEN", "", nil, "a bearer token every gRPC call must carry (as limitd reads it); without one, and without a client CA, the gRPC listener serves everyone, as the peer does, and says so in the log"},
	{"LIMITD_TOKEN_FILE", "", []string{"token-file"}, "`--token-file`: the callers and their tokens"},
	{"LIMITD_LISTEN", "", []string{"listen"}, "`--listen`: limitd's own HTTP API (`/v1`, `/healthz`, `/readyz`, `/metrics`); off when empty"},
	{"LIMITD_METRICS_LISTEN", "", []string{"metrics-listen"}, "`--metrics-listen`: limitd's own `/metrics`"},
	{"LIMITD_KEY_PREFIX", "rl:", []string{"key-prefix"}, "`--key-prefix`: the prefix of token buckets' Redis keys"},
	{"LIMITD_GRPC_MAX_CONNS", "1024", []string{"grpc-max-conns"}, "`--grpc-max-conns`"},
	{"LIMITD_CONFIG_POLL", "2s", []string{"rls-config-poll"}, "`--rls-config-poll`: how often the YAML folder is read again"},
}

// envReader reads the variables of the tables, each one's default from
// its row, and keeps every error, in the order met.
type envReader struct {
	getenv func(string) string
	rows   map[string]envSetting
	flags  *flag.FlagSet // limitd's, to know which flags this build has
	args   []string
	byFlag map[string]string // a flag: the variables that set it
	errs   []error
}

func newEnvReader(getenv func(string) string) *envReader {
	r := &envReader{getenv: getenv, rows: map[string]envSetting{}, byFlag: map[string]string{}}
	for _, s := range append(append([]envSetting(nil), ratelimitEnv...), limitdEnv...) {
		r.rows[s.Name] = s
	}
	r.flags = newFlagSet(&options{}, io.Discard)
	return r
}

// fail keeps err.
func (r *envReader) fail(err error) { r.errs = append(r.errs, err) }

// set reports whether name is set to something but its default.
func (r *envReader) set(name string) bool {
	v := strings.TrimSpace(r.getenv(name))
	return v != "" && v != r.rows[name].Default
}

// str returns name's value, or its default when unset or empty.
func (r *envReader) str(name string) string {
	row, ok := r.rows[name]
	if !ok {
		r.fail(fmt.Errorf("%s: not in the table of variables", name))
		return ""
	}
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return row.Default
}

func (r *envReader) bool(name string) bool {
	v := r.str(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(fmt.Errorf("%s=%s: want true or false", name, v))
	}
	return b
}

func (r *envReader) int(name string) int {
	v := r.str(name)
	n, err := strconv.Atoi(v)
	if err != nil {
		r.fail(fmt.Errorf("%s=%s: want an integer", name, v))
	}
	return n
}

func (r *envReader) duration(name string) time.Duration {
	v := r.str(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		r.fail(fmt.Errorf("%s=%s: want a duration such as 10s", name, v))
	}
	return d
}

func (r *envReader) float(name string) float64 {
	v := r.str(name)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		r.fail(fmt.Errorf("%s=%s: want a number", name, v))
	}
	return f
}

// refuse fails when name is set to something but its default.
func (r *envReader) refuse(name, why string) {
	if r.set(name) {
		r.fail(fmt.Errorf("%s=%s: %s", name, r.str(name), why))
	}
}

// refuseTrue fails when the boolean name is true.
func (r *envReader) refuseTrue(name, why string) {
	if r.bool(name) {
		r.fail(fmt.Errorf("%s=true: %s", name, why))
	}
}

// flag passes value to limitd's flag f, which must be one of the rows'
// flags; vars (the variables it comes from) name it in errors. A flag this
// build lacks refuses the variables, naming it.
func (r *envReader) flag(f, value string, vars ...string) {
	for _, v := range vars {
		if !contains(r.rows[v].Flags, f) {
			r.fail(fmt.Errorf("%s: --%s is not among its flags in the table", v, f))
			return
		}
	}
	if r.flags.Lookup(f) == nil {
		r.fail(fmt.Errorf("%s: needs limitd's --%s, which this build does not have", strings.Join(vars, ", "), f))
		return
	}
	r.args = append(r.args, "--"+f+"="+value)
	r.byFlag[f] = strings.Join(vars, "/")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// pairs parses the peer's map form, "k<sep>v,k<sep>v" (envconfig's maps
// use ':'; its xDS node metadata '='), into "k=v" items.
func (r *envReader) pairs(name string, sep string) []string {
	v := r.str(name)
	if v == "" {
		return nil
	}
	var out []string
	for _, item := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(item, sep)
		if !ok || strings.TrimSpace(k) == "" {
			r.fail(fmt.Errorf("%s=%s: want key%svalue,key%svalue", name, v, sep, sep))
			return nil
		}
		out = append(out, strings.TrimSpace(k)+"="+strings.TrimSpace(val))
	}
	return out
}

// hostPort joins the HOST/PORT-style pair into an address.
func (r *envReader) hostPort(host, port string) string {
	p := r.int(port)
	if p < 0 || p > 65535 {
		r.fail(fmt.Errorf("%s=%d: want a port, 0 to 65535", port, p))
	}
	return net.JoinHostPort(r.str(host), strconv.Itoa(p))
}

// fromEnv translates envoyproxy/ratelimit's environment (and limitd's
// LIMITD_* choices) into limitd's flags and the mode's settings: the one
// place where a variable becomes a flag. The error names every variable
// refused and why, one a line.
func fromEnv(getenv func(string) string) ([]string, *ratelimitMode, error) {
	r := newEnvReader(getenv)
	m := &ratelimitMode{byFlag: r.byFlag}

	// Listeners.
	m.httpAddr = r.hostPort("HOST", "PORT")
	m.debugAddr = r.hostPort("DEBUG_HOST", "DEBUG_PORT")
	r.refuse("GRPC_UDS", "limitd serves gRPC on TCP only: use GRPC_HOST and GRPC_PORT")
	r.flag("grpc-listen", r.hostPort("GRPC_HOST", "GRPC_PORT"), "GRPC_HOST", "GRPC_PORT")
	r.flag("grpc-max-connection-age", r.duration("GRPC_MAX_CONNECTION_AGE").String(), "GRPC_MAX_CONNECTION_AGE")
	r.flag("grpc-max-connection-age-grace", r.duration("GRPC_MAX_CONNECTION_AGE_GRACE").String(), "GRPC_MAX_CONNECTION_AGE_GRACE")

	// The gRPC listener's TLS.
	ca := r.str("GRPC_CLIENT_TLS_CACERT")
	if egCA := strings.TrimSpace(getenv("GRPC_SERVER_TLS_CA_CERT")); egCA != "" {
		if ca != "" && ca != egCA {
			r.fail(fmt.Errorf("GRPC_CLIENT_TLS_CACERT=%s and GRPC_SERVER_TLS_CA_CERT=%s: two client CAs; set one", ca, egCA))
		}
		ca = egCA
	}
	if r.bool("GRPC_SERVER_USE_TLS") {
		r.flag("grpc-tls-cert", r.str("GRPC_SERVER_TLS_CERT"), "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT")
		r.flag("grpc-tls-key", r.str("GRPC_SERVER_TLS_KEY"), "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_KEY")
		if ca != "" {
			r.flag("grpc-tls-client-ca", ca, "GRPC_CLIENT_TLS_CACERT")
			m.clientCA = true
			if san := r.str("GRPC_CLIENT_TLS_SAN"); san != "" {
				r.flag("grpc-tls-client-san", san, "GRPC_CLIENT_TLS_SAN")
			}
		} else {
			r.str("GRPC_CLIENT_TLS_SAN") // the peer too checks a SAN only with a client CA
		}
	} else {
		for _, v := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_SAN"} {
			r.str(v) // the peer reads them only with GRPC_SERVER_USE_TLS=true
		}
	}

	// Logs.
	level := strings.ToLower(r.str("LOG_LEVEL"))
	switch level {
	case "trace":
		level = "debug"
	case "warning":
		level = "warn"
	case "debug", "info", "warn", "error":
	default:
		r.fail(fmt.Errorf("LOG_LEVEL=%s: want debug, info, warn or error (limitd has no quieter level than error)", r.str("LOG_LEVEL")))
	}
	r.flag("log-level", level, "LOG_LEVEL")
	format := strings.ToLower(r.str("LOG_FORMAT"))
	if format != "text" && format != "json" {
		r.fail(fmt.Errorf("LOG_FORMAT=%s: want text or json", r.str("LOG_FORMAT")))
	}
	r.flag("log-format", format, "LOG_FORMAT")

	// The configuration: files, or xDS.
	for _, v := range []string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"} {
		r.refuse(v, "limitd's xDS client retries with its own back-off and jitter")
	}
	forceStart := r.bool("FORCE_START_WITHOUT_INITIAL_CONFIG")
	dir := filepath.Join(r.str("RUNTIME_ROOT"), r.str("RUNTIME_SUBDIRECTORY"), r.str("RUNTIME_APPDIRECTORY"))
	ignoreDot := r.bool("RUNTIME_IGNOREDOTFILES")
	r.bool("RUNTIME_WATCH_ROOT")
	xdsVars := []string{"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"}
	switch ct := r.str("CONFIG_TYPE"); strings.ToUpper(ct) {
	case "FILE":
		r.flag("rls-config", dir, "CONFIG_TYPE", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
		if !ignoreDot {
			m.refuseDotFiles = dir
		}
		for _, v := range xdsVars {
			r.str(v) // the peer reads them only with CONFIG_TYPE=GRPC_XDS_SOTW
		}
		r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
		r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")
		r.str("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	case "GRPC_XDS_SOTW":
		r.flag("rls-xds-server", r.str("CONFIG_GRPC_XDS_SERVER_URL"), "CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL")
		r.flag("rls-xds-node-id", r.str("CONFIG_GRPC_XDS_NODE_ID"), "CONFIG_GRPC_XDS_NODE_ID")
		if kv := r.pairs("CONFIG_GRPC_XDS_NODE_METADATA", "="); len(kv) > 0 {
			r.flag("rls-xds-node-metadata", metadataJSON(kv), "CONFIG_GRPC_XDS_NODE_METADATA")
		}
		if kv := r.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ":"); len(kv) > 0 {
			r.flag("rls-xds-headers", strings.Join(kv, ","), "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
		}
		if r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
			for v, f := range map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "rls-xds-tls-cert",
				"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "rls-xds-tls-key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "rls-xds-tls-ca",
				"CONFIG_GRPC_XDS_SERVER_TLS_SAN": "rls-xds-tls-san"} {
				if val := r.str(v); val != "" {
					r.flag(f, val, v)
				}
			}
		}
		if forceStart {
			r.flag("rls-start-without-config", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG")
		}
		for v, f := range map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "rls-xds-backoff",
			"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "rls-xds-backoff-max"} {
			if d := r.duration(v); d > 0 {
				r.flag(f, d.String(), v)
			} else {
				r.fail(fmt.Errorf("%s=%s: want a positive duration", v, r.str(v)))
			}
		}
		if r.str("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") != "" {
			if n := r.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); n > 0 {
				r.flag("rls-xds-max-recv-bytes", strconv.Itoa(n), "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
			} else {
				r.fail(fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=%s: want a positive number of bytes", r.str("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")))
			}
		}
	default:
		r.fail(fmt.Errorf("CONFIG_TYPE=%s: want FILE or GRPC_XDS_SOTW", ct))
	}

	// Statistics.
	r.refuseTrue("USE_DOG_STATSD", "limitd sends no statsd; its metrics are Prometheus: set USE_PROMETHEUS=true")
	r.str("USE_DOG_STATSD_MOGRIFIERS")
	if r.bool("USE_STATSD") {
		r.fail(errors.New("USE_STATSD=true (the default): limitd sends no statsd; set USE_STATSD=false, and USE_PROMETHEUS=true for its Prometheus series"))
	}
	r.str("STATSD_HOST")
	r.int("STATSD_PORT")
	r.refuse("EXTRA_TAGS", "limitd adds no tags to its series")
	r.duration("STATS_FLUSH_INTERVAL")
	disabled := r.bool("DISABLE_STATS")
	if r.bool("USE_PROMETHEUS") && !disabled {
		r.flag("prometheus-listen", r.str("PROMETHEUS_ADDR"), "USE_PROMETHEUS", "PROMETHEUS_ADDR")
		r.flag("prometheus-path", r.str("PROMETHEUS_PATH"), "PROMETHEUS_PATH")
		if f := r.str("PROMETHEUS_MAPPER_YAML"); f != "" {
			if _, err := os.Stat(f); err != nil {
				r.fail(fmt.Errorf("PROMETHEUS_MAPPER_YAML=%s: %w", f, err))
			}
			m.mapper = f
		}
	} else {
		r.str("PROMETHEUS_ADDR")
		r.str("PROMETHEUS_PATH")
		r.str("PROMETHEUS_MAPPER_YAML")
	}

	// The counting.
	r.refuse("EXPIRATION_JITTER_MAX_SECONDS", "limitd expires a fixed window's key at the window's end, without jitter")
	r.refuse("LOCAL_CACHE_SIZE_IN_BYTES", "limitd keeps no local cache of keys over their limit")
	if ratio := r.float("NEAR_LIMIT_RATIO"); ratio <= 0 || ratio > 1 {
		r.fail(fmt.Errorf("NEAR_LIMIT_RATIO=%s: want a ratio in (0, 1]", r.str("NEAR_LIMIT_RATIO")))
	} else if r.set("NEAR_LIMIT_RATIO") || r.flags.Lookup("rls-near-limit-ratio") != nil {
		r.flag("rls-near-limit-ratio", r.str("NEAR_LIMIT_RATIO"), "NEAR_LIMIT_RATIO")
	}
	r.flag("rls-window-key-prefix", r.str("CACHE_KEY_PREFIX"), "CACHE_KEY_PREFIX")
	if b := r.str("BACKEND_TYPE"); strings.ToLower(b) != "redis" {
		r.fail(fmt.Errorf("BACKEND_TYPE=%s: limitd keeps its counters in Redis only", b))
	}
	r.refuseTrue("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "limitd counts every hit of a window")
	headerVars := []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"}
	if r.bool("LIMIT_RESPONSE_HEADERS_ENABLED") {
		r.flag("rls-response-headers", "true", "LIMIT_RESPONSE_HEADERS_ENABLED")
		names := make([]string, len(headerVars))
		for i, v := range headerVars {
			names[i] = r.str(v)
		}
		r.flag("rls-response-header-names", strings.Join(names, ","), headerVars...)
	} else {
		for _, v := range headerVars {
			r.str(v)
		}
	}
	m.healthNeedsConfig = r.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	r.refuseTrue("SHADOW_MODE", "limitd has no global shadow mode: set shadow_mode: true on the limits")
	r.refuseTrue("QUOTA_MODE", "limitd has no global quota mode: set quota_mode: true on the limits")
	if r.bool("RESPONSE_DYNAMIC_METADATA") {
		r.flag("rls-response-metadata", "true", "RESPONSE_DYNAMIC_METADATA")
	}
	r.refuseTrue("MERGE_DOMAIN_CONFIG", "limitd refuses a domain given in two files")
	r.refuseTrue("TRACING_ENABLED", "limitd exports no traces")
	for _, v := range []string{"TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
		"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE"} {
		r.str(v)
	}

	// Redis.
	redisFromEnv(r, m)
	for _, v := range []string{"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH",
		"MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT",
		"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"} {
		r.str(v) // the peer reads them only with BACKEND_TYPE=memcache
	}

	// limitd's own.
	algo := r.str("LIMITD_ALGORITHM")
	r.flag("rls-algorithm", algo, "LIMITD_ALGORITHM")
	r.str("LIMITD_TOKEN") // loadTokens reads it, as limitd does
	if f := r.str("LIMITD_TOKEN_FILE"); f != "" {
		r.flag("token-file", f, "LIMITD_TOKEN_FILE")
	}
	r.flag("listen", r.str("LIMITD_LISTEN"), "LIMITD_LISTEN")
	if a := r.str("LIMITD_METRICS_LISTEN"); a != "" {
		r.flag("metrics-listen", a, "LIMITD_METRICS_LISTEN")
	}
	r.flag("key-prefix", r.str("LIMITD_KEY_PREFIX"), "LIMITD_KEY_PREFIX")
	r.flag("grpc-max-conns", strconv.Itoa(r.int("LIMITD_GRPC_MAX_CONNS")), "LIMITD_GRPC_MAX_CONNS")
	r.flag("rls-config-poll", r.duration("LIMITD_CONFIG_POLL").String(), "LIMITD_CONFIG_POLL")

	if len(r.errs) > 0 {
		return nil, nil, errors.Join(r.errs...)
	}
	return r.args, m, nil
}

// redisFromEnv reads the REDIS_* variables as the peer's Redis client
// does.
func redisFromEnv(r *envReader, m *ratelimitMode) {
	for _, v := range []string{"REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
		"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH",
		"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_TIMEOUT",
		"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR"} {
		r.str(v) // the peer reads them only with REDIS_PERSECOND=true
	}
	r.refuseTrue("REDIS_PERSECOND", "limitd keeps every limit in one Redis (REDIS_URL)")
	sock := strings.ToLower(r.str("REDIS_SOCKET_TYPE"))
	url := r.str("REDIS_URL")
	typ := strings.ToUpper(r.str("REDIS_TYPE"))
	var addrs []string
	for _, a := range strings.Split(url, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	switch {
	case sock != "tcp" && sock != "unix":
		r.fail(fmt.Errorf("REDIS_SOCKET_TYPE=%s: want tcp or unix", r.str("REDIS_SOCKET_TYPE")))
	case len(addrs) == 0:
		r.fail(errors.New("REDIS_URL: empty"))
	case typ == "SINGLE" && sock == "unix":
		r.flag("redis", "unix://"+url, "REDIS_URL", "REDIS_SOCKET_TYPE")
	case typ == "SINGLE":
		if len(addrs) != 1 {
			r.fail(fmt.Errorf("REDIS_URL=%s: REDIS_TYPE=SINGLE takes one host:port", url))
		}
		r.flag("redis", url, "REDIS_URL")
	case sock == "unix":
		r.fail(fmt.Errorf("REDIS_SOCKET_TYPE=unix: limitd reaches a Redis %s over tcp only", strings.ToLower(typ)))
	case typ == "CLUSTER":
		r.flag("redis", strings.Join(addrs, ","), "REDIS_URL", "REDIS_TYPE")
		r.flag("redis-cluster", "true", "REDIS_TYPE")
	case typ == "SENTINEL":
		if len(addrs) < 2 {
			r.fail(fmt.Errorf("REDIS_URL=%s: REDIS_TYPE=SENTINEL wants the master's name, then the Sentinels: name,host:port,...", url))
			break
		}
		r.flag("redis-master", addrs[0], "REDIS_URL", "REDIS_TYPE")
		r.flag("redis", strings.Join(addrs[1:], ","), "REDIS_URL")
	default:
		r.fail(fmt.Errorf("REDIS_TYPE=%s: want SINGLE, SENTINEL or CLUSTER", r.str("REDIS_TYPE")))
	}
	if n := r.int("REDIS_POOL_SIZE"); n < 1 {
		r.fail(fmt.Errorf("REDIS_POOL_SIZE=%d: want at least 1", n))
	} else {
		r.flag("redis-pool-size", strconv.Itoa(n), "REDIS_POOL_SIZE")
	}
	if auth := r.str("REDIS_AUTH"); auth != "" {
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			m.redisUser, m.redisPass = user, pass
		} else {
			m.redisPass = auth
		}
	}
	m.sentinelPass = r.str("REDIS_SENTINEL_AUTH")
	cert, key, ca := r.str("REDIS_TLS_CLIENT_CERT"), r.str("REDIS_TLS_CLIENT_KEY"), r.str("REDIS_TLS_CACERT")
	skip := r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if r.bool("REDIS_TLS") {
		c, err := redisTLS(cert, key, ca, skip)
		if err != nil {
			r.fail(err)
		}
		m.redisTLS = c
	}
	if w := r.duration("REDIS_PIPELINE_WINDOW"); w < 0 {
		r.fail(fmt.Errorf("REDIS_PIPELINE_WINDOW=%v: want >= 0", w))
	} else {
		r.flag("batch-window", w.String(), "REDIS_PIPELINE_WINDOW")
	}
	r.int("REDIS_PIPELINE_LIMIT")
	m.redisActive = r.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
	if t := r.duration("REDIS_TIMEOUT"); t <= 0 {
		r.fail(fmt.Errorf("REDIS_TIMEOUT=%v: want > 0", t))
	} else {
		r.flag("timeout", t.String(), "REDIS_TIMEOUT")
	}
	if b := strings.ToUpper(r.str("REDIS_POOL_ON_EMPTY_BEHAVIOR")); b != "WAIT" {
		r.fail(fmt.Errorf("REDIS_POOL_ON_EMPTY_BEHAVIOR=%s: only WAIT (envoyproxy/ratelimit refuses the others too)", r.str("REDIS_POOL_ON_EMPTY_BEHAVIOR")))
	}
}

// redisTLS is the TLS configuration REDIS_TLS asks for: the client's
// certificate and key when given, the CA when given (else the system's),
// the name checked unless skip (the chain still is).
func redisTLS(cert, key, ca string, skip bool) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS_CLIENT_CERT=%s, REDIS_TLS_CLIENT_KEY=%s: %w", cert, key, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS_CACERT=%s: %w", ca, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("REDIS_TLS_CACERT=%s: no PEM certificate", ca)
		}
		c.RootCAs = pool
	}
	if skip {
		roots := c.RootCAs
		c.InsecureSkipVerify = true // the chain is verified below, only the name is not
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("redis: no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

// metadataJSON is "k=v" items as a JSON object of strings.
func metadataJSON(kv []string) string {
	m := map[string]string{}
	for _, item := range kv {
		k, v, _ := strings.Cut(item, "=")
		m[k] = v
	}
	b, _ := json.Marshal(m) // a map of strings always encodes
	return string(b)
}
