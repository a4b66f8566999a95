// Package requestpath measures the code one request runs through: the
// module's source files it executes and the calls it makes from one of the
// module's packages to another.
//
// A test hands Measure the part to measure (one request, from the host's
// callback to the reply or continue, the plugin already started). Measure
// runs that test twice more, built with coverage of the module's packages,
// with and without that part; a block that ran more often with it is a
// block the request ran. A call is counted once per call site that ran:
//   - a call of a function or method of another package of the module;
//   - a call through an interface method (engine.Stream.SendReply) when a
//     method of that name that ran, on a type implementing the interface,
//     lives in another package than the caller.
//
// Calls of function values (callbacks) and of the standard library or the
// SDKs are not counted. The harness (internal/testing/...) is left out of
// the files. The Wasm plugin is measured natively, under the SDK's
// emulator: its clock, metric and host-string files are the _native.go ones
// where the Wasm build has their _wasip1.go counterparts, one for one.
// Each measured request (allowed, refused, and allowed to its end, in both
// builds) is held under a Ceiling written in its test at today's figures.
// Rerun with `make request-path`.
package requestpath

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Module is the module whose packages are measured.
const Module = "github.com/ratelimit-wasm/tokenbucket"

// harness is left out of what a request runs through.
const harness = Module + "/internal/testing/"

// Path is what one request ran through.
type Path struct {
	// Files are the module's source files with a block that ran
	// (import path of the package / file name).
	Files []string
	// Calls are the call sites that ran from one of the module's packages
	// to another: "caller file:line -> callee package.name".
	Calls []string
	// Hops are the distinct (caller package -> callee package) pairs.
	Hops []string
}

// Ceiling is the most a request path may run through: today's figures,
// written in its test, so that a change that adds a file, a call across
// packages or a pair of packages to the request path fails until the same
// change raises the ceiling, where a reviewer sees it.
type Ceiling struct{ Files, Calls, Hops int }

// Within reports to t each figure of p above c, naming the figure, by how
// much it grew and where the ceiling lives (the file and line of Within's
// call, where the Ceiling is written). A zero Path (Measure's inner runs)
// is within every ceiling.
func (p Path) Within(t testing.TB, c Ceiling) {
	t.Helper()
	where := "its test"
	if _, file, line, ok := runtime.Caller(1); ok {
		where = moduleRelative(file) + ":" + strconv.Itoa(line)
	}
	for _, f := range []struct {
		name      string
		got, most int
	}{{"files", len(p.Files), c.Files}, {"cross-package calls", len(p.Calls), c.Calls}, {"package pairs", len(p.Hops), c.Hops}} {
		if f.got > f.most {
			t.Errorf("the request path's %s grew from %d to %d (ceiling at %s): a layer was added; raise the ceiling there only if it must be:\n%v", f.name, f.most, f.got, where, p)
		}
	}
}

// moduleRelative is file's path from the root of its module (the nearest
// directory above it with a go.mod), or file when there is none.
func moduleRelative(file string) string {
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if rel, err := filepath.Rel(dir, file); err == nil {
				return filepath.ToSlash(rel)
			}
			return file
		}
		if filepath.Dir(dir) == dir {
			return file
		}
	}
}

// String is the summary a test logs.
func (p Path) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d files, %d cross-package calls, %d package pairs\n", len(p.Files), len(p.Calls), len(p.Hops))
	b.WriteString("files:\n  " + strings.Join(p.Files, "\n  ") + "\n")
	b.WriteString("calls:\n  " + strings.Join(p.Calls, "\n  ") + "\n")
	b.WriteString("package pairs:\n  " + strings.Join(p.Hops, "\n  "))
	return b.String()
}

// Measure returns what run ran through. It runs the calling test (the
// package in the working directory, t.Name()) twice more with coverage of
// the module's packages it links: once with run, once without; a block that
// ran more often with run is a block run ran. Inside those runs Measure
// calls run or not and returns a zero Path.
func Measure(t *testing.T, run func()) Path {
	t.Helper()
	switch os.Getenv(runEnv) {
	case "1":
		run()
		return Path{}
	case "0":
		return Path{}
	}
	deps, err := goList(".", "-deps", "-test", "-f", "{{.ImportPath}}")
	if err != nil {
		t.Fatalf("requestpath: %v", err)
	}
	var pkgs []string
	for _, line := range strings.Split(string(deps), "\n") {
		p, _, _ := strings.Cut(line, " ") // "path [path.test]": a test variant
		if (p == Module || strings.HasPrefix(p, Module+"/")) && !strings.HasPrefix(p, harness) && !strings.HasSuffix(p, ".test") {
			pkgs = append(pkgs, p)
		}
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	dir := t.TempDir()
	var profiles [2]string
	for i, with := range []string{"0", "1"} {
		profiles[i] = filepath.Join(dir, "profile"+with)
		cmd := exec.Command("go", "test", "-count=1", "-covermode=count", "-coverpkg="+strings.Join(pkgs, ","),
			"-coverprofile="+profiles[i], "-run", "^"+t.Name()+"$", ".")
		cmd.Env = append(os.Environ(), runEnv+"="+with)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("requestpath: %v: %v\n%s", cmd.Args, err, b)
		}
	}
	p, err := analyse(profiles[0], profiles[1])
	if err != nil {
		t.Fatalf("requestpath: %v", err)
	}
	return p
}

