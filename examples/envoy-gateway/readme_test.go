package envoygateway

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADME: README.md names what exists. Each test it names is a test of
// this package, each `make <target>` a target of the repository's
// Makefile, and the image and module path it quotes are native.yaml's (the
// init container's image, the registered path) and the rate limit
// deployment's image of envoy-gateway-values.yaml.
func TestREADME(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)

	tests := map[string]bool{}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`).FindAllStringSubmatch(string(src), -1) {
			tests[m[1]] = true
		}
	}
	named := regexp.MustCompile("`(Test\\w+)`").FindAllStringSubmatch(readme, -1)
	if len(named) == 0 {
		t.Error("README.md names no test")
	}
	for _, m := range named {
		if !tests[m[1]] {
			t.Errorf("README.md names %s, which is no test of this package", m[1])
		}
	}

	var makefiles []byte
	mks, _ := filepath.Glob("../../mk/*.mk")
	for _, f := range append([]string{"../../Makefile"}, mks...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		makefiles = append(makefiles, src...)
	}
	targets := regexp.MustCompile(`\bmake ([a-z][a-z0-9-]*)`).FindAllStringSubmatch(readme, -1)
	if len(targets) == 0 {
		t.Error("README.md names no make target")
	}
	for _, m := range targets {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `:`).Match(makefiles) {
			t.Errorf("README.md names make %s, which the Makefile does not define", m[1])
		}
	}

	objs := loadExample(t)
	mods, err := resolve(objs)
	if err != nil || len(mods) != 1 {
		t.Fatalf("resolve: %d, %v", len(mods), err)
	}
	if p := mods[0].entry.Source.Local.Path; !strings.Contains(readme, "`"+p+"`") {
		t.Errorf("README.md does not quote the registered path %s", p)
	}
	inits := mods[0].proxy.Spec.Provider.Kubernetes.EnvoyDeployment.InitContainers
	if len(inits) != 1 || !strings.Contains(readme, "`"+inits[0].Image+"`") {
		t.Errorf("README.md does not quote the init container's image (%d init containers)", len(inits))
	}

	_, eg := loadGlobal(t)
	if img := *eg.Provider.Kubernetes.RateLimitDeployment.Container.Image; !strings.Contains(readme, "`"+img+"`") {
		t.Errorf("README.md does not quote the rate limit deployment's image %s", img)
	}
}
