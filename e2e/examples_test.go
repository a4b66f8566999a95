package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// The examples under examples/<name>/ are runnable as they are: from the
// repository root, `envoy -c examples/<name>/envoy.yaml` serves on
// localhost:10000 (admin on localhost:9901, the upstream on localhost:10001)
// with the plugin at build/plugin.wasm and the configuration of config.json
// embedded. TestExamples boots each on real Envoy, with those ports replaced
// by free ones and the plugin path by PLUGIN_WASM, and replays its README.
//
// # README sessions
//
// Every fenced block of README.md whose info string is "console" is a
// session (an example without one is not run here); the blocks of one README run in order against one Envoy. In a
// block, a line starting with "$ " is a command (a line ending in a
// backslash continues on the next); the other lines up to the next command
// are what it prints. The commands:
//
//	NAME=value                     sets a shell variable ($NAME, ${NAME})
//	curl [options] URL             a request to localhost:10000 or, for the
//	                               admin interface, localhost:9901
//	for i in LIST; do curl ...; done
//	                               LIST is words or $(seq N) or $(seq A B)
//
// curl takes -s, -S, -i (combinable: -si), -o /dev/null, -w FORMAT (with
// %{http_code} and \n), -H 'name: value' and -X METHOD. Words are quoted as
// in a POSIX shell ('...', "..." with $NAME expanded).
//
// What a command prints is checked exactly, except after -i: there the first
// line is the status line ("HTTP/1.1 429 Too Many Requests"), the following
// lines up to an empty one are headers that the response must carry with
// exactly that value (curl prints more, which the README may leave out), and
// the lines after the empty line, if any, are the whole body.

// wantExamples are the scenarios that must exist. Any other
// examples/<name>/ whose README.md has a ```console block is checked too;
// examples that need more than Envoy (a limit service, Istio) show their
// commands in other blocks and are tested elsewhere.
var wantExamples = []string{"concurrency", "cost-by-header", "llm-token-budget", "per-key-api", "shadow-rollout", "smooth-bursts", "stacked", "tiers-by-plan"}

// exampleChecks are claims of a README that its session cannot show (an
// absent header, a log line), checked after the session.
var exampleChecks = map[string]func(t *testing.T, e *envoytest.Envoy, runs []sessionRun){
	// README.md's quick start: what its prose says the 429s carry besides
	// the headers the session shows.
	"quickstart": func(t *testing.T, _ *envoytest.Envoy, runs []sessionRun) {
		rejected := 0
		for _, r := range runs {
			if r.res.Status != http.StatusTooManyRequests {
				continue
			}
			rejected++
			for _, h := range []string{"RateLimit-Reset", "Retry-After"} {
				if r.res.Header.Get(h) == "" {
					t.Errorf("README line %d: the 429 has no %s", r.cmd.line, h)
				}
			}
			if v := r.res.Header.Get("RateLimit"); !regexp.MustCompile(`^"per-key";r=0;t=[0-9]+$`).MatchString(v) {
				t.Errorf("README line %d: the 429's RateLimit is %q, want \"per-key\";r=0;t=<seconds>", r.cmd.line, v)
			}
			var body map[string]any
			if err := json.Unmarshal(r.res.Body, &body); err != nil || r.res.Header.Get("Content-Type") != "application/json" {
				t.Errorf("README line %d: the 429's body is not JSON (%s, %v): %q", r.cmd.line, r.res.Header.Get("Content-Type"), err, r.res.Body)
			}
		}
		if rejected == 0 {
			t.Error("the quick start's session got no 429")
		}
	},
	"per-key-api": func(t *testing.T, _ *envoytest.Envoy, runs []sessionRun) {
		for _, r := range runs {
			if strings.HasPrefix(r.req.URL.Path, "/healthz") {
				assertNoRateLimitHeaders(t, r)
			}
		}
	},
	"cost-by-header": func(t *testing.T, _ *envoytest.Envoy, runs []sessionRun) {
		for _, r := range runs {
			if r.res.Header.Get("X-RateLimit-Reason") == "cost_exceeds_burst" && r.res.Header.Get("Retry-After") != "" {
				t.Errorf("README line %d: a cost above the burst got Retry-After %q", r.cmd.line, r.res.Header.Get("Retry-After"))
			}
			if r.req.Method == http.MethodGet {
				assertNoRateLimitHeaders(t, r)
			}
		}
	},
	// The refused request: what its prose says, which the one-line session
	// does not print.
	"smooth-bursts": func(t *testing.T, _ *envoytest.Envoy, runs []sessionRun) {
		for _, r := range runs {
			if r.res.Status != http.StatusTooManyRequests {
				continue
			}
			if got := r.res.Header.Get("X-Ratelimit-Reason"); got != "token_bucket_exceeded" || r.res.Header.Get("Retry-After") == "" {
				t.Errorf("README line %d: the 429 has x-ratelimit-reason %q and Retry-After %q, want token_bucket_exceeded and one",
					r.cmd.line, got, r.res.Header.Get("Retry-After"))
			}
		}
	},
	"shadow-rollout": func(t *testing.T, e *envoytest.Envoy, runs []sessionRun) {
		for _, r := range runs {
			for name, vs := range r.res.Header {
				for _, v := range vs {
					if strings.Contains(v, "strict") {
						t.Errorf("README line %d: the shadow rule shows in %s: %s", r.cmd.line, name, v)
					}
				}
			}
		}
		// The log line the README quotes, whole: what follows "... " is
		// the end of the line Envoy writes.
		readme, err := os.ReadFile(filepath.Join("..", "examples", "shadow-rollout", "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		_, quoted, ok := strings.Cut(string(readme), "\n[info][wasm] ... ")
		quoted, _, _ = strings.Cut(quoted, "\n")
		if !ok || !strings.Contains(quoted, `shadow rule "strict"`) {
			t.Fatal(`examples/shadow-rollout/README.md quotes no "[info][wasm] ... " line of the shadow rule`)
		}
		if line := strings.TrimSpace(e.WaitLog(quoted, 10*time.Second)); !strings.HasSuffix(line, quoted) {
			t.Errorf("Envoy logs %q; the README quotes %q as its end", line, quoted)
		}
	},
}

// rateLimitHeaders are the headers the plugin may add.
var rateLimitHeaders = []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining",
	"RateLimit-Reset", "Retry-After", "X-RateLimit-Reason"}

func assertNoRateLimitHeaders(t *testing.T, r sessionRun) {
	t.Helper()
	for _, h := range rateLimitHeaders {
		if v := r.res.Header.Values(h); len(v) > 0 {
			t.Errorf("README line %d: %s %s has %s: %q, want none", r.cmd.line, r.req.Method, r.req.URL.Path, h, v)
		}
	}
}

// example is one examples/<name>/ folder, loaded and checked for
// consistency.
type example struct {
	name, dir string
	// bootstrap is envoy.yaml as a template for envoytest.Options.Config.
	bootstrap string
	// config is the plugin configuration embedded in envoy.yaml.
	config  string
	session []sessionCmd
}

// sessionCmd is one "$ " line of a README and what it prints.
type sessionCmd struct {
	line int // in README.md, 1-based
	text string
	want []string
}

// sessionRun is one request a command sent and what came back.
type sessionRun struct {
	cmd *sessionCmd
	req *http.Request
	res envoytest.Result
	// statusLine is what curl -i prints first, e.g. "HTTP/1.1 200 OK".
	statusLine string
}

// exampleDirs lists the examples/<name>/ folders that take part: those
// whose README.md has a ```console session (and an envoy.yaml). Each of
// wantExamples must.
func exampleDirs(t *testing.T) map[string]string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join("..", "examples", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		if consoleBlockRE.Match(b) {
			d := filepath.Dir(m)
			dirs[filepath.Base(d)] = d
		}
	}
	for _, w := range wantExamples {
		if dirs[w] == "" {
			t.Errorf("examples/%s/README.md is missing or has no ```console session", w)
		}
	}
	// The quick start of the repository's own README runs on envoy.yaml,
	// which embeds its configuration (no config.json).
	dirs["quickstart"] = ".."
	return dirs
}

