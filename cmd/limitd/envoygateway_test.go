package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// envoyGatewayVersion is the Envoy Gateway release whose rate limit
// deployments TestEnvoyGatewayDeployments reads.
const envoyGatewayVersion = "v1.9.1"

// TestEnvoyGatewayDeployments reads the rate limit deployments Envoy
// Gateway renders (its golden files, internal/infrastructure/kubernetes/
// ratelimit/testdata/deployments, from the Go module proxy or its cache)
// and gives each one's environment to the ratelimit mode: every variable
// it sets is taken but for the refusals documented: tracing (TRACING_ENABLED=true: limitd exports no
// traces), statsd (USE_STATSD=true, which Envoy Gateway sets false and
// some of these files override), a Sentinel URL without the master's name
// (envoyproxy/ratelimit refuses it too), and the deployment's files,
// absent here.
func TestEnvoyGatewayDeployments(t *testing.T) {
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/envoyproxy/gateway@"+envoyGatewayVersion).Output()
	if err != nil {
		t.Fatalf("go mod download github.com/envoyproxy/gateway@%s: %v", envoyGatewayVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %q: %v", out, err)
	}
	dir := filepath.Join(mod.Dir, "internal/infrastructure/kubernetes/ratelimit/testdata/deployments")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 10 {
		t.Fatalf("%s: %d deployments (%v)", dir, len(files), err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		found := false
		for _, c := range d.Spec.Template.Spec.Containers {
			if len(c.Command) == 0 || c.Command[0] != "/bin/ratelimit" {
				continue
			}
			found = true
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
				if e.ValueFrom != nil {
					env[e.Name] = "from-the-pod" // a secret's or the pod's field
				}
			}
			_, _, err := fromEnv(func(k string) string { return env[k] })
			for _, line := range strings.Split(errString(err), "\n") {
				switch {
				case line == "":
				case strings.HasPrefix(line, "TRACING_ENABLED=true"), strings.HasPrefix(line, "USE_STATSD=true"),
					strings.Contains(line, "REDIS_TYPE=SENTINEL wants the master's name"):
				case strings.Contains(line, "no such file or directory"):
				default:
					t.Errorf("%s: %s", filepath.Base(file), line)
				}
			}
		}
		if !found {
			t.Errorf("%s: no container runs /bin/ratelimit", filepath.Base(file))
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		var lines []string
		for _, e := range joined.Unwrap() {
			lines = append(lines, e.Error())
		}
		return strings.Join(lines, "\n")
	}
	return err.Error()
}