// runEnv tells a run with coverage whether to run the measured part.
const runEnv = "REQUESTPATH_RUN"

func goList(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %v: %v\n%s", args, err, stderr.Bytes())
	}
	return out, nil
}

// block is a range of a file that ran.
type block struct{ l0, c0, l1, c1 int }

func (b block) contains(p token.Position) bool {
	if p.Line < b.l0 || p.Line > b.l1 {
		return false
	}
	if p.Line == b.l0 && p.Column < b.c0 {
		return false
	}
	return p.Line != b.l1 || p.Column <= b.c1
}

// readProfile reads a text coverage profile: each block's count, by
// "import/path/file.go".
func readProfile(name string) (map[string]map[block]int, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]map[block]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file.go:l0.c0,l1.c1 statements count
		colon := strings.LastIndex(line, ":")
		if colon < 0 {
			return nil, fmt.Errorf("profile line %q", line)
		}
		fields := strings.Fields(line[colon+1:])
		var b block
		n, err := 0, error(nil)
		if len(fields) == 3 {
			n, err = strconv.Atoi(fields[2])
		}
		if err == nil {
			_, err = fmt.Sscanf(fields[0], "%d.%d,%d.%d", &b.l0, &b.c0, &b.l1, &b.c1)
		}
		if len(fields) != 3 || err != nil {
			return nil, fmt.Errorf("profile line %q: %v", line, err)
		}
		if counts[line[:colon]] == nil {
			counts[line[:colon]] = map[block]int{}
		}
		counts[line[:colon]][b] += n
	}
	return counts, sc.Err()
}

// ranMore are the blocks that ran more often in with than in without.
func ranMore(without, with string) (map[string][]block, error) {
	before, err := readProfile(without)
	if err != nil {
		return nil, err
	}
	after, err := readProfile(with)
	if err != nil {
		return nil, err
	}
	ran := map[string][]block{}
	for f, blocks := range after {
		for b, n := range blocks {
			if n > before[f][b] {
				ran[f] = append(ran[f], b)
			}
		}
	}
	return ran, nil
}

// listed is what go list says of a package.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Export     string
	Standard   bool
}