// TestExampleFiles checks every example without Envoy: envoy.yaml parses and
// embeds exactly config.json, config.json is a valid configuration, and the
// README has a session in the format above.
func TestExampleFiles(t *testing.T) {
	t.Parallel()
	for name, dir := range exampleDirs(t) {
		t.Run(name, func(t *testing.T) {
			ex := loadExample(t, name, dir)
			t.Logf("%d commands in README.md", len(ex.session))
		})
	}
}

// TestExamples boots every example on real Envoy and replays its README.
// The examples run in parallel, each Envoy with one worker.
//
// Wasm only: it replays shipped configurations, which load the Wasm filter.
func TestExamples(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, true)
	envoytest.PluginWasm(t)
	for name, dir := range exampleDirs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ex := loadExample(t, name, dir)
			start := time.Now()
			e := envoytest.Start(t, envoytest.Options{
				Config: ex.bootstrap, UpstreamPort: envoytest.FreePort(t), Concurrency: 1,
			})
			booted := time.Since(start)
			runs := runSession(t, envoyRoute(e), ex.session, examplePace[name])
			if check := exampleChecks[name]; check != nil && !t.Failed() {
				check(t, e, runs)
			}
			t.Logf("booted in %v; %d requests in %v", booted.Round(time.Millisecond), len(runs),
				(time.Since(start) - booted).Round(time.Millisecond))
		})
	}
}

// loadExample reads an example folder and fails the test on any
// inconsistency.
func loadExample(t *testing.T, name, dir string) example {
	t.Helper()
	ex := example{name: name, dir: dir}
	raw, err := os.ReadFile(filepath.Join(dir, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var tree any
	if err := json.Unmarshal(j, &tree); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}

	// The embedded plugin configuration is config.json.
	embedded := wasmConfigurations(tree)
	if len(embedded) != 1 {
		t.Fatalf("envoy.yaml: want one Wasm filter with a configuration value, found %d", len(embedded))
	}
	file, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		file = []byte(embedded[0]) // the configuration lives in envoy.yaml alone
	} else if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal([]byte(embedded[0]), &a); err != nil {
		t.Fatalf("envoy.yaml: the plugin configuration is not JSON: %v", err)
	}
	if err := json.Unmarshal(file, &b); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("the configuration embedded in envoy.yaml differs from config.json:\n%s\nvs\n%s", embedded[0], file)
	}
	if _, err := config.Parse(file); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	ex.config = embedded[0]

	ex.bootstrap, err = exampleTemplate(tree)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ex.session, err = parseSessions(string(readme))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	if len(ex.session) == 0 {
		t.Fatalf("README.md: no ```console session")
	}
	vars := map[string]string{}
	for i := range ex.session {
		if _, err := parseCommand(ex.session[i].text, vars); err != nil {
			t.Errorf("README.md:%d: %v", ex.session[i].line, err)
		}
	}
	return ex
}

