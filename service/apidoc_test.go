package service

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"
)

// apiExampleRE is one call of the HTTP API as docs/limit-service.md lists
// it: "- `POST /v1/<path>` `<request>` →" and "`<answer>`", each JSON text
// possibly wrapped over lines.
var apiExampleRE = regexp.MustCompile("(?s)- `POST (/v1/[a-z/]+)` `([^`]+)` →\\s+`([^`]+)`")

// replayOnFreshBucket sends req to path of a new server (memory store,
// stopped clock, limitd's at t0 too), so every bucket starts full, and checks that the answer
// is the JSON want.
func replayOnFreshBucket(t *testing.T, path, req, want string) {
	t.Helper()
	clk := &fakeClock{}
	clk.Set(t0)
	s, err := NewServer(Config{Store: NewMemoryStore(MemoryOptions{Now: clk.Now}), StoreName: "memory",
		Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	w := do(s, "POST", path, req)
	if w.Code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", path, req, w.Code, w.Body)
	}
	var got, wantV any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &wantV); err != nil {
		t.Fatalf("the docs' answer is not JSON: %v: %s", err, want)
	}
	if !reflect.DeepEqual(got, wantV) {
		t.Errorf("%s %s\nanswers %s\nthe docs say %s", path, req, strings.TrimSpace(w.Body.String()), want)
	}
}

// TestAPIExamplesInDocs replays each call of the HTTP API that
// docs/limit-service.md shows, and openapi.yaml's charge example, on a
// fresh bucket, and checks the answer the docs give.
func TestAPIExamplesInDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/limit-service.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range apiExampleRE.FindAllStringSubmatch(string(doc), -1) {
		path, req, want := m[1], strings.Join(strings.Fields(m[2]), " "), strings.Join(strings.Fields(m[3]), " ")
		seen[path] = true
		t.Run(path, func(t *testing.T) {
			replayOnFreshBucket(t, path, strings.ReplaceAll(req, `"key": "..."`, `"key": "k"`), want)
		})
	}
	t.Run("openapi.yaml /v1/charge", func(t *testing.T) {
		raw, err := os.ReadFile("openapi.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Paths map[string]struct {
				Post struct {
					RequestBody struct {
						Content map[string]struct{ Example json.RawMessage } `json:"content"`
					} `json:"requestBody"`
					Responses map[string]struct {
						Content map[string]struct{ Example json.RawMessage } `json:"content"`
					} `json:"responses"`
				} `json:"post"`
			} `json:"paths"`
		}
		if err := yaml.Unmarshal(raw, &spec); err != nil {
			t.Fatal(err)
		}
		op := spec.Paths["/v1/charge"].Post
		req, want := op.RequestBody.Content["application/json"].Example, op.Responses["200"].Content["application/json"].Example
		if len(req) == 0 || len(want) == 0 {
			t.Fatal("openapi.yaml: /v1/charge has no request or 200 example")
		}
		replayOnFreshBucket(t, "/v1/charge", string(req), string(want))
	})
	for _, p := range []string{"/v1/decide", "/v1/lease", "/v1/charge", "/v1/slots/acquire", "/v1/slots/renew", "/v1/slots/release"} {
		if !seen[p] {
			t.Errorf("docs/limit-service.md shows no call of %s", p)
		}
	}
}
