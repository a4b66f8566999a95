package e2e

import (
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
)

// TestDocumentedLogLines provokes what docs/troubleshooting.md quotes and
// checks that Envoy logs each line as quoted, on both builds: the start line
// (which build, which version) and, in "The limit service cannot be
// reached", one line per cause: a connection refused, a service that never
// answers within timeout_ms, limitd answering while its Redis is down, and a
// service.cluster that names no Envoy cluster. One Envoy per build: the
// limit_service cluster's port is first closed, then silent, then limitd's;
// the last cause comes through LDS.
func TestDocumentedLogLines(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testDocumentedLogLines)
}

// docLogLineRE is a log line as docs/troubleshooting.md quotes it: level,
// component, "... " and the end of the line.
var docLogLineRE = regexp.MustCompile(`^\[([a-z]+)\]\[(wasm|dynamic_modules)\] \.\.\. (.+)$`)

// docLogLines are the ends of the lines of docs/troubleshooting.md at level,
// in order.
func docLogLines(t *testing.T, level string) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(doc), "\n") {
		if m := docLogLineRE.FindStringSubmatch(l); m != nil && m[1] == level {
			out = append(out, m[3])
		}
	}
	return out
}

// docLogLine is the one line of docLogLines(level) that contains key.
func docLogLine(t *testing.T, level, key string) string {
	t.Helper()
	var found []string
	for _, l := range docLogLines(t, level) {
		if strings.Contains(l, key) {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/troubleshooting.md: %d [%s] lines contain %q, want 1: %q", len(found), level, key, found)
	}
	return found[0]
}

// docRedisAddr is the Redis address of the store-down line the docs quote.
const docRedisAddr = "127.0.0.1:6379"

var gomaxprocsRE = regexp.MustCompile(`GOMAXPROCS [0-9]+`)

func testDocumentedLogLines(t *testing.T, build envoytest.Build) {
	component := "[wasm]"
	if build == envoytest.Native {
		component = "[dynamic_modules]"
	}
	doc, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`"+component+"`") {
		t.Errorf("docs/troubleshooting.md does not name the component %s", component)
	}
	version := os.Getenv("BUILD_VERSION") // as the Makefile stamped the builds
	if version == "" {
		version = "dev"
	}

	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	port := envoytest.FreePort(t) // nothing listens yet: connections are refused
	service := func(cluster string) string {
		return `{"service": {"cluster": "` + cluster + `", "timeout_ms": 2000, "failure_mode": "allow"},
		 "rules": [{"name": "fleet", "scope": "cluster", "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1, "burst": 4}}]}`
	}
	e := envoytest.Start(t, envoytest.Options{Build: build, LDS: true, PluginConfig: service("limit_service"),
		UpstreamPort: up.Port(), ServicePort: port, Concurrency: 1})
	c := e.Client()
	t.Cleanup(c.Close)

	// The start line.
	startKey := "(wasm build, version "
	if build == envoytest.Native {
		startKey = "(native build, version "
	}
	want := strings.Replace(docLogLine(t, "info", startKey), "version dev)", "version "+version+")", 1)
	line := e.WaitLog(startKey, 30*time.Second)
	if !strings.Contains(line, component) || !strings.HasSuffix(gomaxprocsRE.ReplaceAllString(line, "GOMAXPROCS n"), gomaxprocsRE.ReplaceAllString(want, "GOMAXPROCS n")) {
		t.Errorf("Envoy logs\n%s\nthe docs quote the end\n%s %s ... %s", line, "[info]", component, want)
	}

	// expect sends requests (each fails open) until Envoy logs the line the
	// docs quote for key (the plugin logs one a second at most), and checks
	// its level and component.
	expect := func(key string, replace ...string) {
		t.Helper()
		want := strings.NewReplacer(replace...).Replace(docLogLine(t, "warning", key))
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if r := c.Get("/", nil); r.Status != 200 {
				t.Fatalf("%s: %v, want 200 (failure_mode allow)", key, r)
			}
			if line := e.Process.LogLine(want); line != "" {
				if !strings.Contains(line, "[warning]"+component) {
					t.Errorf("%s: logged as %q, want [warning]%s", key, line, component)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Envoy did not log the line the docs quote,\n%s\nits last lines:\n%s", want, logtext.Grep(e.Log(), "limit service"))
			}
		}
	}

	t.Run("connection refused", func(t *testing.T) { expect("status 503: upstream connect error") })

	t.Run("timeout", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var conns []net.Conn
		go func() { // accepts, reads nothing, answers nothing
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, conn)
				mu.Unlock()
			}
		}()
		defer func() {
			ln.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, conn := range conns {
				conn.Close()
			}
		}()
		expect("status 504")
	})

	t.Run("limitd without Redis", func(t *testing.T) {
		redisAddr := "127.0.0.1:" + strconv.Itoa(envoytest.FreePort(t)) // nothing listens
		startLimitdOn(t, port, redisAddr)
		expect(`status 503: {"error"`, docRedisAddr, redisAddr)
	})

	t.Run("no such cluster", func(t *testing.T) {
		e.WriteLDS("2", service("nope"))
		expect(`no cluster "nope"`)
	})
}