// analyse turns a profile into a Path: it type-checks the module's
// packages that ran, from source, to resolve each call site that ran.
func analyse(without, with string) (Path, error) {
	ran, err := ranMore(without, with)
	if err != nil {
		return Path{}, err
	}
	ranPkgs := map[string]bool{}
	for f := range ran {
		if !strings.HasPrefix(f, harness) {
			ranPkgs[filepath.Dir(f)] = true
		}
	}
	args := []string{"-deps", "-export", "-json=ImportPath,Dir,GoFiles,CgoFiles,Export,Standard"}
	for p := range ranPkgs {
		args = append(args, p)
	}
	out, err := goList(".", args...)
	if err != nil {
		return Path{}, err
	}
	var all []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var l listed
		if err := dec.Decode(&l); err == io.EOF {
			break
		} else if err != nil {
			return Path{}, err
		}
		all = append(all, l)
	}
	fset := token.NewFileSet()
	exports := map[string]string{}
	for _, l := range all {
		exports[l.ImportPath] = l.Export
	}
	fromExport := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})
	// The module's packages are checked from source in dependency order
	// (go list -deps lists a package after its dependencies), so that one
	// type is one object everywhere (types.Implements across packages).
	checked := map[string]*types.Package{}
	imp := importerFunc(func(path string) (*types.Package, error) {
		if p := checked[path]; p != nil {
			return p, nil
		}
		return fromExport.Import(path)
	})
	type source struct {
		pkg   *types.Package
		info  *types.Info
		files []*ast.File
	}
	var sources []source
	for _, l := range all {
		if l.Standard || !(l.ImportPath == Module || strings.HasPrefix(l.ImportPath, Module+"/")) {
			continue
		}
		var files []*ast.File
		for _, name := range append(slices.Clone(l.GoFiles), l.CgoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(l.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return Path{}, err
			}
			files = append(files, f)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		conf := types.Config{Importer: imp, FakeImportC: true, Error: func(error) {}}
		pkg, _ := conf.Check(l.ImportPath, fset, files, info)
		checked[l.ImportPath] = pkg
		sources = append(sources, source{pkg, info, files})
	}
	// ranAt says whether the code at pos ran.
	fileOf := func(pos token.Pos, pkg string) string {
		return pkg + "/" + filepath.Base(fset.Position(pos).Filename)
	}
	ranAt := func(pos token.Pos, pkg string) bool {
		p := fset.Position(pos)
		for _, b := range ran[fileOf(pos, pkg)] {
			if b.contains(p) {
				return true
			}
		}
		return false
	}
	// methods are the module's concrete methods whose body ran, by name.
	type method struct {
		fn   *types.Func
		recv types.Type
	}
	methods := map[string][]method{}
	for _, s := range sources {
		for _, f := range s.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || fd.Body == nil || len(fd.Body.List) == 0 || !ranAt(fd.Body.List[0].Pos(), s.pkg.Path()) {
					continue
				}
				obj, _ := s.pkg.Scope().Lookup(recvName(fd)).(*types.TypeName)
				if obj == nil {
					continue
				}
				var recv types.Type = obj.Type()
				if _, ptr := fd.Recv.List[0].Type.(*ast.StarExpr); ptr {
					recv = types.NewPointer(recv)
				}
				sel := types.NewMethodSet(recv).Lookup(s.pkg, fd.Name.Name)
				if sel == nil {
					continue
				}
				fn, _ := sel.Obj().(*types.Func)
				methods[fd.Name.Name] = append(methods[fd.Name.Name], method{fn: fn, recv: recv})
			}
		}
	}
	var p Path
	hops := map[string]bool{}
	for _, s := range sources {
		caller := s.pkg.Path()
		for _, f := range s.files {
			name := fileOf(f.Pos(), caller)
			if len(ran[name]) > 0 {
				p.Files = append(p.Files, strings.TrimPrefix(name, Module+"/"))
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || !ranAt(call.Lparen, caller) {
					return true
				}
				fn := callee(s.info, call.Fun)
				if fn == nil || fn.Pkg() == nil {
					return true
				}
				var to []string
				if sig, _ := fn.Type().(*types.Signature); sig != nil && sig.Recv() != nil && types.IsInterface(sig.Recv().Type()) {
					iface, _ := sig.Recv().Type().Underlying().(*types.Interface)
					for _, m := range methods[fn.Name()] {
						if m.fn != nil && iface != nil && types.Implements(m.recv, iface) && m.fn.Pkg().Path() != caller {
							to = append(to, m.fn.Pkg().Path())
						}
					}
				} else if fp := fn.Pkg().Path(); fp != caller && strings.HasPrefix(fp, Module) {
					to = append(to, fp)
				}
				if len(to) == 0 {
					return true
				}
				slices.Sort(to)
				to = slices.Compact(to)
				pos := fset.Position(call.Lparen)
				short := func(s string) string {
					if s == Module {
						return "(root)"
					}
					return strings.TrimPrefix(s, Module+"/")
				}
				var names []string
				for _, t := range to {
					names = append(names, short(t))
					hops[short(caller)+" -> "+short(t)] = true
				}
				p.Calls = append(p.Calls, fmt.Sprintf("%s:%d -> %s.%s", strings.TrimPrefix(name, Module+"/"), pos.Line,
					strings.Join(names, "|"), fn.Name()))
				return true
			})
		}
	}
	for h := range hops {
		p.Hops = append(p.Hops, h)
	}
	slices.Sort(p.Files)
	slices.Sort(p.Calls)
	slices.Sort(p.Hops)
	return p, nil
}

// callee is the function or method a call's expression names, or nil (a
// function value, a conversion, a builtin).
func callee(info *types.Info, fun ast.Expr) *types.Func {
	fun = ast.Unparen(fun)
	switch e := fun.(type) {
	case *ast.IndexExpr: // a generic function instantiated
		fun = e.X
	case *ast.IndexListExpr:
		fun = e.X
	}
	var obj types.Object
	switch e := fun.(type) {
	case *ast.Ident:
		obj = info.Uses[e]
	case *ast.SelectorExpr:
		if sel := info.Selections[e]; sel != nil {
			obj = sel.Obj()
		} else {
			obj = info.Uses[e.Sel]
		}
	}
	fn, _ := obj.(*types.Func)
	if fn != nil {
		fn = fn.Origin()
	}
	return fn
}

// recvName is the name of a method's receiver type.
func recvName(fd *ast.FuncDecl) string {
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch e := t.(type) {
	case *ast.IndexExpr:
		t = e.X
	case *ast.IndexListExpr:
		t = e.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
