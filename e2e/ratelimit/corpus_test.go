// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// referenceModule is the directory of envoyproxy/ratelimit's source in the
// module cache, at the version this module's go.mod names (`go mod
// download` puts it there).
func referenceModule(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", "github.com/envoyproxy/ratelimit").Output()
	version, dir, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	if err != nil || dir == "" {
		t.Fatalf("go list -m github.com/envoyproxy/ratelimit: %q, %v (run `go -C e2e/ratelimit mod download`)", out, err)
	}
	if version != envoyratelimit.Version {
		t.Fatalf("go.mod names envoyproxy/ratelimit %s, the harness (and mk/ratelimit.mk) %s", version, envoyratelimit.Version)
	}
	return dir
}

// referenceConfigs are the configuration files that ship in
// envoyproxy/ratelimit's source: its example's, its unit tests' (good and
// bad) and its integration tests'.
func referenceConfigs(t *testing.T) []string {
	t.Helper()
	dir := referenceModule(t)
	var files []string
	for _, pattern := range []string{
		"examples/ratelimit/config/*.yaml",
		"test/config/*.yaml",
		"test/integration/runtime/current/ratelimit/config/*.yaml",
		"test/integration/runtime/current/ratelimit/*.yaml",
	} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 20 {
		t.Fatalf("%d configuration files in %s, want the 20 or more it ships", len(files), dir)
	}
	return files
}

// outcome is what a service made of one file.
type outcome struct {
	accepted bool
	reason   string // a refusal's log line
}

// TestReferenceConfigurations feeds every configuration file shipped in
// envoyproxy/ratelimit's source, one at a time, to envoyproxy/ratelimit and
// to limitd: both accept it or both refuse it (limitd naming the file).
// Every accepted file is then decided: each limit's descriptor, then all of
// a domain's together, asked directly over gRPC of envoyproxy/ratelimit and
// of limitd with fixed windows (the same answers: codes, limits,
// remaining, reset within a second) and with token buckets (the same codes
// for the first hits, the same limits throughout).
func TestReferenceConfigurations(t *testing.T) {
	t.Parallel()
	files := referenceConfigs(t)
	mod := referenceModule(t)
	var table []string
	for _, path := range files {
		rel, _ := filepath.Rel(mod, path)
		t.Run(strings.ReplaceAll(rel, "/", "_"), func(t *testing.T) {
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(path)
			files := map[string]string{name: string(text)}
			ref := startService(t, reference, files)
			refOut := outcome{accepted: len(ref.rl.ConfigErrors()) == 0}
			if !refOut.accepted {
				refOut.reason = ref.rl.ConfigErrors()[0]
			}
			var sides []*service
			var limitdOut outcome
			for _, args := range [][]string{{"--rls-algorithm", "fixed_window"}, nil} {
				s := &service{kind: limitd, redis: redistest.Start(t)}
				dir := t.TempDir()
				if err := os.WriteFile(filepath.Join(dir, name), text, 0o644); err != nil {
					t.Fatal(err)
				}
				err := s.launchLimitd(t, filepath.Join(dir, name), args)
				limitdOut = outcome{accepted: err == nil}
				if err != nil {
					limitdOut.reason = refusalLine(s.log())
					break
				}
				s.dial(t)
				sides = append(sides, s)
			}
			table = append(table, fmt.Sprintf("%-70s envoyproxy/ratelimit %s, limitd %s", rel, verdict(refOut), verdict(limitdOut)))
			if !limitdOut.accepted {
				table = append(table, "    envoyproxy/ratelimit: "+refusalReason(refOut.reason), "    limitd: "+refusalReason(limitdOut.reason))
			}
			if refOut.accepted != limitdOut.accepted {
				t.Fatalf("envoyproxy/ratelimit %s (%s), limitd %s (%s)", verdict(refOut), refOut.reason, verdict(limitdOut), limitdOut.reason)
			}
			if !limitdOut.accepted {
				if !strings.Contains(limitdOut.reason, name) {
					t.Errorf("limitd's refusal %q does not name the file %s", limitdOut.reason, name)
				}
				return
			}
			decideAlike(t, string(text), ref, sides[0], sides[1])
		})
	}
	t.Logf("the configurations shipped in envoyproxy/ratelimit %s:\n%s", envoyratelimit.Version, strings.Join(table, "\n"))
}

func verdict(o outcome) string {
	if o.accepted {
		return "accepts"
	}
	return "refuses"
}

