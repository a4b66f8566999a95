// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// pluginMetrics returns the metrics the plugin defines, name to kind
// ("counter" or "gauge"), read from every call of the host's Counter and
// Gauge in engine/: the name's parts are string literals, string
// constants of the package, and local variables assigned once from those;
// any other part (a rule's name) is written <name>.
func pluginMetrics(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	dir := filepath.Join(root, "engine")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	consts := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[n.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
	}
	out := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			// Local variables assigned with := in this function.
			locals := map[string]ast.Expr{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && as.Tok == token.DEFINE && len(as.Lhs) == len(as.Rhs) {
					for i, l := range as.Lhs {
						if id, ok := l.(*ast.Ident); ok {
							locals[id.Name] = as.Rhs[i]
						}
					}
				}
				return true
			})
			var name func(e ast.Expr, depth int) string
			name = func(e ast.Expr, depth int) string {
				switch e := e.(type) {
				case *ast.BasicLit:
					if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
						return s
					}
				case *ast.BinaryExpr:
					if e.Op == token.ADD {
						return name(e.X, depth) + name(e.Y, depth)
					}
				case *ast.ParenExpr:
					return name(e.X, depth)
				case *ast.Ident:
					if v, ok := consts[e.Name]; ok {
						return v
					}
					if v, ok := locals[e.Name]; ok && depth < 4 {
						return name(v, depth+1)
					}
				}
				return "<name>"
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 1 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if h, ok := sel.X.(*ast.SelectorExpr); !ok || h.Sel.Name != "host" {
					return true // p.host.Counter(...), p.host.Gauge(...)
				}
				switch sel.Sel.Name {
				case "Counter":
					out[name(call.Args[0], 0)] = "counter"
				case "Gauge":
					out[name(call.Args[0], 0)] = "gauge"
				}
				return true
			})
		}
	}
	if len(out) == 0 {
		t.Fatal("no host.Counter or host.Gauge calls in engine/: the reader is broken")
	}
	return out
}

// metricRowRE is a row of the metric table: | `name` | kind | meaning |
var metricRowRE = regexp.MustCompile("^\\|\\s*`([^`]+)`\\s*\\|\\s*(counter|gauge)\\s*\\|")

// TestMetricList checks the metric table of docs/responses.md (its section
// "Metrics") against the plugin's source: every metric the plugin defines
// is listed with its kind, and nothing else is.
func TestMetricList(t *testing.T) {
	defined := pluginMetrics(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "responses.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal(`docs/responses.md has no section "## Metrics"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	listed := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		if m := metricRowRE.FindStringSubmatch(line); m != nil {
			if _, dup := listed[m[1]]; dup {
				t.Errorf("docs/responses.md lists %s twice", m[1])
			}
			listed[m[1]] = m[2]
		}
	}
	var names []string
	for n := range defined {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch kind, ok := listed[n]; {
		case !ok:
			t.Errorf("the plugin defines the %s %s; docs/responses.md does not list it", defined[n], n)
		case kind != defined[n]:
			t.Errorf("docs/responses.md lists %s as a %s; the plugin defines a %s", n, kind, defined[n])
		}
	}
	for n := range listed {
		if _, ok := defined[n]; !ok {
			t.Errorf("docs/responses.md lists %s, which the plugin does not define", n)
		}
	}
	t.Logf("%d metrics: %s", len(names), strings.Join(names, ", "))
}