const wasmType = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"

// wasmConfigurations returns config.configuration.value of every Wasm
// filter in an Envoy configuration tree.
func wasmConfigurations(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if v["@type"] == wasmType {
			c, _ := v["config"].(map[string]any)
			conf, _ := c["configuration"].(map[string]any)
			if s, ok := conf["value"].(string); ok {
				out = append(out, s)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			out = append(out, wasmConfigurations(v[k])...)
		}
	case []any:
		for _, e := range v {
			out = append(out, wasmConfigurations(e)...)
		}
	}
	return out
}

// The fixed addresses of every example and what the test puts in their
// place.
var (
	examplePorts = map[float64]string{10000: "listener", 9901: "admin", 10001: "upstream"}
	exampleTmpl  = map[string]string{
		"listener": "{{.ListenerPort}}", "admin": "{{.AdminPort}}", "upstream": "{{.UpstreamPort}}",
		"plugin": "{{json .PluginWasm}}",
	}
)

const examplePlugin = "build/plugin.wasm"

// exampleTemplate turns an example's configuration tree into a template for
// envoytest.Start: ports 10000, 9901 and 10001 become the listener, admin
// and upstream ports, and the plugin path becomes PLUGIN_WASM. Any other
// port, or a missing one, is an error: the test could not reach it.
func exampleTemplate(tree any) (string, error) {
	found := map[string]int{}
	var walk func(v any) (any, error)
	walk = func(v any) (any, error) {
		switch v := v.(type) {
		case map[string]any:
			out := make(map[string]any, len(v))
			for k, e := range v {
				switch n, isNum := e.(float64); {
				case k == "port_value" && isNum:
					p, ok := examplePorts[n]
					if !ok {
						return nil, fmt.Errorf("port_value %v: want one of 10000 (listener), 9901 (admin), 10001 (upstream)", n)
					}
					found[p]++
					out[k] = "@@" + p + "@@"
					continue
				case k == "filename" && e == examplePlugin:
					found["plugin"]++
					out[k] = "@@plugin@@"
					continue
				}
				w, err := walk(e)
				if err != nil {
					return nil, err
				}
				out[k] = w
			}
			if _, listener := v["filter_chains"]; listener {
				// Never share a port with another process (see the
				// harness's bootstrap template): a taken port then fails
				// the bind, and envoytest.Start retries on new ones.
				out["enable_reuse_port"] = false
			}
			return out, nil
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				w, err := walk(e)
				if err != nil {
					return nil, err
				}
				out[i] = w
			}
			return out, nil
		}
		return v, nil
	}
	t, err := walk(tree)
	if err != nil {
		return "", err
	}
	for _, p := range examplePorts {
		if found[p] == 0 {
			return "", fmt.Errorf("no port_value for the %s", p)
		}
	}
	if found["plugin"] != 1 {
		return "", fmt.Errorf("want one code.local.filename %q, found %d", examplePlugin, found["plugin"])
	}
	j, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	// JSON is YAML. Escape what text/template would read as an action, then
	// put in the placeholders.
	s := strings.ReplaceAll(string(j), "{{", `{{"{{"}}`)
	for name, expr := range exampleTmpl {
		s = strings.ReplaceAll(s, `"@@`+name+`@@"`, expr)
	}
	return s, nil
}

// parseSessions returns the commands of every ```console block of a README.
func parseSessions(readme string) ([]sessionCmd, error) {
	var cmds []sessionCmd
	in := false
	cont := false // the last command line ended in a backslash
	sc := bufio.NewScanner(strings.NewReader(readme))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case !in && consoleBlockRE.MatchString(line):
			in = true
		case !in:
		case strings.TrimSpace(line) == "```":
			if cont {
				return nil, fmt.Errorf("line %d: the block ends after a continued command", n)
			}
			in = false
		case cont:
			c := &cmds[len(cmds)-1]
			c.text, cont = strings.CutSuffix(c.text+" "+strings.TrimSpace(line), `\`)
		case strings.HasPrefix(line, "$ "):
			text, more := strings.CutSuffix(strings.TrimSpace(line[2:]), `\`)
			cmds = append(cmds, sessionCmd{line: n, text: text})
			cont = more
		case len(cmds) == 0:
			return nil, fmt.Errorf("line %d: output before the first command: %q", n, line)
		default:
			c := &cmds[len(cmds)-1]
			c.want = append(c.want, line)
		}
	}
	if in {
		return nil, fmt.Errorf("a ```console block is not closed")
	}
	return cmds, sc.Err()
}

// curlCall is one curl invocation.
type curlCall struct {
	method, rawURL string
	headers        [][2]string
	include        bool // -i
	discard        bool // -o /dev/null
	writeOut       string
	data           *string // -d: the request body
}

// sessionLine is a parsed session line: a variable assignment (no calls) or
// curl, maybe repeated by a for loop.
type sessionLine struct {
	calls []curlCall
}

var (
	assignRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	forRE    = regexp.MustCompile(`^for ([A-Za-z_][A-Za-z0-9_]*) in (.+?); do (.+?);? done$`)
	seqRE    = regexp.MustCompile(`^\$\(seq ([0-9]+)(?: ([0-9]+))?\)$`)

	consoleBlockRE = regexp.MustCompile("(?m)^[ \t]*```console[ \t]*$")
)

