package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// istioEnv is Istio's sample's environment (samples/ratelimit/
// rate-limit-service.yaml), Redis moved to addr.
func istioEnv(redisAddr string, kv ...string) func(string) string {
	base := []string{"LOG_LEVEL", "debug", "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", redisAddr, "USE_STATSD", "false",
		"RUNTIME_ROOT", "/data", "RUNTIME_SUBDIRECTORY", "ratelimit", "RUNTIME_IGNOREDOTFILES", "true", "RUNTIME_WATCH_ROOT", "false"}
	return envOver(base, kv...)
}

// envOver is base with kv's pairs set over it.
func envOver(base []string, kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(base); i += 2 {
		m[base[i]] = base[i+1]
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestFromEnvIstio: Istio's sample's environment becomes limitd's flags
// with the peer's defaults for what it does not set.
func TestFromEnvIstio(t *testing.T) {
	args, m, err := fromEnv(istioEnv("redis:6379"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--grpc-listen=0.0.0.0:8081", "--rls-config=/data/ratelimit/config", "--redis=redis:6379",
		"--log-level=debug", "--log-format=text", "--redis-pool-size=10", "--timeout=10s", "--rls-algorithm=token_bucket",
		"--listen=", "--grpc-max-connection-age=24h0m0s", "--grpc-max-connection-age-grace=1h0m0s", "--rls-window-key-prefix="} {
		if !slices.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if m.httpAddr != "0.0.0.0:8080" || m.debugAddr != "0.0.0.0:6070" || m.refuseDotFiles != "" {
		t.Errorf("mode %+v", m)
	}
	if m.byFlag["grpc-listen"] != "GRPC_HOST/GRPC_PORT" {
		t.Errorf("--grpc-listen named %q", m.byFlag["grpc-listen"])
	}
	o := &options{}
	if err := newFlagSet(o, io.Discard).Parse(args); err != nil {
		t.Fatalf("limitd refuses the flags: %v", err)
	}
}

// TestFromEnvRedis: REDIS_TYPE, REDIS_URL, REDIS_SOCKET_TYPE and REDIS_AUTH
// as the peer's Redis client reads them.
func TestFromEnvRedis(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		want []string
		user string
		pass string
	}{
		{[]string{"REDIS_TYPE", "cluster", "REDIS_URL", "a:1,b:2"}, []string{"--redis=a:1,b:2", "--redis-cluster=true"}, "", ""},
		{[]string{"REDIS_TYPE", "SENTINEL", "REDIS_URL", "mymaster,s1:26379,s2:26379", "REDIS_AUTH", "u:p:q"},
			[]string{"--redis-master=mymaster", "--redis=s1:26379,s2:26379"}, "u", "p:q"},
		{[]string{"REDIS_SOCKET_TYPE", "unix", "REDIS_URL", "/run/redis.sock", "REDIS_AUTH", "secret"}, []string{"--redis=unix:///run/redis.sock"}, "", "secret"},
		{[]string{"REDIS_PIPELINE_WINDOW", "150us", "REDIS_POOL_SIZE", "3"}, []string{"--batch-window=150µs", "--redis-pool-size=3"}, "", ""},
	} {
		args, m, err := fromEnv(istioEnv("r:6379", tc.kv...))
		if err != nil {
			t.Errorf("%q: %v", tc.kv, err)
			continue
		}
		for _, w := range tc.want {
			if !slices.Contains(args, w) {
				t.Errorf("%q: args %q lack %s", tc.kv, args, w)
			}
		}
		if m.redisUser != tc.user || m.redisPass != tc.pass {
			t.Errorf("%q: auth %q %q, want %q %q", tc.kv, m.redisUser, m.redisPass, tc.user, tc.pass)
		}
	}
}

// TestFromEnvRefuses: every value limitd does not support is refused at
// start, naming the variable.
func TestFromEnvRefuses(t *testing.T) {
	for _, kv := range [][]string{
		{"PORT", "http"}, {"PORT", "70000"}, {"GRPC_PORT", "-1"}, {"DEBUG_PORT", "x"}, {"GRPC_UDS", "/tmp/rl.sock"},
		{"GRPC_MAX_CONNECTION_AGE", "forever"},
		{"LOG_LEVEL", "fatal"}, {"LOG_LEVEL", "loud"}, {"LOG_FORMAT", "xml"},
		{"CONFIG_TYPE", "GRPC_XDS_DELTA"},
		{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1s"}, {"XDS_CLIENT_BACKOFF_JITTER", "false"},
		{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "big", "CONFIG_TYPE", "GRPC_XDS_SOTW"}, {"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "0s", "CONFIG_TYPE", "GRPC_XDS_SOTW"},
		{"USE_DOG_STATSD", "true"}, {"USE_STATSD", "true"}, {"USE_STATSD", "yes"}, {"EXTRA_TAGS", "a:b"},
		{"STATS_FLUSH_INTERVAL", "often"}, {"DISABLE_STATS", "maybe"},
		{"EXPIRATION_JITTER_MAX_SECONDS", "60"}, {"LOCAL_CACHE_SIZE_IN_BYTES", "1048576"},
		{"NEAR_LIMIT_RATIO", "1.5"}, {"NEAR_LIMIT_RATIO", "most"},
		{"BACKEND_TYPE", "memcache"}, {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"},
		{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "sometimes"},
		{"REDIS_SOCKET_TYPE", "udp"}, {"REDIS_TYPE", "RING"}, {"REDIS_POOL_SIZE", "0"},
		{"REDIS_TIMEOUT", "0s"}, {"REDIS_PIPELINE_WINDOW", "-1s"}, {"REDIS_POOL_ON_EMPTY_BEHAVIOR", "CREATE"},
		{"REDIS_PERSECOND", "true"}, {"REDIS_TLS", "true", "REDIS_TLS_CACERT", "/nonexistent/ca.pem"},
		{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "nope"},
		{"SHADOW_MODE", "true"}, {"QUOTA_MODE", "true"}, {"MERGE_DOMAIN_CONFIG", "true"}, {"TRACING_ENABLED", "true"},
		{"GRPC_CLIENT_TLS_CACERT", "/a.pem", "GRPC_SERVER_TLS_CA_CERT", "/b.pem"},
	} {
		_, _, err := fromEnv(istioEnv("r:6379", kv...))
		if err == nil || !strings.HasPrefix(err.Error(), kv[0]) {
			t.Errorf("%s=%s: %v, want an error naming %s", kv[0], kv[1], err, kv[0])
		}
	}
	// REDIS_TYPE=SENTINEL without the master's name, and a unix socket to a
	// cluster, name the variable the peer would fail on.
	for _, tc := range []struct{ kv []string }{
		{[]string{"REDIS_TYPE", "SENTINEL", "REDIS_URL", "s1:26379"}},
		{[]string{"REDIS_TYPE", "CLUSTER", "REDIS_SOCKET_TYPE", "unix"}},
	} {
		if _, _, err := fromEnv(istioEnv("r:6379", tc.kv...)); err == nil || !strings.Contains(err.Error(), "REDIS_") {
			t.Errorf("%q: %v", tc.kv, err)
		}
	}
	// The peer's defaults as they stand: USE_STATSD=true is refused.
	if _, _, err := fromEnv(env()); err == nil || !strings.HasPrefix(err.Error(), "USE_STATSD") {
		t.Errorf("no environment: %v, want USE_STATSD refused", err)
	}
}

// TestFromEnvMappedFlags: the variables the other flags of limitd serve
// (xDS, TLS, the Prometheus series, headers, metadata) reach them in the
// form limitd's flags take, and limitd takes the arguments.
func TestFromEnvMappedFlags(t *testing.T) {
	xds := func(kv ...string) []string { return append([]string{"CONFIG_TYPE", "GRPC_XDS_SOTW"}, kv...) }
	for _, tc := range []struct {
		kv   []string
		want string // an argument
	}{
		{xds(), "--rls-xds-server=localhost:18000"},
		{xds(), "--rls-xds-backoff=10s"},
		{xds(), "--rls-xds-backoff-max=1m0s"},
		{xds("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1000"), "--rls-xds-max-recv-bytes=1000"},
		{xds("CONFIG_GRPC_XDS_NODE_METADATA", "a=b"), `--rls-xds-node-metadata={"a":"b"}`},
		{xds("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"), "--rls-start-without-config=true"},
		{[]string{"USE_PROMETHEUS", "true"}, "--prometheus-listen=:9090"},
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c", "GRPC_SERVER_TLS_KEY", "k"}, "--grpc-tls-cert=c"},
		{[]string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true"}, "--rls-response-headers=true"},
		{[]string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_RESET_HEADER", "X-Reset"},
			"--rls-response-header-names=RateLimit-Limit,RateLimit-Remaining,X-Reset"},
		{[]string{"RESPONSE_DYNAMIC_METADATA", "true"}, "--rls-response-metadata=true"},
		{[]string{"NEAR_LIMIT_RATIO", "0.5"}, "--rls-near-limit-ratio=0.5"},
	} {
		args, _, err := fromEnv(istioEnv("r:6379", tc.kv...))
		if err != nil {
			t.Errorf("%q: %v", tc.kv, err)
			continue
		}
		if !slices.Contains(args, tc.want) {
			t.Errorf("%q: args %q lack %s", tc.kv, args, tc.want)
		}
		// limitd takes them.
		if _, err := parseFlags(args, io.Discard); err != nil {
			t.Errorf("%q: limitd refuses %q: %v", tc.kv, args, err)
		}
	}
}

// TestFromEnvReadsTheTable: fromEnv reads every variable of the tables,
// and none of envoyproxy/ratelimit's that is not in them (a variable read
// outside the table fails the read).
func TestFromEnvReadsTheTable(t *testing.T) {
	read := map[string]bool{}
	for _, kv := range [][]string{nil, {"CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"},
		{"GRPC_SERVER_USE_TLS", "true", "GRPC_CLIENT_TLS_CACERT", "/ca"}, {"USE_PROMETHEUS", "true"},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "true"}, {"LIMITD_TOKEN_FILE", "/t", "LIMITD_METRICS_LISTEN", "127.0.0.1:0"}} {
		get := istioEnv("r:6379", kv...)
		_, _, err := fromEnv(func(k string) string { read[k] = true; return get(k) })
		if err != nil && strings.Contains(err.Error(), "not in the table") {
			t.Error(err)
		}
	}
	for _, s := range append(append([]envSetting(nil), ratelimitEnv...), limitdEnv...) {
		if !read[s.Name] {
			t.Errorf("%s: in the table, never read", s.Name)
		}
		delete(read, s.Name)
	}
	delete(read, "GRPC_SERVER_TLS_CA_CERT") // Envoy Gateway's name of GRPC_CLIENT_TLS_CACERT
	for k := range read {
		t.Errorf("%s: read, not in the table", k)
	}
}

// TestTableFlags: every flag the table names is limitd's.
func TestTableFlags(t *testing.T) {
	fs := newFlagSet(&options{}, io.Discard)
	for _, s := range append(append([]envSetting(nil), ratelimitEnv...), limitdEnv...) {
		for _, f := range s.Flags {
			if fs.Lookup(f) == nil {
				t.Errorf("%s: --%s is not limitd's", s.Name, f)
			}
		}
	}
}

// TestPeerSettings reads envoyproxy/ratelimit's settings.go, at the version
// e2e/ratelimit's go.mod requires, from the Go module proxy (or its
// cache): every variable it
// reads is in the table, with its default, and the table has no other.
func TestPeerSettings(t *testing.T) {
	mod, err := os.ReadFile("../../e2e/ratelimit/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`github.com/envoyproxy/ratelimit (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("e2e/ratelimit/go.mod requires no github.com/envoyproxy/ratelimit")
	}
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/envoyproxy/ratelimit@"+string(m[1])).Output()
	if err != nil {
		t.Fatalf("go mod download github.com/envoyproxy/ratelimit@%s: %v", m[1], err)
	}
	var mod2 struct{ Dir string }
	if err := json.Unmarshal(out, &mod2); err != nil || mod2.Dir == "" {
		t.Fatalf("go mod download: %q: %v", out, err)
	}
	file := filepath.Join(mod2.Dir, "src/settings/settings.go")
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]string{}
	for _, s := range ratelimitEnv {
		ours[s.Name] = s.Default
	}
	tag := regexp.MustCompile(`envconfig:"([A-Z0-9_]+)"(?:\s+default:"([^"]*)")?`)
	seen := 0
	for _, f := range tag.FindAllSubmatch(src, -1) {
		name, def := string(f[1]), string(f[2])
		seen++
		got, ok := ours[name]
		switch {
		case !ok:
			t.Errorf("%s (default %q): read by envoyproxy/ratelimit, missing from ratelimitEnv", name, def)
		case got != def:
			t.Errorf("%s: default %q in ratelimitEnv, %q in envoyproxy/ratelimit", name, got, def)
		}
		delete(ours, name)
	}
	for name := range ours {
		t.Errorf("%s: in ratelimitEnv, not read by envoyproxy/ratelimit", name)
	}
	if seen < 100 {
		t.Errorf("read %d variables in %s: the pattern no longer fits the file", seen, file)
	}
}

// TestDocsEnvTable: docs/from-envoy-ratelimit.md's table of variables is
// the code's (LIMITD_UPDATE_DOCS=1 rewrites it).
func TestDocsEnvTable(t *testing.T) {
	const path = "../../docs/from-envoy-ratelimit.md"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- env: generated from cmd/limitd/ratelimitenv.go", "<!-- end of env -->"
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("%s: no table between %q and %q", path, begin, end)
	}
	i += bytes.IndexByte(doc[i:], '\n') + 1
	want := envTableMarkdown()
	if string(doc[i:j]) == want {
		return
	}
	if os.Getenv("LIMITD_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, slices.Concat(doc[:i], []byte(want), doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the table of variables differs from the code's; LIMITD_UPDATE_DOCS=1 go test -run TestDocsEnvTable ./cmd/limitd/ rewrites it", path)
}

// envTableMarkdown is the tables as Markdown.
func envTableMarkdown() string {
	var b strings.Builder
	row := func(s envSetting) {
		def := "(none)"
		if s.Default != "" {
			def = "`" + s.Default + "`"
		}
		b.WriteString("| `" + s.Name + "` | " + def + " | " + s.Does + " |\n")
	}
	b.WriteString("| variable | envoyproxy/ratelimit's default | what limitd does |\n|---|---|---|\n")
	for _, s := range ratelimitEnv {
		row(s)
	}
	b.WriteString("\nlimitd's own choices:\n\n| variable | default | what limitd does |\n|---|---|---|\n")
	for _, s := range limitdEnv {
		row(s)
	}
	return b.String()
}

// TestLimitdEnvDefaults: a LIMITD_* variable's default is its flag's, but
// LIMITD_LISTEN's (limitd's HTTP API is off in the ratelimit mode). The
// Istio token-bucket differential found LIMITD_KEY_PREFIX's "tb:" against
// --key-prefix's "rl:".
func TestLimitdEnvDefaults(t *testing.T) {
	fs := newFlagSet(&options{}, io.Discard)
	for _, s := range limitdEnv {
		if len(s.Flags) != 1 || s.Name == "LIMITD_LISTEN" {
			continue
		}
		f := fs.Lookup(s.Flags[0])
		if f == nil {
			t.Errorf("%s: no --%s", s.Name, s.Flags[0])
			continue
		}
		if f.DefValue != s.Default {
			t.Errorf("%s: default %q, --%s's %q", s.Name, s.Default, f.Name, f.DefValue)
		}
	}
}