// refusalReason is a refusal's log line from its reason on: after the
// directory (limitd) or after the log's prefix (envoyproxy/ratelimit).
func refusalReason(line string) string {
	if _, r, ok := strings.Cut(line, "rlsconfig: "); ok {
		return strings.TrimSuffix(dirs.ReplaceAllString(r, ""), `"}`)
	}
	if _, r, ok := strings.Cut(line, envoyratelimit.RefusedLine+": "); ok {
		return strings.TrimSuffix(r, `"`)
	}
	return line
}

// dirs matches the directories of the paths in a log line.
var dirs = regexp.MustCompile(`/[^\s:'"()]*/`)

// refusalLine is the line of limitd's log that says why it did not start.
func refusalLine(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "rls-config") || strings.Contains(lines[i], "rlsconfig") {
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}

// dial opens s's gRPC client (launchLimitd alone does not).
func (s *service) dial(t *testing.T) {
	t.Helper()
	conn, err := newConn(s.grpcPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn = conn
}

// limitPaths returns, per domain of a configuration file, one descriptor
// for each node that has a rate_limit: the keys and values down to it (a
// wildcard value completed, a missing value made up).
func limitPaths(t *testing.T, text string) map[string][]entries {
	t.Helper()
	var doc struct {
		Domain      string `json:"domain"`
		Descriptors []node `json:"descriptors"`
	}
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("the accepted file does not decode: %v", err)
	}
	out := map[string][]entries{}
	var walk func(prefix entries, ns []node)
	walk = func(prefix entries, ns []node) {
		for _, n := range ns {
			value := n.Value
			switch {
			case value == "":
				value = "any"
			case strings.HasSuffix(value, "*"):
				value = strings.TrimSuffix(value, "*") + "x"
			}
			path := append(slices.Clone(prefix), n.Key, value)
			if n.RateLimit != nil {
				out[doc.Domain] = append(out[doc.Domain], path)
			}
			walk(path, n.Descriptors)
		}
	}
	walk(nil, doc.Descriptors)
	return out
}

type node struct {
	Key         string          `json:"key"`
	Value       string          `json:"value"`
	RateLimit   *map[string]any `json:"rate_limit"`
	Descriptors []node          `json:"descriptors"`
}

// decideAlike asks every limit of text of ref, window (limitd with fixed
// windows) and bucket (limitd with token buckets): one call per
// descriptor, then one with all of a domain's. The three calls of a round
// are made in one second, so that no window's edge falls between them;
// when one did on a loaded machine, the domain is decided again on emptied
// Redis servers (at most three times).
func decideAlike(t *testing.T, text string, ref, window, bucket *service) {
	t.Helper()
	domains := limitPaths(t, text)
	calls := 0
	for _, domain := range slices.Sorted(mapsKeys(domains)) {
		for attempt := 1; ; attempt++ {
			for _, s := range []*service{ref, window, bucket} {
				if _, err := redistest.Do(s.redis.Addr(), "FLUSHALL"); err != nil {
					t.Fatal(err)
				}
			}
			n, problems, straddled := decideDomain(t, domain, domains[domain], ref, window, bucket)
			if straddled && attempt < 3 {
				t.Logf("%s: a second's edge fell between the calls of a round: again", domain)
				continue
			}
			calls += n
			for _, p := range problems {
				t.Error(p)
			}
			break
		}
	}
	t.Logf("%d calls decided on each of the three", calls)
}