// parseCommand parses one command line, updating vars on an assignment.
func parseCommand(text string, vars map[string]string) (sessionLine, error) {
	if m := forRE.FindStringSubmatch(text); m != nil {
		var items []string
		if s := seqRE.FindStringSubmatch(strings.TrimSpace(m[2])); s != nil {
			lo, hi := 1, 0
			hi, _ = strconv.Atoi(s[1])
			if s[2] != "" {
				lo = hi
				hi, _ = strconv.Atoi(s[2])
			}
			if hi-lo > 1000 {
				return sessionLine{}, fmt.Errorf("seq: at most 1000 items")
			}
			for i := lo; i <= hi; i++ {
				items = append(items, strconv.Itoa(i))
			}
		} else {
			w, err := shellWords(m[2], vars)
			if err != nil {
				return sessionLine{}, err
			}
			items = w
		}
		var cmd sessionLine
		defer delete(vars, m[1]) // the loop variable is the loop's alone
		for _, it := range items {
			vars[m[1]] = it
			words, err := shellWords(m[3], vars)
			if err != nil {
				return sessionLine{}, err
			}
			c, err := parseCurl(words)
			if err != nil {
				return sessionLine{}, err
			}
			if c.include {
				return sessionLine{}, fmt.Errorf("curl -i in a loop: show one response per command")
			}
			cmd.calls = append(cmd.calls, c)
		}
		return cmd, nil
	}
	if m := assignRE.FindStringSubmatch(text); m != nil {
		w, err := shellWords(m[2], vars)
		if err != nil || len(w) != 1 {
			return sessionLine{}, fmt.Errorf("assignment: want one word after =, got %q (%v)", m[2], err)
		}
		vars[m[1]] = w[0]
		return sessionLine{}, nil
	}
	words, err := shellWords(text, vars)
	if err != nil {
		return sessionLine{}, err
	}
	c, err := parseCurl(words)
	if err != nil {
		return sessionLine{}, err
	}
	return sessionLine{calls: []curlCall{c}}, nil
}

// parseCurl reads the curl options the session format allows.
func parseCurl(w []string) (curlCall, error) {
	if len(w) == 0 || w[0] != "curl" {
		return curlCall{}, fmt.Errorf("only curl, NAME=value and for loops are supported, got %q", w)
	}
	c := curlCall{method: http.MethodGet}
	for i := 1; i < len(w); i++ {
		a := w[i]
		arg := func() (string, error) {
			if i+1 >= len(w) {
				return "", fmt.Errorf("curl %s: missing argument", a)
			}
			i++
			return w[i], nil
		}
		var err error
		switch {
		case a == "-H":
			var h string
			if h, err = arg(); err == nil {
				name, value, ok := strings.Cut(h, ":")
				if !ok || name == "" {
					return c, fmt.Errorf("curl -H %q: want 'name: value'", h)
				}
				c.headers = append(c.headers, [2]string{strings.TrimSpace(name), strings.TrimSpace(value)})
			}
		case a == "-X":
			c.method, err = arg()
		case a == "-d":
			var d string
			if d, err = arg(); err == nil {
				c.data = &d
				if c.method == http.MethodGet {
					c.method = http.MethodPost // as curl does
				}
			}
		case a == "-w":
			c.writeOut, err = arg()
		case a == "-o":
			var f string
			if f, err = arg(); err == nil && f != "/dev/null" {
				return c, fmt.Errorf("curl -o %s: only /dev/null", f)
			}
			c.discard = true
		case len(a) > 1 && a[0] == '-' && strings.Trim(a[1:], "siS") == "":
			c.include = c.include || strings.Contains(a, "i")
		case strings.HasPrefix(a, "-"):
			return c, fmt.Errorf("curl %s: option not supported by the session format", a)
		case c.rawURL != "":
			return c, fmt.Errorf("curl: two URLs (%s, %s)", c.rawURL, a)
		default:
			c.rawURL = a
		}
		if err != nil {
			return c, err
		}
	}
	if c.rawURL == "" {
		return c, fmt.Errorf("curl: no URL")
	}
	if _, _, err := exampleURL(c.rawURL, 1, 1); err != nil {
		return c, err
	}
	return c, nil
}

// exampleURL maps a URL of the README (localhost:10000 or :9901) to the
// running Envoy's ports, and returns the authority the README used.
func exampleURL(raw string, listener, admin int) (string, string, error) {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", err
	}
	if u.Scheme != "http" || (u.Hostname() != "localhost" && u.Hostname() != "127.0.0.1") {
		return "", "", fmt.Errorf("URL %s: want http://localhost:<port>", raw)
	}
	authority := u.Host
	switch u.Port() {
	case "10000":
		u.Host = "127.0.0.1:" + strconv.Itoa(listener)
	case "9901":
		u.Host = "127.0.0.1:" + strconv.Itoa(admin)
	default:
		return "", "", fmt.Errorf("URL %s: want port 10000 (the listener) or 9901 (admin)", raw)
	}
	if u.Path == "" {
		u.Path = "/"
	}
	return u.String(), authority, nil
}

// shellWords splits s into words as a POSIX shell would for the simple
// quoting the sessions use, expanding $NAME and ${NAME} outside single
// quotes. An unset variable is an error.
func shellWords(s string, vars map[string]string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	expand := func(i int) (int, error) { // s[i] == '$'
		j := i + 1
		braced := j < len(s) && s[j] == '{'
		if braced {
			j++
		}
		k := j
		for k < len(s) && (s[k] == '_' || s[k] >= 'A' && s[k] <= 'Z' || s[k] >= 'a' && s[k] <= 'z' || k > j && s[k] >= '0' && s[k] <= '9') {
			k++
		}
		if k == j {
			return 0, fmt.Errorf("%q: a lone $ or $( is not supported", s)
		}
		name := s[j:k]
		if braced {
			if k >= len(s) || s[k] != '}' {
				return 0, fmt.Errorf("%q: unclosed ${", s)
			}
			k++
		}
		v, ok := vars[name]
		if !ok {
			return 0, fmt.Errorf("$%s is not set", name)
		}
		cur.WriteString(v)
		return k, nil
	}
	for i := 0; i < len(s); {
		ch := s[i]
		switch {
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			i++
		case ch == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("%q: unclosed '", s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			inWord, i = true, i+end+2
		case ch == '"':
			inWord = true
			i++
			for {
				if i >= len(s) {
					return nil, fmt.Errorf("%q: unclosed \"", s)
				}
				if s[i] == '"' {
					i++
					break
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					cur.WriteByte(s[i+1])
					i += 2
					continue
				}
				if s[i] == '$' {
					var err error
					if i, err = expand(i); err != nil {
						return nil, err
					}
					continue
				}
				cur.WriteByte(s[i])
				i++
			}
		case ch == '\\' && i+1 < len(s):
			cur.WriteByte(s[i+1])
			inWord, i = true, i+2
		case ch == '$':
			var err error
			if i, err = expand(i); err != nil {
				return nil, err
			}
			inWord = true
		case strings.IndexByte(";|&<>()`", ch) >= 0:
			return nil, fmt.Errorf("%q: %c is not supported by the session format", s, ch)
		default:
			cur.WriteByte(ch)
			inWord, i = true, i+1
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// route maps a URL as a README writes it (localhost:10000/..., the admin on
// localhost:9901) to the URL the test sends to and the authority curl would
// send.
type route func(rawURL string) (u, authority string, err error)

// envoyRoute sends the README's fixed ports to e's free ones.
func envoyRoute(e *envoytest.Envoy) route {
	return func(raw string) (string, string, error) { return exampleURL(raw, e.ListenerPort(), e.AdminPort()) }
}

// humanPace is the least time a reader takes from one pasted command to the
// next. examplePace names the examples replayed at that pace: those whose
// outcomes (not only their countdowns, which a reader sees lower) hold only
// if the commands follow each other within a second. (smooth-bursts' three
// blocks, pasted one after another as its README said, showed a reader 200,
// 200, 200 where the machine-paced replay printed 200, 200, 429.)
const humanPace = 1500 * time.Millisecond

// concurrency: its stats read what the end of the request before gave back.
var examplePace = map[string]time.Duration{"smooth-bursts": humanPace, "concurrency": humanPace}

// runSession replays the commands through to, pace apart (a command's own
// requests, a loop's, go back to back), and reports every output that
// differs from the README.
func runSession(t *testing.T, to route, cmds []sessionCmd, pace time.Duration) []sessionRun {
	t.Helper()
	hc := &http.Client{Timeout: envoytest.RequestTimeout, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	vars := map[string]string{}
	var runs []sessionRun
	for i := range cmds {
		cmd := &cmds[i]
		if i > 0 && pace > 0 && (strings.HasPrefix(cmd.text, "curl") || strings.HasPrefix(cmd.text, "for ")) {
			time.Sleep(pace) // a reader's pace, not a wait for an outcome
		}
		parsed, err := parseCommand(cmd.text, vars)
		if err != nil {
			t.Fatalf("README line %d: %v", cmd.line, err)
		}
		var out strings.Builder
		for _, c := range parsed.calls {
			run := doCurl(hc, to, c)
			if run.res.Err != nil {
				t.Fatalf("README line %d: %s: %v", cmd.line, abbreviate(cmd.text), run.res.Err)
			}
			run.cmd = cmd
			runs = append(runs, run)
			res := run.res
			if c.include {
				if err := matchInclude(cmd.want, run); err != nil {
					t.Errorf("README line %d: $ %s\n%v", cmd.line, abbreviate(cmd.text), err)
				}
				continue
			}
			if !c.discard {
				out.Write(res.Body)
			}
			out.WriteString(writeOut(c.writeOut, res))
		}
		if len(parsed.calls) == 0 || parsed.calls[0].include {
			continue
		}
		got := strings.TrimSuffix(out.String(), "\n")
		if want := strings.Join(cmd.want, "\n"); !outputMatches(got, want) {
			t.Errorf("README line %d: $ %s\nprints:\n%s\nREADME says:\n%s", cmd.line, abbreviate(cmd.text), got, want)
		}
	}
	return runs
}

// measuredHeaders are the headers whose value is a measured time, with how
// far (in the header's unit) a session's run may differ from the value its
// README shows: a README shows what a reader would typically see.
var measuredHeaders = map[string]int{"x-ratelimit-delayed-ms": 150}

// measuredMark brackets a measured header's value in writeOut's output.
const measuredMark = "\x00"

// writeOut is what curl -w format prints for res: %{http_code}, and
// %header{name} (curl 7.84 and later) the response header's value, empty
// when absent; a measured header's value is bracketed by measuredMark for
// outputMatches.
func writeOut(format string, res envoytest.Result) string {
	s := strings.NewReplacer(`%{http_code}`, strconv.Itoa(res.Status), `\n`, "\n").Replace(format)
	return headerOutRE.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.ToLower(headerOutRE.FindStringSubmatch(m)[1])
		v := res.Header.Get(name)
		if _, ok := measuredHeaders[name]; ok && v != "" {
			return measuredMark + name + "=" + v + measuredMark
		}
		return v
	})
}

var headerOutRE = regexp.MustCompile(`%header\{([A-Za-z0-9-]+)\}`)

// outputMatches says whether got, a session command's output as writeOut
// made it, is what the README shows: line by line, trailing spaces aside
// (a terminal shows none), and a measured header's value within its
// tolerance of the README's.
func outputMatches(got, want string) bool {
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	if len(gl) != len(wl) {
		return false
	}
	for i := range gl {
		g, w := strings.TrimRight(gl[i], " "), strings.TrimRight(wl[i], " ")
		parts := strings.Split(g, measuredMark)
		if len(parts) == 1 {
			if g != w {
				return false
			}
			continue
		}
		// parts alternate literal text and name=value: the README's line
		// must hold the same text with a number in each value's place.
		var pat strings.Builder
		pat.WriteString("^")
		var values []string
		for j, p := range parts {
			if j%2 == 0 {
				pat.WriteString(regexp.QuoteMeta(p))
				continue
			}
			values = append(values, p)
			pat.WriteString(`([0-9]+)`)
		}
		pat.WriteString("$")
		m := regexp.MustCompile(pat.String()).FindStringSubmatch(w)
		if m == nil {
			return false
		}
		for j, nv := range values {
			name, v, _ := strings.Cut(nv, "=")
			a, err1 := strconv.Atoi(v)
			b, err2 := strconv.Atoi(m[j+1])
			if err1 != nil || err2 != nil || a-b > measuredHeaders[name] || b-a > measuredHeaders[name] {
				return false
			}
		}
	}
	return true
}

// doCurl sends one curl call the way curl would: with the README's
// authority as Host.
func doCurl(hc *http.Client, to route, c curlCall) sessionRun {
	u, authority, err := to(c.rawURL)
	if err != nil {
		return sessionRun{res: envoytest.Result{Err: err}}
	}
	var data io.Reader
	if c.data != nil {
		data = strings.NewReader(*c.data)
	}
	req, err := http.NewRequest(c.method, u, data)
	if err != nil {
		return sessionRun{res: envoytest.Result{Err: err}}
	}
	req.Host = authority
	req.Header.Set("User-Agent", "curl/8")
	req.Header.Set("Accept", "*/*")
	if c.data != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d does
	}
	for _, h := range c.headers {
		req.Header.Add(h[0], h[1])
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return sessionRun{req: req, res: envoytest.Result{Err: err}}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return sessionRun{
		req:        req,
		res:        envoytest.Result{Status: resp.StatusCode, Header: resp.Header, Body: body, Elapsed: time.Since(start), Err: err},
		statusLine: resp.Proto + " " + resp.Status,
	}
}

// matchInclude checks the README's lines for a curl -i against a response.
func matchInclude(want []string, run sessionRun) error {
	var errs []string
	res, status := run.res, run.statusLine
	if len(want) == 0 || want[0] != status {
		return fmt.Errorf("status line %q, README says %q", status, strings.Join(want[:min(len(want), 1)], ""))
	}
	i := 1
	for ; i < len(want) && want[i] != ""; i++ {
		name, value, ok := strings.Cut(want[i], ": ")
		if !ok {
			errs = append(errs, fmt.Sprintf("%q is not a header line", want[i]))
			continue
		}
		if got := res.Header.Values(name); !slices.Contains(got, value) {
			errs = append(errs, fmt.Sprintf("%s: %q, README says %q", name, got, value))
		}
	}
	if i < len(want) { // the body follows the empty line
		got := string(bytes.TrimSuffix(res.Body, []byte("\n")))
		if w := strings.Join(want[i+1:], "\n"); got != w {
			errs = append(errs, fmt.Sprintf("body %q, README says %q", got, w))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s\n(status %d, headers %v)", strings.Join(errs, "\n"), res.Status, res.Header)
	}
	return nil
}

func abbreviate(s string) string {
	if len(s) > 160 {
		return s[:160] + "..."
	}
	return s
}

func TestSessionFormat(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"TOK": "a b", "K": "k1"}
	for _, tc := range []struct {
		text    string
		want    []curlCall // nil: an assignment or an error
		wantErr bool
	}{
		{text: `curl -si localhost:10000/ -H 'x-api-key: alice'`,
			want: []curlCall{{method: "GET", rawURL: "localhost:10000/", include: true, headers: [][2]string{{"x-api-key", "alice"}}}}},
		{text: `curl -s -X POST "localhost:10000/api?q=1" -H "authorization: Bearer $TOK" -H x-k:\ ${K}`,
			want: []curlCall{{method: "POST", rawURL: "localhost:10000/api?q=1",
				headers: [][2]string{{"authorization", "Bearer a b"}, {"x-k", "k1"}}}}},
		{text: `for i in $(seq 2); do curl -s -o /dev/null -w '%{http_code}\n' localhost:10000/$i; done`,
			want: []curlCall{
				{method: "GET", rawURL: "localhost:10000/1", discard: true, writeOut: `%{http_code}\n`},
				{method: "GET", rawURL: "localhost:10000/2", discard: true, writeOut: `%{http_code}\n`}}},
		{text: `for i in a b; do curl localhost:9901/$i; done`,
			want: []curlCall{{method: "GET", rawURL: "localhost:9901/a"}, {method: "GET", rawURL: "localhost:9901/b"}}},
		{text: `NEW='x y'`},
		{text: `curl localhost:10000/ | grep x`, wantErr: true},
		{text: `curl localhost:8080/`, wantErr: true},
		{text: `curl -v localhost:10000/`, wantErr: true},
		{text: `curl -o out.txt localhost:10000/`, wantErr: true},
		{text: `curl -H "x: $UNSET" localhost:10000/`, wantErr: true},
		{text: `curl -H 'x: y localhost:10000/`, wantErr: true},
		{text: `echo hi`, wantErr: true},
		{text: `for i in 1; do curl -si localhost:10000/; done`, wantErr: true},
	} {
		cmd, err := parseCommand(tc.text, vars)
		switch {
		case tc.wantErr != (err != nil):
			t.Errorf("%s: error %v, want error %v", tc.text, err, tc.wantErr)
		case !tc.wantErr && !reflect.DeepEqual(cmd.calls, tc.want):
			t.Errorf("%s:\n got %+v\nwant %+v", tc.text, cmd.calls, tc.want)
		}
	}
	if vars["NEW"] != "x y" {
		t.Errorf("NEW='x y' set NEW to %q", vars["NEW"])
	}
	if _, ok := vars["i"]; ok {
		t.Errorf("the loop variable outlives its loop")
	}

	readme := "text\n```console\n$ A=1\n$ curl localhost:10000/ \\\n  -H 'x: $A'\nout 1\n\nout 2\n```\n```sh\n$ not a session\n```\n"
	cmds, err := parseSessions(readme)
	if err != nil {
		t.Fatal(err)
	}
	want := []sessionCmd{{line: 3, text: "A=1"}, {line: 4, text: "curl localhost:10000/  -H 'x: $A'", want: []string{"out 1", "", "out 2"}}}
	if !reflect.DeepEqual(cmds, want) {
		t.Errorf("parseSessions:\n got %+v\nwant %+v", cmds, want)
	}
	for _, bad := range []string{"```console\nstray output\n```\n", "```console\n$ curl x \\\n```\n", "```console\n$ A=1\n"} {
		if _, err := parseSessions(bad); err == nil {
			t.Errorf("parseSessions(%q): no error", bad)
		}
	}
}

func TestMatchInclude(t *testing.T) {
	t.Parallel()
	run := sessionRun{
		res: envoytest.Result{Status: 429, Body: []byte("{\"a\":1}\n"), Header: http.Header{
			"Retry-After": {"11"}, "Ratelimit-Remaining": {"0"}}},
		statusLine: "HTTP/1.1 429 Too Many Requests",
	}
	for _, tc := range []struct {
		want []string
		ok   bool
	}{
		{[]string{"HTTP/1.1 429 Too Many Requests"}, true},
		{[]string{"HTTP/1.1 429 Too Many Requests", "retry-after: 11", "ratelimit-remaining: 0"}, true},
		{[]string{"HTTP/1.1 429 Too Many Requests", "retry-after: 11", "", `{"a":1}`}, true},
		{[]string{"HTTP/1.1 200 OK"}, false},
		{[]string{"HTTP/1.1 429 Too Many Requests", "retry-after: 12"}, false},
		{[]string{"HTTP/1.1 429 Too Many Requests", "x-missing: 1"}, false},
		{[]string{"HTTP/1.1 429 Too Many Requests", "not a header"}, false},
		{[]string{"HTTP/1.1 429 Too Many Requests", "", `{"a":2}`}, false},
		{nil, false},
	} {
		if err := matchInclude(tc.want, run); (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok %v", tc.want, err, tc.ok)
		}
	}
}

// FuzzShellWords checks that the session tokenizer never panics and that
// words without quotes, escapes or variables split on spaces and tabs.
func FuzzShellWords(f *testing.F) {
	for _, s := range []string{`curl -H 'a: b' "x $V" \ y`, `${V}`, `'unclosed`, `"a\"b"`, `$`, `a;b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := shellWords(s, map[string]string{"V": "v"})
		if err != nil || strings.ContainsAny(s, "'\"\\$") {
			return
		}
		got := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' })
		if !slices.Equal(words, got) && (len(words) != 0 || len(got) != 0) {
			t.Errorf("shellWords(%q) = %q, want %q", s, words, got)
		}
	})
}

// examples/rate-limit-quota runs stock Envoy with its own rate limit quota
// filter against limitd and Redis. Its session is the README's block whose
// info string is "console rate-limit-quota" (TestExamples, which needs the
// plugin in envoy.yaml, leaves it alone): TestExampleRateLimitQuota replays
// it against the example's envoy.yaml on free ports, with build/limitd
// serving the example's limits.yaml on a real redis-server, as run.sh
// starts them.
var rlqsExampleBlockRE = regexp.MustCompile("(?m)^```console rate-limit-quota[ \t]*$")

// rlqsExamplePorts are the fixed ports of the example's envoy.yaml and what
// the test puts in their place.
var rlqsExamplePorts = map[float64]string{10000: "{{.ListenerPort}}", 9901: "{{.AdminPort}}", 8082: "{{.RLQSPort}}"}

// TestExampleRateLimitQuotaFiles checks the example without limitd: Envoy
// 1.40 accepts envoy.yaml, limitd's configuration parser limits.yaml, and
// the README has a session in the format above that names only Envoy's ports.
func TestExampleRateLimitQuotaFiles(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	dir := filepath.Join("..", "examples", "rate-limit-quota")
	if _, _, err := rlsconfig.Load(filepath.Join(dir, "limits.yaml")); err != nil {
		t.Fatal(err)
	}
	tmpl := rlqsExampleTemplate(t, dir)
	text, err := envoytest.RenderConfig(tmpl, envoytest.TemplateData{ListenerPort: 10000, AdminPort: 9901, RLQSPort: 8082})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := envoy.Validate(path); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cmds := rlqsExampleSession(t, dir)
	vars := map[string]string{}
	for _, c := range cmds {
		if _, err := parseCommand(c.text, vars); err != nil {
			t.Errorf("README.md:%d: %v", c.line, err)
		}
	}
	if b, err := exec.Command("bash", "-n", filepath.Join(dir, "run.sh")).CombinedOutput(); err != nil {
		t.Errorf("run.sh: %v\n%s", err, b)
	}
}

// TestExampleRateLimitQuota replays the README's session.
func TestExampleRateLimitQuota(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	dir := filepath.Join("..", "examples", "rate-limit-quota")
	cmds := rlqsExampleSession(t, dir)
	redis := redistest.Start(t)
	svc := startLimitdWith(t, redis.Addr(), filepath.Join(dir, "limits.yaml"))
	e := envoytest.Start(t, envoytest.Options{Config: rlqsExampleTemplate(t, dir), NoWasm: true, RLQSPort: svc.grpcPort,
		Concurrency: 2})
	// The README quotes the line Envoy logs when limitd's first assignment
	// arrives, and its session waits for it after the command that reports
	// the key (the one that prints 429 first).
	readme := readFile(filepath.Join(dir, "README.md"))
	_, quoted, ok := strings.Cut(readme, "\n[info][rate_limit_quota] ... ")
	quoted, _, _ = strings.Cut(quoted, " for id")
	if !ok || quoted == "" {
		t.Fatal(`README.md quotes no "[info][rate_limit_quota] ... " line`)
	}
	first := slices.IndexFunc(cmds, func(c sessionCmd) bool { return slices.Contains(c.want, "429") })
	if first < 0 {
		t.Fatal("README.md: no command of the session prints 429")
	}
	to := envoyRoute(e)
	runSession(t, to, cmds[:first+1], 0)
	if line := e.WaitLog(quoted, rlqsWait); line == "" {
		t.Fatalf("Envoy did not log %q within %v", quoted, rlqsWait)
	}
	runSession(t, to, cmds[first+1:], 0)
}

// rlqsExampleTemplate turns the example's envoy.yaml into a template whose
// fixed ports are the test's.
func rlqsExampleTemplate(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var tree any
	if err := json.Unmarshal(j, &tree); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	found := map[float64]int{}
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if n, ok := e.(float64); ok && k == "port_value" {
					if _, known := rlqsExamplePorts[n]; !known {
						t.Fatalf("envoy.yaml: port_value %v: want 10000 (listener), 9901 (admin) or 8082 (limitd's gRPC)", n)
					}
					found[n]++
					v[k] = fmt.Sprintf("@@%v@@", n)
					continue
				}
				v[k] = walk(e)
			}
		case []any:
			for i, e := range v {
				v[i] = walk(e)
			}
		}
		return v
	}
	b, err := json.Marshal(walk(tree))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(b), "{{", `{{"{{"}}`)
	for port, expr := range rlqsExamplePorts {
		if found[port] != 1 {
			t.Fatalf("envoy.yaml: port %v appears %d times, want once", port, found[port])
		}
		s = strings.ReplaceAll(s, fmt.Sprintf(`"@@%v@@"`, port), expr)
	}
	return s
}

// rlqsExampleSession returns the commands of the README's "console
// rate-limit-quota" blocks.
func rlqsExampleSession(t *testing.T, dir string) []sessionCmd {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Make those blocks the only console blocks, line for line, and let the
	// examples' session parser read them.
	text := consoleBlockRE.ReplaceAllString(string(b), "```text")
	text = rlqsExampleBlockRE.ReplaceAllString(text, "```console")
	cmds, err := parseSessions(text)
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	if len(cmds) == 0 {
		t.Fatal("README.md: no ```console rate-limit-quota session")
	}
	return cmds
}

// TestWriteOutMeasured: %header{name} prints the header (empty when absent),
// trailing spaces are no difference, and a measured header matches the
// README's value within its tolerance and no further.
func TestWriteOutMeasured(t *testing.T) {
	t.Parallel()
	held := envoytest.Result{Status: 200, Header: http.Header{"X-Ratelimit-Delayed-Ms": {"537"}}}
	plain := envoytest.Result{Status: 429, Header: http.Header{}}
	const format = `%{http_code} %header{x-ratelimit-delayed-ms}\n`
	got := strings.TrimSuffix(writeOut(format, plain)+writeOut(format, held), "\n")
	for _, tc := range []struct {
		want string
		ok   bool
	}{
		{"429\n200 500", true},
		{"429 \n200 537", true},
		{"429\n200 650", true},
		{"429\n200 700", false},
		{"429\n200", false},
		{"200\n200 500", false},
		{"429\n200 500\n200", false},
	} {
		if ok := outputMatches(got, tc.want); ok != tc.ok {
			t.Errorf("outputMatches(%q, %q) = %v, want %v", got, tc.want, ok, tc.ok)
		}
	}
	if got := writeOut(`%header{x-ratelimit-reason}|%{http_code}`, envoytest.Result{Status: 429,
		Header: http.Header{"X-Ratelimit-Reason": {"token_bucket_exceeded"}}}); got != "token_bucket_exceeded|429" {
		t.Errorf("writeOut = %q", got)
	}
}