// decideDomain plays the rounds of one domain and returns how many, the
// differences found, and whether a round's calls straddled a second's edge.
func decideDomain(t *testing.T, domain string, paths []entries, ref, window, bucket *service) (int, []string, bool) {
	t.Helper()
	rounds := [][]entries{}
	for _, p := range paths {
		rounds = append(rounds, []entries{p})
	}
	if len(paths) > 1 && len(paths) <= 64 {
		rounds = append(rounds, paths)
	}
	var problems []string
	straddled := false
	for r, ds := range rounds {
		alignSecond(t, 300*time.Millisecond)
		before := time.Now()
		a, errA := ref.call(domain, 1, ds...)
		b, errB := window.call(domain, 1, ds...)
		c, errC := bucket.call(domain, 1, ds...)
		if !time.Now().Truncate(time.Second).Equal(before.Truncate(time.Second)) {
			straddled = true
		}
		if errA != nil || errB != nil || errC != nil {
			problems = append(problems, fmt.Sprintf("%s %v: errors: envoyproxy/ratelimit %v, limitd fixed_window %v, limitd token_bucket %v", domain, ds, errA, errB, errC))
			continue
		}
		if d := diffResponses(a, b, true); d != "" {
			problems = append(problems, fmt.Sprintf("%s %v: envoyproxy/ratelimit and limitd fixed_window differ: %s\n%v\n%v", domain, ds, d, a, b))
		}
		// Token buckets: the same limits; the same codes while every
		// bucket is fresh (the calls of one descriptor each).
		if d := diffResponses(a, c, false); d != "" && (r < len(paths) || strings.Contains(d, "limit")) {
			problems = append(problems, fmt.Sprintf("%s %v: envoyproxy/ratelimit and limitd token_bucket differ: %s\n%v\n%v", domain, ds, d, a, c))
		}
	}
	return len(rounds), problems, straddled
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// diffResponses describes how b differs from a: the overall code, each
// status's code and current limit and, when exact, its remaining count
// and its reset (within a second). "" when alike.
func diffResponses(a, b *rlsv3.RateLimitResponse, exact bool) string {
	var d []string
	if a.GetOverallCode() != b.GetOverallCode() {
		d = append(d, fmt.Sprintf("overall code %v, %v", a.GetOverallCode(), b.GetOverallCode()))
	}
	as, bs := a.GetStatuses(), b.GetStatuses()
	if len(as) != len(bs) {
		return strings.Join(append(d, fmt.Sprintf("%d statuses, %d", len(as), len(bs))), "; ")
	}
	for i := range as {
		x, y := as[i], bs[i]
		if x.GetCode() != y.GetCode() {
			d = append(d, fmt.Sprintf("statuses[%d].code %v, %v", i, x.GetCode(), y.GetCode()))
		}
		xl, yl := x.GetCurrentLimit(), y.GetCurrentLimit()
		if xl.GetRequestsPerUnit() != yl.GetRequestsPerUnit() || xl.GetUnit() != yl.GetUnit() || xl.GetName() != yl.GetName() || (xl == nil) != (yl == nil) {
			d = append(d, fmt.Sprintf("statuses[%d].current_limit %v, %v", i, xl, yl))
		}
		if !exact {
			continue
		}
		if x.GetLimitRemaining() != y.GetLimitRemaining() {
			d = append(d, fmt.Sprintf("statuses[%d].limit_remaining %d, %d", i, x.GetLimitRemaining(), y.GetLimitRemaining()))
		}
		xr, yr := x.GetDurationUntilReset().AsDuration(), y.GetDurationUntilReset().AsDuration()
		if (x.GetDurationUntilReset() == nil) != (y.GetDurationUntilReset() == nil) || xr-yr > time.Second || yr-xr > time.Second {
			d = append(d, fmt.Sprintf("statuses[%d].duration_until_reset %v, %v", i, x.GetDurationUntilReset(), y.GetDurationUntilReset()))
		}
	}
	return strings.Join(d, "; ")
}

// TestReferenceConfigurationPairs loads files of envoyproxy/ratelimit's
// tests that are meant to be read together, as a folder: a second file of
// one domain is refused by both (without envoyproxy/ratelimit's
// MERGE_DOMAIN_CONFIG, which limitd does not offer).
func TestReferenceConfigurationPairs(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(referenceModule(t), "test", "config")
	for _, pair := range [][2]string{
		{"basic_config.yaml", "duplicate_domain.yaml"},
		{"merge_domain_key1.yaml", "merge_domain_key2.yaml"},
	} {
		t.Run(pair[0]+"+"+pair[1], func(t *testing.T) {
			files := map[string]string{}
			for _, name := range pair {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				files[name] = string(b)
			}
			ref := startService(t, reference, files)
			refErrs := ref.rl.ConfigErrors()
			if len(refErrs) == 0 || !strings.Contains(refErrs[0], "duplicate domain") {
				t.Errorf("envoyproxy/ratelimit: refusals %q, want a duplicate domain", refErrs)
			}
			s := &service{kind: limitd, redis: redistest.Start(t)}
			folder := t.TempDir()
			for name, text := range files {
				if err := os.WriteFile(filepath.Join(folder, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := s.launchLimitd(t, folder, nil)
			if err == nil {
				t.Fatalf("limitd accepted %v", pair)
			}
			line := refusalLine(s.log())
			if !strings.Contains(line, "domain") || !strings.Contains(line, pair[1]) {
				t.Errorf("limitd's refusal %q: want the domain and the second file, %s", line, pair[1])
			}
			t.Logf("envoyproxy/ratelimit: %s\nlimitd: %s", refusalReason(refErrs[0]), refusalReason(line))
		})
	}
}
